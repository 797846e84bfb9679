"""ShinkaEvolve's evaluation program: kbench scores each candidate.

ShinkaEvolve runs ``python evaluate.py --program_path CANDIDATE --results_dir DIR`` and reads DIR/metrics.json
and DIR/correct.json. The candidate runs as an untrusted kbench kernel file (sandboxed, secret inputs, outputs
and time judged by the parent) on the OpenEvolve example's suite, beside numpy-flash measured in the same
run: combined_score = geometric-mean speedup over numpy-flash, 0 when any case fails (docs/evaluators.md).
"""
import sys
from pathlib import Path

from kbench.evaluators.shinka import main

SUITE = Path(__file__).resolve().parent.parent / "openevolve" / "suite.yaml"

if __name__ == "__main__":
    sys.exit(main(default_suite=str(SUITE), default_baseline="numpy-flash"))
