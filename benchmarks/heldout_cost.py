"""What the held-out shapes cost per evaluation (docs/fuzz.md "Measured").

``python benchmarks/heldout_cost.py [SUITE] [--repeat N] [--kernel FILE]`` scores the kernel file (default: the
red-team corpus's honest NumPy kernel) with ``kbench.evaluators.score_kernel`` alternately with ``held_out=0``
and ``held_out=3``, and prints each call's wall time and the held-out checks' own time, one JSON line each,
then the medians. Run it on a quiet machine: on a shared one the noise of a whole evaluation is larger than
the difference.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("suite", nargs="?", default=str(ROOT / "suites" / "evolve-cpu.yaml"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--kernel", default=str(ROOT / "tests" / "redteam" / "honest_numpy.py"))
    args = ap.parse_args()
    from kbench.evaluators import score_kernel

    walls: dict[int, list[float]] = {0: [], 3: []}
    checks: list[float] = []
    for _ in range(args.repeat):
        for n in (0, 3):
            start = time.perf_counter()
            fit = score_kernel(args.kernel, suite=args.suite, held_out=n)
            walls[n].append(time.perf_counter() - start)
            if fit.held_out:
                checks.append(fit.held_out["seconds"])
            print(json.dumps({"held_out": n, "seconds": round(walls[n][-1], 2), "score": fit.score,
                              "held": fit.held_out}), flush=True)
    base = statistics.median(walls[0])
    print(f"median evaluation: {base:.1f} s without held-out shapes, {statistics.median(walls[3]):.1f} s with; "
          f"the held-out checks {min(checks):.1f}-{max(checks):.1f} s = "
          f"{100 * min(checks) / base:.0f}-{100 * max(checks) / base:.0f}% of the median evaluation")


if __name__ == "__main__":
    main()
