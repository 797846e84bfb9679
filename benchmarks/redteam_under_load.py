#!/usr/bin/env python3
"""The red-team corpus N times under a CPU hog: every run must catch every exploit and pass every honest kernel.

Runs ``python -m pytest -q tests/redteam/test_redteam.py`` (the corpus for the attack classes 1-5, 7 and 10
of docs/integrity.md and the classic exploits, with and without static checks, plus the honest kernels) REPEATS
times while a hog process keeps every CPU core busy, and prints one line per run and the outcome table: for
every test, how many runs passed. A figure, not a test; the exit status is 1 if any run had a failure.

    python benchmarks/redteam_under_load.py              # 10 runs, one hog process per core
    python benchmarks/redteam_under_load.py --repeats 3 --hogs 4
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOG = "import time\nwhile True:\n    sum(i * i for i in range(10000))\n"


def one_run() -> tuple[dict[str, str], float]:
    """Outcome per test id ("passed"/"failed"/"error"), wall time."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider",
                           "tests/redteam/test_redteam.py"], cwd=ROOT, capture_output=True, text=True)
    outcomes = {}
    for line in proc.stdout.splitlines():
        m = re.match(r"^(PASSED|FAILED|ERROR) (\S+)", line)
        if m:
            outcomes[m.group(2).split("::", 1)[-1]] = m.group(1).lower()
    if not outcomes:
        outcomes["<pytest>"] = f"error: {proc.stdout[-400:]}{proc.stderr[-400:]}"
    return outcomes, time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--hogs", type=int, default=os.cpu_count() or 2, help="busy processes (default: one per core)")
    args = ap.parse_args()
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(args.hogs)]
    table: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    bad_runs = 0
    try:
        for i in range(args.repeats):
            outcomes, wall = one_run()
            for test, outcome in outcomes.items():
                table[test][outcome] += 1
            failed = sorted(t for t, o in outcomes.items() if o != "passed")
            bad_runs += bool(failed)
            print(f"run {i + 1}/{args.repeats}: {len(outcomes) - len(failed)}/{len(outcomes)} passed in {wall:.0f} s "
                  f"under {args.hogs} hog(s)" + (f"; FAILED: {', '.join(failed)}" if failed else ""), flush=True)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    print(f"\n{'test':<78} {'passed':>6} {'other':>6}")
    for test in sorted(table):
        other = sum(n for o, n in table[test].items() if o != "passed")
        print(f"{test:<78} {table[test]['passed']:>6} {other:>6}")
    print(f"\n{args.repeats - bad_runs}/{args.repeats} runs caught every exploit and passed every honest kernel")
    return 1 if bad_runs else 0


if __name__ == "__main__":
    sys.exit(main())
