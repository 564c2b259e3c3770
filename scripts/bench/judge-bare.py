#!/usr/bin/env python3
"""One judged run with no sandbox: the peer of fork's judged runs in scripts/bench-judged.sh.

    judge-bare.py --subject-tree DIR --judge-tree DIR --state DIR --reports DIR \
                  -- JUDGE ARG... -- SUBJECT ARG...

Starts the subject (cwd SUBJECT-TREE) and the judge (cwd JUDGE-TREE) as two plain
processes joined by two pipes, exactly as fork joins them (the judge reads the subject's
stdout on fd 3 and writes its stdin on fd 4; FORK_REPORTS, FORK_STATE and FORK_SEED for the
judge), waits for both and exits with the judge's status.
"""

import argparse
import os
import subprocess
import sys


def main():
    argv = sys.argv[1:]
    if argv.count("--") < 2:
        sys.exit("judge-bare.py: give the judge's argv after --, then the subject's after another --")
    cut = argv.index("--")
    cut2 = argv.index("--", cut + 1)
    p = argparse.ArgumentParser()
    p.add_argument("--subject-tree", required=True)
    p.add_argument("--judge-tree", required=True)
    p.add_argument("--state", required=True)
    p.add_argument("--reports", required=True)
    p.add_argument("--seed", default="0123456789abcdef0123456789abcdef")
    a = p.parse_args(argv[:cut])
    judge_argv = argv[cut + 1 : cut2]
    subject_argv = argv[cut2 + 1 :]
    os.makedirs(a.reports, exist_ok=True)
    to_subject_r, to_subject_w = os.pipe()
    from_subject_r, from_subject_w = os.pipe()
    subject = subprocess.Popen(
        subject_argv, cwd=a.subject_tree, stdin=to_subject_r, stdout=from_subject_w, stderr=subprocess.DEVNULL
    )
    os.close(to_subject_r)
    os.close(from_subject_w)
    env = dict(os.environ, FORK_REPORTS=os.path.abspath(a.reports), FORK_STATE=os.path.abspath(a.state), FORK_SEED=a.seed)
    # The judge's fds 3 and 4, as fork places them.
    os.dup2(from_subject_r, 3)
    os.dup2(to_subject_w, 4)
    for fd in (from_subject_r, to_subject_w):
        if fd not in (3, 4):
            os.close(fd)
    judge = subprocess.Popen(judge_argv, cwd=a.judge_tree, env=env, pass_fds=(3, 4))
    os.close(3)
    os.close(4)
    code = judge.wait()
    subject.kill()
    subject.wait()
    return code


if __name__ == "__main__":
    sys.exit(main())
