"""Execute one (backend, case): the trusted judge and the runner of calls -> one record.

:mod:`kbench.judge` (trusted: inputs from the run's secret, verification, clock, verdict) drives a
:class:`kbench.calls.CallRunner` (runs the candidate's calls, reports raw facts) through a channel:
a worker process's socket (:mod:`kbench.workers`) or, for trusted backends run in this process,
:class:`kbench.calls.LocalChannel`. Both go through :func:`kbench.judge.judge`: one code path.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kbench.backends import Backend
from kbench.devices import Device
from kbench.enums import Status
from kbench.hardware import HardwareProfile
from kbench.integrity import HarnessSnapshot, IntegritySettings, static_failure
from kbench.judge import CheckFailed, new_secret, relative_l2  # noqa: F401 - re-exported for plugins and tests
from kbench.ops import Case, Op
from kbench.results import now_iso
from kbench.suite import CheckSettings
from kbench.timing import TimingSettings


@dataclass
class ExecContext:
    op: Op
    device: Device
    check: CheckSettings
    timing: TimingSettings
    hardware: HardwareProfile | None = None
    integrity: IntegritySettings = field(default_factory=IntegritySettings)
    #: timers and harness functions captured before candidate code loaded (a worker takes it at start)
    harness: HarnessSnapshot | None = None
    #: the run's secret: every input is derived from it (drawn per run, recorded only when the run ends)
    secret: bytes = field(default_factory=new_secret, repr=False)

    def for_worker(self) -> ExecContext:
        """What a worker may know: everything but the secret (it only ever sees input content)."""
        return ExecContext(self.op, self.device, self.check, self.timing, self.hardware, self.integrity,
                           secret=b"")


def base_record(backend_name: str, case: Case, device: str) -> dict[str, Any]:
    return {"backend": backend_name, "op": case.op, "case_id": case.id, "case": case.to_json(), "device": device,
            "status": None, "reason": None, "started": now_iso()}


def skip_reason(ctx: ExecContext, backend: Backend) -> str | None:
    if backend.device != ctx.device.name:
        return f"runs on device {backend.device!r}; this run uses {ctx.device.name!r}"
    return None


def execute(ctx: ExecContext, backend: Backend, case: Case) -> dict[str, Any]:
    """One record for (backend, case), the kernel called in this process (trusted backends only).

    Never raises for a backend's misbehaviour: it is recorded.
    """
    from kbench.calls import CallRunner, LocalChannel
    from kbench.judge import judge

    skip = skip_reason(ctx, backend)
    if skip:
        rec = base_record(backend.name, case, ctx.device.name)
        rec.update(status=Status.SKIPPED.value, reason=skip)
        return rec
    static = static_failure(ctx.integrity, backend)
    if static:
        rec = base_record(backend.name, case, ctx.device.name)
        rec.update(status=Status.FAILED.value, reason=static, integrity={"checks": ["static"]})
        return rec
    snapshot = ctx.harness or (HarnessSnapshot(ctx.device) if ctx.integrity.check_harness else None)
    runner = CallRunner(ctx.device, check_threads=ctx.integrity.check_threads,
                        harness=snapshot if ctx.integrity.check_harness else None)
    rec = judge(ctx, LocalChannel(runner, backend), backend.name, case, trusted=backend.trusted)
    if backend.source_path and ctx.integrity.static_applies(backend.trusted) and isinstance(rec.get("integrity"), dict):
        rec["integrity"]["checks"].insert(0, "static")
    return rec
