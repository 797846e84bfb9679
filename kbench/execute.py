"""Execute one (backend, case): availability, correctness, timing, metrics -> one record.

This is the unit of work. It runs the same in the parent process (``--no-isolate``) and inside a
worker process; it never touches the result file or the screen.
"""
from __future__ import annotations

import time
import traceback
import zlib
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from kbench.backends import Backend
from kbench.devices import Device
from kbench.enums import Status
from kbench.hardware import HardwareProfile, roofline_point
from kbench.ops import Case, Op
from kbench.results import now_iso
from kbench.stats import summarize
from kbench.suite import CheckSettings
from kbench.timing import TimingSettings, measure


class CheckFailed(Exception):
    """A wrong answer or a tripped integrity check: the record's status becomes ``failed``."""


def case_seed(case: Case, index: int) -> int:
    """Reproducible, distinct seeds per case and trial (crc32 of the id: stable across processes)."""
    return (zlib.crc32(case.id.encode()) + 7919 * index) % 2**32


@dataclass
class InputCache:
    """Host inputs and float64 references of the current case, shared by the backends of a case."""

    case_id: str | None = None
    inputs: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)
    references: dict[tuple[int, int | None], tuple[np.ndarray | None, np.ndarray]] = field(default_factory=dict)

    def host_inputs(self, op: Op, case: Case, seed: int) -> dict[str, np.ndarray]:
        if self.case_id != case.id:
            self.case_id, self.inputs, self.references = case.id, {}, {}
        if seed not in self.inputs:
            self.inputs[seed] = op.make_inputs(case, seed)
        return self.inputs[seed]

    def reference(self, op: Op, case: Case, seed: int, max_rows: int) -> tuple[np.ndarray | None, np.ndarray]:
        key = (seed, max_rows)
        if key not in self.references:
            rows = op.sample_rows(case, max_rows, np.random.default_rng(seed))
            self.references[key] = (rows, op.reference(case, self.host_inputs(op, case, seed), rows))
        return self.references[key]


@dataclass
class ExecContext:
    op: Op
    device: Device
    check: CheckSettings
    timing: TimingSettings
    hardware: HardwareProfile | None = None
    cache: InputCache = field(default_factory=InputCache)


def _tolerance(ctx: ExecContext, case: Case) -> float:
    return float(ctx.check.tolerance.get(str(case.dtype), ctx.op.tolerance(case)))


def relative_l2(got: np.ndarray, ref: np.ndarray) -> float:
    """||got - ref|| / ||ref||; for a zero reference the absolute norm of ``got`` (so zeros pass only zeros)."""
    diff = float(np.linalg.norm((got - ref).ravel()))
    norm = float(np.linalg.norm(ref.ravel()))
    return diff / norm if norm > 0 else diff


def check_output(ctx: ExecContext, case: Case, result: Any, out: Any, inputs: Mapping[str, Any]) -> Any:
    """The array that holds the answer; raises CheckFailed for aliasing, shape or dtype problems."""
    output = out if result is None else result
    for name, arr in inputs.items():
        if ctx.device.is_same_memory(output, arr):
            raise CheckFailed(f"output aliases input {name!r}: a kernel must write its own buffer")
    host = ctx.device.to_host(output)
    want_shape = ctx.op.output_shape(case)
    if tuple(host.shape) != tuple(want_shape):
        raise CheckFailed(f"output shape {tuple(host.shape)} differs from expected {tuple(want_shape)}")
    if host.dtype != case.dtype.numpy:
        raise CheckFailed(f"output dtype {host.dtype} differs from the case dtype {case.dtype} "
                          f"({case.dtype.numpy}): precision must not change")
    return host


def check_correctness(ctx: ExecContext, backend: Backend, case: Case, kernel) -> dict[str, Any]:
    """Run the kernel on ``check.seeds`` fresh inputs into poisoned buffers; compare with float64."""
    bound = _tolerance(ctx, case)
    errors: list[float] = []
    rows_checked = None
    for trial in range(ctx.check.seeds):
        seed = case_seed(case, trial)
        host_inputs = ctx.cache.host_inputs(ctx.op, case, seed)
        dev_inputs = {k: ctx.device.from_host(v) for k, v in host_inputs.items()}
        before = {k: ctx.device.fingerprint(v) for k, v in dev_inputs.items()}
        out = ctx.device.poisoned(ctx.op.output_shape(case), case.dtype)
        result = kernel(**dev_inputs, out=out)
        ctx.device.synchronize()
        host_out = check_output(ctx, case, result, out, dev_inputs)
        for name, arr in dev_inputs.items():
            if ctx.device.fingerprint(arr) != before[name]:
                raise CheckFailed(f"input {name!r} was modified by the kernel (inputs must be read-only)")
        rows, ref = ctx.cache.reference(ctx.op, case, seed, ctx.check.max_rows)
        got = ctx.op.select(case, host_out, rows).astype(np.float64)
        bad = int(np.count_nonzero(~np.isfinite(got)))
        if bad:
            raise CheckFailed(f"{bad} of {got.size} checked output elements are NaN/Inf "
                              f"(never written, or overflow) on trial {trial}")
        err = relative_l2(got, ref)
        errors.append(err)
        rows_checked = None if rows is None else int(len(rows))
        if not err <= bound:
            raise CheckFailed(f"relative L2 error {err:.3g} exceeds the {case.dtype} bound {bound:g} on trial {trial}",
                              {"rel_l2": err, "bound": bound, "seeds": trial + 1, "rows_checked": rows_checked,
                               "per_seed": errors})
    return {"rel_l2": max(errors), "bound": bound, "seeds": len(errors), "rows_checked": rows_checked,
            "per_seed": errors}


def time_kernel(ctx: ExecContext, case: Case, kernel):
    """Adaptive timing over ``timing.rotate`` input sets distinct from the correctness inputs."""
    sets = []
    for j in range(ctx.timing.rotate):
        host = ctx.op.make_inputs(case, case_seed(case, 1000 + j))
        dev = {k: ctx.device.from_host(v) for k, v in host.items()}
        out = ctx.device.poisoned(ctx.op.output_shape(case), case.dtype)
        sets.append((dev, out))
    calls = [(lambda d=dev, o=out: kernel(**d, out=o)) for dev, out in sets]
    return measure(ctx.device, calls, ctx.timing)


def base_record(backend_name: str, case: Case, device: str) -> dict[str, Any]:
    return {"backend": backend_name, "op": case.op, "case_id": case.id, "case": case.to_json(), "device": device,
            "status": None, "reason": None, "started": now_iso()}


def execute(ctx: ExecContext, backend: Backend, case: Case) -> dict[str, Any]:
    """One record for (backend, case). Never raises for a backend's misbehaviour: it is recorded."""
    t0 = time.perf_counter()
    rec = base_record(backend.name, case, ctx.device.name)
    try:
        rec.update(_execute(ctx, backend, case, rec))
    except CheckFailed as exc:
        rec["status"], rec["reason"] = Status.FAILED.value, str(exc.args[0])
        if len(exc.args) > 1:
            rec["correctness"] = exc.args[1]
    except MemoryError as exc:
        rec["status"], rec["reason"] = Status.ERROR.value, f"out of memory: {exc}".rstrip(": ")
    except Exception as exc:  # noqa: BLE001 - a failing backend is a record, never the end of a run
        rec["status"] = Status.ERROR.value
        rec["reason"] = f"{type(exc).__name__}: {exc}"
        rec["traceback"] = "".join(traceback.format_exception(exc)[-6:])
    rec["duration"] = time.perf_counter() - t0
    return rec


def _execute(ctx: ExecContext, backend: Backend, case: Case, rec: dict[str, Any]) -> dict[str, Any]:
    if backend.device != ctx.device.name:
        return {"status": Status.SKIPPED.value,
                "reason": f"runs on device {backend.device!r}; this run uses {ctx.device.name!r}"}
    for question in (backend.available, lambda: backend.supports(case)):
        reason = question()
        if reason:
            return {"status": Status.SKIPPED.value, "reason": str(reason)}
    rec["backend_info"] = backend.info()
    kernel = backend.prepare(case)
    rec["correctness"] = check_correctness(ctx, backend, case, kernel)
    timing = time_kernel(ctx, case, kernel)
    rec["timing"] = timing.to_json()
    stats = summarize(timing.samples)
    rec["stats"] = stats
    metrics = roofline_point(ctx.hardware, str(case.dtype), ctx.op.flops(case), ctx.op.min_bytes(case),
                             stats["median"])
    metrics["footprint"] = ctx.op.footprint(case)
    rec["metrics"] = metrics
    rec["telemetry"] = ctx.device.telemetry()
    if metrics.get("impossible"):
        raise CheckFailed(f"impossible rate: {metrics['tflops']:.3g} TFLOP/s is {metrics['roof_fraction']:.2f}x the "
                          f"{metrics['bound']} roof of {ctx.hardware.name} (work skipped, cached or done "
                          f"outside the timed region)")
    return {"status": Status.PASSED.value}
