#!/usr/bin/env python3
"""The VM harness's verdict comparison (scripts/vm-test.sh, scripts/vm-guest.sh).

  vm-verdict.py key VERDICT.json     # what must be the same here and in the guest:
                                     # the verdict and each plan task's verdict
  vm-verdict.py detail VERDICT.json  # what may differ (printed, not compared): the
                                     # confidence and each metric's class
A verdict that cannot be read prints `NO VERDICT (...)` and exits 1.
"""
import json
import sys


def main() -> int:
    if len(sys.argv) != 3 or sys.argv[1] not in ("key", "detail"):
        print(__doc__, file=sys.stderr)
        return 64
    try:
        with open(sys.argv[2]) as f:
            v = json.load(f)
        kind = v["verdict"]
    except (OSError, ValueError, KeyError) as e:
        print(f"NO VERDICT ({sys.argv[2]}: {e})")
        return 1
    tasks = v.get("plan") or []
    if sys.argv[1] == "key":
        parts = [kind] + [f"{t['task']}={t['verdict']}" for t in tasks]
        print(" ".join(parts))
    else:
        metrics = v.get("metrics") or []
        classes = ", ".join(f"{m['name']} {m.get('class', '?')}" for m in metrics)
        print(f"confidence {v.get('confidence')}; metrics: {classes or 'none'}")
    return 0


sys.exit(main())
