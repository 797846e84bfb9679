"""Execute one (backend, case): availability, correctness, timing, metrics -> one record.

This is the unit of work. It runs the same in the parent process (``--no-isolate``) and inside a
worker process; it never touches the result file or the screen.
"""
from __future__ import annotations

import time
import traceback
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from kbench.backends import Backend
from kbench.devices import Device
from kbench.enums import Status
from kbench.hardware import HardwareProfile, roofline_point
from kbench.integrity import (HarnessSnapshot, IntegritySettings, SampleGuard, ThreadLeak, ThreadWatch,
                              static_failure, thread_counts)
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
    integrity: IntegritySettings = field(default_factory=IntegritySettings)
    #: timers and harness functions captured before candidate code loaded (a worker takes it at start)
    harness: HarnessSnapshot | None = None


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
    if result is not None and not isinstance(result, type(out)):
        raise CheckFailed(f"the kernel returned a {type(result).__name__}, not a {type(out).__name__} like its output "
                          f"buffer: results must be materialised before return (lazy results are not timed)")
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


def _verify_harness(ctx: ExecContext, snapshot: HarnessSnapshot | None, phase: str) -> None:
    if snapshot is None:
        return
    changed = snapshot.changed()
    if changed:
        shown = ", ".join(changed[:4]) + (f" and {len(changed) - 4} more" if len(changed) > 4 else "")
        raise CheckFailed(f"harness tampering: {shown} replaced {phase} (timer or harness functions must not be "
                          f"patched)")


def _call(ctx: ExecContext, kernel, inputs: Mapping[str, Any], out: Any, watch: ThreadWatch) -> tuple[Any, float]:
    """One untimed-by-the-sampler call: its result and its duration on the device's timer."""
    holder: list[Any] = []
    before = thread_counts()
    seconds = ctx.device.time_call(lambda: holder.append(kernel(**inputs, out=out)))
    try:
        watch.after(before)
    except ThreadLeak as exc:
        raise CheckFailed(str(exc)) from None
    return (holder[0] if holder else None), seconds


def _compare(ctx: ExecContext, case: Case, host_out: np.ndarray, seed: int, what: str) -> tuple[float, int | None]:
    """Relative L2 error of a host output against the float64 reference of ``seed``; raises CheckFailed."""
    bound = _tolerance(ctx, case)
    rows, ref = ctx.cache.reference(ctx.op, case, seed, ctx.check.max_rows)
    got = ctx.op.select(case, host_out, rows).astype(np.float64)
    bad = int(np.count_nonzero(~np.isfinite(got)))
    if bad:
        raise CheckFailed(f"{bad} of {got.size} checked output elements are NaN/Inf "
                          f"(never written, or overflow) on {what}")
    err = relative_l2(got, ref)
    rows_checked = None if rows is None else int(len(rows))
    if not err <= bound:
        raise CheckFailed(f"relative L2 error {err:.3g} exceeds the {case.dtype} bound {bound:g} on {what}",
                          {"rel_l2": err, "bound": bound, "rows_checked": rows_checked})
    # the tolerance rule for degenerate answers: an output that does not vary, or that is no closer to the
    # reference than the reference's own mean, is garbage whatever the bound and the magnitudes
    ref_spread = float(np.ptp(ref)) if ref.size else 0.0
    if ref_spread > 0 and got.size and float(np.ptp(got)) == 0.0:
        raise CheckFailed(f"output is constant ({float(got.ravel()[0]):g} everywhere) while the reference varies, "
                          f"on {what}")
    if ref_spread > 0 and err >= relative_l2(np.full_like(ref, ref.mean()), ref):
        raise CheckFailed(f"output is no closer to the reference than a constant (relative L2 {err:.3g}) on {what}")
    return err, rows_checked


def check_correctness(ctx: ExecContext, backend: Backend, case: Case, kernel,
                      watch: ThreadWatch | None = None) -> dict[str, Any]:
    """Run the kernel on ``check.seeds`` fresh inputs into poisoned buffers; compare with float64.

    The output is copied the moment the call returns and compared with a second copy taken after the
    reference is computed: an output that changes in between was written by work left running.
    """
    watch = watch or ThreadWatch(ctx.integrity.check_threads)
    bound = _tolerance(ctx, case)
    errors: list[float] = []
    durations: list[float] = []
    rows_checked = None
    for trial in range(ctx.check.seeds):
        seed = case_seed(case, trial)
        host_inputs = ctx.cache.host_inputs(ctx.op, case, seed)
        dev_inputs = {k: ctx.device.from_host(v) for k, v in host_inputs.items()}
        before = {k: ctx.device.fingerprint(v) for k, v in dev_inputs.items()}
        out = ctx.device.poisoned(ctx.op.output_shape(case), case.dtype)
        result, seconds = _call(ctx, kernel, dev_inputs, out, watch)
        ctx.device.synchronize()
        durations.append(seconds)
        host_out = np.array(check_output(ctx, case, result, out, dev_inputs), copy=True)
        for name, arr in dev_inputs.items():
            if ctx.device.fingerprint(arr) != before[name]:
                raise CheckFailed(f"input {name!r} was modified by the kernel (inputs must be read-only)")
        ctx.cache.reference(ctx.op, case, seed, ctx.check.max_rows)  # takes a while: late work shows up
        ctx.device.synchronize()
        late = np.asarray(ctx.device.to_host(out if result is None else result))
        if late.tobytes() == host_out.tobytes() and not np.isfinite(host_out.astype(np.float32)).all():
            # unwritten elements: give late work up to a second more, to name the cause rather than the symptom
            for _ in range(50):
                time.sleep(0.02)
                ctx.device.synchronize()
                late = np.asarray(ctx.device.to_host(out if result is None else result))
                if late.tobytes() != host_out.tobytes():
                    break
        if late.tobytes() != host_out.tobytes():
            raise CheckFailed(f"the output changed after the kernel returned on trial {trial}: work was left running "
                              f"(a thread, a stream or lazy evaluation) and would not be timed")
        try:
            err, rows_checked = _compare(ctx, case, host_out, seed, f"trial {trial}")
        except CheckFailed as exc:
            if len(exc.args) > 1:
                exc.args[1].update({"seeds": trial + 1, "per_seed": errors + [exc.args[1]["rel_l2"]]})
            raise
        errors.append(err)
    return {"rel_l2": max(errors), "bound": bound, "seeds": len(errors), "rows_checked": rows_checked,
            "per_seed": errors, "call_seconds": durations}


def time_kernel(ctx: ExecContext, case: Case, kernel, watch: ThreadWatch | None = None):
    """Adaptive timing over ``timing.rotate`` input buffer sets distinct from the correctness inputs.

    Before every sample the set about to be timed gets new input content (written in place, outside the
    timed region) and its output is re-poisoned: no timed call sees input content seen before, so a
    cache keyed by content never hits and one keyed by address answers stale. Afterwards the last
    output of every set is checked against the reference of its last content, and the inputs against
    their fingerprints, so a kernel that is right when checked but lazy, stale or wrong when timed fails.
    """
    watch = watch or ThreadWatch(ctx.integrity.check_threads)
    seeds = [case_seed(case, 1000 + j) for j in range(ctx.timing.rotate)]
    sets = []
    for seed in seeds:
        dev = {k: ctx.device.from_host(v) for k, v in ctx.cache.host_inputs(ctx.op, case, seed).items()}
        sets.append((dev, ctx.device.poisoned(ctx.op.output_shape(case), case.dtype)))
    fingerprints = [{k: ctx.device.fingerprint(v) for k, v in dev.items()} for dev, _ in sets]
    results: list[Any] = [None] * len(sets)

    def make_call(j: int, dev: dict[str, Any], out: Any):
        def call():
            results[j] = kernel(**dev, out=out)
        return call

    def refresh(j: int, sample: int) -> None:
        seeds[j] = case_seed(case, 10_000 + sample)
        dev = sets[j][0]
        for name, value in ctx.op.make_inputs(case, seeds[j]).items():
            dev[name][...] = ctx.device.from_host(value)
        fingerprints[j] = {k: ctx.device.fingerprint(v) for k, v in dev.items()}

    calls = [make_call(j, dev, out) for j, (dev, out) in enumerate(sets)]
    guarded = ctx.integrity.verify_timed_outputs or ctx.integrity.check_threads
    device = SampleGuard(ctx.device, [out for _, out in sets], watch,
                         refresh if ctx.integrity.verify_timed_outputs else None) if guarded else ctx.device
    try:
        timing = measure(device, calls, ctx.timing)
    except ThreadLeak as exc:
        raise CheckFailed(f"{exc} (during timing)") from None
    ctx.device.synchronize()
    for j, ((dev, out), seed) in enumerate(zip(sets, seeds)):
        for name, arr in dev.items():
            if ctx.device.fingerprint(arr) != fingerprints[j][name]:
                raise CheckFailed(f"input {name!r} was modified by the kernel during timing")
        if ctx.integrity.verify_timed_outputs:
            host = check_output(ctx, case, results[j], out, dev)
            try:
                _compare(ctx, case, np.asarray(host), seed, f"the last timed call of input set {j}")
            except CheckFailed as exc:
                raise CheckFailed(f"timed output wrong although the checked calls were right (lazy, stale or "
                                  f"garbage results when timed): {exc.args[0]}") from None
    return timing


#: fresh input sets timed once each right after the sampling loop, in the same warm state
FRESH_PROBES = 3


def fresh_probe(ctx: ExecContext, case: Case, kernel, watch: ThreadWatch) -> list[float]:
    """Durations of single calls on never-seen inputs (each output verified: no stale answers).

    A cache keyed by address or content makes the repeated inputs of the timing loop fast but not these
    calls; comparing the two exposes it (see ``_cache_check``).
    """
    seeds = [case_seed(case, 2000 + j) for j in range(FRESH_PROBES)]
    sets = [({k: ctx.device.from_host(v) for k, v in ctx.cache.host_inputs(ctx.op, case, s).items()},
             ctx.device.poisoned(ctx.op.output_shape(case), case.dtype)) for s in seeds]
    durations = []
    for seed, (dev, out) in zip(seeds, sets):
        ctx.device.before_sample()
        result, seconds = _call(ctx, kernel, dev, out, watch)
        durations.append(seconds)
        host = check_output(ctx, case, result, out, dev)
        try:
            _compare(ctx, case, np.asarray(host), seed, "a call on fresh inputs after timing")
        except CheckFailed as exc:
            raise CheckFailed(f"stale or wrong result on fresh inputs after timing: {exc.args[0]}") from None
    return durations


def _cache_check(ctx: ExecContext, fresh: list[float], median: float) -> dict[str, Any]:
    """Timed calls much faster than calls on fresh inputs: a secondary signal, recorded, never a verdict.

    Speed ratios depend on the machine's load, so they decide nothing: caching is defeated by giving
    every timed call new input content (``time_kernel``) and verifying the answers.
    """
    info: dict[str, Any] = {"fresh_call": min(fresh) if fresh else None, "timed_median": median}
    if not fresh or median <= 0:
        return info
    ratio = min(fresh) / median
    info["fresh_over_timed"] = ratio
    if ctx.integrity.cache_ratio and ratio > ctx.integrity.cache_ratio:
        info["cache_suspect"] = True
    return info


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
    integrity: dict[str, Any] = {"checks": []}
    rec["integrity"] = integrity
    static = static_failure(ctx.integrity, backend)
    if static:
        raise CheckFailed(static)
    if backend.source_path and ctx.integrity.static_applies(backend.trusted):
        integrity["checks"].append("static")
    # in-process (trusted) runs take the snapshot here; a worker took it before any candidate code loaded
    snapshot = ctx.harness or (HarnessSnapshot(ctx.device) if ctx.integrity.check_harness else None)
    if not ctx.integrity.check_harness:
        snapshot = None
    _verify_harness(ctx, snapshot, "when the backend was loaded")
    rec["backend_info"] = backend.info()
    kernel = backend.prepare(case)
    _verify_harness(ctx, snapshot, "while the kernel was prepared")
    watch = ThreadWatch(ctx.integrity.check_threads)
    try:
        rec["correctness"] = check_correctness(ctx, backend, case, kernel, watch)
    except CheckFailed:
        _verify_harness(ctx, snapshot, "during the correctness check")  # tampering is the cause, not the symptom
        raise
    _verify_harness(ctx, snapshot, "during the correctness check")
    try:
        timing = time_kernel(ctx, case, kernel, watch)
    except CheckFailed:
        _verify_harness(ctx, snapshot, "during timing")
        raise
    _verify_harness(ctx, snapshot, "during timing")
    rec["timing"] = timing.to_json()
    stats = summarize(timing.samples)
    rec["stats"] = stats
    fresh = fresh_probe(ctx, case, kernel, watch) if ctx.integrity.cache_ratio else []
    _verify_harness(ctx, snapshot, "during the fresh-input calls")
    integrity.update(_cache_check(ctx, fresh, stats["median"]))
    if ctx.integrity.verify_timed_outputs:
        integrity["timed_inputs"] = "new content before every sample"
    integrity["threads"] = {"python": watch.max_seen[0], "native": watch.max_seen[1]}
    integrity["checks"] += (["harness"] if snapshot else []) + (["threads"] if watch.enabled else []) + \
        (["timed_outputs"] if ctx.integrity.verify_timed_outputs else []) + \
        ["fresh_inputs", "poisoned_output", "input_fingerprints", "no_aliasing", "late_writes", "degenerate_output",
         "cache_ratio", "roofline"]
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
