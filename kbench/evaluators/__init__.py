"""kbench as the fitness function of an external search: one candidate kernel file -> a score and its reasons.

:func:`score_kernel` runs the candidate as an untrusted kernel file (sandboxed worker, static checks, the
judge of ``kbench run``) against a suite, optionally beside a baseline backend measured in the same run, and
returns a :class:`Fitness`: the score is 0 when any case did not pass, with the reason of each such case.
The adapters turn a Fitness into what an evolver reads: :mod:`kbench.evaluators.openevolve` (OpenEvolve's
``evaluate(program_path)``) and :mod:`kbench.evaluators.shinka` (ShinkaEvolve's ``evaluate.py`` program).
See docs/evaluators.md for what the score guarantees and what it does not.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from kbench.errors import BadInput, KbenchError


class EnvironmentFailure(KbenchError):
    """The harness could not measure (no sandbox, a worker that did not start, the baseline itself failing):
    nobody's kernel is to blame, so no score is given; the evolver should retry or stop, not record a 0."""


@dataclass
class Fitness:
    """One candidate's verdict: ``score`` (0 unless every case passed), why each failing case failed, and the
    per-case figures behind the score."""

    score: float
    correct: bool
    #: case id -> "status: reason" (or "(load)" -> why the file was refused before any case ran)
    failures: dict[str, str] = field(default_factory=dict)
    #: case id -> {"tflops", "median_s", "rel_l2", "speedup" (with a baseline), "status"}
    cases: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: what the score is: "geomean speedup over <baseline>" or "geomean TFLOP/s"
    score_kind: str = ""
    backend: str | None = None
    baseline: str | None = None
    result_file: str | None = None
    #: the held-out shapes' verdict (``checked``, ``seconds``, ``passed``, ``reason``); None when not checked
    held_out: dict[str, Any] | None = None

    @property
    def passed_cases(self) -> int:
        return sum(1 for c in self.cases.values() if c.get("status") == "passed")

    def metrics(self) -> dict[str, float]:
        """Numbers only (evolvers bin and average them): the combined score and what it is made of."""
        tflops = [c["tflops"] for c in self.cases.values() if c.get("tflops")]
        from kbench.measurement import geomean_or_zero

        out = {"combined_score": float(self.score), "correct": 1.0 if self.correct else 0.0,
               "cases_passed": float(self.passed_cases), "cases": float(len(self.cases)),
               "geomean_tflops": geomean_or_zero(tflops) if self.correct else 0.0}
        if self.baseline is not None:
            out["speedup"] = float(self.score)
        if self.held_out is not None:
            out["held_out_passed"] = 1.0 if self.held_out.get("passed") else 0.0
        return out

    def feedback(self) -> str:
        """A few lines for the next prompt: the score, then each failure, then the per-case figures."""
        lines = [f"kbench: score {self.score:.4g} ({self.score_kind}); "
                 f"{self.passed_cases}/{len(self.cases)} cases passed"]
        if self.failures:
            lines.append("failed (the score is 0 until every case passes):")
            lines += [f"  {case}: {why}" for case, why in self.failures.items()]
        lines += [f"  {case}: " + _case_line(c) for case, c in self.cases.items() if c.get("status") == "passed"]
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {"score": self.score, "correct": self.correct, "score_kind": self.score_kind,
                "backend": self.backend, "baseline": self.baseline, "failures": dict(self.failures),
                "cases": dict(self.cases), "result_file": self.result_file, "held_out": self.held_out}


def _case_line(c: Mapping[str, Any]) -> str:
    parts = [f"{c['tflops']:.4g} TFLOP/s" if c.get("tflops") else None,
             f"median {c['median_s'] * 1e3:.4g} ms" if c.get("median_s") else None,
             f"{c['speedup']:.3g}x the baseline" if c.get("speedup") else None,
             f"rel. L2 {c['rel_l2']:.2g}" if c.get("rel_l2") is not None else None]
    return ", ".join(p for p in parts if p)


def score_kernel(program_path: str | os.PathLike, *, suite: Any, baseline: Any = None,
                 device: str | None = None, keyword: str | None = None, timing: Mapping[str, Any] | None = None,
                 results_dir: str | os.PathLike | None = None, allow_unsandboxed: bool = False,
                 case_timeout: float | None = None, held_out: int | None = None, show_held_out: bool = False,
                 pm=None) -> Fitness:
    """Measure the kernel file ``program_path`` on ``suite`` (a path, a suite dict or a Suite) as an untrusted
    backend; with ``baseline`` (a registered backend name, or any other target :func:`kbench.api.measure` takes)
    that one is measured in the same run, case by case,
    and the score is the geometric mean of the speedups over it, else of the attained TFLOP/s.

    A case that does not pass (wrong, failed integrity check, crash, timeout, unsupported) makes the score 0
    and is listed in ``failures`` with its reason; so is a file refused before running (no ``attention``
    function, a forbidden call found by the static checks). ``results_dir``: keep each run's result file there
    (``<dir>/<machine>/<suite>-<time>.json``). ``device``: default the device of the file's ``SUBSTRATE``
    (a NumPy kernel is measured on the CPU even where a GPU is present). Raises :class:`EnvironmentFailure`
    when the harness, not the kernel, failed (records of ``cause: infrastructure``, or the baseline not passing).

    Held-out shapes (docs/fuzz.md): a candidate that passed every case is also checked, for correctness only,
    on ``held_out`` shapes near the suite's (default ``$KBENCH_EVAL_HELD_OUT``, else
    :data:`kbench.fuzz.heldout.HELD_OUT_CASES`; 0 turns it off) drawn from a secret of this call's, never
    written anywhere; wrong on one, it scores 0 with the reason under ``failures["(held-out)"]``, the shape hidden
    unless ``show_held_out``.
    """
    from kbench.kernelfile import KernelFileRef
    from kbench.plugins import get_plugin_manager
    from kbench.fuzz.heldout import held_out_default
    from kbench.measurement import geomean_or_zero, measure

    path = str(program_path)
    held_out = held_out_default(held_out)  # KBENCH_EVAL_HELD_OUT when the caller gives no number
    pm = pm if pm is not None else get_plugin_manager()
    suite = _load_suite(suite)  # the user's configuration: its errors are raised, never a candidate's 0
    try:
        if device is None:  # the file's text only: the candidate is never imported here
            device = KernelFileRef(path, pm.registry).device
        m = measure(path, suite=suite, baseline=baseline, device=device, keyword=keyword, timing=timing,
                    output=results_dir, allow_unsandboxed=allow_unsandboxed, case_timeout=case_timeout,
                    held_out=held_out, show_held_out=show_held_out, pm=pm)
    except BadInput as exc:
        if exc.file is not None and Path(exc.file) == Path(path):  # the candidate's own fault: it scores 0
            label = _label(baseline)
            return Fitness(0.0, False, {"(load)": exc.format()}, score_kind=_kind(label), baseline=label)
        raise
    broken = {r.case_id: r.status_text for r in m.records if r.extra.get("cause") == "infrastructure"}
    if broken:
        case, why = next(iter(broken.items()))
        raise EnvironmentFailure(f"the harness could not measure {len(broken)} case(s), e.g. {case}: {why}")
    name = m.subject
    base_failed = m.failures(m.baseline) if m.baseline else {}
    if base_failed:
        raise EnvironmentFailure("the baseline did not pass, so nothing can be compared with it: "
                                 + "; ".join(f"{k}: {v}" for k, v in list(base_failed.items())[:3]))
    speedups = {cid: s.speedup for cid, s in m.speedups(name).items()} if m.baseline else {}
    cases: dict[str, dict[str, Any]] = {}
    failures: dict[str, str] = {}
    for r in m.of(name):
        cell: dict[str, Any] = {"status": r.status.value}
        if r.passed:
            cell.update(tflops=r.tflops, median_s=r.median, rel_l2=r.rel_l2)
            if r.case_id in speedups:
                cell["speedup"] = speedups[r.case_id]
        else:
            failures[r.case_id] = r.status_text
            if r.rel_l2 is not None:
                cell["rel_l2"] = r.rel_l2
        cases[r.case_id] = cell
    correct = bool(cases) and not failures
    held = m.held_out.get(name)  # checked by measure() when every case passed
    if correct and held is not None:
        if held.infrastructure:
            raise EnvironmentFailure(f"the harness could not check the held-out shapes: {held.infrastructure}")
        if not held.passed:
            failures["(held-out)"] = held.reason(show_held_out)
            correct = False
    if not correct:
        score = 0.0
    elif baseline is not None:
        score = geomean_or_zero(c.get("speedup") for c in cases.values())
    else:
        score = geomean_or_zero(c.get("tflops") for c in cases.values())
    return Fitness(score, correct, failures, cases, _kind(m.baseline), name, m.baseline,
                   str(m.result_file) if m.result_file else None,
                   held.to_json(show_held_out) if held is not None else None)


def _load_suite(suite: Any):
    from kbench.suite import Suite, load_suite, suite_from_data

    if isinstance(suite, Suite):
        return suite
    return suite_from_data(dict(suite)) if isinstance(suite, Mapping) else load_suite(suite)


def _label(baseline: Any) -> str | None:
    """A baseline's name before it is measured (a backend name, a Backend's name, a callable's)."""
    if baseline is None or isinstance(baseline, str):
        return baseline
    return str(getattr(baseline, "name", None) or getattr(baseline, "__name__", None) or baseline)


def _kind(baseline: str | None) -> str:
    return f"geomean speedup over {baseline}" if baseline else "geomean TFLOP/s"


__all__ = ["EnvironmentFailure", "Fitness", "score_kernel"]
