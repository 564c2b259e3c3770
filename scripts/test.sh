#!/usr/bin/env bash
# The README's test command: installs what the tests need from the package registries,
# then runs the whole test suite (unit tests and the integration tests that drive the
# real binary on the real kernel). Run it as root: the sandbox tests mount the capped
# workspace and create cgroups.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v python3 >/dev/null 2>&1 || missing+=(python3)
command -v perl >/dev/null 2>&1 || missing+=(perl)
command -v setpriv >/dev/null 2>&1 || missing+=(util-linux)
# Distinct uids for a user's sandboxes: the subordinate-id helpers (newuidmap, newgidmap).
command -v newuidmap >/dev/null 2>&1 || missing+=(uidmap)
# The AppArmor profile under policies/apparmor is checked with apparmor_parser -Q.
[ -x /sbin/apparmor_parser ] || [ -x /usr/sbin/apparmor_parser ] || missing+=(apparmor)
# The launch-by-layer benchmark's test times bubblewrap beside fork.
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
# The mesh tests run a real NATS server (loopback only).
command -v nats-server >/dev/null 2>&1 || [ -x /usr/sbin/nats-server ] || missing+=(nats-server)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
  else
    echo "scripts/test.sh: please install: ${missing[*]}" >&2
    exit 1
  fi
fi

# The CI-output tests read fork's JUnit report back with junitparser (PyPI), as CI tools do.
if ! python3 -c 'import junitparser' >/dev/null 2>&1; then
  python3 -m pip install --quiet junitparser || {
    echo "scripts/test.sh: please install junitparser (python3 -m pip install junitparser)" >&2
    exit 1
  }
fi

# tests/attestation.rs verifies every bundle fork writes with third-party tools
# (scripts/verify-bundle.py): securesystemslib (DSSE, ed25519) and in-toto-attestation
# (Statement v1), from PyPI, pinned.
attestation_packages=('securesystemslib[crypto]==1.6.0' 'in-toto-attestation==0.9.3')
if ! python3 -c 'import securesystemslib.dsse, securesystemslib.signer, in_toto_attestation.v1.statement, cryptography' >/dev/null 2>&1; then
  python3 -m pip install --quiet "${attestation_packages[@]}" || {
    echo "scripts/test.sh: please install ${attestation_packages[*]} (python3 -m pip install ...)" >&2
    exit 1
  }
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "scripts/test.sh: cargo is missing: install Rust (rustup) first" >&2
  exit 1
fi

# shellcheck source=scripts/target-dir.sh
. scripts/target-dir.sh

# Build every target first (the hostile probe is an example binary the tests run; the
# benchmarks are built, so they keep compiling, but not run: a benchmark in a debug build
# measures nothing and cost about 100 s of every test run; run them with `cargo bench`).
# The build stays in the target directory (`target/`, or the one scripts/target-dir.sh
# names) and is reused by the next run; `cargo clean` removes it.
cargo build --all-targets --locked
cargo test --locked --lib --bins --tests --examples "$@"
