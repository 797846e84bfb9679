"""One evaluation: the cascade of checks, cheapest first, stopping at the first failure, and the reward.

The server-side stages need no sandbox: the submission's size and encoding, then the suite's static policy
(:func:`kbench.judge.policy.static_check`, the rules ``kbench run`` applies to a kernel file). The rest is one
call of :func:`kbench.evaluators.score_kernel`, the judge every evolver uses: the file is loaded in a sandboxed
worker (import), each case is checked before it is timed (correctness), the task's baseline is measured in
the same run (timing), and a kernel that passed every case is checked on held-out shapes near the suite's,
hidden from the client. The per-stage report is read off that verdict; no verdict is made here.

Reward (docs/serve.md, "Reward"): 0 unless every stage passed; otherwise ``log2(1 + speedup)`` where speedup
is the geometric mean over the cases of median(baseline) / median(kernel), both measured in this run (1.0 at
parity, 0 for an infinitely slow kernel, +1 per doubling of 1 + speedup), with the same transform of the
geometric means of the per-case 95% bootstrap bounds as its interval. A task without a baseline scores
``log2(1 + geomean TFLOP/s)`` and gives no interval.
"""
from __future__ import annotations

import math
import shutil
import tempfile
from pathlib import Path
from typing import Any

from kbench_serve.tasks import Task

#: the stages in order; a report lists those that ran, the last one that ran says why when it failed
STAGES = ("limits", "static", "import", "correctness", "held_out", "timing", "reward")


class HarnessFailure(Exception):
    """The harness, not the kernel, could not measure: the evaluation ends as ``error`` and no reward is
    given (a rollout should drop the sample, not learn 0 from it)."""


def reward_of(speedup: float) -> float:
    return math.log2(1.0 + max(0.0, speedup))


def _stage(name: str, ok: bool, reason: str | None = None, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"stage": name, "ok": ok}
    if reason:
        out["reason"] = reason
    out.update(extra)
    return out


def check_limits(task: Task, source: str) -> str | None:
    """Why the source cannot even be looked at, or None."""
    try:
        data = source.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"the source is not valid UTF-8 text ({exc.reason} at character {exc.start})"
    if len(data) > task.max_source_bytes:
        return f"the source is {len(data):,} bytes, over this task's limit of {task.max_source_bytes:,}"
    if "\x00" in source:
        return "the source contains a NUL character"
    if not source.strip():
        return "the source is empty"
    return None


def check_static(task: Task, source: str) -> str | None:
    from kbench.api import IntegritySettings, static_check

    settings = IntegritySettings.from_mapping(task.suite.data.get("integrity"))  # checked when the task loaded
    if not settings.static_applies(False):
        return None
    try:
        found = static_check(source, settings, filename="kernel.py")
    except SyntaxError as exc:  # the loader in the sandbox would say the same; say it before starting one
        return f"syntax error at line {exc.lineno}: {exc.msg}"
    if not found:
        return None
    more = f"; and {len(found) - 3} more" if len(found) > 3 else ""
    return "; ".join(map(str, found[:3])) + more


def evaluate(task: Task, source: str) -> tuple[str, float | None, dict[str, Any]]:
    """(outcome, reward, report) of ``source`` on ``task``. ``outcome`` is ``passed`` or the name of the
    stage that failed; raises :class:`HarnessFailure` when kbench itself could not measure."""
    stages: list[dict[str, Any]] = []

    def stop(stage: str, reason: str, records: list | None = None, backend: str | None = None, **extra: Any):
        stages.append(_stage(stage, False, reason, **extra))
        stages.append(_stage("reward", True, reward=0.0, why=f"0: the {stage} stage failed"))
        return stage, 0.0, _with_records(stages, records or [], backend, False)

    why = check_limits(task, source)
    if why:
        return stop("limits", why)
    stages.append(_stage("limits", True))
    why = check_static(task, source)
    if why:
        return stop("static", why)
    stages.append(_stage("static", True))

    from kbench.api import EnvironmentFailure, score_kernel

    tmp = Path(tempfile.mkdtemp(prefix="kbench-serve-"))
    try:
        kernel = tmp / "kernel.py"
        kernel.write_text(source, encoding="utf-8")
        try:
            fit = score_kernel(kernel, suite=task.suite, baseline=task.baseline, device=task.device,
                               held_out=task.held_out, case_timeout=task.case_timeout, results_dir=tmp / "results")
        except EnvironmentFailure as exc:
            raise HarnessFailure(str(exc)) from None
        records = _records(fit.result_file)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    if "(load)" in fit.failures:
        return stop("import", _clean(fit.failures["(load)"], tmp), records, fit.backend)
    stages.append(_stage("import", True))
    case_fail = {c: _clean(r, tmp) for c, r in fit.failures.items() if c not in ("(load)", "(held-out)")}
    mine = [r for r in records if r.get("backend") == fit.backend]
    if case_fail:
        statuses = {r["case_id"]: r.get("status") for r in mine}
        first = next(iter(case_fail.items()))
        return stop("correctness", f"{len(case_fail)} of {len(fit.cases)} case(s) did not pass; "
                    f"{first[0]}: {first[1]}", records,
                    fit.backend, failures=case_fail, statuses=statuses)
    stages.append(_stage("correctness", True, cases=len(fit.cases)))
    if fit.held_out is not None:
        if "(held-out)" in fit.failures:
            return stop("held_out", _clean(fit.failures["(held-out)"], tmp), records, fit.backend,
                        checked=fit.held_out.get("checked"))
        stages.append(_stage("held_out", True, checked=fit.held_out.get("checked")))
    timing = {cid: {k: c.get(k) for k in ("median_s", "speedup", "tflops", "rel_l2")} for cid, c in fit.cases.items()}
    stages.append(_stage("timing", True, cases=timing))
    if fit.baseline:
        lo, hi = _interval(records, fit.backend, fit.baseline)
        reward = reward_of(fit.score)
        interval = [reward_of(lo), reward_of(hi)] if lo is not None else None
        stages.append(_stage("reward", True, reward=reward, speedup=fit.score, speedup_ci=[lo, hi] if lo else None,
                             reward_ci=interval, why=f"log2(1 + {fit.score:.4g}x over {fit.baseline})"))
    else:
        reward, interval = reward_of(fit.score), None
        stages.append(_stage("reward", True, reward=reward, why=f"log2(1 + {fit.score:.4g} TFLOP/s)"))
    report = _with_records(stages, records, fit.backend, True)
    report.update(reward=reward, reward_ci=interval, score=fit.score, score_kind=fit.score_kind)
    return "passed", reward, report


def _with_records(stages, records, backend, correct) -> dict[str, Any]:
    reward = next((s.get("reward") for s in stages if s["stage"] == "reward"), 0.0)
    return {"stages": stages, "reward": reward, "correct": correct, "backend": backend, "records": records}


def _clean(text: str, tmp: Path) -> str:
    """Reasons name the kernel by its temporary path: the client knows it as its submission."""
    return str(text).replace(str(tmp / "kernel.py"), "kernel.py").replace(str(tmp), "")


def _records(result_file: str | None) -> list[dict[str, Any]]:
    """The run's records as the result file holds them (the CLI's form), without raw outputs' tails of
    other backends: what a client may read about its own evaluation."""
    if not result_file:
        return []
    from kbench.api import load_result

    data = load_result(result_file)
    return list(data.get("records", []))


def _interval(records, backend: str, baseline: str) -> tuple[float | None, float | None]:
    """Geometric means over the cases of the per-case 95% bootstrap bounds of the speedup (kbench.compare's
    ratio test, as ``kbench compare --baseline`` and ``Measurement.speedups`` compute it)."""
    from kbench.api import Record, geomean, ratio_test

    mine = {r["case_id"]: Record.of(r) for r in records if r.get("backend") == backend}
    theirs = {r["case_id"]: Record.of(r) for r in records if r.get("backend") == baseline}
    lows, highs = [], []
    for cid, rec in mine.items():
        base = theirs.get(cid)
        if base is None or not rec.passed or not base.passed or len(rec.samples) < 2 or len(base.samples) < 2:
            continue
        t = ratio_test(rec.samples, base.samples)  # base / kernel medians: > 1 is faster
        lows.append(t.ci_low)
        highs.append(t.ci_high)
    if not lows:
        return None, None
    return float(geomean(lows)), float(geomean(highs))
