"""What the judge judges with: the run's context (op, device, settings, hardware, secret) and a new record."""
from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

from kbench.devices import Device
from kbench.hardware import HardwareProfile
from kbench.judge.policy import IntegritySettings
from kbench.ops import Case, Op
from kbench.results import now_iso
from kbench.suite import CheckSettings
from kbench.timing import TimingSettings


def new_secret() -> bytes:
    """A run's secret: every input content of the run is derived from it (kbench.judge.inputs)."""
    return secrets.token_bytes(32)


@dataclass
class RunContext:
    """One run's measurement context, shared by the runner (which makes it) and the judge (which uses it)."""

    op: Op
    device: Device
    check: CheckSettings
    timing: TimingSettings
    hardware: HardwareProfile | None = None
    integrity: IntegritySettings = field(default_factory=IntegritySettings)
    #: the run's secret: every input is derived from it (drawn per run, recorded only when the run ends)
    secret: bytes = field(default_factory=new_secret, repr=False)
    #: correctness only (``kbench fuzz``, held-out shapes): the judge ends the record after the correctness
    #: trials, with no warm-up, timing or clock accounting (a record then has no ``timing``)
    correctness_only: bool = False


def new_record(backend_name: str, case: Case, device: str) -> dict[str, Any]:
    """The fields every record starts with, whatever becomes of it."""
    return {"backend": backend_name, "op": case.op, "case_id": case.id, "case": case.to_json(), "device": device,
            "status": None, "reason": None, "started": now_iso()}


def skip_reason(ctx: RunContext, backend) -> str | None:
    if backend.device != ctx.device.name:
        return f"runs on device {backend.device!r}; this run uses {ctx.device.name!r}"
    return None
