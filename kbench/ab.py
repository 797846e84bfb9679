"""A/B in one run: old and new code timed side by side, round after round, and judged as pairs.

Two runs made at different moments compare two moments of the machine as much as two versions of the code: on
a shared machine a slow minute moves every record of a run, and no rule applied afterwards can tell that
from a change of the code with certainty. ``kbench ab SUITE OLD NEW`` never compares two moments. OLD and NEW
(:func:`resolve_side`: backends, backend settings, kernel files, or a kernel file at a git revision checked out
into a scratch ``git worktree``) are measured in one run of the ordinary runner (:func:`kbench.run.runner.
run_suite`, same judge, same sandbox, same inputs for both: one run draws one set) in ``rounds`` rounds
(:mod:`kbench.run.rounds`). :class:`PairedOrder` hands the runner's jobs to its executor so that OLD's and
NEW's round k of a case run back to back, in a random order, and the (case, round)s themselves in a random
order; so a slow moment falls on both sides of a pair, or on one side of one pair at random.

The verdict (:func:`judge`) is paired: per case and round, the ratio of NEW's fastest sample to OLD's in that
round (:func:`paired_logs`); per case, the median over the rounds with a sign-test interval (:func:`order_interval`:
the rounds are the independent replicates, a round being a fresh job whose samples share one moment; the
interval assumes nothing of how they scatter, so a round that met a slow moment moves it one place, not by its
size); per group (head_dim x causal x heads x dtype for attention) and over all cases, per round the geometric
mean over the cases, then the same median and interval over the rounds. A line is ``slower`` when its whole
interval lies above ``threshold``, ``faster`` below 1/threshold, ``same`` inside [1/threshold, threshold], and
``undecided`` otherwise (more rounds narrow the interval). Same code is flagged only when an interval misses
the true ratio 1 by more than the threshold: benchmarks/ab_gate.py measures how often (docs/compare.md).
"""
from __future__ import annotations

import contextlib
import copy
import math
import random
import secrets
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from kbench.enums import Status
from kbench.errors import BadInput
from kbench.run.interface import Executor, Job

#: rounds of an A/B run unless told otherwise: ten paired ratios per case, so that the 95% interval (the 2nd to
#: the 9th of them, :func:`order_interval`) leaves out one round on either side that met a slow moment
DEFAULT_ROUNDS = 10
#: what counts as slower: NEW beyond this many times OLD's time, with confidence
DEFAULT_THRESHOLD = 1.05
DEFAULT_CONFIDENCE = 0.95

SLOWER, FASTER, SAME, UNDECIDED, FAILING, FIXED, INCOMPARABLE = (
    "slower", "faster", "same", "undecided", "failing", "fixed", "incomparable")
MARKS = {SLOWER: "+", FASTER: "-", SAME: " ", UNDECIDED: "?", FAILING: "!", FIXED: "*", INCOMPARABLE: "x"}


# -- the two sides ------------------------------------------------------------------------------

@dataclass
class Side:
    """One side of an A/B run: what the user named (``spec``), the backend measured, and where it came from."""

    label: str          # "old" or "new"
    spec: str
    backend: Any
    origin: str         # "backend numpy-flash", "kernel file k.py", "kernel file k.py at HEAD~1 (3f2a...)"

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "spec": self.spec, "backend": self.backend.name, "origin": self.origin}


def _git(args: Sequence[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def split_revision(spec: str) -> tuple[str, str] | None:
    """``REV:PATH`` (a kernel file at a git revision: ``HEAD~1:kernels/k.py``, ``main:k.py``) as (REV, PATH);
    None when ``spec`` is a file here or has no ``REV:`` part ending in a ``.py`` path."""
    if Path(spec).is_file() or ":" not in spec:
        return None
    rev, _, path = spec.partition(":")
    if not rev or not path.endswith(".py"):
        return None
    return rev, path


@contextlib.contextmanager
def revision_checkout(rev: str, *, cwd: Path | None = None) -> Iterator[tuple[Path, str, str]]:
    """The repository holding ``cwd`` at ``rev``, checked out into a scratch ``git worktree`` (detached): yields
    (the worktree's counterpart of ``cwd``, the commit, the repository root); removed afterwards."""
    cwd = Path.cwd() if cwd is None else Path(cwd)
    top = _git(["rev-parse", "--show-toplevel"], cwd)
    if top.returncode != 0:
        raise BadInput(f"{cwd} is not inside a git repository, so a revision cannot be checked out",
                       where=f"{rev}:...", fix="run kbench ab inside the repository, or give the kernel file's path")
    root = Path(top.stdout.strip())
    prefix = _git(["rev-parse", "--show-prefix"], cwd).stdout.strip()
    sha = _git(["rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], root)
    if sha.returncode != 0 or not sha.stdout.strip():
        raise BadInput(f"{rev!r} is not a commit of the repository at {root}", where=f"{rev}:...",
                       fix="give a commit, branch or tag: HEAD~1:kernel.py, main:kernels/k.py")
    commit = sha.stdout.strip()
    scratch = Path(tempfile.mkdtemp(prefix="kbench-ab-"))
    tree = scratch / "tree"
    added = _git(["worktree", "add", "--detach", "--quiet", str(tree), commit], root)
    if added.returncode != 0:
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)
        raise BadInput(f"git worktree add failed: {added.stderr.strip()[:400]}", where=f"{rev}:...",
                       fix="check that git can add a worktree here (git worktree prune clears stale ones)")
    try:
        yield tree / prefix, commit, root
    finally:
        _git(["worktree", "remove", "--force", str(tree)], root)
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)
        _git(["worktree", "prune"], root)


def resolve_side(pm, op_name: str, spec: str, label: str, stack: contextlib.ExitStack) -> Side:
    """OLD or NEW as a backend: ``REV:PATH`` (a kernel file at a git revision), a kernel file path, or a
    registered backend name with optional settings (``numpy-flash[block_q=64]``)."""
    from kbench.kernelfile import KernelFileRef

    reg = pm.registry
    where = label.upper()
    at_rev = split_revision(spec)
    if at_rev is not None:
        rev, rel = at_rev
        here, commit, _ = stack.enter_context(revision_checkout(rev))
        path = here / rel
        if not path.is_file():
            raise BadInput(f"{rel} does not exist at {rev} ({commit[:10]})", where=where,
                           fix="give the kernel file's path relative to this directory, as it was at that revision")
        ref = KernelFileRef(path, reg)
        ref.name = f"{label}:{ref.name}"
        return Side(label, spec, ref, f"kernel file {rel} at {rev} ({commit[:10]})")
    if spec.endswith(".py") or Path(spec).is_file():
        ref = KernelFileRef(spec, reg)
        ref.name = f"{label}:{ref.name}"
        return Side(label, spec, ref, f"kernel file {spec}")
    matched = reg.select_backends(op_name, [spec])
    if len(matched) != 1:
        known = sorted(b.name for b in reg.backends.values() if b.op == op_name)
        raise BadInput(f"{spec!r} names {len(matched)} backends of op {op_name!r}" +
                       (f" ({', '.join(b.name for b in matched[:6])})" if matched else ""), where=where,
                       fix="name exactly one backend (settings allowed: numpy-flash[block_q=64]), a kernel file, "
                           f"or REV:kernel.py; known backends: {', '.join(known)}")
    return Side(label, spec, matched[0], f"backend {matched[0].name}")


def distinct(sides: Sequence[Side]) -> None:
    """The sides must be measured under different names: the same registered backend on two sides (an A/A
    check of the gate) is measured as copies named ``LABEL:NAME``."""
    names = [s.backend.name for s in sides]
    for side in sides:
        if names.count(side.backend.name) > 1:
            twin = copy.copy(side.backend)
            twin.name = f"{side.label}:{side.backend.name}"
            side.backend = twin


# -- the order of the jobs ------------------------------------------------------------------------

class PairedOrder(Executor):
    """Another executor's jobs, handed to it so that the sides of one (case, round) run back to back in a
    random order, and the (case, round)s that are ready in a random order too. The runner gives round k of a
    record once its round k-1 is back (kbench.run.rounds); this wrapper only chooses, among the jobs it holds,
    which goes next, keeping ``inner``'s slots busy. Jobs are handed on when the runner waits for one
    (:meth:`next_done`), never as they are submitted: the runner submits what is ready in a batch, and the
    choice is among all of it (handed on at once, OLD, submitted first, would always run first)."""

    def __init__(self, inner: Executor, *, seed: int) -> None:
        self.inner = inner
        self.name, self.slots = inner.name, inner.slots
        self.rng = random.Random(seed)
        self.pending: list[tuple[tuple[str, int], Job]] = []
        self.rounds_seen: dict[tuple[str, str], int] = {}
        self.current: tuple[str, int] | None = None
        self.in_flight = 0
        #: (case id, round, backend) in the order handed on: what the tests and the result's ``ab.order`` show
        self.started: list[tuple[str, int, str]] = []

    def order(self, todo: list) -> list:
        return self.inner.order(todo)

    def submit(self, job: Job) -> None:
        key = (job.case.id, job.backend.name)
        k = self.rounds_seen[key] = self.rounds_seen.get(key, 0) + 1  # a record's jobs come in round order
        self.pending.append(((job.case.id, k), job))  # handed on at next_done: the runner submits a batch first

    def _pick(self) -> tuple[tuple[str, int], Job]:
        mates = [i for i, (g, _) in enumerate(self.pending) if g == self.current]
        i = mates[0] if mates else self.rng.randrange(len(self.pending))
        return self.pending.pop(i)

    def _feed(self) -> None:
        while self.pending and self.in_flight < self.inner.slots:
            group, job = self._pick()
            self.current = group
            self.started.append((group[0], group[1], job.backend.name))
            self.inner.submit(job)
            self.in_flight += 1

    def next_done(self, timeout: float):
        self._feed()
        got = self.inner.next_done(timeout)
        if got is not None:
            self.in_flight -= 1
            self._feed()
        return got

    def cancel(self) -> None:
        self.pending.clear()
        self.inner.cancel()

    def close(self) -> None:
        self.inner.close()

    def describe(self) -> dict[str, Any]:
        return {**self.inner.describe(), "order": "A/B pairs back to back, random order"}


# -- the verdict ------------------------------------------------------------------------------------

def round_samples(rec) -> list[list[float]]:
    """A passed record's samples split back into its rounds (``timing.rounds[i].pooled`` of them each, in
    round order: kbench.run.rounds pools equal shares); one list when it was measured in one round."""
    samples = list(rec.samples)
    rounds = (rec.timing or {}).get("rounds")
    if not isinstance(rounds, list) or not rounds:
        return [samples] if samples else []
    out, start = [], 0
    for r in rounds:
        n = int((r or {}).get("pooled") or 0)
        if n:
            out.append(samples[start:start + n])
        start += n
    return out


def paired_logs(old_rec, new_rec) -> list[float]:
    """Per round both sides have: log(NEW's fastest sample / OLD's fastest sample) in that round. The fastest
    samples, because interference from other work only ever adds time: a slow moment lifts a round's median
    and spread, rarely its minimum, while a change of the code moves every sample, the fastest too (Chen and
    Revels, "Robust benchmarking in noisy environments", 2016)."""
    a, b = round_samples(old_rec), round_samples(new_rec)
    return [math.log(min(y) / min(x)) for x, y in zip(a, b) if len(x) and len(y) and min(x) > 0 and min(y) > 0]


@dataclass
class Interval:
    """A ratio (NEW / OLD time): the median over ``n`` rounds, and the distribution-free interval between two
    order statistics of the rounds' ratios that covers the median ratio with probability ``coverage``."""

    ratio: float
    low: float
    high: float
    n: int
    coverage: float

    def verdict(self, threshold: float, confidence: float) -> str:
        if self.coverage < confidence:
            return UNDECIDED
        if self.low > threshold:
            return SLOWER
        if self.high < 1 / threshold:
            return FASTER
        if self.low >= 1 / threshold and self.high <= threshold:
            return SAME
        return UNDECIDED


def rounds_needed(confidence: float) -> int:
    """The fewest rounds whose widest order-statistic interval (smallest to largest) reaches ``confidence``."""
    n = 2
    while 1 - 2 * 0.5 ** n < confidence:
        n += 1
    return n


def order_interval(logs: Sequence[float], confidence: float) -> Interval | None:
    """The median of ``exp(logs)`` and the sign-test interval around it: the j-th smallest to the j-th largest
    round, j as large as keeps the coverage ``1 - 2 P(Binomial(n, 1/2) < j)`` at or above ``confidence`` (with
    10 rounds at 95%: the 2nd to the 9th, 97.9%). It assumes nothing of the rounds' distribution, so a round that
    met a slow moment of the machine (on either side: the ratio jumps up or down) moves it by one place, not by
    its size. None under two rounds."""
    from scipy import stats

    x = np.sort(np.asarray(logs, dtype=np.float64))
    n = int(x.size)
    if n < 2:
        return None
    j = 1
    while j < n // 2 and 1 - 2 * float(stats.binom.cdf(j, n, 0.5)) >= confidence:
        j += 1
    coverage = 1 - 2 * float(stats.binom.cdf(j - 1, n, 0.5))
    return Interval(math.exp(float(np.median(x))), math.exp(float(x[j - 1])), math.exp(float(x[n - j])), n,
                    coverage)


@dataclass
class CaseVerdict:
    case_id: str
    group: str
    old: Any
    new: Any
    verdict: str
    interval: Interval | None = None
    logs: list[float] = field(default_factory=list)
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        from kbench.compare import median_of

        iv = self.interval
        return {"case_id": self.case_id, "group": self.group, "verdict": self.verdict,
                "old_median_s": median_of(self.old), "new_median_s": median_of(self.new),
                "ratio": iv and iv.ratio, "ci_low": iv and iv.low, "ci_high": iv and iv.high,
                "rounds": iv and iv.n, "coverage": iv and iv.coverage,
                "round_ratios": [math.exp(v) for v in self.logs], "note": self.note}


@dataclass
class GroupVerdict:
    group: str
    cases: int
    verdict: str
    interval: Interval | None

    def to_json(self) -> dict[str, Any]:
        iv = self.interval
        return {"group": self.group, "cases": self.cases, "verdict": self.verdict, "ratio": iv and iv.ratio,
                "ci_low": iv and iv.low, "ci_high": iv and iv.high, "rounds": iv and iv.n}


@dataclass
class ABVerdict:
    old: str
    new: str
    threshold: float
    confidence: float
    cases: list[CaseVerdict]
    groups: list[GroupVerdict]
    overall: GroupVerdict | None

    @property
    def regressed(self) -> list[str]:
        """What ``--fail-on-regression`` fails on: slower cases and groups, and cases newly failing."""
        bad = [f"{c.case_id} x{c.interval.ratio:.3f}" for c in self.cases if c.verdict == SLOWER]
        bad += [f"{c.case_id} failing" for c in self.cases if c.verdict == FAILING]
        bad += [f"group {g.group} x{g.interval.ratio:.3f}" for g in self.groups if g.verdict == SLOWER]
        if self.overall is not None and self.overall.verdict == SLOWER:
            bad.append(f"all cases x{self.overall.interval.ratio:.3f}")
        return bad

    def to_json(self) -> dict[str, Any]:
        return {"old": self.old, "new": self.new, "threshold": self.threshold, "confidence": self.confidence,
                "cases": [c.to_json() for c in self.cases],
                "groups": [g.to_json() for g in self.groups],
                "overall": self.overall.to_json() if self.overall else None, "regressed": self.regressed}


def _passed(rec) -> bool:
    return rec is not None and rec.passed and len(rec.samples) >= 2


def judge(records: Sequence[Any], old: str, new: str, group_key: Callable[[Any], str], *,
          threshold: float = DEFAULT_THRESHOLD, confidence: float = DEFAULT_CONFIDENCE) -> ABVerdict:
    """The paired verdict of an A/B run's records (kbench.record.Record) of backends ``old`` and ``new``."""
    if not threshold >= 1:
        raise BadInput(f"the threshold must be a time ratio of 1 or more, got {threshold:g}", where="--threshold",
                       fix="e.g. 1.05 (NEW 5% slower) or 5%")
    if not 0 < confidence < 1:
        raise BadInput(f"the confidence must be between 0 and 1, got {confidence:g}", where="--confidence",
                       fix="e.g. 0.95")
    by_key = {(r.case_id, r.backend): r for r in records}
    case_ids = list(dict.fromkeys(r.case_id for r in records if r.backend in (old, new)))
    cases: list[CaseVerdict] = []
    for cid in case_ids:
        a, b = by_key.get((cid, old)), by_key.get((cid, new))
        rec = a or b
        c = CaseVerdict(cid, group_key(rec), a, b, INCOMPARABLE)
        if _passed(a) and _passed(b):
            c.logs = paired_logs(a, b)
            c.verdict = UNDECIDED
            if len(c.logs) < 2:
                c.note = f"fewer than two rounds: no interval (run with --rounds {DEFAULT_ROUNDS})"
        elif _passed(a) and b is not None and b.status is not Status.SKIPPED:
            c.verdict, c.note = FAILING, b.status_text
        elif _passed(b) and a is not None and a.status is not Status.SKIPPED:
            c.verdict, c.note = FIXED, f"was {a.status_text}"
        else:
            c.note = "; ".join(f"{side}: {r.status_text if r is not None else 'missing'}"
                               for side, r in (("old", a), ("new", b)) if not _passed(r))
        cases.append(c)
    timed = [c for c in cases if len(c.logs) >= 2]
    for c in timed:
        c.interval = order_interval(c.logs, confidence)
        c.verdict = c.interval.verdict(threshold, confidence)
        if c.interval.coverage < confidence:
            c.note = (f"{c.interval.n} rounds cannot give a {100 * confidence:g}% interval (at least "
                      f"{rounds_needed(confidence)})")
    by_group: dict[str, list[CaseVerdict]] = {}
    for c in timed:
        by_group.setdefault(c.group, []).append(c)

    def pooled(members: Sequence[CaseVerdict], name: str) -> GroupVerdict:
        # per round, the mean log ratio over the cases (the geometric mean), then the rounds as for one case
        rounds = min(len(c.logs) for c in members)
        per_round = [float(np.mean([c.logs[k] for c in members])) for k in range(rounds)]
        iv = order_interval(per_round, confidence)
        return GroupVerdict(name, len(members), iv.verdict(threshold, confidence) if iv else UNDECIDED, iv)

    groups = [pooled(members, g) for g, members in by_group.items()]
    overall = pooled(timed, "all cases") if len(by_group) > 1 else None
    return ABVerdict(old, new, threshold, confidence, cases, groups, overall)


# -- the run --------------------------------------------------------------------------------------

def default_output(pm, device: str, suite) -> Path:
    """``<results root>/<machine>/<suite>-ab-<time>.json``: beside the machine's runs, named as an A/B run."""
    import datetime as _dt

    from kbench.outputs import unique_result_path
    from kbench.results import results_root

    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f")[:-3]
    return unique_result_path(results_root() / pm.registry.device(device).machine_id(), f"{suite.name}-ab", stamp)


@dataclass
class ABRun:
    """What :func:`run_ab` made: the result file, its records, the sides (OLD first) and the jobs' order."""

    output: Path
    records: list[Any]
    sides: list[Side]
    seed: int
    started: list[tuple[str, int, str]]
    data: dict[str, Any]

    @property
    def old(self) -> Side:
        return self.sides[0]

    @property
    def new(self) -> Side:
        return self.sides[1]


def run_ab(pm, suite, old_spec: str, new_spec: str, **options: Any) -> ABRun:
    """Measure OLD and NEW on ``suite``'s cases in one run (:func:`run_sides`)."""
    return run_sides(pm, suite, [("old", old_spec), ("new", new_spec)], **options)


def run_sides(pm, suite, specs: Sequence[tuple[str, str]], *, rounds: int = DEFAULT_ROUNDS, device: str = "auto",
              keyword: str | None = None, output: Path | None = None, force: bool = False, isolate: bool = True,
              case_timeout: float | None = None, allow_unsandboxed: bool = False, seed: int | None = None,
              on_record: Callable[[dict[str, Any], int, int], None] | None = None) -> ABRun:
    """Measure every side (``(label, spec)``: OLD first, then one or more NEWs) on ``suite``'s cases in one run of
    the ordinary runner, rounds interleaved at random (:class:`PairedOrder`: the sides of a (case, round) back to
    back); the result file is an ordinary result file (``kbench show``, ``compare --baseline`` read it) with an
    ``ab`` entry naming the sides and the seed of the order."""
    from kbench.record import records_of
    from kbench.results import load_result
    from kbench.run.runner import RunRequest, make_executor, pick_device, plan_run, run_suite

    if rounds < 2:
        raise BadInput(f"an A/B run needs at least two rounds, got {rounds}", where="--rounds",
                       fix=f"e.g. --rounds {DEFAULT_ROUNDS}: each round is one paired ratio per case")
    seed = secrets.randbits(32) if seed is None else seed
    device_name = pick_device(pm, device)
    with contextlib.ExitStack() as stack:
        sides = [resolve_side(pm, suite.op, spec, label, stack) for label, spec in specs]
        distinct(sides)
        req = RunRequest(suite=suite, device=device_name, backend_patterns=["!*"],
                         backends=[s.backend for s in sides], keyword=keyword,
                         output=output or default_output(pm, device_name, suite), isolate=isolate,
                         case_timeout=case_timeout, allow_unsandboxed=allow_unsandboxed, force=force, rounds=rounds)
        planned = plan_run(pm, req)
        ex = PairedOrder(make_executor(pm, planned), seed=seed)
        run_suite(pm, planned, executor=ex, on_record=on_record)
    stamp_ab(planned.output, sides, seed, rounds)
    data = load_result(planned.output)
    return ABRun(planned.output, records_of(data), sides, seed, ex.started, data)


def stamp_ab(path: Path, sides: Sequence[Side], seed: int, rounds: int) -> None:
    """Name the sides (and how they were ordered) in the finished result file: ``ab``."""
    import json

    from kbench.results import atomic_write_json

    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    data["ab"] = {"old": sides[0].to_json(), "new": [s.to_json() for s in sides[1:]], "seed": seed,
                  "rounds": rounds,
                  "order": "each (case, round): the sides back to back in a random order; (case, round)s at random"}
    atomic_write_json(Path(path), data)


def ab_command_for(suite_path: str | None, old: str, new: str) -> str:
    """The command line that measures OLD and NEW in one run (what compare suggests when it cannot decide)."""
    import shlex

    return f"kbench ab {shlex.quote(suite_path or 'SUITE.yaml')} {shlex.quote(old)} {shlex.quote(new)} --fail-on-regression"
