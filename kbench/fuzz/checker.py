"""One case checked for correctness, through the judge and sandbox of ``kbench run``, cheaply.

A :class:`Checker` holds one run context (``correctness_only``: the judge's correctness trials, no warm-up,
timing or clock accounting) and one :class:`kbench.run.pool.WorkerPool` for the whole fuzz run: an untrusted
kernel file runs in its sandboxed worker, a registry backend in the shared trusted worker, started once and
kept across cases, including after a wrong answer (``keep_failed``; a crash, a timeout or an error still
ends the worker and the next case starts another). So a check costs the kernel's calls, the input
generation and the float64 reference, not a process start.
"""
from __future__ import annotations

from typing import Any

from kbench.backends import Backend
from kbench.enums import Status
from kbench.ops import Case

#: statuses that mean the kernel is wrong on a case (skipped is not: the backend does not take that case)
BAD = frozenset({Status.FAILED.value, Status.ERROR.value, Status.CRASHED.value, Status.TIMEOUT.value})
#: seconds one correctness check may take before it is a ``timeout`` (a hang is a failure like any other)
CASE_TIMEOUT = 60.0


class Checker:
    """Correctness checks of cases of one op on one device, by one worker pool kept for the whole run."""

    def __init__(self, pm, op: str, device: str = "cpu", *, secret: bytes | None = None, check=None,
                 integrity=None, case_timeout: float = CASE_TIMEOUT, allow_unsandboxed: bool = False,
                 isolate: bool = True) -> None:
        """``check`` and ``integrity``: a suite's settings (default: those of a suite that says nothing)."""
        from kbench.judge.context import RunContext, new_secret
        from kbench.judge.policy import IntegritySettings
        from kbench.run.pool import WorkerPool
        from kbench.suite import CheckSettings
        from kbench.timing import TimingSettings

        reg = pm.registry
        self.pm = pm
        self.ctx = RunContext(op=reg.op(op), device=reg.device(device), check=check or CheckSettings(),
                              timing=TimingSettings(), integrity=integrity or IntegritySettings(),
                              secret=secret if secret is not None else new_secret(), correctness_only=True)
        self.pool = WorkerPool(pm, self.ctx, isolate=isolate, case_timeout=case_timeout,
                               allow_unsandboxed=allow_unsandboxed, keep_failed=True)
        self.checked = 0

    @property
    def op(self):
        return self.ctx.op

    def check(self, backend: Backend, case: Case) -> dict[str, Any]:
        """The record of ``backend`` on ``case``: passed, skipped, or what went wrong (never raises for the kernel)."""
        self.checked += 1
        return self.pool(backend, case)

    def close(self) -> None:
        self.pool.close()

    def __enter__(self) -> Checker:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def is_bad(record: dict[str, Any]) -> bool:
    """Whether a record says the kernel is wrong on its case (the environment's failures are not)."""
    return record.get("status") in BAD and record.get("cause") != "infrastructure"


def infrastructure(record: dict[str, Any]) -> str | None:
    """Why the harness, not the kernel, failed on a record (no sandbox, a worker that would not start)."""
    if record.get("cause") == "infrastructure":
        return str(record.get("reason") or "infrastructure")
    reason = str(record.get("reason") or "")
    if record.get("status") == Status.ERROR.value and reason.startswith("worker failed to start"):
        return reason
    return None
