"""Fitness: the harness's own measurement of a candidate kernel file, never the candidate's word.

A candidate is run as an untrusted kernel file through the core runner (``plan_run`` / ``run_suite``,
which isolate untrusted backends and apply the suite's integrity checks); its score is the vector
of per-case TFLOP/s, all zero if any case is not ``passed``. Whether a candidate beats the champion
is decided from interleaved re-measurements (champion, candidate, champion, candidate, ...) with a
bootstrap confidence interval of the geometric-mean speedup (scipy), never from a bare threshold.
"""
from __future__ import annotations

import copy
import datetime as _dt
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kbench.enums import Status
from kbench.suite import Suite, load_suite, suite_from_data

#: timing for a correctness-only run: every case is still executed and checked, barely timed
CHECK_TIMING = {"warmup_calls": 1, "warmup_time": 0.0, "min_samples": 2, "min_time": 0.0, "max_time": 0.001,
                "target_rel_se": 1.0, "rotate": 1}


def geomean(values: list[float]) -> float:
    vals = [v for v in values]
    if not vals or any(not v or v <= 0 for v in vals):
        return 0.0
    return float(math.exp(sum(math.log(v) for v in vals) / len(vals)))


@dataclass
class Measurement:
    """One kbench run of one kernel file over (a subset of) a suite."""

    kernel: str
    result_file: str | None
    scores: dict[str, float] = field(default_factory=dict)          # case id -> TFLOP/s (0 when wrong)
    samples: dict[str, list[float]] = field(default_factory=dict)   # case id -> seconds
    flops: dict[str, float] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)          # case id -> "status: reason"
    profile: dict[str, dict[str, Any]] = field(default_factory=dict)  # case id -> roofline metrics

    @property
    def correct(self) -> bool:
        return bool(self.scores) and not self.failures

    @property
    def geomean(self) -> float:
        return geomean(list(self.scores.values())) if self.correct else 0.0

    def zeroed(self) -> dict[str, float]:
        """The fitness vector: every entry 0 if any case failed (AVO's correctness gate)."""
        return dict(self.scores) if self.correct else {c: 0.0 for c in self.scores}

    def merge(self, other: Measurement) -> Measurement:
        """Pool the samples of two runs of the same kernel (scores recomputed from pooled medians)."""
        out = Measurement(self.kernel, other.result_file, flops={**self.flops, **other.flops},
                          failures={**self.failures, **other.failures}, profile={**self.profile, **other.profile})
        for case in set(self.samples) | set(other.samples):
            out.samples[case] = self.samples.get(case, []) + other.samples.get(case, [])
        for case in set(self.scores) | set(other.scores):
            s = out.samples.get(case)
            out.scores[case] = (out.flops[case] / float(np.median(s)) / 1e12
                                if s and case not in out.failures and out.flops.get(case) else 0.0)
        return out

    def summary(self) -> dict[str, Any]:
        return {"geomean": self.geomean, "scores": self.zeroed(), "failures": self.failures,
                "result_file": self.result_file}


def measurement_from_records(kernel: str, result_file: str | None, records: list[dict[str, Any]]) -> Measurement:
    m = Measurement(kernel, result_file)
    for rec in records:
        case = rec["case_id"]
        m.scores.setdefault(case, 0.0)
        if rec["status"] != Status.PASSED.value:
            m.failures[case] = f"{rec['status']}: {rec.get('reason') or ''}".strip()
            continue
        metrics = rec.get("metrics") or {}
        m.scores[case] = float(metrics.get("tflops") or 0.0)
        m.samples[case] = list((rec.get("timing") or {}).get("samples") or [])
        m.flops[case] = float(metrics.get("flops") or 0.0)
        m.profile[case] = {k: metrics.get(k) for k in ("tflops", "gbps", "intensity", "bound", "roof_fraction")
                           if metrics.get(k) is not None}
        m.profile[case]["median_s"] = (rec.get("stats") or {}).get("median")
        m.profile[case]["rel_l2"] = (rec.get("correctness") or {}).get("rel_l2")
    return m


@dataclass
class Decision:
    commit: bool
    reason: str
    speedup: float = 0.0                    # geomean of champion time / candidate time over cases
    ci: tuple[float, float] = (0.0, 0.0)    # bootstrap 95% interval of the speedup
    p_values: dict[str, float] = field(default_factory=dict)  # per case, Mann-Whitney U (candidate faster)
    champion: Measurement | None = None
    candidate: Measurement | None = None

    def to_json(self) -> dict[str, Any]:
        return {"commit": self.commit, "reason": self.reason, "speedup": self.speedup, "ci": list(self.ci),
                "p_values": self.p_values,
                "champion_geomean": self.champion.geomean if self.champion else None,
                "candidate_geomean": self.candidate.geomean if self.candidate else None}


def speedup_interval(champ: dict[str, list[float]], cand: dict[str, list[float]], *, seed: int = 0,
                     n_resamples: int = 2000, confidence: float = 0.95) -> tuple[float, tuple[float, float]]:
    """Geomean over cases of median(champion)/median(candidate), with a percentile bootstrap interval."""
    from scipy import stats

    cases = sorted(set(champ) & set(cand))
    data = []
    for c in cases:
        data += [np.asarray(champ[c], dtype=float), np.asarray(cand[c], dtype=float)]

    def statistic(*arrays, axis=-1):
        logs = [np.log(np.median(arrays[2 * i], axis=axis)) - np.log(np.median(arrays[2 * i + 1], axis=axis))
                for i in range(len(cases))]
        return np.exp(np.mean(logs, axis=0))

    point = float(statistic(*data))
    res = stats.bootstrap(data, statistic, n_resamples=n_resamples, confidence_level=confidence,
                          method="percentile", vectorized=True, random_state=np.random.default_rng(seed))
    return point, (float(res.confidence_interval.low), float(res.confidence_interval.high))


class Evaluator:
    """Runs kernel files over the lineage's suite with the core runner and turns records into fitness."""

    def __init__(self, pm, suite: str | Path | Suite, runs_dir: Path, *, device: str = "auto",
                 min_gain: float = 0.0, rounds: int = 2, on_run=None) -> None:
        self.pm = pm
        self.suite = suite if isinstance(suite, Suite) else load_suite(suite)
        self.runs_dir = Path(runs_dir)
        self.device = device
        self.min_gain = min_gain
        self.rounds = rounds
        self.on_run = on_run  # called after each benchmark run (budget accounting)

    def _suite(self, check_only: bool) -> Suite:
        if not check_only:
            return self.suite
        data = copy.deepcopy(self.suite.data)
        data["timing"] = {**data.get("timing", {}), **CHECK_TIMING}
        for per in (data.get("devices") or {}).values():
            if "timing" in per:
                per["timing"] = {**per["timing"], **CHECK_TIMING}
        return suite_from_data(data, path=self.suite.path)

    def measure(self, kernel: str | Path, *, label: str, keyword: str | None = None,
                check_only: bool = False) -> Measurement:
        from kbench.runner import RunRequest, plan_run, run_suite

        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
        output = self.runs_dir / f"{stamp}-{label}.json"
        # "!*" selects no registered backend: only the kernel file runs
        req = RunRequest(suite=self._suite(check_only), device=self.device, backend_patterns=["!*"],
                         kernel_files=[str(kernel)], keyword=keyword, output=output)
        try:
            planned = plan_run(self.pm, req)
        except Exception as exc:  # noqa: BLE001 - a candidate that does not even load is a failed attempt
            m = Measurement(str(kernel), None)
            m.failures["(load)"] = f"{type(exc).__name__}: {exc}"
            return m
        writer = run_suite(self.pm, planned)
        if self.on_run is not None:
            self.on_run()
        return measurement_from_records(str(kernel), str(output), writer.records)

    def duel(self, champion: str | Path, candidate: str | Path, *, seed: int = 0,
             first: Measurement | None = None) -> Decision:
        """Interleaved re-measurement, then the bootstrap decision.

        With ``first`` (the candidate's screening run, just made) the order is B A, A B, A B, ...:
        balanced against drift, and one run cheaper than A B, A B, ...
        """
        from scipy import stats

        champ_m: Measurement | None = None
        cand_m: Measurement | None = first
        for r in range(self.rounds):
            a = self.measure(champion, label=f"champion-r{r}")
            champ_m = a if champ_m is None else champ_m.merge(a)
            if r > 0 or first is None:
                b = self.measure(candidate, label=f"candidate-r{r}")
                cand_m = b if cand_m is None else cand_m.merge(b)
            if not cand_m.correct:
                return Decision(False, "incorrect: " + "; ".join(f"{c}: {why}" for c, why in
                                                                 list(cand_m.failures.items())[:3]),
                                champion=champ_m, candidate=cand_m)
        if not champ_m.correct:
            return Decision(False, "the champion itself failed on re-measurement (environment changed?): "
                            + "; ".join(list(champ_m.failures.values())[:2]), champion=champ_m, candidate=cand_m)
        point, ci = speedup_interval(champ_m.samples, cand_m.samples, seed=seed)
        p_values = {}
        for case in sorted(cand_m.samples):
            a, b = champ_m.samples.get(case, []), cand_m.samples[case]
            if len(a) >= 2 and len(b) >= 2:
                p_values[case] = float(stats.mannwhitneyu(b, a, alternative="less").pvalue)
        beats = ci[0] > 1.0 + self.min_gain
        if beats:
            verdict = " beats the champion beyond noise"
        elif ci[1] < 1.0:
            verdict = " slower than the champion"
        else:
            verdict = f" does not exclude {1 + self.min_gain:.3f}x (not better beyond noise)"
        reason = f"speedup {point:.3f}x, 95% CI [{ci[0]:.3f}, {ci[1]:.3f}]" + verdict
        return Decision(beats, reason, point, ci, p_values, champ_m, cand_m)
