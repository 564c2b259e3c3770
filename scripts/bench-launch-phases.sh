#!/usr/bin/env bash
# Where a launch's wall time goes, fork against bwrap, from the kernel's process events
# (perf's sched tracepoints; no change to either program): N interleaved launches of
# `fork run -- /bin/true` and bwrap's /bin/true (default N=100), each split into
# start (exec to the sandbox's pid 1 created), sandbox (pid 1 to the command forked),
# command, and end (the command's exit to the launcher's exit); medians in ms, and
# fork minus bwrap per phase. Run it as root, with nothing else running (perf records the
# whole machine). See scripts/bench/launch_phases.py.
#
#   scripts/bench-launch-phases.sh [N]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

n=${1:-100}
case $n in '' | *[!0-9]* | 0) echo "usage: $0 [N]   (N >= 1 rounds, default 100)" >&2; exit 64 ;; esac

need=(python3 bwrap:bubblewrap perf:linux-perf)
# shellcheck source=scripts/bench/common.sh
. "$root/scripts/bench/common.sh"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/fork-bench-phases.XXXXXX")
trap 'rm -rf "$tmp" "$installed"' EXIT

"$fork" run -- /bin/true || { echo "$0: '$fork run -- /bin/true' failed (run as root; see 'fork check')" >&2; exit 1; }
bwrap_cmd="bwrap --unshare-all --ro-bind / / --proc /proc --dev /dev --tmpfs /tmp /bin/true"
$bwrap_cmd || { echo "$0: '$bwrap_cmd' failed" >&2; exit 1; }
perf record -q -o "$tmp/probe.data" -e sched:sched_process_exec true >/dev/null 2>&1 ||
  { echo "$0: perf cannot record the sched tracepoints here (perf record -e sched:sched_process_exec failed)" >&2; exit 69; }

cat >"$tmp/drive.sh" <<DRIVE
#!/bin/sh
i=0
while [ \$i -lt $n ]; do
  $(printf '%q' "$fork") run -- /bin/true
  $bwrap_cmd
  i=\$((i + 1))
done
DRIVE
chmod +x "$tmp/drive.sh"
"$tmp/drive.sh" >/dev/null 2>&1 # warm-up round: both binaries and the page cache
echo "launch phases: $n interleaved launches each on $(nproc) cores, kernel $(uname -r)"
perf record -q -a -o "$tmp/sched.data" \
  -e sched:sched_process_fork,sched:sched_process_exec,sched:sched_process_exit \
  "$tmp/drive.sh" >/dev/null 2>&1
perf script -i "$tmp/sched.data" >"$tmp/sched.txt" 2>/dev/null
echo "medians, ms (start: exec to pid 1 created; sandbox: to the command forked; command; end: the command's exit to the launcher's)"
python3 "$root/scripts/bench/launch_phases.py" "$tmp/sched.txt" fork=fork bwrap=bwrap
