"""The evolution loop: budgets, the context an operator works in, candidate submission and commit.

``submit`` is the only way into the lineage: syntax check, de-duplication, a screening run of the
whole suite (correctness gate on every case), then interleaved re-measurement against the champion
and a statistical decision (:mod:`kbench_evolve.fitness`). Every outcome goes to the attempts log;
only a win becomes a version. The run's progress (budgets spent, operator state) is saved after
every step, so ``kbench evolve resume`` continues a killed or paused run where it stopped.

With ``parallel`` > 1 (``--parallel N``) a variation runs N workers (threads), each an independent call of
the operator on its own view of the context: their candidates are proposed and screened concurrently, while
the duel against the champion and the commit are serialised (one at a time, on one device). A candidate
another worker is measuring counts as attempted; once a worker commits, the others stop at their next step,
and a candidate screened against a champion that has since been replaced is logged ``superseded`` (tried
again later), never dueled against a champion it was not screened with.
"""
from __future__ import annotations

import copy
import datetime as _dt
import random
import signal
import threading
import time
import uuid
import zlib
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, Iterator

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


class Superseded(Exception):
    """Another worker of a parallel variation committed: this worker's variation is over."""


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


class DeviceGate:
    """The lineage's device among a parallel variation's workers: screenings share it, a duel has it alone
    (it waits for the screenings running to end, and screenings wait while a duel waits or runs)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._screens = 0
        self._duels_waiting = 0
        self._dueling = False

    @contextmanager
    def screening(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._dueling and not self._duels_waiting)
            self._screens += 1
        try:
            yield
        finally:
            with self._cond:
                self._screens -= 1
                self._cond.notify_all()

    @contextmanager
    def duel(self) -> Iterator[None]:
        with self._cond:
            self._duels_waiting += 1
            self._cond.wait_for(lambda: not self._dueling and not self._screens)
            self._duels_waiting -= 1
            self._dueling = True
        try:
            yield
        finally:
            with self._cond:
                self._dueling = False
                self._cond.notify_all()


class _Shared:
    """What the workers of one parallel variation share: locks, the candidates in flight, the stop flag."""

    def __init__(self) -> None:
        self.lock = threading.RLock()          # budgets, the state, the attempts log
        self.device = DeviceGate()             # the duel and the commit: one at a time, alone on the device
        self.in_flight: dict[str, int] = {}    # sha -> worker measuring it
        self.stop = threading.Event()          # a worker committed or failed: the others stop


def clock() -> str:
    """Wall-clock time to the millisecond, for the log of concurrent workers."""
    return _dt.datetime.now().strftime("%H:%M:%S.%f")[:-3]


@dataclass
class VariationContext:
    """What an operator sees and may do. One per variation (one per worker with ``--parallel``: views of
    the same budgets, state and lineage); state survives in ``lineage/state.json``."""

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
    worker: int = 0
    parallel: int = 1
    shared: _Shared = field(default_factory=_Shared)

    def log(self, text: str) -> None:
        """``echo``, stamped with the time and the worker when workers run concurrently."""
        self.echo(f"[{clock()} w{self.worker}] {text.strip()}" if self.parallel > 1 else text)

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
        if self.shared.stop.is_set():
            raise Superseded()
        why = self.exhausted()
        if why:
            raise BudgetExhausted(why)

    def step(self) -> None:
        """Count one step of this variation; raise when the run's budgets are gone."""
        with self.shared.lock:
            self.check_budget()
            self.spent.steps += 1
            self.save()

    def steps_left(self) -> int:
        return self.budget.max_steps - self.spent.steps

    def save(self) -> None:
        with self.shared.lock:
            self.spent.time = self.elapsed()
            self.state["spent"] = asdict(self.spent)
            for _ in range(10):  # another worker's operator may be changing its own op_state right now
                try:
                    snapshot = copy.deepcopy(self.state)
                    break
                except RuntimeError:
                    continue
            self.lineage.save_state(snapshot)

    @property
    def op_state(self) -> dict[str, Any]:
        """Operator-private state of the current variation (persisted with the run; one per worker)."""
        if self.worker == 0:
            return self.state.setdefault("variation", {})
        return self.state.setdefault("variation_workers", {}).setdefault(str(self.worker), {})

    def rng(self) -> random.Random:
        worker = f":w{self.worker}" if self.worker else ""
        return random.Random(zlib.crc32(f"{self.lineage.name}:{len(self.lineage.attempts())}{worker}".encode()))

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
        with self.shared.lock:
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
        return self.evaluator.rounds + (self.evaluator.screen_executor is not None)

    def attempted(self, sha: str) -> dict[str, Any] | None:
        """The logged attempt that settled ``sha`` (rejected or committed), or the one another worker is
        measuring now."""
        with self.shared.lock:
            worker = self.shared.in_flight.get(sha)
        if worker is not None and worker != self.worker:
            return {"sha": sha, "outcome": "in flight", "time": f"now (worker {worker})",
                    "reason": f"being measured by worker {worker}"}
        for a in self.lineage.attempts():
            if a.get("sha") == sha and a.get("outcome") in ("rejected", "committed"):
                return a
        return None

    def submit(self, source: str, *, rationale: str, extra: dict[str, Any] | None = None) -> SubmitResult:
        """Measure a candidate with the harness and commit it if it beats the champion beyond noise."""
        sha = src.sha(source)
        with self.shared.lock:
            if self.shared.stop.is_set():
                raise Superseded()
            other = self.shared.in_flight.get(sha)
            if other is not None:  # the same candidate from two workers: measured once
                return SubmitResult(False, f"being measured by worker {other}")
            self.shared.in_flight[sha] = self.worker
        try:
            return self._submit(source, rationale=rationale, extra=extra)
        finally:
            with self.shared.lock:
                self.shared.in_flight.pop(sha, None)

    def _log(self, entry: dict[str, Any]) -> None:
        """An attempt line; the submit it settles is no longer in flight (both saved before returning)."""
        with self.shared.lock:
            self.lineage.log_attempt(entry)
            if self.state.get("in_flight", {}).pop(entry.get("submit"), None) is not None:
                self.save()

    def _environment_failed(self, base: dict[str, Any], exc: EnvironmentFailure) -> None:
        """The harness could not measure the candidate: logged (never held against it), and the step is given
        back, so the variation tried again after the outage still has it."""
        with self.shared.lock:
            self.spent.steps = max(0, self.spent.steps - 1)
            self._log({**base, "outcome": "environment", "reason": str(exc)[:500]})
            self.save()

    def _in_flight(self, base: dict[str, Any], stage: str, **more: Any) -> None:
        """Note in the saved state that this submit is measuring now (``stage``: screening, duel): if the process
        dies, the next run logs it as ``interrupted`` with the time it had used (:func:`settle_interrupted`)."""
        with self.shared.lock:
            ticket = self.state.setdefault("in_flight", {}).setdefault(base["submit"],
                                                                        {"started": round(time.time(), 3)})
            ticket.update(stage=stage, attempt={**base, **more})
            self.save()

    def _submit(self, source: str, *, rationale: str, extra: dict[str, Any] | None = None) -> SubmitResult:
        champion = self.champion()
        sha = src.sha(source)
        base = {"operator": self.operator, "sha": sha, "parent": champion.label, "rationale": rationale,
                **(extra or {}), "submit": uuid.uuid4().hex[:12]}

        def fail(reason: str, **more) -> SubmitResult:
            self._log({**base, "outcome": "rejected", "reason": reason, **more})
            self.log(f"  x {sha[:8]} {reason}")
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
        if self.parallel > 1:
            base["worker"] = self.worker
            self.log(f"screening {sha[:8]} ({rationale[:80]})")
        self._in_flight(base, "screening")
        # a screening here shares the device with the other workers' screenings, never with a duel
        gate = self.shared.device.screening() if self.evaluator.screen_executor is None else nullcontext()
        try:
            with gate:
                started = time.time()
                champ_screen, screen = self.evaluator.measure_pair(champion.kernel_path, path, label="screen",
                                                                   bracket=True, remote=True)
        except EnvironmentFailure as exc:  # the harness's failure: logged, never held against the candidate
            self._environment_failed(base, exc)
            raise
        base["screened"] = [round(started, 3), round(time.time(), 3)]  # (start, end) in Unix seconds
        if self.parallel > 1:
            self.log(f"screened {sha[:8]} in {base['screened'][1] - base['screened'][0]:.1f} s")
        self.save()
        if not screen.correct:
            reasons = "; ".join(f"{c}: {w}" for c, w in list(screen.failures.items())[:3])
            return fail(f"incorrect: {reasons}", scores=screen.zeroed(), result_file=screen.result_file)
        keep, why = screen_verdict(champ_screen.samples, screen.samples, ratio=self.evaluator.screen_ratio,
                                   seed=zlib.crc32(sha.encode()))
        if not keep:
            return fail(why, scores=screen.zeroed(), result_file=screen.result_file,
                        champion_remeasured=champ_screen.geomean)
        with self.shared.device.duel():  # one duel at a time, alone, against the champion of the moment
            now = self.champion()
            if now.number != champion.number:
                reason = f"superseded: {now.label} was committed while it was screened against {champion.label}"
                self._log({**base, "outcome": "superseded", "reason": reason, "scores": screen.zeroed(),
                           "result_file": screen.result_file})
                self.log(f"  ~ {sha[:8]} {reason}")
                raise Superseded()
            return self._duel(source, sha, base, champion, path, champ_screen, screen, rationale, extra, fail)

    def _duel(self, source, sha, base, champion, path, champ_screen, screen, rationale, extra, fail) -> SubmitResult:
        # a screening that ran elsewhere (--executor) is no round of the duel: the duel is all on this device
        remote = self.evaluator.screen_executor is not None
        extra_runs = self.evaluator.rounds - (0 if remote else 1)
        if extra_runs:
            try:
                for _ in range(extra_runs):
                    self._bench_call()
            except BudgetExhausted as exc:  # measured once, no decision: logged, and tried again on resume
                self._log({**base, "outcome": "abandoned", "reason": f"{exc} before the duel",
                           "scores": screen.zeroed(), "result_file": screen.result_file})
                raise
        self._in_flight(base, "duel", scores=screen.zeroed(), result_file=screen.result_file)
        try:
            decision = self.evaluator.duel(champion.kernel_path, path, seed=zlib.crc32(sha.encode()),
                                           first=None if remote else (champ_screen, screen))
        except EnvironmentFailure as exc:
            self._environment_failed(base, exc)
            raise
        self.save()
        dj = decision.to_json()
        if not decision.commit:
            return fail(decision.reason, decision=dj, scores=decision.candidate.zeroed() if decision.candidate else {})
        try:  # the commit rule's last part: right on shapes held out from the suite too (docs/fuzz.md)
            held = self.evaluator.held_out_check(path)
        except EnvironmentFailure as exc:
            self._environment_failed(base, exc)
            raise
        if held is not None and not held.passed:
            return fail(f"incorrect: {held.reason(self.evaluator.show_held_out)}", decision=dj,
                        held_out=held.to_json(self.evaluator.show_held_out))
        cand = decision.candidate
        meta = {"operator": self.operator, "parent": champion.number, "rationale": rationale, "sha": sha,
                "suite": self.lineage.current_suite_record(),
                "suite_origin": champion.meta.get("suite_origin"), "scores": cand.zeroed(), "geomean": cand.geomean,
                "profile": cand.profile, "champion_remeasured": decision.champion.geomean,
                "decision": dj, "result_files": sorted({m.result_file for m in (screen, cand) if m.result_file}), "created": now_iso(), **(extra or {})}
        if held is not None:
            meta["held_out"] = held.to_json()  # how many held-out shapes it was right on, never which
        with self.shared.lock:
            version = self.lineage.commit(source, meta)
            self.spent.commits += 1
            if self.parallel > 1:
                self.shared.stop.set()  # the other workers' candidates were proposed from the old champion
            self._log({**base, "outcome": "committed", "version": version.label,
                       "reason": decision.reason, "geomean": cand.geomean})
            self.save()
        self.log(f"  + {version.label} geomean {cand.geomean:.4g} TFLOP/s ({decision.reason})")
        return SubmitResult(True, decision.reason, version, cand, dj)


class Terminated(KeyboardInterrupt):
    """SIGTERM during a parallel variation: the run stops as interrupted, like Ctrl-C."""


def _on_sigterm(signum, frame):
    raise Terminated("terminated (SIGTERM)")


def vary(op, ctx: VariationContext, parallel: int) -> str:
    """One variation: ``op.vary(ctx)``, or ``parallel`` independent calls of it on worker views of ``ctx``
    run concurrently (threads: the work is kbench runs in worker processes and model calls). Returns the
    committing worker's summary, else the first worker's; "exhausted" only when every worker found nothing
    left. The first exception of a worker (budget, outage, provider, Ctrl-C...) stops the others and is
    raised once they have stopped."""
    if parallel <= 1:
        return op.vary(ctx)
    shared = _Shared()
    views = [replace(ctx, worker=i, parallel=parallel, shared=shared) for i in range(parallel)]
    ops = [op] + [copy.copy(op) for _ in range(parallel - 1)]
    summaries: list[str | None] = [None] * parallel
    errors: list[BaseException | None] = [None] * parallel

    def work(i: int) -> None:
        try:
            summaries[i] = ops[i].vary(views[i])
        except Superseded:
            summaries[i] = None
        except BaseException as exc:  # handed to the main thread
            errors[i] = exc
            shared.stop.set()

    threads = [threading.Thread(target=work, args=(i,), name=f"evolve-worker-{i}", daemon=True)
               for i in range(parallel)]
    # the runs are in the workers' threads, where the runner cannot turn SIGTERM into an interruption: here
    in_main = threading.current_thread() is threading.main_thread()
    old_term = signal.signal(signal.SIGTERM, _on_sigterm) if in_main else None
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive():
                t.join(0.2)  # in slices, so a Ctrl-C reaches the main thread
    except KeyboardInterrupt:
        shared.stop.set()  # submits in flight are abandoned: logged `interrupted` by the next run, tried again
        raise
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, old_term if old_term is not None else signal.SIG_DFL)
    for i, exc in enumerate(errors):
        if exc is not None:
            raise exc
    done = [s for s in summaries if s is not None]
    committed = [s for s in done if s.startswith("committed")]
    if committed:
        return "; ".join(committed)
    if done and all(s.startswith("exhausted") for s in done):
        return done[0]
    return next((s for s in done if not s.startswith("exhausted")), "no commit (every worker stopped)")


def settle_interrupted(lineage: Lineage, lease, echo: Callable[[str], None] = print) -> dict[str, Any] | None:
    """What the process before left unfinished, settled by the next holder of the lineage before it measures
    anything; returns the saved run state, settled (None when there is none).

    Every submit still in flight in the saved state (the process was killed, or stopped by Ctrl-C, while
    measuring it) gets its attempt line: ``outcome: interrupted``, the stage it was in and ``time_s``, the
    seconds it ran until its process was last alive (the lock's heartbeat). It counts as a step spent, not
    as a candidate tried: it may be proposed again. When that process was killed, the run's spent time
    becomes what it had run until its last heartbeat (the time after its last save would be lost otherwise).
    """
    old = lineage.load_state()
    if not old:
        return None
    session = old.get("session") or {}
    previous = lease.previous
    # the lock's last heartbeat is this run's only if the run was its last holder (not, say, a transfer since)
    last = previous if previous and session.get("lease") and previous.get("token") == session["lease"] else None
    last_alive = last.get("alive") if last else None
    changed = False
    tickets = old.pop("in_flight", None) or {}
    logged = {a.get("submit") for a in lineage.attempts() if a.get("submit")} if tickets else set()
    for submit, ticket in tickets.items():
        changed = True
        if submit in logged:  # its line was written, the process died before saving the state
            continue
        used = round(max(0.0, last_alive - ticket["started"]), 3) if last_alive else None
        lineage.log_attempt({**ticket.get("attempt", {}), "submit": submit, "outcome": "interrupted",
                             "stage": ticket.get("stage"), "started": ticket["started"], "time_s": used,
                             "reason": f"the run stopped during its {ticket.get('stage', 'measurement')} "
                                       "(counted as spent; not settled, it may be proposed again)"})
        echo(f"  ! {str(ticket.get('attempt', {}).get('sha', '?'))[:8]} was interrupted during its "
             f"{ticket.get('stage')}" + (f" after {used:.1f} s" if used is not None else "")
             + ": logged, its time and step counted")
    if last and last_alive and not last.get("ended"):
        ran = round(float(session.get("spent_before") or 0.0) + max(0.0, last_alive - last["started"]), 3)
        spent = old.setdefault("spent", {})
        if ran > float(spent.get("time") or 0.0):
            spent["time"], changed = ran, True
    if changed:
        lineage.save_state(old)
    return old


@contextmanager
def measuring(lineage: Lineage, echo: Callable[[str], None] = print) -> Iterator[tuple[Any, dict[str, Any] | None]]:
    """Hold the lineage (one measuring process at a time; what a killed one left is removed) and settle what
    the run before left in flight: ``(lease, the saved run state, settled)``."""
    with lineage.hold() as lease:
        yield lease, settle_interrupted(lineage, lease, echo)


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
    with measuring(lineage, echo) as (lease, saved):
        state.pop("in_flight", None)  # settled
        if saved and saved.get("started") == state.get("started"):  # this run continued: its time as settled
            spent = state.setdefault("spent", {})
            spent["time"] = max(float(spent.get("time") or 0.0), float((saved.get("spent") or {}).get("time") or 0.0))
        state["session"] = {"lease": lease.token, "started": round(lease.started, 3),
                            "spent_before": float(state.get("spent", {}).get("time") or 0.0)}
        return _run_held(pm, lineage, state, device=device, knowledge=knowledge, echo=echo,
                         operator_obj=operator_obj, sleep=sleep)


def _run_held(pm, lineage: Lineage, state: dict[str, Any], *, device: str, knowledge, echo: Callable[[str], None],
              operator_obj, sleep: Callable[[float], None]) -> str:
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
                          infra_backoff=float(opts.get("infra_backoff", 5.0)), sleep=sleep,
                          screen_executor=opts.get("executor"), profile=opts.get("profile"))
    ctx = VariationContext(pm, lineage, evaluator, budget, spent, state, name, knowledge=knowledge, echo=echo,
                           spent_time_before=spent.time)
    state["status"] = "running"
    ctx.save()
    status = "finished"
    unattended = bool(opts.get("unattended"))
    parallel = max(1, int(opts.get("parallel", 1)))
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
             f"(champion {lineage.champion().label}, {lineage.champion().geomean:.4g} TFLOP/s"
             + (f"; {parallel} workers screening concurrently)" if parallel > 1 else ")"))
        try:
            summary = vary(op, ctx, parallel)
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
        state.pop("variation_workers", None)
        ctx.save()
        if summary.startswith("exhausted"):
            status = "stalled"
            break
    state["status"] = status
    state["ended"] = now_iso()
    ctx.save()
    return status
