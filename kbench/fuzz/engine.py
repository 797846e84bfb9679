"""``kbench fuzz``'s search: draw cases of an op's space until one fails or the budget is spent, shrink it.

Hypothesis drives both halves (its ``@given`` engine over :mod:`kbench.fuzz.space`, derandomised by the seed,
no example database): each drawn case is checked through :class:`kbench.fuzz.checker.Checker`; a wrong case
raises, Hypothesis shrinks it to the smallest case that still fails and raises again with that one. The budget
is wall time for the whole of it: when it runs out during the shrink, the smallest failing case seen so far is
the answer (still a real failure, found and checked). The failing case goes into a suite file of its own, so
``kbench run <that suite> -b <backend>`` measures it again.
"""
from __future__ import annotations

import hashlib
import os
import re
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from kbench.backends import Backend
from kbench.errors import KbenchError
from kbench.fuzz.checker import Checker, infrastructure, is_bad
from kbench.fuzz.space import Space, reference_work, size_key
from kbench.ops import CaseError


class OutOfTime(BaseException):
    """The budget is spent: ends Hypothesis's loop at once (a BaseException, so it is not taken for a failure)."""


class HarnessFailed(BaseException):
    """The harness could not check a case (no sandbox, a worker that does not start): the fuzz stops."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class CaseFailed(Exception):
    """A case the kernel gets wrong: what Hypothesis shrinks."""


class FuzzEnvironmentError(KbenchError):
    """The harness, not the kernel, failed: nothing can be said about the kernel (exit 2)."""

    exit_code = 2


@dataclass
class Failure:
    """The smallest failing case found: its parameters and id, the record's status and reason."""

    params: dict[str, Any]
    case_id: str
    status: str
    reason: str
    rel_l2: float | None = None
    bound: float | None = None
    #: the first failing case drawn, before shrinking
    found: dict[str, Any] = field(default_factory=dict)
    found_after: float = 0.0
    #: failing cases checked while shrinking (the first included)
    failing_checks: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"case": self.params, "case_id": self.case_id, "status": self.status, "reason": self.reason,
                "rel_l2": self.rel_l2, "bound": self.bound, "found": self.found,
                "found_after_seconds": round(self.found_after, 3), "failing_checks": self.failing_checks}


@dataclass
class FuzzResult:
    """One backend's fuzz: how many cases were drawn and checked, and the failure (None: none found)."""

    backend: str
    backend_arg: str
    op: str
    device: str
    seed: int
    budget: float
    dtypes: tuple[str, ...]
    #: cases checked through the judge; skipped (the backend does not take them) and passed over (too costly)
    checked: int = 0
    skipped: int = 0
    passed_over: int = 0
    elapsed: float = 0.0
    failure: Failure | None = None
    suite_path: str | None = None
    repro: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"backend": self.backend, "op": self.op, "device": self.device, "seed": self.seed,
                "budget_seconds": self.budget, "dtypes": list(self.dtypes), "checked": self.checked,
                "skipped": self.skipped, "passed_over": self.passed_over, "elapsed_seconds": round(self.elapsed, 3),
                "failure": self.failure.to_json() if self.failure else None, "suite": self.suite_path,
                "repro": self.repro}


def fuzz_secret(seed: int) -> bytes:
    """The input secret of a fuzz run: derived from its seed, so the same seed draws the same cases with the same
    input values (a fuzz finds bugs in honest kernels; the secret of ``kbench run`` stays drawn per run)."""
    return hashlib.sha256(f"kbench fuzz inputs, seed {seed}".encode()).digest()


def fuzz(backend: Backend, checker: Checker, space: Space, *, budget: float, seed: int, backend_arg: str | None = None,
         on_case: Callable[[str, dict[str, Any]], None] | None = None) -> FuzzResult:
    """Search ``space`` for a case ``backend`` gets wrong within ``budget`` seconds; shrink the first one found.

    ``checker`` checks each case (its worker is kept for the whole search); ``on_case(case_id, record)`` is
    called after each check. Raises :class:`FuzzEnvironmentError` when the harness cannot check at all.
    """
    from hypothesis import HealthCheck, Phase, Verbosity, given, settings
    from hypothesis import seed as hseed

    op = checker.op
    result = FuzzResult(backend.name, backend_arg or backend.name, op.name, checker.ctx.device.name, seed, budget,
                        tuple(space.dtypes))
    start = time.monotonic()
    deadline = start + budget
    failing: list[tuple[tuple, dict[str, Any], Any, dict[str, Any]]] = []

    def body(params: dict[str, Any]) -> None:
        if time.monotonic() >= deadline:
            raise OutOfTime()
        if reference_work(op.name, params) > space.max_work:
            result.passed_over += 1
            return
        try:
            case = op.make_case(params)
        except CaseError:  # a combination the op refuses is no case at all, not the kernel's failure
            result.passed_over += 1
            return
        why = _unsupported(backend, case)
        if why:
            result.skipped += 1
            return
        record = checker.check(backend, case)
        result.checked += 1
        if on_case is not None:
            on_case(case.id, record)
        broken = infrastructure(record)
        if broken:
            raise HarnessFailed(broken)
        if record.get("status") == "skipped":
            result.skipped += 1
            return
        if is_bad(record):
            if not failing:
                result.failure = Failure(dict(params), case.id, record["status"], "", found=dict(params),
                                         found_after=time.monotonic() - start)
            failing.append((size_key(params), dict(params), case, record))
            raise CaseFailed(case.id)

    test = given(space.strategy())(body)
    test = settings(database=None, deadline=None, max_examples=10**9, phases=[Phase.generate, Phase.shrink],
                    suppress_health_check=list(HealthCheck), verbosity=Verbosity.quiet, report_multiple_bugs=False,
                    print_blob=False, derandomize=False)(test)
    test = hseed(seed)(test)
    try:
        with _hypothesis_home():
            test()
    except HarnessFailed as exc:
        raise FuzzEnvironmentError(f"the harness could not check {backend.name}: {exc.reason}") from None
    except (OutOfTime, CaseFailed):
        pass
    except Exception as exc:  # noqa: BLE001 - Hypothesis's own verdicts (flaky, ...): the failures seen still stand
        if not failing:
            raise KbenchError(f"the fuzz of {backend.name} stopped: {type(exc).__name__}: {exc}") from exc
    result.elapsed = time.monotonic() - start
    if failing:
        _, params, case, record = min(failing, key=lambda f: f[0])
        correctness = record.get("correctness") or {}
        assert result.failure is not None
        result.failure.params, result.failure.case_id = params, case.id
        result.failure.status, result.failure.reason = record["status"], str(record.get("reason") or "")
        result.failure.rel_l2, result.failure.bound = correctness.get("rel_l2"), correctness.get("bound")
        result.failure.failing_checks = len(failing)
    return result


@contextmanager
def _hypothesis_home() -> Iterator[None]:
    """Hypothesis's own files (its cache of constants; no example database here) under the user's cache
    (``$XDG_CACHE_HOME/kbench/hypothesis``), not in a ``.hypothesis`` directory of wherever ``kbench fuzz`` is
    run; the previous home is put back after (a test session's own Hypothesis keeps its directory)."""
    from hypothesis.configuration import set_hypothesis_home_dir, storage_directory

    before = storage_directory(intent_to_write=False).home_directory
    set_hypothesis_home_dir(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kbench" / "hypothesis")
    try:
        yield
    finally:
        set_hypothesis_home_dir(before)


def _unsupported(backend: Backend, case) -> str | None:
    """Why a trusted backend does not take ``case``, asked here without a worker trip; None for cases it takes
    and for untrusted kernel files (never run in this process: their worker answers with a skipped record)."""
    if not backend.trusted:
        return None
    try:
        return backend.supports(case)
    except Exception:  # noqa: BLE001 - the worker will say it in a record
        return None


# -- the repro ------------------------------------------------------------------------------------------------


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")[:60] or "backend"


def repro_suite(result: FuzzResult, check: dict[str, Any] | None = None) -> dict[str, Any]:
    """A suite holding the minimal failing case alone (its grid entry as drawn), for ``kbench run``."""
    failure = result.failure
    assert failure is not None
    return {"version": 1, "name": f"fuzz-{slug(result.backend)}-seed{result.seed}", "op": result.op,
            "description": (f"kbench fuzz --seed {result.seed}: the smallest case found that {result.backend} gets "
                            f"wrong ({failure.status}: {failure.reason[:300]})"),
            "check": dict(check or {"seeds": 3}),
            "timing": {"warmup_time": 0.0, "min_samples": 2, "min_time": 0.0, "max_time": 0.05},
            "grid": [_grid_entry(failure.params)]}


def _grid_entry(params: dict[str, Any]) -> dict[str, Any]:
    """A grid entry of one case: list values (varlen lengths, a window) wrapped once, since a bare list in a
    grid entry is an axis."""
    return {k: [v] if isinstance(v, list) else v for k, v in params.items()}


def write_repro(result: FuzzResult, directory: Path) -> Path:
    """Write the repro suite of a failing fuzz into ``directory``; set ``result.suite_path`` and ``result.repro``."""
    import shlex

    import yaml

    from kbench.outputs import atomic_write

    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"fuzz-{slug(result.backend)}-seed{result.seed}.yaml"
    text = "# written by kbench fuzz: the smallest failing case it found\n" + yaml.safe_dump(
        repro_suite(result), sort_keys=False, width=120)
    atomic_write(path, lambda fh: fh.write(text))
    result.suite_path = str(path)
    result.repro = f"kbench run {shlex.quote(str(path))} -b {shlex.quote(result.backend_arg)}"
    if result.device != "cpu":
        result.repro += f" --device {result.device}"
    return path
