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
import hashlib
import hmac
import os
import secrets
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kbench.api import Status, Suite, load_suite, suite_from_data
from kbench.api import geomean as core_geomean

from kbench_evolve.store import IN_FLIGHT

#: timing for a correctness-only run: every case is still executed and checked, barely timed
CHECK_TIMING = {"warmup_calls": 1, "warmup_time": 0.0, "min_samples": 2, "min_time": 0.0, "max_time": 0.001,
                "target_rel_se": 1.0, "rotate": 1}


#: a candidate is dropped at screening only when even the top of its speedup's 95% interval against the
#: champion, measured in the same run, is below this (clearly slower, not merely noisy)
SCREEN_RATIO = 0.9
#: the runs profiled with ``--profile``: a candidate's screening (beside the champion) and a version's benchmark
PROFILED_RUNS = ("screen", "bench")


class EnvironmentFailure(Exception):
    """The harness could not measure (a worker that did not start, no sandbox, a broken channel, the
    champion itself failing): nobody's kernel is to blame, so no candidate is marked or blacklisted."""


def infrastructure_reason(record: dict[str, Any]) -> str | None:
    """Why a record failed for reasons of the environment, not the kernel; None when the kernel is to blame.

    The core marks such records ``cause: infrastructure``; a worker that failed to start is one too
    (its setup is the same for every kernel: no candidate code has run yet).
    """
    reason = str(record.get("reason") or "")
    if record.get("cause") == "infrastructure":
        return reason or "infrastructure"
    if record.get("status") == Status.ERROR.value and reason.startswith("worker failed to start"):
        return reason
    return None


def geomean(values: list[float]) -> float:
    """The core's geometric mean, except that one missing or non-positive value makes the fitness 0 (a
    candidate that fails a case is worth nothing; the core's geomean would leave the case out)."""
    vals = list(values)
    if not vals or any(not v or v <= 0 for v in vals):
        return 0.0
    return float(core_geomean(vals))


@dataclass
class Measurement:
    """One kbench run of one kernel file over (a subset of) a suite."""

    kernel: str
    result_file: str | None
    scores: dict[str, float] = field(default_factory=dict)          # case id -> TFLOP/s (0 when wrong)
    samples: dict[str, list[float]] = field(default_factory=dict)   # case id -> seconds
    flops: dict[str, float] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)          # case id -> "status: reason"
    infrastructure: dict[str, str] = field(default_factory=dict)    # case id -> why the harness could not measure
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
                          failures={**self.failures, **other.failures},
                          infrastructure={**self.infrastructure, **other.infrastructure}, profile={**self.profile, **other.profile})
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
        infra = infrastructure_reason(rec)
        if infra:
            m.infrastructure[case] = infra
            continue
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
        ncu = rec.get("profile")
        if isinstance(ncu, dict) and ncu.get("status") == "ok":  # Nsight Compute's figures, for the brief
            m.profile[case]["ncu"] = ncu
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


def screen_verdict(champ: dict[str, list[float]], cand: dict[str, list[float]], *, ratio: float = SCREEN_RATIO,
                   seed: int = 0) -> tuple[bool, str]:
    """Screening: keep the candidate unless it is clearly slower than the champion measured alongside.

    Dropped only when the upper end of the bootstrap 95% interval of the speedup is below ``ratio``: a
    copy of the champion measures at 1x give or take the noise of one run, so it goes on to the duel.
    """
    point, ci = speedup_interval(champ, cand, seed=seed, n_resamples=1000)
    text = f"speedup {point:.3f}x, 95% CI [{ci[0]:.3f}, {ci[1]:.3f}] against the champion measured alongside"
    if ci[1] < ratio:
        return False, f"clearly slower at screening: {text} (below {ratio:g}x)"
    return True, text


class Evaluator:
    """Runs kernel files over the lineage's suite with the core runner and turns records into fitness.

    Champion and candidate are measured in the same kbench run whenever they are compared (the
    runner goes case by case, so each case of one is timed right beside the same case of the other),
    never against a score stored under other conditions. A run the environment spoiled (records of
    ``cause: infrastructure``) is retried ``infra_retries`` times with capped backoff, then raises
    :class:`EnvironmentFailure`.
    """

    def __init__(self, pm, suite: str | Path | Suite, runs_dir: Path, *, device: str = "auto",
                 min_gain: float = 0.0, rounds: int = 2, on_run=None, infra_retries: int = 2,
                 infra_backoff: float = 5.0, infra_backoff_cap: float = 120.0, screen_ratio: float = SCREEN_RATIO,
                 sleep=time.sleep, screen_executor: dict[str, Any] | None = None, profile: str | None = None,
                 held_out: int | None = None, show_held_out: bool = False) -> None:
        self.pm = pm
        self.suite = suite if isinstance(suite, Suite) else load_suite(suite)
        self.runs_dir = Path(runs_dir)
        self.device = device
        self.min_gain = min_gain
        self.rounds = max(1, rounds)
        self.on_run = on_run  # called after each benchmark run (budget accounting)
        self.infra_retries = infra_retries
        self.infra_backoff = infra_backoff
        self.infra_backoff_cap = infra_backoff_cap
        self.screen_ratio = screen_ratio
        self.sleep = sleep
        #: where screening runs go (``{"name": "ray", "address": ..., "settings": {...}}``); None: here. Duels,
        #: checks and benchmarks always run here, on the lineage's device
        self.screen_executor = screen_executor
        #: a profiler (``"ncu"``) for the screening and benchmark runs, whose figures reach the operators' brief;
        #: never for checks and duels (a profile is a run of its own per record, and duels only decide)
        self.profile = profile
        #: held-out shapes a candidate must also be right on before it is committed (docs/fuzz.md; None: the
        #: core's default, 0: none): drawn for each candidate from this run's secret (never written: not in the
        #: lineage, not in a result file)
        self.held_out = held_out
        self.show_held_out = show_held_out
        self._held_out_secret = secrets.token_bytes(32)

    def _suite(self, check_only: bool) -> Suite:
        if not check_only:
            return self.suite
        data = copy.deepcopy(self.suite.data)
        data["timing"] = {**data.get("timing", {}), **CHECK_TIMING}
        for per in (data.get("devices") or {}).values():
            if "timing" in per:
                per["timing"] = {**per["timing"], **CHECK_TIMING}
        return suite_from_data(data, path=self.suite.path)

    def _run_once(self, kernels: list[str], *, label: str, keyword: str | None,
                  check_only: bool, remote: bool = False) -> list[Measurement]:
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
        # concurrent workers (--parallel) may start runs in the same microsecond: their thread tells them apart
        worker = "" if threading.current_thread() is threading.main_thread() else f"-{threading.get_ident():x}"
        name = f"{stamp}-{label}{worker}"
        # the run writes in a directory of its own (with its journal and lock) and its file joins runs/ only
        # complete: what a killed run leaves is all under runs/.in-flight, which the next holder removes
        staging = self.runs_dir / IN_FLIGHT / name
        try:
            staging.mkdir(parents=True)
        except OSError as exc:
            raise EnvironmentFailure(f"cannot make the run's directory {staging}: {exc}") from exc
        try:
            return self._run_in(staging / f"{name}.json", self.runs_dir / f"{name}.json", kernels, label=label,
                                keyword=keyword, check_only=check_only, remote=remote)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
            try:
                staging.parent.rmdir()  # the last run in flight: runs/ holds result files only
            except OSError:
                pass

    def _run_in(self, output: Path, final: Path, kernels: list[str], *, label: str, keyword: str | None,
                check_only: bool, remote: bool) -> list[Measurement]:
        from kbench.api import KbenchError, RunRequest, plan_run, run_suite

        # "!*" selects no registered backend: only the kernel files run
        req = RunRequest(suite=self._suite(check_only), device=self.device, backend_patterns=["!*"],
                         kernel_files=kernels, keyword=keyword, output=output)
        if self.profile and not check_only and label.split("-")[0] in PROFILED_RUNS:
            req.profile = self.profile
        if remote and self.screen_executor:
            req.executor = self.screen_executor["name"]
            req.executor_address = self.screen_executor.get("address")
            req.executor_settings = dict(self.screen_executor.get("settings") or {})
        try:
            planned = plan_run(self.pm, req)
        except KbenchError as exc:  # a candidate that does not even load is a failed attempt
            if len(kernels) > 1:  # which one? each alone: the one that does not load gets its failure
                return [self._run_once([k], label=f"{label}-{i}", keyword=keyword, check_only=check_only,
                                       remote=remote)[0] for i, k in enumerate(kernels)]
            m = Measurement(kernels[0], None)
            m.failures["(load)"] = f"{type(exc).__name__}: {exc}"
            return [m]
        except OSError as exc:  # the disk, a lock, a directory: the environment's
            raise EnvironmentFailure(f"the run could not be planned: {type(exc).__name__}: {exc}") from exc
        names = [b.name for b in planned.backends]
        if len(set(names)) != len(names):  # two files declaring the same NAME: measure them one by one
            return [self._run_once([k], label=f"{label}-{i}", keyword=keyword, check_only=check_only,
                                   remote=remote)[0] for i, k in enumerate(kernels)]
        writer = run_suite(self.pm, planned)
        try:
            os.replace(output, final)
        except OSError as exc:
            raise EnvironmentFailure(f"cannot keep the run's result file in {final.parent}: {exc}") from exc
        if self.on_run is not None:
            self.on_run()
        return [measurement_from_records(k, str(final), [r for r in writer.records if r["backend"] == name])
                for k, name in zip(kernels, names)]

    def run(self, kernels: list[str | Path], *, label: str, keyword: str | None = None,
            check_only: bool = False, remote: bool = False) -> list[Measurement]:
        """One kbench run of ``kernels`` together, retried while the environment spoils it (``remote``: on
        the screening executor, when there is one)."""
        wait = self.infra_backoff
        for attempt in range(self.infra_retries + 1):
            ms = self._run_once([str(k) for k in kernels], label=label, keyword=keyword, check_only=check_only,
                                remote=remote)
            broken = {c: why for m in ms for c, why in m.infrastructure.items()}
            if not broken:
                return ms
            if attempt < self.infra_retries:
                self.sleep(wait)
                wait = min(wait * 2, self.infra_backoff_cap)
        case, why = next(iter(broken.items()))
        raise EnvironmentFailure(f"the harness could not measure ({len(broken)} cases, {self.infra_retries + 1} "
                                 f"tries): {case}: {why[:300]}")

    def held_out_check(self, kernel: str | Path):
        """The candidate ``kernel`` on :attr:`held_out` shapes near the suite's cases, for correctness only
        (kbench.fuzz.heldout): a :class:`~kbench.fuzz.heldout.HeldOut`, or None when the setting is 0. The shapes
        are drawn for this candidate (its source) from the run's secret. Raises :class:`EnvironmentFailure` when
        the harness could not check."""
        if self.held_out is not None and self.held_out <= 0:
            return None
        from kbench.api import KernelFileRef, check_held_out, pick_device

        ref = KernelFileRef(kernel, self.pm.registry)
        secret = hmac.new(self._held_out_secret, ref.source_text.encode(), hashlib.sha256).digest()
        verdict = check_held_out(self.pm, [ref], suite=self.suite, device=pick_device(self.pm, self.device),
                                 n=self.held_out, secret=secret)[ref.name]
        if verdict.infrastructure:
            raise EnvironmentFailure(f"the held-out shapes could not be checked: {verdict.infrastructure}")
        return verdict

    def measure(self, kernel: str | Path, *, label: str, keyword: str | None = None,
                check_only: bool = False) -> Measurement:
        return self.run([kernel], label=label, keyword=keyword, check_only=check_only)[0]

    def measure_pair(self, champion: str | Path, candidate: str | Path, *, label: str, keyword: str | None = None,
                     candidate_first: bool = False, bracket: bool = False,
                     remote: bool = False) -> tuple[Measurement, Measurement]:
        """Champion and candidate in one run, case by case: the same conditions for both.

        ``bracket``: the champion runs before *and* after the candidate in each case (A B A, from a
        copy of its file), its samples pooled, so neither position nor drift within the case favours
        either; a screening verdict rests on one run, so it gets this symmetry.
        """
        if bracket:
            again = self._champion_copy(champion)
            a, b, a2 = self.run([champion, candidate, again], label=label, keyword=keyword, remote=remote)
            a = a.merge(a2)
        elif candidate_first:
            b, a = self.run([candidate, champion], label=label, keyword=keyword, remote=remote)
        else:
            a, b = self.run([champion, candidate], label=label, keyword=keyword, remote=remote)
        if not a.correct and a.failures and b.correct:
            # the champion was correct when committed: failing now means the environment changed
            raise EnvironmentFailure("the champion itself failed on re-measurement (environment changed?): "
                                     + "; ".join(list(a.failures.values())[:2]))
        return a, b

    def _champion_copy(self, champion: str | Path) -> Path:
        """The champion's source under another file name (another backend name in the same run)."""
        import hashlib

        text = Path(champion).read_text(encoding="utf-8")
        path = self.runs_dir.parent / "candidates" / f"champion-again-{hashlib.sha256(text.encode()).hexdigest()[:12]}.py"
        if not path.is_file():
            from kbench_evolve.store import atomic_write_text

            atomic_write_text(path, text)
        return path

    def duel(self, champion: str | Path, candidate: str | Path, *, seed: int = 0,
             first: tuple[Measurement, Measurement] | None = None) -> Decision:
        """Interleaved re-measurement, then the bootstrap decision.

        Each round is one run of both kernels, case by case; rounds alternate which goes first,
        against drift. ``first`` is the screening round already made (champion first).
        """
        from scipy import stats

        champ_m, cand_m = first if first is not None else (None, None)
        for r in range(0 if first is None else 1, self.rounds):
            a, b = self.measure_pair(champion, candidate, label=f"duel-r{r}", candidate_first=r % 2 == 1)
            champ_m = a if champ_m is None else champ_m.merge(a)
            cand_m = b if cand_m is None else cand_m.merge(b)
            if not cand_m.correct:
                break
        if not cand_m.correct:
            return Decision(False, "incorrect: " + "; ".join(f"{c}: {why}" for c, why in
                                                             list(cand_m.failures.items())[:3]),
                            champion=champ_m, candidate=cand_m)
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
