#!/usr/bin/env bash
# Boots Debian's stock kernel in qemu (virtme-ng, software emulation) over this host's root
# filesystem and runs fork inside, as root and as an unprivileged user, on a cgroup v2 host
# with every controller, AppArmor and Landlock in the LSM list and /dev mounted noexec.
#
#   scripts/vm-test.sh            # smoke: fork check + fork run, as root and as a user
#   scripts/vm-test.sh full       # smoke, the demo's plan as root and as the user, then the
#                                 # suites as the user (sandbox, evaluate) and as root (sandbox,
#                                 # portability, evaluate, host_safety)
# Each `fork evaluate` of the demo patch in the guest must give the verdict this build gives
# on this host (evaluated here first; scripts/vm-verdict.py says what is compared).
#   scripts/vm-test.sh full ARGS  # ARGS go to the suites' test binaries (a name filter...)
#   FORK_VM_SUITES=root|user scripts/vm-test.sh full   # the suites of one pass only
#   FORK_VM_USER_ARGS=... scripts/vm-test.sh full ARGS  # other test args for the user's pass
#
# Prints one line per step and a closing "N passed, N failed". Exits non-zero when a step
# fails or when the VM did not boot or did not finish: it never skips. Run it as root (it
# installs qemu, the kernel package and virtme-ng when they are missing).
set -euo pipefail
# The whole script is one compound command, read before any of it runs: editing this file
# while a (long) run is under way cannot change what that run does next.
{
cd "$(dirname "$0")/.."
mode=${1:-smoke}
shift || true
case "$mode" in smoke | full) ;; *)
  echo "usage: scripts/vm-test.sh [smoke|full] [test args...]" >&2
  exit 64
  ;;
esac

# shellcheck source=scripts/target-dir.sh
. scripts/target-dir.sh

venv=${FORK_VM_VENV:-/var/tmp/fork-vng}
# bubblewrap: the guest runs scripts/bench-launch-layers.sh (its bwrap rows) with the
# host's binaries, read over 9p.
if ! command -v qemu-system-x86_64 >/dev/null 2>&1 || ! ls /boot/vmlinuz-* >/dev/null 2>&1 \
  || ! command -v busybox >/dev/null 2>&1 || ! command -v bwrap >/dev/null 2>&1; then
  if [ "$(id -u)" != 0 ]; then
    echo "scripts/vm-test.sh: install qemu-system-x86 linux-image-amd64 busybox-static bubblewrap (as root)" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-system-x86 linux-image-amd64 busybox-static bubblewrap
fi
if [ ! -x "$venv/bin/vng" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q virtme-ng
fi
export PATH="$venv/bin:$PATH"
kernel=${FORK_VM_KERNEL:-$(ls /boot/vmlinuz-* | sort -V | tail -n 1)}

# Build on the host (the guest sees the tree read-only) and find the suites' test binaries.
cargo build --all-targets --locked
tests=$(cargo test --locked --no-run --message-format=json --test sandbox --test portability --test evaluate --test host_safety 2>/dev/null |
  python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["target"]["name"] + "=" + m["executable"])')
target=${CARGO_TARGET_DIR:-$PWD/target}
mkdir -p "$target/tmp"

out=$(mktemp -d /var/tmp/fork-vm-XXXXXX)
chmod 755 "$out"
log=$out/console.log
# The guest reads the host's files live over 9p: it runs a snapshot of this build, so that
# a rebuild on the host while the VM runs (a test binary or fork rewritten under a running
# guest dies with SIGSEGV) cannot disturb it.
mkdir -p "$out/bin"
# The snapshot (hundreds of MB) goes however the run ends; the logs stay.
trap 'rm -rf "$out/bin"' EXIT
cp "$target/debug/fork" "$out/bin/fork"
cp "$target/debug/fork-init" "$out/bin/fork-init"   # the sandbox init, beside fork
# bash reads a script as it runs it: the guest runs a copy, so editing the tree's
# vm-guest.sh meanwhile cannot change a running guest's steps either.
cp scripts/vm-guest.sh "$out/bin/vm-guest.sh"
snap=""
if [ "$mode" = full ]; then
  for t in $tests; do
    cp "${t#*=}" "$out/bin/${t%%=*}"
    snap="$snap ${t%%=*}=$out/bin/${t%%=*}"
  done
fi
tests=$snap
# The verdict here, which the guest's must equal (as root and as the user): the demo patch
# evaluated by this build as this host's root, with the judged task (smoke) and with the
# demo's evaluation plan, the README's main command (full). The keys (the verdict and each
# plan task's) go to the output directory, where the guest reads them.
host_verdict() {
  local kind=$1 d
  shift
  d=$(mktemp -d /var/tmp/fork-vm-eval-XXXXXX)
  chmod 755 "$d"
  XDG_CONFIG_HOME=$d/xdg "$target/debug/fork" evaluate fixtures/patches/swap-compressor.diff \
    --runtime fixtures/hermes-demo --no-ledger --out "$d/out" "$@" >"$d/verdict.txt" 2>"$d/stderr.txt" || true
  python3 scripts/vm-verdict.py key "$d/out/verdict.json" >"$out/host-$kind.txt" || tail -n 3 "$d/stderr.txt" >&2
  cp "$d/out/verdict.json" "$out/host-$kind.json" 2>/dev/null || true
  echo "vm-test: this host's verdict ($kind): $(cat "$out/host-$kind.txt") ($(python3 scripts/vm-verdict.py detail "$d/out/verdict.json"))"
  rm -rf "$d"
}
host_verdict judged --task judged
if [ "$mode" = full ]; then host_verdict plan; fi
chmod 644 "$out"/host-*
echo "vm-test: kernel $kernel, mode $mode, output in $out"
# virtme-ng's guest: the host's files read-only, writable overlays on /etc, /tmp, /var, /home
# and the tests' scratch directory; the guest's own init, fork starts in the root cgroup.
# Those tmpfs overlays hide the host's /var/tmp (and /var/cache, /var/log, /run), where
# scripts/target-dir.sh builds a checkout under /tmp or a 0700 home: such a target
# directory is shared read-only by itself (a share is mounted after the overlays, so an
# overlay inside it would be hidden: the guest mounts a tmpfs on its tmp/ instead).
shares=(--overlay-rwdir "$target/tmp")
tmp_mount=no
case "$(cd "$target" && pwd -P)/" in
  /var/tmp/*|/var/cache/*|/var/log/*|/run/*)
    shares=(--rodir "$target")
    tmp_mount=yes ;;
esac
status=0
timeout "${FORK_VM_TIMEOUT:-3000}" vng --disable-kvm --run "$kernel" --memory 4G --cpus 2 \
  "${shares[@]}" --rwdir "$out" \
  --exec "env FORK_VM_TMP_MOUNT=$tmp_mount FORK_VM_MODE=$mode FORK_VM_SUITES=${FORK_VM_SUITES:-both} FORK_VM_TESTS='$(echo "$tests" | tr '\n' ' ')' FORK_VM_ARGS='$*' ${FORK_VM_USER_ARGS+FORK_VM_USER_ARGS='$FORK_VM_USER_ARGS'} FORK_VM_BIN='$target/debug/fork' FORK_VM_REAL='$out/bin/fork' FORK_VM_TMP='$target/tmp' FORK_VM_REPO='$PWD' FORK_VM_OUT='$out' bash $out/bin/vm-guest.sh" \
  >"$log" 2>&1 || status=$?
rm -rf "$out/bin" # the snapshot (hundreds of MB); the logs stay
grep -E '^vm: ' "$log" || true
result=$(grep -E '^vm-result: ' "$log" | tail -n 1 || true)
if [ -z "$result" ]; then
  echo "vm-test: the VM did not boot or did not finish (vng exit $status); see $log" >&2
  tail -n 30 "$log" >&2
  echo "0 passed, 1 failed"
  exit 1
fi
passed=$(echo "$result" | sed -E 's/.*passed=([0-9]+).*/\1/')
failed=$(echo "$result" | sed -E 's/.*failed=([0-9]+).*/\1/')
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
exit
}
