# Sourced by the bench scripts: installs what they need and finds (or builds) the release
# binary. Expects `root` (the repository) and `need` (commands; `name:package` when the
# package is named otherwise) to be set; sets `fork`.
missing=()
for _need in "${need[@]}"; do
  _cmd=${_need%%:*}
  _pkg=${_need#*:}
  command -v "$_cmd" >/dev/null 2>&1 || missing+=("$_pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
  else
    echo "$0: please install: ${missing[*]} (e.g. apt-get install -y ${missing[*]})" >&2
    exit 69
  fi
fi

fork=${FORK_BIN:-$root/target/release/fork}
if [ ! -x "$fork" ]; then
  command -v cargo >/dev/null 2>&1 || { echo "$0: cargo is missing: install Rust (rustup) first" >&2; exit 69; }
  echo "building the release binary (cargo build --release)..." >&2
  cargo build --release --locked >&2
fi
if [ -n "$(find src -newer "$fork" -name '*.rs' -print -quit)" ]; then
  echo "note: src/ is newer than $fork; run cargo build --release for current figures" >&2
fi

# Timed as installed: `cargo install` copies fork and fork-init, and the files the linker
# left in target/release start about 7% slower on the development VM (README, Benchmarks),
# so the scripts time a copy of both. Each script removes "$installed" on exit.
installed=$(mktemp -d "${TMPDIR:-/tmp}/fork-bench-bin.XXXXXX")
trap 'rm -rf "$installed"' EXIT
chmod 755 "$installed"
cp "$fork" "$installed/fork"
cp "$(dirname "$fork")/fork-init" "$installed/fork-init" || {
  echo "$0: no fork-init beside $fork: build both (cargo build --release)" >&2
  rm -rf "$installed"
  exit 69
}
fork=$installed/fork
