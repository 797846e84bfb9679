"""OpenEvolve's evaluation file: kbench scores each candidate.

Each call runs the candidate as an untrusted kbench kernel file (sandboxed worker, static checks, inputs
from a per-run secret, outputs verified and time accounted for by the parent) on suite.yaml, beside the
built-in numpy-flash backend measured in the same run. combined_score = geometric-mean speedup over
numpy-flash, 0 when any case fails; the artifacts tell the next prompt why (docs/evaluators.md).
"""
from pathlib import Path

from kbench.evaluators.openevolve import OpenEvolveEvaluator

HERE = Path(__file__).resolve().parent

evaluate = OpenEvolveEvaluator(suite=HERE / "suite.yaml", baseline="numpy-flash")
