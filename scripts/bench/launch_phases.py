#!/usr/bin/env python3
"""Where a sandbox launch's wall time goes, from the kernel's own process events.

    launch_phases.py PERF_SCRIPT_OUTPUT NAME=EXE_BASENAME ...

Reads the text of `perf script` over a recording of the tracepoints
sched:sched_process_fork, sched:sched_process_exec and sched:sched_process_exit, taken
while launchers (fork, bwrap) each ran a sandboxed `/bin/true` many times, and splits
every launch into four phases, the same for any launcher:

  start      the launcher's exec to its sandbox's pid 1 created (the clone returned):
             the launcher's own start-up, its preparation and the clone itself;
  sandbox    pid 1 created to the command forked: pid 1 building the sandbox;
  command    the command forked to its exit (/bin/true's exec and exit);
  end        the command's exit to the launcher's main thread exiting: pid 1's exit,
             the launcher's wait, teardown and report.

A launch is found from its command: the process that exec'd /bin/true, its parent (pid 1
of the sandbox), and the launcher that created pid 1 (named by the basename of the file
it exec'd). Prints, per launcher, the median of each phase and of their sum, in ms.
"""

import collections
import re
import statistics
import sys

EVENT = re.compile(r"^\s*(?P<comm>.+?)\s+(?P<tid>\d+)\s+\[\d+\]\s+(?P<ts>[\d.]+):\s+sched:(?P<ev>\w+):\s+(?P<rest>.*)$")


def parse(path):
    forks = {}  # child tid -> (ts, parent tid)
    execs = {}  # tid -> list of (ts, filename)
    exits = {}  # tid -> ts (last)
    for line in open(path, errors="replace"):
        m = EVENT.match(line)
        if not m:
            continue
        ts = float(m["ts"]) * 1e3
        tid = int(m["tid"])
        rest = m["rest"]
        if m["ev"] == "sched_process_fork":
            c = re.search(r"child_pid=(\d+)", rest)
            if c:
                forks[int(c.group(1))] = (ts, tid)
        elif m["ev"] == "sched_process_exec":
            f = re.search(r"filename=(\S+)", rest)
            execs.setdefault(tid, []).append((ts, f.group(1) if f else ""))
        elif m["ev"] == "sched_process_exit":
            exits[tid] = ts
    return forks, execs, exits


def launches(forks, execs, exits, names):
    """(launcher name, {phase: ms}) for each command found."""
    by_base = {base: name for name, base in names.items()}
    for cmd, evs in execs.items():
        if not any(f == "/bin/true" for _, f in evs) or cmd not in forks or cmd not in exits:
            continue
        cmd_forked, pid1 = forks[cmd]
        if pid1 not in forks:
            continue
        pid1_made, creator = forks[pid1]
        # The creator is a thread of the launcher, or the launcher itself: the launcher
        # is the nearest ancestor (through thread creation) that exec'd a named file.
        launcher, name, t = creator, None, None
        for _ in range(8):
            for ts, f in execs.get(launcher, []):
                base = f.rsplit("/", 1)[-1]
                if base in by_base and ts <= pid1_made:
                    name, t = by_base[base], ts
            if name or launcher not in forks:
                break
            launcher = forks[launcher][1]
        if not name or launcher not in exits:
            continue
        yield name, {
            "start": pid1_made - t,
            "sandbox": cmd_forked - pid1_made,
            "command": exits[cmd] - cmd_forked,
            "end": exits[launcher] - exits[cmd],
            "total": exits[launcher] - t,
        }


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        sys.exit(64)
    names = dict(a.split("=", 1) for a in sys.argv[2:])
    got = collections.defaultdict(lambda: collections.defaultdict(list))
    for name, ph in launches(*parse(sys.argv[1]), names):
        for k, v in ph.items():
            got[name][k].append(v)
    if not got:
        print("no launch found in the recording", file=sys.stderr)
        sys.exit(1)
    phases = ["start", "sandbox", "command", "end", "total"]
    print(f"  {'':8}" + "".join(f"{p:>10}" for p in phases) + "   launches")
    for name in names:
        if name not in got:
            continue
        meds = [statistics.median(got[name][p]) for p in phases]
        print(f"  {name:8}" + "".join(f"{v:10.2f}" for v in meds) + f"   {len(got[name]['total'])}")
    if len(names) == 2 and all(n in got for n in names):
        a, b = list(names)
        print(f"  {a + '-' + b:8}" + "".join(
            f"{statistics.median(got[a][p]) - statistics.median(got[b][p]):+10.2f}" for p in phases))


if __name__ == "__main__":
    main()
