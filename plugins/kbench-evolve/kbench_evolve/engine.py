"""The evolution loop: budgets, the context an operator works in, candidate submission and commit.

``submit`` is the only way into the lineage: syntax check, de-duplication, a screening run of the
whole suite (correctness gate on every case), then interleaved re-measurement against the champion
and a statistical decision (:mod:`kbench_evolve.fitness`). Every outcome goes to the attempts log;
only a win becomes a version. The run's progress (budgets spent, operator state) is saved after
every step, so ``kbench evolve resume`` continues a killed or paused run where it stopped.
"""
from __future__ import annotations

import random
import time
import zlib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable

from kbench.api import BadInput

from kbench_evolve import source as src
from kbench_evolve.fitness import EnvironmentFailure, Evaluator, Measurement, screen_verdict
from kbench_evolve.store import Lineage, Version, now_iso


def _from_json(cls, data: dict[str, Any]):
    """A dataclass from saved JSON, ignoring keys of other versions of this plugin."""
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


class BudgetExhausted(Exception):
    """A budget ran out: the run stops cleanly (resume with a larger budget to continue)."""


class LLMUnavailable(Exception):
    """The model could not be reached after the retries: the run pauses (or, unattended, waits), the
    lineage is untouched."""


class ProviderRejected(BadInput):
    """The provider refused the request for a reason retrying cannot fix (bad credentials, unknown model,
    bad request): the run stops with exit 2, its state saved as ``provider-error`` and resumable, e.g.
    with another ``--model``."""


#: run states `kbench evolve resume` continues without a larger budget
RESUMABLE = ("running", "paused", "interrupted", "provider-error", "environment")


@dataclass
class Budget:
    iterations: int = 5                 # variations (each ends at a commit or at max_steps)
    max_steps: int = 20                 # steps per variation: model calls, or candidates for `mutate`
    max_tokens: int | None = None       # total LLM tokens of the run
    max_cost: float | None = None       # total LLM cost of the run (USD, litellm's cost tracking)
    max_time: float | None = None       # wall seconds of the run, summed over resumes
    max_bench_calls: int | None = None  # kbench runs (checks, benchmarks, screenings, duels)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Budget:
        return _from_json(cls, data)


@dataclass
class Spent:
    iterations: int = 0
    steps: int = 0                      # in the current variation
    tokens: int = 0
    cost: float = 0.0
    unpriced_calls: int = 0             # model calls whose cost is unknown (never counted as $0)
    time: float = 0.0
    bench_calls: int = 0
    commits: int = 0

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Spent:
        return _from_json(cls, data)


@dataclass
class SubmitResult:
    committed: bool
    reason: str
    version: Version | None = None
    measurement: Measurement | None = None
    decision: dict[str, Any] | None = None

    def text(self) -> str:
        if self.committed:
            return f"COMMITTED as {self.version.label}: {self.reason}"
        return f"not committed: {self.reason}"


@dataclass
class VariationContext:
    """What an operator sees and may do. One per variation; state survives in ``lineage/state.json``."""

    pm: Any
    lineage: Lineage
    evaluator: Evaluator
    budget: Budget
    spent: Spent
    state: dict[str, Any]
    operator: str
    knowledge: Any = None
    echo: Callable[[str], None] = print
    clock_start: float = field(default_factory=time.monotonic)
    spent_time_before: float = 0.0

    # -- budget ----------------------------------------------------------------------------------

    def elapsed(self) -> float:
        return self.spent_time_before + (time.monotonic() - self.clock_start)

    def exhausted(self) -> str | None:
        b, s = self.budget, self.spent
        s.time = self.elapsed()
        if b.max_time is not None and s.time >= b.max_time:
            return f"wall time budget ({b.max_time:g} s) spent"
        if b.max_tokens is not None and s.tokens >= b.max_tokens:
            return f"token budget ({b.max_tokens}) spent"
        if b.max_cost is not None and s.cost >= b.max_cost:
            return f"cost budget (${b.max_cost:g}) spent"
        if b.max_bench_calls is not None and s.bench_calls >= b.max_bench_calls:
            return f"benchmark-call budget ({b.max_bench_calls}) spent"
        return None

    def check_budget(self) -> None:
        why = self.exhausted()
        if why:
            raise BudgetExhausted(why)

    def step(self) -> None:
        """Count one step of this variation; raise when the run's budgets are gone."""
        self.check_budget()
        self.spent.steps += 1
        self.save()

    def steps_left(self) -> int:
        return self.budget.max_steps - self.spent.steps

    def save(self) -> None:
        self.spent.time = self.elapsed()
        self.state["spent"] = asdict(self.spent)
        self.lineage.save_state(self.state)

    @property
    def op_state(self) -> dict[str, Any]:
        """Operator-private state of the current variation (persisted with the run)."""
        return self.state.setdefault("variation", {})

    def rng(self) -> random.Random:
        return random.Random(zlib.crc32(f"{self.lineage.name}:{len(self.lineage.attempts())}".encode()))

    # -- lineage -----------------------------------------------------------------------------

    def champion(self) -> Version:
        return self.lineage.champion()

    def _candidate_file(self, source: str) -> Path:
        path = self.lineage.scratch("candidates") / f"cand-{src.sha(source)}.py"
        if not path.exists():
            from kbench_evolve.store import atomic_write_text

            atomic_write_text(path, source)
        return path

    def _bench_call(self) -> None:
        self.check_budget()
        self.spent.bench_calls += 1

    def check(self, source: str, keyword: str | None = None) -> Measurement:
        """Correctness of a candidate on every case (or those matching ``keyword``), barely timed."""
        self._bench_call()
        m = self.evaluator.measure(self._candidate_file(source), label="check", keyword=keyword, check_only=True)
        self.save()
        return m

    def benchmark(self, source: str, keyword: str | None = None) -> tuple[Measurement, Measurement]:
        """The candidate and the champion measured in the same run (case by case): (champion, candidate)."""
        self._bench_call()
        pair = self.evaluator.measure_pair(self.champion().kernel_path, self._candidate_file(source),
                                           label="bench", keyword=keyword)
        self.save()
        return pair

    def submit_cost(self) -> int:
        """kbench runs one submit takes (each runs the champion and the candidate side by side)."""
        return self.evaluator.rounds

    def attempted(self, sha: str) -> dict[str, Any] | None:
        for a in self.lineage.attempts():
            if a.get("sha") == sha and a.get("outcome") in ("rejected", "committed"):
                return a
        return None

    def submit(self, source: str, *, rationale: str, extra: dict[str, Any] | None = None) -> SubmitResult:
        """Measure a candidate with the harness and commit it if it beats the champion beyond noise."""
        champion = self.champion()
        sha = src.sha(source)
        base = {"operator": self.operator, "sha": sha, "parent": champion.label, "rationale": rationale,
                **(extra or {})}

        def fail(reason: str, **more) -> SubmitResult:
            self.lineage.log_attempt({**base, "outcome": "rejected", "reason": reason, **more})
            self.echo(f"  x {sha[:8]} {reason}")
            return SubmitResult(False, reason, decision=more.get("decision"), measurement=more.get("_m"))

        bad = src.check_syntax(source)
        if bad:
            return fail(bad)
        if sha == src.sha(champion.source):
            return fail(f"identical to the champion {champion.label}")
        seen = self.attempted(sha)
        if seen:
            return fail(f"identical to a candidate tried at {seen.get('time')} ({seen.get('reason', '')[:80]})")
        self._bench_call()
        path = self._candidate_file(source)
        try:
            champ_screen, screen = self.evaluator.measure_pair(champion.kernel_path, path, label="screen",
                                                               bracket=True)
        except EnvironmentFailure as exc:  # the harness's failure: logged, never held against the candidate
            self.lineage.log_attempt({**base, "outcome": "environment", "reason": str(exc)[:500]})
            self.save()
            raise
        self.save()
        if not screen.correct:
            reasons = "; ".join(f"{c}: {w}" for c, w in list(screen.failures.items())[:3])
            return fail(f"incorrect: {reasons}", scores=screen.zeroed(), result_file=screen.result_file)
        keep, why = screen_verdict(champ_screen.samples, screen.samples, ratio=self.evaluator.screen_ratio,
                                   seed=zlib.crc32(sha.encode()))
        if not keep:
            return fail(why, scores=screen.zeroed(), result_file=screen.result_file,
                        champion_remeasured=champ_screen.geomean)
        extra_runs = self.evaluator.rounds - 1
        if extra_runs:
            try:
                for _ in range(extra_runs):
                    self._bench_call()
            except BudgetExhausted as exc:  # measured once, no decision: logged, and tried again on resume
                self.lineage.log_attempt({**base, "outcome": "abandoned", "reason": f"{exc} before the duel",
                                          "scores": screen.zeroed(), "result_file": screen.result_file})
                raise
        try:
            decision = self.evaluator.duel(champion.kernel_path, path, seed=zlib.crc32(sha.encode()),
                                           first=(champ_screen, screen))
        except EnvironmentFailure as exc:
            self.lineage.log_attempt({**base, "outcome": "environment", "reason": str(exc)[:500]})
            self.save()
            raise
        self.save()
        dj = decision.to_json()
        if not decision.commit:
            return fail(decision.reason, decision=dj, scores=decision.candidate.zeroed() if decision.candidate else {})
        cand = decision.candidate
        meta = {"operator": self.operator, "parent": champion.number, "rationale": rationale, "sha": sha,
                "suite": self.lineage.current_suite_record(),
                "suite_origin": champion.meta.get("suite_origin"), "scores": cand.zeroed(), "geomean": cand.geomean,
                "profile": cand.profile, "champion_remeasured": decision.champion.geomean,
                "decision": dj, "result_files": sorted({m.result_file for m in (screen, cand) if m.result_file}), "created": now_iso(), **(extra or {})}
        version = self.lineage.commit(source, meta)
        self.spent.commits += 1
        self.lineage.log_attempt({**base, "outcome": "committed", "version": version.label,
                                  "reason": decision.reason, "geomean": cand.geomean})
        self.save()
        self.echo(f"  + {version.label} geomean {cand.geomean:.4g} TFLOP/s ({decision.reason})")
        return SubmitResult(True, decision.reason, version, cand, dj)


def make_state(operator: str, budget: Budget, options: dict[str, Any]) -> dict[str, Any]:
    return {"operator": operator, "budget": asdict(budget), "options": options, "spent": asdict(Spent()),
            "status": "running", "started": now_iso(), "variation": {}}


#: outage waiting of an --unattended run: first wait, cap of one wait, and the default limit of waiting in a row
OUTAGE_FIRST_WAIT = 30.0
OUTAGE_WAIT_CAP = 1800.0
OUTAGE_LIMIT = 24 * 3600.0


def run_evolution(pm, lineage: Lineage, state: dict[str, Any], *, device: str = "auto", knowledge=None,
                  echo: Callable[[str], None] = print, operator_obj=None, sleep: Callable[[float], None] = time.sleep
                  ) -> str:
    """Run (or continue) the operator run described by ``state``; returns its final status.

    Statuses: ``finished`` (all iterations done), ``budget`` (a budget ran out), ``paused`` (the
    model was unreachable; resume later), ``environment`` (the harness could not measure; resume
    when fixed), ``stalled`` (the operator had nothing left to try); a Ctrl-C or SIGTERM leaves
    ``interrupted`` and re-raises; a provider refusal (credentials, unknown model, bad request)
    leaves ``provider-error`` and raises :class:`ProviderRejected` (exit 2). All can be resumed.

    With ``options["unattended"]`` an outage (model or environment) does not pause the run: it waits
    with capped exponential backoff and tries the variation again, until ``options["max_outage"]``
    seconds of waiting in a row; the waits are recorded in ``state["outages"]``.
    """
    from kbench_evolve.operators import operator_registry

    name = state["operator"]
    opts = state.get("options", {})
    budget = Budget.from_json(state["budget"])
    spent = Spent.from_json(state.get("spent", {}))
    op = operator_obj or operator_registry(pm).get(name)(**opts)
    evaluator = Evaluator(pm, lineage.current_suite(), lineage.scratch("runs"), device=device,
                          rounds=int(opts.get("rounds", 2)), min_gain=float(opts.get("min_gain", 0.0)),
                          screen_ratio=float(opts.get("screen_ratio", 0.9)),
                          infra_retries=int(opts.get("infra_retries", 2)),
                          infra_backoff=float(opts.get("infra_backoff", 5.0)), sleep=sleep)
    ctx = VariationContext(pm, lineage, evaluator, budget, spent, state, name, knowledge=knowledge, echo=echo,
                           spent_time_before=spent.time)
    state["status"] = "running"
    ctx.save()
    status = "finished"
    unattended = bool(opts.get("unattended"))
    max_outage = float(opts.get("max_outage", OUTAGE_LIMIT))
    wait = float(opts.get("outage_first_wait", OUTAGE_FIRST_WAIT))
    waited = 0.0
    while spent.iterations < budget.iterations:
        why = ctx.exhausted()
        if why:
            echo(f"stop: {why}")
            status = "budget"
            break
        echo(f"variation {spent.iterations + 1}/{budget.iterations} with {name} "
             f"(champion {lineage.champion().label}, {lineage.champion().geomean:.4g} TFLOP/s)")
        try:
            summary = op.vary(ctx)
        except BudgetExhausted as exc:
            echo(f"stop: {exc}")
            status = "budget"
            break
        except (LLMUnavailable, EnvironmentFailure) as exc:
            kind = "model" if isinstance(exc, LLMUnavailable) else "environment"
            if unattended and waited + wait <= max_outage:
                echo(f"  ! {kind} outage: {str(exc)[:200]}; unattended: waiting {wait:.0f} s "
                     f"({waited:.0f} s of at most {max_outage:.0f} s waited so far), then trying again")
                state.setdefault("outages", []).append({"time": now_iso(), "kind": kind, "wait_s": wait,
                                                        "error": str(exc)[:300]})
                ctx.save()
                sleep(wait)
                waited += wait
                wait = min(wait * 2, float(opts.get("outage_wait_cap", OUTAGE_WAIT_CAP)))
                continue
            status = "paused" if kind == "model" else "environment"
            echo(f"paused: {exc}; the lineage is intact, continue with `kbench evolve resume {lineage.name}`")
            break
        except ProviderRejected as exc:
            state["status"] = "provider-error"
            state["error"] = {"time": now_iso(), "message": exc.message[:500]}
            state["ended"] = now_iso()
            ctx.save()
            raise
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM turned into RunInterrupted by the runner
            state["status"] = "interrupted"
            ctx.save()
            echo(f"interrupted; continue with `kbench evolve resume {lineage.name}`")
            raise
        waited, wait = 0.0, float(opts.get("outage_first_wait", OUTAGE_FIRST_WAIT))
        echo(f"  = {summary}")
        spent.iterations += 1
        spent.steps = 0
        state["variation"] = {}
        ctx.save()
        if summary.startswith("exhausted"):
            status = "stalled"
            break
    state["status"] = status
    state["ended"] = now_iso()
    ctx.save()
    return status
