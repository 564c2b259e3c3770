#!/usr/bin/env bash
# Sequential stopping against fixed pairs, on the demo (run it as root; FORK_BIN times
# another fork binary):
#
#   for each task (compress: self-measured p99_ms; bench: the judged p50_ms) and each patch
#   (swap-compressor.diff, a clear-cut gain; noop-comment.diff; busy-wait.diff), N rounds,
#   interleaved, of three policies on the same machine:
#     sequential  the default: pairs until every metric is decided, at most 20
#     fixed-20    [decision] sequential = false, max_pairs = 20: 20 pairs, one look
#     fixed-5     [decision] sequential = false, max_pairs = 5: the compress task's 5 pairs
#                 before this release ("today's")
#   and reports per cell the verdicts, the pairs run and the median wall time, and the
#   median per-round ratio sequential / fixed-5 (paired by round, so drift cancels).
#
#   scripts/bench-sequential.sh [N] [TASKS] [PATCHES]
#     (default 3, "compress bench", "swap-compressor noop-comment busy-wait")
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

n=${1:-3}
tasks=${2:-compress bench}
patches=${3:-swap-compressor noop-comment busy-wait}
case $n in '' | *[!0-9]* | 0) echo "usage: $0 [N] [TASKS] [PATCHES]   (N >= 1 rounds, default 3)" >&2; exit 64 ;; esac
need=(python3)
# shellcheck source=scripts/bench/common.sh
. "$root/scripts/bench/common.sh"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/fork-bench-seq.XXXXXX")
trap 'rm -rf "$tmp" "$installed"' EXIT
export XDG_CONFIG_HOME=$tmp/config XDG_DATA_HOME=$tmp/data
"$fork" keygen >/dev/null 2>&1
# Self-reported evidence (the compress task) may APPROVE, as for patches written by people.
printf '[decision]\nself_reported = "accept"\n' >"$tmp/sequential.toml"
printf '[decision]\nself_reported = "accept"\nsequential = false\nmax_pairs = 20\n' >"$tmp/fixed-20.toml"
printf '[decision]\nself_reported = "accept"\nsequential = false\nmax_pairs = 5\n' >"$tmp/fixed-5.toml"

echo "sequential stopping vs fixed pairs: $n interleaved rounds on $(nproc) cores, kernel $(uname -r), load $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$fork" "$root" "$tmp" "$n" "$tasks" "$patches" <<'EOF'
import json, statistics, subprocess, sys, time
from pathlib import Path

fork, root, tmp, n = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
tasks, patches = sys.argv[5].split(), sys.argv[6].split()
policies = ["sequential", "fixed-20", "fixed-5"]
results = {}  # (task, patch, policy) -> [(seconds, verdict, pairs, classes)]
for r in range(n):
    for task in tasks:
        for patch in patches:
            for pol in policies:
                out = tmp / f"out-{task}-{patch}-{pol}-{r}"
                cmd = [fork, "evaluate", str(root / "fixtures/patches" / f"{patch}.diff"),
                       "--runtime", str(root / "fixtures/hermes-demo"), "--task", task,
                       "--no-ledger", "--policy", str(tmp / f"{pol}.toml"), "--out", str(out), "--json"]
                t0 = time.perf_counter()
                p = subprocess.run(cmd, capture_output=True, text=True)
                took = time.perf_counter() - t0
                try:
                    v = json.loads(p.stdout)
                except ValueError:
                    sys.exit(f"bench-sequential.sh: {' '.join(cmd)} exited {p.returncode}: {p.stderr[-2000:]}")
                ms = v.get("metrics", [])
                pairs = ms[0].get("samples") if ms else None
                classes = ",".join(f"{m['name']}={m.get('class', '?')}" for m in ms)
                results.setdefault((task, patch, pol), []).append((took, v["verdict"], pairs, classes))
                print(f"round {r + 1} {task:8} {patch:16} {pol:10} {took:6.2f} s  {v['verdict']:14} {pairs} pairs  {classes}", flush=True)

print()
print(f"---- medians over {n} rounds ----")
print(f"{'task':8} {'patch':16} {'policy':10} {'wall s':>7} {'pairs':>6}  verdicts")
for task in tasks:
    for patch in patches:
        for pol in policies:
            rs = results[(task, patch, pol)]
            wall = statistics.median(x[0] for x in rs)
            pairs = statistics.median(x[2] or 0 for x in rs)
            verdicts = ", ".join(f"{k} x{sum(1 for x in rs if x[1] == k)}" for k in sorted({x[1] for x in rs}))
            print(f"{task:8} {patch:16} {pol:10} {wall:7.2f} {pairs:6.1f}  {verdicts}")
        seq = results[(task, patch, "sequential")]
        f5 = results[(task, patch, "fixed-5")]
        f20 = results[(task, patch, "fixed-20")]
        ratio5 = statistics.median(a[0] / b[0] for a, b in zip(seq, f5))
        ratio20 = statistics.median(a[0] / b[0] for a, b in zip(seq, f20))
        same = sum(1 for a, b in zip(seq, f20) if a[1] == b[1])
        print(f"{task:8} {patch:16} sequential / fixed-5 {ratio5:.2f}x, / fixed-20 {ratio20:.2f}x (median per-round); "
              f"same verdict as fixed-20 in {same}/{len(seq)} rounds")
EOF
