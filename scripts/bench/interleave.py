#!/usr/bin/env python3
"""Interleaved wall-clock timing of a few commands, side by side in one run.

    interleave.py --runs N [--warmup W] [--ratio A/B] [--target-ratio A/B<=X]
                  [--target-median NAME<MS] -- NAME1 CMD1 NAME2 CMD2 ...

Each CMD is one string split like a shell would (shlex), with no shell started. The
string `{i}` in a CMD is replaced by the iteration number (warm-up runs use w0, w1...),
so a command can write to a fresh directory each time. Round r runs CMD1, CMD2, ...
in order (A, B, A, B, ...); each run is timed with time.perf_counter_ns() around
os.posix_spawn + waitpid (stdout/stderr to /dev/null), so the harness's own cost is the
same small spawn for every command. A command that exits non-zero stops the benchmark.

The harness is a child subreaper (PR_SET_CHILD_SUBREAPER): a process the command started
and did not wait for (bubblewrap's monitor, for one, exits on its sandbox's exit code
without reaping the sandbox's pid 1, which goes on tearing its namespaces down) is
reparented to the harness, which reaps it after the command's exit, before the next run.
So each run's CPU counts every process the command started, and the next run never
overlaps the last one's leftovers. Wall time stays the command's own (what its caller
waits for); "settled" is the time until every process it started had exited.

Prints, per command, the median, p10, p90, mean and min in ms; for --ratio A/B the
ratio of medians and the median of the per-round ratios A_r/B_r (paired, so drift on
a shared machine cancels out); the settled time's median; then the CPU time per run
(user + system of the command and of every process it started, from wait4; kernel work
done in kernel threads, such as a network namespace's cleanup, is in neither side's) with
the ratio of medians; then one PASS/FAIL line per target. Exit status 0 even when a
target is missed (the figures are the product); 1 on a failed command or usage.
"""

import ctypes
import os
import signal
import shlex
import shutil
import statistics
import sys
import time


def die(msg):
    print(f"interleave.py: {msg}", file=sys.stderr)
    sys.exit(1)


def percentile(xs, p):
    """Linear-interpolated percentile (p in 0..100) of a non-empty list."""
    s = sorted(xs)
    if len(s) == 1:
        return float(s[0])
    k = (len(s) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


# A process a command left behind must be gone within this many seconds of its exit.
ORPHAN_DEADLINE_S = 30
PR_SET_CHILD_SUBREAPER = 36


def become_subreaper():
    """Orphans of the commands are reparented to this process (Linux 3.4 and later)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        die(f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(ctypes.get_errno())}")


def on_deadline(signum, frame):
    die(
        f"a process a command started was still running {ORPHAN_DEADLINE_S} s after "
        "the command exited; nothing more timed"
    )


def reap_orphans():
    """Wait for every process the last command left behind; their CPU seconds."""
    cpu = 0.0
    signal.signal(signal.SIGALRM, on_deadline)
    signal.alarm(ORPHAN_DEADLINE_S)
    try:
        while True:
            try:
                _, _, ru = os.wait4(-1, 0)
            except ChildProcessError:
                return cpu
            cpu += ru.ru_utime + ru.ru_stime
    finally:
        signal.alarm(0)


def spawn_and_time(argv, devnull):
    path = argv[0] if "/" in argv[0] else shutil.which(argv[0])
    if path is None:
        die(f"command not found: {argv[0]}")
    fa = [
        (os.POSIX_SPAWN_DUP2, devnull, 1),
        (os.POSIX_SPAWN_DUP2, devnull, 2),
    ]
    t0 = time.perf_counter_ns()
    pid = os.posix_spawn(path, argv, os.environ, file_actions=fa)
    _, status, ru = os.wait4(pid, 0)
    t1 = time.perf_counter_ns()
    # CPU: user + system time of the command, of every descendant it reaped, and of
    # every process it left behind (reparented here and reaped now).
    orphans = reap_orphans()
    t2 = time.perf_counter_ns()
    cpu = ru.ru_utime + ru.ru_stime + orphans
    return t1 - t0, t2 - t0, os.waitstatus_to_exitcode(status), cpu


def main(argv):
    runs, warmup = None, 3
    ratios, target_ratios, target_medians = [], [], []
    if "--" not in argv:
        die("usage: interleave.py --runs N [options] -- NAME CMD [NAME CMD ...]")
    sep = argv.index("--")
    opts, rest = argv[:sep], argv[sep + 1 :]
    it = iter(opts)
    for o in it:
        v = next(it, None)
        if v is None:
            die(f"{o} needs a value")
        if o == "--runs":
            runs = int(v)
        elif o == "--warmup":
            warmup = int(v)
        elif o == "--ratio":
            ratios.append(tuple(v.split("/", 1)))
        elif o == "--target-ratio":  # A/B<=X
            pair, x = v.split("<=", 1)
            target_ratios.append((tuple(pair.split("/", 1)), float(x)))
        elif o == "--target-median":  # NAME<MS
            name, ms = v.split("<", 1)
            target_medians.append((name, float(ms)))
        else:
            die(f"unknown option {o}")
    if not runs or runs < 1:
        die("--runs N (N >= 1) is required")
    if not rest or len(rest) % 2:
        die("after --, give NAME CMD pairs")
    cmds = [(rest[k], shlex.split(rest[k + 1])) for k in range(0, len(rest), 2)]
    names = [n for n, _ in cmds]
    for a, b in ratios + [p for p, _ in target_ratios]:
        if a not in names or b not in names:
            die(f"ratio {a}/{b}: unknown command name")

    become_subreaper()
    devnull = os.open(os.devnull, os.O_WRONLY)
    samples = {n: [] for n in names}
    settled = {n: [] for n in names}
    cpu = {n: [] for n in names}
    total = warmup + runs
    for r in range(total):
        tag = f"w{r}" if r < warmup else str(r - warmup)
        for name, argv in cmds:
            a = [x.replace("{i}", tag) for x in argv]
            ns, settled_ns, code, cpu_s = spawn_and_time(a, devnull)
            if code != 0:
                die(f"{name} (round {tag}) exited {code}: {shlex.join(a)}")
            if r >= warmup:
                samples[name].append(ns / 1e6)
                settled[name].append(settled_ns / 1e6)
                cpu[name].append(cpu_s * 1e3)

    print(f"{runs} interleaved rounds ({warmup} warm-up rounds discarded), wall ms:")
    w = max(len(n) for n in names)
    print(f"  {'':<{w}}  {'median':>8} {'p10':>8} {'p90':>8} {'mean':>8} {'min':>8}")
    med = {}
    for n in names:
        xs = samples[n]
        med[n] = statistics.median(xs)
        print(
            f"  {n:<{w}}  {med[n]:8.2f} {percentile(xs, 10):8.2f} {percentile(xs, 90):8.2f}"
            f" {statistics.fmean(xs):8.2f} {min(xs):8.2f}"
        )
    paired = {}
    for a, b in dict.fromkeys(ratios + [p for p, _ in target_ratios]):
        per = [x / y for x, y in zip(samples[a], samples[b])]
        paired[(a, b)] = statistics.median(per)
        if (a, b) in ratios:
            print(
                f"  ratio {a}/{b}: {med[a] / med[b]:.2f} (of medians), "
                f"{paired[(a, b)]:.2f} (median of per-round ratios, "
                f"p10 {percentile(per, 10):.2f}, p90 {percentile(per, 90):.2f})"
            )
    print("settled ms (until every process the command started had exited), median:")
    for n in names:
        print(f"  settled {n:<{w}}  {statistics.median(settled[n]):8.2f}")
    print("CPU ms (user + system, the command and every process it started):")
    for n in names:
        xs = cpu[n]
        print(
            f"  cpu {n:<{w}}  {statistics.median(xs):8.2f} {percentile(xs, 10):8.2f}"
            f" {percentile(xs, 90):8.2f}"
        )
    for a, b in ratios:
        cm_a, cm_b = statistics.median(cpu[a]), statistics.median(cpu[b])
        if cm_b > 0:
            print(f"  cpu ratio {a}/{b}: {cm_a / cm_b:.2f} (of medians)")
    for (a, b), x in target_ratios:
        got = paired[(a, b)]
        ok = "PASS" if got <= x else "FAIL"
        print(f"  target {a}/{b} <= {x:g}: {ok} (median per-round ratio {got:.2f})")
    for n, ms in target_medians:
        ok = "PASS" if med[n] < ms else "FAIL"
        print(f"  target median {n} < {ms:g} ms: {ok} ({med[n]:.1f} ms)")


if __name__ == "__main__":
    main(sys.argv[1:])
