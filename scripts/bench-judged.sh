#!/usr/bin/env bash
# The judged demo evaluation and the judge channel's cost per call, each against a peer in
# the same run (run it as root; FORK_BIN times another fork binary):
#
#   1. plan: `fork evaluate swap-compressor.diff` on a copy of fixtures/hermes-demo (its
#      default plan: contract, then bench with its baseline, 3 repeats: 7 judged runs, 14
#      sandboxes), N times, interleaved with the same 7 judged runs bare (judge and subject
#      as two plain processes joined by two pipes, scripts/bench/judge-bare.py, on patched
#      and unpatched copies prepared once). Target: median < 3 s.
#   2. channel: the `channel` task (judge/ping.py: 2,000 pings over the pipe pair) under
#      fork and bare; the per-call median each measured, and their difference: what fork's
#      channel adds per call.
#
#   scripts/bench-judged.sh [N]     (default 10)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

n=${1:-10}
case $n in '' | *[!0-9]* | 0) echo "usage: $0 [N]   (N >= 1 rounds, default 10)" >&2; exit 64 ;; esac
need=(python3 git)
# shellcheck source=scripts/bench/common.sh
. "$root/scripts/bench/common.sh"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/fork-bench-judged.XXXXXX")
trap 'rm -rf "$tmp" "$installed"' EXIT
mkdir "$tmp/out" "$tmp/bare" "$tmp/ping"
rt=$tmp/hermes-demo
cp -r "$root/fixtures/hermes-demo" "$rt"
patch=$root/fixtures/patches/swap-compressor.diff
# The bare peer's trees: the patched copy (git apply, as a deployer would) and the parent.
cp -r "$rt" "$tmp/patched"
(cd "$tmp/patched" && git apply "$patch")
export XDG_CONFIG_HOME=$tmp/config
"$fork" keygen >/dev/null 2>&1
# The same 7 judged runs as the bare peer: exactly 3 bench pairs (no sequential stopping;
# the demo's bench may run up to 20), p50_ms reported but not deciding (3 pairs cannot
# decide a timing metric at the default error rate; scripts/bench-sequential.sh times that).
printf '[decision]\nsequential = false\nmax_pairs = 3\ninformational = ["p50_ms"]\n' >"$tmp/three-pairs.toml"

# One evaluation outside the timing: the plan must APPROVE with a signed verdict.
if ! "$fork" evaluate "$patch" --runtime "$rt" --policy "$tmp/three-pairs.toml" --no-ledger --out "$tmp/check" >"$tmp/check.log" 2>&1; then
  cat "$tmp/check.log" >&2
  echo "$0: the judged plan did not APPROVE; nothing timed" >&2
  exit 1
fi
"$fork" verify "$tmp/check" >/dev/null

# The bare plan: contract once on the patched tree; bench 3x patched, 3x baseline.
cat >"$tmp/bare-plan.sh" <<EOS
#!/bin/sh
set -e
b=\$1
j() { python3 $root/scripts/bench/judge-bare.py --subject-tree "\$1" --judge-tree $rt --state $rt/state --reports "\$b/\$2" -- python3 judge/judge.py --suite "\$3" -- python3 -m hermes serve; }
j $tmp/patched contract contract
for r in 1 2 3; do j $tmp/patched bench-p\$r bench; j $rt bench-b\$r bench; done
EOS
chmod +x "$tmp/bare-plan.sh"
"$tmp/bare-plan.sh" "$tmp/bare/check"

q() { printf '%q' "$1"; }
echo "judged plan: $n interleaved rounds on $(nproc) cores, kernel $(uname -r)"
python3 "$root/scripts/bench/interleave.py" --runs "$n" --warmup 1 \
  --ratio 'fork/bare' --target-median 'fork<3000' \
  -- fork "$(q "$fork") evaluate $(q "$patch") --runtime $(q "$rt") --policy $(q "$tmp/three-pairs.toml") --no-ledger --out $(q "$tmp/out")/{i}" \
  bare "$(q "$tmp/bare-plan.sh") $(q "$tmp/bare")/{i}" | tee "$tmp/report"

# The channel: N rounds of each, the per-call medians they measured.
noop=$root/fixtures/patches/noop-comment.diff
for i in $(seq 1 "$n"); do
  "$fork" evaluate "$noop" --runtime "$rt" --task channel --no-ledger --out "$tmp/ping/fork-$i" >/dev/null 2>&1 || true
  python3 "$root/scripts/bench/judge-bare.py" --subject-tree "$tmp/patched" --judge-tree "$rt" --state "$rt/state" \
    --reports "$tmp/ping/bare-$i" -- python3 judge/ping.py --calls 2000 -- python3 -m hermes serve
done
python3 - "$tmp/ping" "$n" <<'EOF'
import json, statistics, sys
from pathlib import Path
d, n = Path(sys.argv[1]), int(sys.argv[2])
def read(p):
    try:
        return json.loads(p.read_text())
    except OSError:
        return None
fork = [m for i in range(1, n + 1) if (m := read(d / f"fork-{i}/artifacts/metrics.json"))]
bare = [m for i in range(1, n + 1) if (m := read(d / f"bare-{i}/metrics.json"))]
if not fork or not bare:
    sys.exit(f"bench-judged.sh: the channel runs wrote no metrics (fork {len(fork)}, bare {len(bare)})")
f50 = statistics.median(m["ping_p50_us"] for m in fork)
b50 = statistics.median(m["ping_p50_us"] for m in bare)
f90 = statistics.median(m["ping_p90_us"] for m in fork)
b90 = statistics.median(m["ping_p90_us"] for m in bare)
print()
print(f"---- channel: 2,000 pings per run, {len(fork)} fork runs, {len(bare)} bare runs ----")
print(f"per-call median: fork {f50:.1f} us, bare {b50:.1f} us: fork's channel adds {f50 - b50:+.1f} us per call ({f50 / b50:.2f}x)")
print(f"per-call p90:    fork {f90:.1f} us, bare {b90:.1f} us")
EOF
