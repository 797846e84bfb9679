"""OpenEvolve's evaluation file: kbench scores each candidate.

Each call runs the candidate as an untrusted kbench kernel file (sandboxed worker, static checks, inputs
from a per-run secret, outputs verified and time accounted for by the parent) on suite.yaml, beside the
built-in numpy-flash backend measured in the same run. combined_score = geometric-mean speedup over
numpy-flash, 0 when any case fails or the candidate is wrong on a held-out shape (docs/fuzz.md); the artifacts
tell the next prompt why (docs/evaluators.md). No held-out number is given here, so the one switch,
``KBENCH_EVAL_HELD_OUT`` (0: none; default 3), decides it.
"""
from pathlib import Path

from kbench.evaluators.openevolve import OpenEvolveEvaluator

HERE = Path(__file__).resolve().parent

evaluate = OpenEvolveEvaluator(suite=HERE / "suite.yaml", baseline="numpy-flash")
