#!/usr/bin/env bash
# Sandbox launch: `fork run -- /bin/true` (release binary, default policy, every layer on)
# against `bwrap --unshare-all ... /bin/true`, interleaved in the same run (fork, bwrap,
# fork, bwrap, ... N times each; default N=200). Target: the median
# per-round ratio fork/bwrap <= 1.0; the CPU per launch (user + system of every process
# each started: bwrap exits on its sandbox's exit code before the sandbox's pid 1 has
# exited, and that pid 1 and the command are counted too, reaped by the harness as a
# subreaper) and the time until every such process had exited are printed beside it.
# Run it as root (fork run needs the sandbox's privileges); set FORK_BIN to time another
# fork binary.
#
#   scripts/bench-launch.sh [N]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

n=${1:-200}
case $n in '' | *[!0-9]* | 0) echo "usage: $0 [N]   (N >= 1 rounds, default 200)" >&2; exit 64 ;; esac

# What the benchmark needs, from the package registry when we can.
need=(python3 bwrap:bubblewrap)
# shellcheck source=scripts/bench/common.sh
. "$root/scripts/bench/common.sh"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/fork-bench-launch.XXXXXX")
trap 'rm -rf "$tmp" "$installed"' EXIT

# Both must work before we time them (a failure would otherwise be timed as a fast run).
"$fork" run -- /bin/true || { echo "$0: '$fork run -- /bin/true' failed (run as root; see 'fork check')" >&2; exit 1; }
bwrap_cmd="bwrap --unshare-all --ro-bind / / --proc /proc --dev /dev --tmpfs /tmp /bin/true"
$bwrap_cmd || { echo "$0: '$bwrap_cmd' failed" >&2; exit 1; }

echo "sandbox launch: $n interleaved rounds on $(nproc) cores, kernel $(uname -r)"
echo "  fork : $fork run -- /bin/true"
echo "  bwrap: $bwrap_cmd ($(bwrap --version))"
python3 "$root/scripts/bench/interleave.py" --runs "$n" --warmup 5 \
  --ratio fork/bwrap --target-ratio 'fork/bwrap<=1.0' \
  -- fork "$(printf '%q' "$fork") run -- /bin/true" bwrap "$bwrap_cmd" | tee "$tmp/out"

# A block a README can quote.
python3 - "$tmp/out" "$n" <<'EOF'
import re, sys
t = open(sys.argv[1]).read()
med = {m[0]: (float(m[1]), float(m[2]), float(m[3])) for m in
       re.findall(r"^\s+(fork|bwrap)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", t, re.M)}
r = re.search(r"ratio fork/bwrap: ([\d.]+) \(of medians\), ([\d.]+)", t)
ok = re.search(r"target fork/bwrap <= 1: (\w+)", t).group(1)
print()
print("---- summary (scripts/bench-launch.sh %s) ----" % sys.argv[2])
for k in ("fork", "bwrap"):
    m, p10, p90 = med[k]
    print(f"{k + ' /bin/true':<16} median {m:6.2f} ms  (p10 {p10:.2f}, p90 {p90:.2f})")
print(f"fork/bwrap       {float(r.group(2)):.2f}x median per-round ratio "
      f"({float(r.group(1)):.2f}x of medians); target <= 1.0: {ok}")
settled = {m[0]: float(m[1]) for m in re.findall(r"^\s+settled (fork|bwrap)\s+([\d.]+)", t, re.M)}
if "fork" in settled and "bwrap" in settled:
    print(f"settled          fork {settled['fork']:.2f} ms, bwrap {settled['bwrap']:.2f} ms "
          "(until every process each started had exited)")
cpu = {m[0]: float(m[1]) for m in re.findall(r"^\s+cpu (fork|bwrap)\s+([\d.]+)", t, re.M)}
if "fork" in cpu and "bwrap" in cpu and cpu["bwrap"] > 0:
    print(f"CPU per launch   fork {cpu['fork']:.2f} ms, bwrap {cpu['bwrap']:.2f} ms: "
          f"{cpu['fork'] / cpu['bwrap']:.2f}x (medians)")
EOF
