#!/usr/bin/env bash
# The whole fork -> patch -> evaluate -> signed verdict -> destroy overhead on the demo
# runtime with a no-op task: `fork evaluate` of a patch against a temporary copy of
# fixtures/hermes-demo whose fork.toml gains `[tasks.noop] command = ["true"]`, N times
# (default 30), interleaved with two peers: the same no-op command run bare (`true`), and
# a plain `cp -r` of the runtime tree. Target: median < 150 ms
# (the seed's bound was 30 s). Run it as root; set FORK_BIN to time another fork binary
# and BENCH_PATCH to evaluate another patch (default fixtures/patches/noop-comment.diff).
#
#   scripts/bench-lifecycle.sh [N]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

n=${1:-30}
case $n in '' | *[!0-9]* | 0) echo "usage: $0 [N]   (N >= 1 rounds, default 30)" >&2; exit 64 ;; esac
patch=${BENCH_PATCH:-$root/fixtures/patches/noop-comment.diff}
[ -f "$patch" ] || { echo "$0: patch $patch not found" >&2; exit 65; }

need=(python3)
# shellcheck source=scripts/bench/common.sh
. "$root/scripts/bench/common.sh"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/fork-bench-lifecycle.XXXXXX")
trap 'rm -rf "$tmp" "$installed"' EXIT
mkdir "$tmp/out" "$tmp/cp"

# The runtime copy, with the no-op task placed first (and selected with --task noop).
rt=$tmp/hermes-demo
cp -r "$root/fixtures/hermes-demo" "$rt"
rm -f "$rt/state/ESCAPED"
python3 - "$rt/fork.toml" <<'EOF'
import sys
p = sys.argv[1]
s = open(p).read()
i = s.index("[tasks.")
open(p, "w").write(s[:i] + '[tasks.noop]\ncommand = ["true"]\n\n' + s[i:])
EOF

# A private node key, created once before timing.
export XDG_CONFIG_HOME=$tmp/config
"$fork" keygen >/dev/null 2>&1

# One evaluation outside the timing: it must APPROVE (exit 0) with a verdict on disk.
if ! "$fork" evaluate "$patch" --runtime "$rt" --task noop --policy "$root/policies/human-patches.toml" --no-ledger --out "$tmp/check" >"$tmp/check.log" 2>&1; then
  cat "$tmp/check.log" >&2
  echo "$0: the no-op evaluation did not APPROVE; nothing timed" >&2
  exit 1
fi
[ -f "$tmp/check/verdict.dsse.json" ] || { echo "$0: no signed verdict in $tmp/check" >&2; exit 1; }
"$fork" verify "$tmp/check" >/dev/null || { echo "$0: fork verify failed on the check run" >&2; exit 1; }

q() { printf '%q' "$1"; }
echo "lifecycle: $n interleaved rounds on $(nproc) cores, kernel $(uname -r)"
echo "  fork   : fork evaluate $(basename "$patch") --runtime <copy of hermes-demo> --task noop --no-ledger --out <fresh dir>"
echo "  true   : true (the task, bare)"
echo "  cp -r  : cp -r <runtime tree, $(du -sh "$rt" | cut -f1)> <fresh dir>"
python3 "$root/scripts/bench/interleave.py" --runs "$n" --warmup 2 \
  --ratio 'fork/cp -r' --target-median 'fork<150' \
  -- fork "$(q "$fork") evaluate $(q "$patch") --runtime $(q "$rt") --task noop --policy $(q "$root/policies/human-patches.toml") --no-ledger --out $(q "$tmp/out")/{i}" \
  true "true" \
  'cp -r' "cp -r $(q "$rt") $(q "$tmp/cp")/{i}" | tee "$tmp/report"

# Every timed run signed a verdict.
signed=$(find "$tmp/out" -mindepth 2 -maxdepth 2 -name verdict.dsse.json | wc -l)
[ "$signed" -ge "$n" ] || { echo "$0: only $signed of $n timed runs wrote a signed verdict" >&2; exit 1; }

python3 - "$tmp/report" "$n" "$(basename "$patch")" <<'EOF'
import re, sys
t = open(sys.argv[1]).read()
row = {m[0].strip(): (float(m[1]), float(m[3])) for m in
       re.findall(r"^  (fork|true|cp -r)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", t, re.M)}
ok = re.search(r"target median fork < 150 ms: (\w+)", t).group(1)
r = re.search(r"ratio fork/cp -r: [\d.]+ \(of medians\), ([\d.]+)", t).group(1)
print()
print(f"---- summary (scripts/bench-lifecycle.sh {sys.argv[2]}, patch {sys.argv[3]}, task noop) ----")
for k, label in (("fork", "fork evaluate"), ("true", "bare true"), ("cp -r", "cp -r runtime")):
    m, p90 = row[k]
    print(f"{label:<14} median {m:7.2f} ms  (p90 {p90:.2f})")
m = row["fork"][0]
print(f"lifecycle overhead over the bare task: {m - row['true'][0]:.1f} ms; "
      f"{float(r):.1f}x a plain cp -r (median per-round ratio)")
print(f"target median < 150 ms: {ok} ({m:.1f} ms; the seed's bound was 30 s)")
EOF
