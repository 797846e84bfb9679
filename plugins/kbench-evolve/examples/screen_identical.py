"""Screening of a copy of the champion, measured: is a candidate identical in speed ever dropped?

    python plugins/kbench-evolve/examples/screen_identical.py LINEAGE [TRIES] [--device cpu]

Each try writes the champion's source with a different trailing comment (so a new candidate, the same
code) and makes the screening run a submit makes: champion and copy in one kbench run, case by case,
then the screening verdict (dropped only if the top of the speedup's 95% interval is below 0.9x).
Prints one line per try; exit status 1 if any try was dropped.
"""
from __future__ import annotations

import argparse
import sys

from kbench.api import get_plugin_manager
from kbench_evolve.fitness import Evaluator, screen_verdict
from kbench_evolve.store import Lineage, atomic_write_text, workspace_root


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("lineage")
    parser.add_argument("tries", type=int, nargs="?", default=5)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    lineage = Lineage.open(workspace_root(), args.lineage)
    champ = lineage.champion()
    ev = Evaluator(get_plugin_manager(), lineage.current_suite(), lineage.scratch("runs"), device=args.device)
    dropped = 0
    for i in range(args.tries):
        copy = lineage.scratch("candidates") / f"screen-copy-{i}.py"
        atomic_write_text(copy, champ.source + f"\n# screening copy {i}\n")
        a, b = ev.measure_pair(champ.kernel_path, copy, label=f"screen-copy-{i}", bracket=True)
        keep, why = screen_verdict(a.samples, b.samples, seed=i)
        dropped += not keep
        print(f"try {i + 1}: {'kept' if keep else 'DROPPED'}: {why}; geomean champion {a.geomean:.4g}, "
              f"copy {b.geomean:.4g} TFLOP/s", flush=True)
    print(f"{args.tries - dropped}/{args.tries} copies of {args.lineage}@{champ.label} kept at screening")
    return 1 if dropped else 0


if __name__ == "__main__":
    sys.exit(main())
