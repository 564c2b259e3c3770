#!/usr/bin/env bash
# A task under the sandbox against the same task bare (DESIGN target: within 5%).
#   scripts/bench-task.sh [N]   (default 10 interleaved rounds)
# The task: the demo runtime's compression benchmark (python3 bench/compress.py, CPU and
# SQLite reads), run bare from a copy of the runtime and under `fork run` (every layer)
# from the same copy given as --workspace. Prints medians and the median per-round ratio.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
n=${1:-10}
need=(python3)
# shellcheck source=scripts/bench/common.sh
. "$root/scripts/bench/common.sh"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/fork-bench-task.XXXXXX")
trap 'rm -rf "$tmp" "$installed"' EXIT
cp -r fixtures/hermes-demo "$tmp/rt"
export FORK_RUN_ROOT=/tmp
task="python3 bench/compress.py --sessions 100"
bare="sh -c 'cd $tmp/rt && FORK_REPORTS=$tmp/bare-reports $task'"
boxed="$fork run --workspace $tmp/rt -- sh -c 'FORK_STATE=/tmp/successor/state FORK_REPORTS=/tmp/successor/reports $task'"
sh -c "$bare" >/dev/null
sh -c "$boxed" >/dev/null || { echo "$0: the task fails under fork run (run as root; see fork check)" >&2; exit 1; }
python3 scripts/bench/interleave.py --runs "$n" --warmup 1 --ratio sandboxed/bare \
  -- sandboxed "$boxed" bare "$bare" | tee "$tmp/out.txt"
python3 - "$tmp/out.txt" "$n" <<'PY'
import re, sys
t = open(sys.argv[1]).read()
r = re.search(r"ratio sandboxed/bare: ([\d.]+) \(of medians\), ([\d.]+)", t)
meds = dict(re.findall(r"^\s+(sandboxed|bare)\s+([\d.]+)", t, re.M))
print()
print(f"---- summary (scripts/bench-task.sh {sys.argv[2]}) ----")
print(f"compress.py bare       median {float(meds['bare']):8.1f} ms")
print(f"compress.py sandboxed  median {float(meds['sandboxed']):8.1f} ms")
ratio = float(r.group(2))
print(f"sandboxed/bare         {ratio:.3f}x median per-round ratio; target <= 1.05: {'PASS' if ratio <= 1.05 else 'FAIL'}")
PY
