#!/usr/bin/env bash
# Zero leaks: runs N evaluations (default 1000) of a no-op task on a copy of the demo
# runtime, each with a private run root, and then counts what remains: run directories,
# mounts, cgroups named fork-*, and processes of fork. Prints the counts; exits 1 if any.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-1000}
[ -x target/release/fork ] || cargo build --release
FORK=$PWD/target/release/fork
tmp=$(mktemp -d)
chmod 755 "$tmp"   # the sandbox uid must reach the run root
trap 'rm -rf "$tmp"' EXIT
cp -r fixtures/hermes-demo "$tmp/rt"
printf '\n[tasks.noop]\ncommand = ["true"]\n' >> "$tmp/rt/fork.toml"
export FORK_RUN_ROOT="$tmp/runs" XDG_CONFIG_HOME="$tmp/xdg" XDG_DATA_HOME="$tmp/data"
mkdir -p "$FORK_RUN_ROOT"
"$FORK" keygen >/dev/null
cg_before=$(find /sys/fs/cgroup -maxdepth 4 -type d -name 'fork-*' 2>/dev/null | wc -l)
start=$(date +%s)
for i in $(seq "$N"); do
  "$FORK" evaluate fixtures/patches/noop-comment.diff --runtime "$tmp/rt" --task noop \
      --no-ledger --out "$tmp/out/$i" >/dev/null 2>"$tmp/err" || { cat "$tmp/err"; exit 1; }
  rm -rf "$tmp/out/$i"
done
secs=$(( $(date +%s) - start ))
dirs=$(find "$FORK_RUN_ROOT" -mindepth 1 -maxdepth 1 | wc -l)
mounts=$(grep -c "$FORK_RUN_ROOT" /proc/self/mountinfo || true)
cg_after=$(find /sys/fs/cgroup -maxdepth 4 -type d -name 'fork-*' 2>/dev/null | wc -l)
procs=$(pgrep -f '__sandbox-init' | wc -l || true)
echo "---- summary (scripts/soak-leaks.sh $N) ----"
echo "evaluations: $N in ${secs}s"
echo "left behind: run dirs $dirs, mounts $mounts, cgroups $((cg_after - cg_before)), sandbox inits $procs"
[ "$dirs" = 0 ] && [ "$mounts" = 0 ] && [ "$cg_after" = "$cg_before" ] && [ "$procs" = 0 ]
