"""OpenEvolve's evaluator contract, answered by kbench: ``evaluate(program_path) -> EvaluationResult``.

OpenEvolve (``pip install kbench[openevolve]``) loads an evaluation file and calls its ``evaluate`` with the
path of a temporary file holding the candidate program. Write that file as::

    from kbench.evaluators.openevolve import OpenEvolveEvaluator
    evaluate = OpenEvolveEvaluator(suite="suite.yaml", baseline="numpy-flash")

or give this module's own file to ``openevolve-run`` with the settings in the environment
(``KBENCH_EVAL_SUITE``, ``KBENCH_EVAL_BASELINE``, ``KBENCH_EVAL_DEVICE``, ``KBENCH_EVAL_KEYWORD``,
``KBENCH_EVAL_RESULTS``, ``KBENCH_EVAL_HELD_OUT``: held-out shapes per candidate, 0 for none,
``KBENCH_EVAL_SHOW_HELD_OUT=1``: name a failing held-out shape in the feedback). The metrics are numbers (``combined_score``, ``correct``, ``cases_passed``,
``cases``, ``geomean_tflops``, ``speedup`` with a baseline); the artifacts, which OpenEvolve puts in the next
prompt, say why each failing case failed and what each passing case reached (examples/openevolve/).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from kbench.errors import BadInput
from kbench.evaluators import Fitness, score_kernel

#: the environment variables :func:`evaluate` reads (this module used directly as an evaluation file)
ENV = {"suite": "KBENCH_EVAL_SUITE", "baseline": "KBENCH_EVAL_BASELINE", "device": "KBENCH_EVAL_DEVICE",
       "keyword": "KBENCH_EVAL_KEYWORD", "results_dir": "KBENCH_EVAL_RESULTS", "held_out": "KBENCH_EVAL_HELD_OUT",
       "show_held_out": "KBENCH_EVAL_SHOW_HELD_OUT"}


class OpenEvolveEvaluator:
    """A configured ``evaluate``: each call measures one candidate file with :func:`kbench.evaluators.score_kernel`.

    ``suite``: a suite file (relative paths are taken from the current directory), a suite dict or a Suite;
    the other options are :func:`~kbench.evaluators.score_kernel`'s. OpenEvolve calls it from a thread
    or a worker process; each call is a kbench run of its own.
    """

    def __init__(self, suite: Any, **options: Any) -> None:
        self.suite = str(suite) if isinstance(suite, Path) else suite
        self.options = options

    def __call__(self, program_path: str) -> Any:
        return as_evaluation_result(score_kernel(program_path, suite=self.suite, **self.options))


def as_evaluation_result(fit: Fitness) -> Any:
    """OpenEvolve's ``EvaluationResult`` (metrics and artifacts); a plain metrics dict where openevolve is not
    installed (its older contract, without artifacts)."""
    artifacts = {"kbench_feedback": fit.feedback()}
    if fit.failures:
        artifacts["kbench_failures"] = "\n".join(f"{case}: {why}" for case, why in fit.failures.items())
    if fit.result_file:
        artifacts["kbench_result_file"] = fit.result_file
    try:
        from openevolve.evaluation_result import EvaluationResult
    except ImportError:
        return fit.metrics()
    return EvaluationResult(metrics=fit.metrics(), artifacts=artifacts)


def from_environment(environ: Mapping[str, str] = os.environ) -> OpenEvolveEvaluator:
    """The evaluator the ``KBENCH_EVAL_*`` variables describe (``KBENCH_EVAL_SUITE`` is required)."""
    values = {key: environ.get(var) or None for key, var in ENV.items()}
    if not values["suite"]:
        raise BadInput(f"{ENV['suite']} is not set", where="environment",
                       fix=f"export {ENV['suite']}=path/to/suite.yaml (and optionally {ENV['baseline']}=numpy-flash)")
    suite = values.pop("suite")
    if values["held_out"] is not None:
        try:
            values["held_out"] = int(values["held_out"])
        except ValueError:
            raise BadInput(f"{ENV['held_out']}={values['held_out']!r} is not a whole number", where="environment",
                           fix=f"export {ENV['held_out']}=3 (held-out shapes per candidate; 0 for none)") from None
    if values["show_held_out"] is not None:
        values["show_held_out"] = values["show_held_out"].strip().lower() in ("1", "true", "yes")
    return OpenEvolveEvaluator(suite, **{k: v for k, v in values.items() if v is not None})


def evaluate(program_path: str) -> Any:
    """OpenEvolve's entry point when this module's file is the evaluation file: settings from ``KBENCH_EVAL_*``."""
    return from_environment()(program_path)


__all__ = ["OpenEvolveEvaluator", "as_evaluation_result", "evaluate", "from_environment"]
