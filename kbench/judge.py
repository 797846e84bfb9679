"""The trusted side of an execution: inputs from a per-run secret, verification, clock, verdict.

The judge runs in the parent and never imports candidate code. For one (backend, case) it:

1. draws input content from the run's secret (HMAC of the secret, the case id, the purpose and a
   counter: a kernel cannot regenerate them) and writes it into a shared-memory arena
   (:mod:`kbench.calls`), keeping its own copy;
2. asks the runner (a worker process, or :class:`kbench.calls.LocalChannel` in-process) to call the
   kernel on named slots, in batches; before each batch it poisons the output slots with NaN, so a
   reply without outputs is all NaN;
3. verifies outputs in the arena: NaN/Inf over every element, relative L2 against the float64
   reference on rows it picks only after the output exists, and the trivial-predictor guard;
4. accounts for every timed sample with its own clock: every call's start/end stamps must lie inside
   the batch's window on the parent's monotonic clock, and the samples must explain at least half of
   the batches' net wall time (the loop's overhead measured by an empty kernel through the same loop,
   in a batch paired with every timed batch, so it tracks the machine's load);
5. gives every timed call input content never used before, verifies the first and last output of every
   batch and one more picked at random after the reply, and judges.

A reply is data to verify, never a verdict: a message the protocol does not expect fails the record.
"""
from __future__ import annotations

import hashlib
import hmac
import math
import mmap
import os
import secrets
import time
from typing import Any, Mapping

import numpy as np

from kbench.calls import Layout, anonymous_file
from kbench.enums import Status
from kbench.hardware import roofline_point
from kbench.stats import rel_standard_error, summarize
from kbench.timing import Timing

#: bytes of input and output slots one execution may hold (the timed pool is sized to fit)
POOL_MEMORY = 256 * 2**20
#: most slots in the pool: timed calls per batch at most
MAX_POOL = 64
#: a batch of timed calls lasts about this long (fewer round trips for fast kernels)
TARGET_BATCH_SECONDS = 0.02
#: an output must be this many times closer to the reference than every trivial predictor
TRIVIAL_MARGIN = 10.0
#: the samples must explain at least this fraction of the parent's net batch time (load-proof: a timer
#: slowed 100x explains 1%)
EXPLAINED_FRACTION = 0.25
#: how much machine load may inflate the calibrated loop overhead before time counts as unexplained
LOAD_FACTOR = 2.0
#: below this much unexplained time (s) in a batch the accounting is too coarse to judge it
ACCOUNTING_FLOOR = 0.0005
#: rows of a timed output verified (picked after the reply; the correctness trials use check.max_rows)
TIMED_ROWS = 32
#: extra timed/empty batch pairs measured before samples that do not add up fail a record
AUDIT_PAIRS = 4
#: a device sample may exceed its wall stamps by this much (event vs host clock granularity)
STAMP_SLACK = 1e-4


class CheckFailed(Exception):
    """A wrong answer or a tripped integrity check: the record's status becomes ``failed``."""


class KernelError(Exception):
    """The kernel (or its backend) raised in the runner: the record's status becomes ``error``."""

    def __init__(self, reply: Mapping[str, Any]) -> None:
        super().__init__(str(reply.get("reason", "error")))
        self.reply = reply


class Abort(Exception):
    """The runner is gone (crash, timeout, broken channel): ``record`` holds what the channel knows."""

    def __init__(self, record: dict[str, Any]) -> None:
        super().__init__(record.get("reason"))
        self.record = record


class ProtocolError(CheckFailed):
    """A reply the protocol does not allow: forged or corrupted by the code in the runner."""


def new_secret() -> bytes:
    return secrets.token_bytes(32)


class InputSource:
    """Input sets of one case derived from the run's secret; never sent anywhere but the arena."""

    def __init__(self, secret: bytes, op, case) -> None:
        self.secret, self.op, self.case = secret, op, case

    def seed(self, purpose: str, index: int) -> int:
        msg = f"{self.case.id}\x00{purpose}\x00{index}".encode()
        return int.from_bytes(hmac.new(self.secret, msg, hashlib.sha256).digest()[:8], "little")

    def make(self, purpose: str, index: int) -> dict[str, np.ndarray]:
        return self.op.make_inputs(self.case, self.seed(purpose, index))


def relative_l2(got: np.ndarray, ref: np.ndarray) -> float:
    """||got - ref|| / ||ref||; for a zero reference the absolute norm of ``got`` (so zeros pass only zeros)."""
    diff = float(np.linalg.norm((got - ref).ravel()))
    norm = float(np.linalg.norm(ref.ravel()))
    return diff / norm if norm > 0 else diff


def tolerance(ctx, case, name: str = "out") -> float:
    """The bound of output ``name``: the op's, or the suite's ``check.tolerance`` for the dtype.

    A suite's bound replaces the forward output's; every other output's (a gradient's) is scaled by the
    same factor, so one number tightens or loosens them all together.
    """
    op = ctx.op
    own = float(op.output_tolerance(case, name))
    override = ctx.check.tolerance.get(str(case.dtype))
    if override is None:
        return own
    if name == "out":
        return float(override)
    return own * float(override) / float(op.output_tolerance(case, "out"))


def trivial_errors(op, case, inputs: Mapping[str, np.ndarray], rows, ref: np.ndarray,
                   uniform: np.ndarray | None = None) -> dict[str, float]:
    """Errors of answers that need no attention at all: zeros, a constant, uniform weights over visible keys."""
    errors = {"zeros": relative_l2(np.zeros_like(ref), ref),
              "a constant (the reference's mean)": relative_l2(np.full_like(ref, ref.mean()), ref)}
    if uniform is None and "q" in inputs:
        uniform = op.reference(case, {**inputs, "q": np.zeros_like(inputs["q"])}, rows)
    if uniform is not None:
        # q = 0 makes every score equal: the reference is then the mean of the visible values per row
        errors["the mean of the visible values"] = relative_l2(uniform, ref)
    return errors


def finite_or_fail(outputs: Mapping[str, np.ndarray], what: str) -> None:
    """NaN/Inf over every element of every output; the message names the output when there are several."""
    for name, output in outputs.items():
        wide = output.astype(np.float32) if output.dtype.itemsize < 4 else output
        bad = int(np.count_nonzero(~np.isfinite(wide)))
        if bad:
            which = "output" if len(outputs) == 1 else f"{name!r} output"
            raise CheckFailed(f"{bad} of {output.size} {which} elements are NaN/Inf (never written, or overflow) "
                              f"on {what}")


def verify(ctx, case, inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray] | np.ndarray, what: str,
           rng: np.random.Generator, *, max_rows: int | None = None,
           uniform: bool = True) -> tuple[float, int | None, dict[str, dict[str, float]]]:
    """Judge every output (copies taken from the arena), each against its own bound.

    Raises CheckFailed naming the output that fails; returns (the worst error relative to its bound's
    scale, rows checked, {name: {"rel_l2", "bound"}}).
    """
    op = ctx.op
    if not isinstance(outputs, Mapping):
        outputs = {"out": outputs}
    finite_or_fail(outputs, what)
    rows = op.sample_rows(case, max_rows or ctx.check.max_rows, rng)  # picked now: the outputs already exist
    refs = op.reference_outputs(case, inputs, rows)
    uniforms = (op.reference_outputs(case, {**inputs, "q": np.zeros_like(inputs["q"])}, rows)
                if uniform and "q" in inputs else {})
    rows_checked = op.rows_checked(rows)
    several = len(outputs) > 1
    report: dict[str, dict[str, float]] = {}
    for name, output in outputs.items():
        ref = refs[name]
        if ref.size == 0:  # the op's sample leaves this output out of this check (docs/backward.md)
            continue
        got = op.select_output(case, name, output, rows).astype(np.float64)
        err = relative_l2(got, ref)
        bound = tolerance(ctx, case, name)
        report[name] = {"rel_l2": err, "bound": bound}
        prefix = f"{name}: " if several else ""
        detail = {"rel_l2": err, "bound": bound, "rows_checked": rows_checked}
        if several:
            detail["output"] = name
        if not err <= bound:
            raise CheckFailed(f"{prefix}relative L2 error {err:.3g} exceeds the {case.dtype} bound {bound:g} on "
                              f"{what}", detail)
        if float(np.ptp(ref)) > 0 and got.size and float(np.ptp(got)) == 0.0:
            raise CheckFailed(f"{prefix}output is constant ({float(got.ravel()[0]):g} everywhere) while the "
                              f"reference varies, on {what}")
        trivial = trivial_errors(op, case, {}, rows, ref, uniforms.get(name))
        best_name, best = min(trivial.items(), key=lambda kv: kv[1])
        if best > 0 and err * TRIVIAL_MARGIN > best:
            raise CheckFailed(f"{prefix}output is not much closer to the reference than {best_name} (relative L2 "
                              f"{err:.3g} vs {best:.3g}; an answer must be {TRIVIAL_MARGIN:g}x closer than every "
                              f"trivial predictor, whatever the tolerance) on {what}", {**detail, "trivial": trivial})
    worst = max(report, key=lambda n: report[n]["rel_l2"] / report[n]["bound"] if report[n]["bound"] else 0.0)
    return report[worst]["rel_l2"], rows_checked, report


def pool_slots(slot_bytes: int, at_least: int) -> int:
    return max(at_least, 2, min(MAX_POOL, POOL_MEMORY // max(slot_bytes, 1)))


class Judge:
    """One (backend, case) judged through ``channel`` (see :mod:`kbench.calls` for the runner's side)."""

    def __init__(self, ctx, channel, case, timeout: float | None = None, *, trusted: bool = True) -> None:
        self.ctx, self.channel, self.case, self.trusted = ctx, channel, case, trusted
        self.deadline = time.monotonic() + timeout if timeout else None
        self.source = InputSource(ctx.secret, ctx.op, case)
        self.rng = np.random.default_rng(secrets.randbits(128))   # rows and verified calls: after the fact
        self.held: dict[int, dict[str, np.ndarray]] = {}           # slot -> the judge's copy of its inputs
        self.buf: mmap.mmap | None = None
        self.layout: Layout | None = None
        self.ended = False

    # -- the channel ---------------------------------------------------------------------------

    def _remaining(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def _expect(self, answer: Any, kind: str) -> dict[str, Any]:
        if not (isinstance(answer, tuple) and len(answer) == 2 and isinstance(answer[1], dict)):
            raise ProtocolError(f"the runner sent a malformed reply ({type(answer).__name__}) where {kind!r} was "
                                f"expected: forged or corrupted by the kernel")
        got, payload = answer
        if got == "error":
            raise KernelError(payload)
        if got != kind:
            raise ProtocolError(f"the runner sent {str(got)[:40]!r} where {kind!r} was expected (a forged message? "
                                f"records are made by the judge, never by the runner)")
        return payload

    def _write(self, slot: int, inputs: dict[str, np.ndarray]) -> None:
        for name, view in self.layout.input_views(self.buf, slot).items():
            np.copyto(view, inputs[name])
        self.held[slot] = inputs

    def _batch(self, slots: list[int], kind: str) -> tuple[list[float], float]:
        """Samples of one batch and the parent's wall time of it; stamps checked against the parent's clock."""
        for s in slots:
            for view in self.layout.output_views(self.buf, s).values():
                view[...] = np.nan
        start = time.perf_counter_ns()
        answer = self.channel.request(("batch", {"slots": slots, "kind": kind}), self._remaining())
        stop = time.perf_counter_ns()
        reply = self._expect(answer, "batch")
        samples, stamps = reply.get("samples"), reply.get("stamps")
        if reply.get("fault"):
            raise CheckFailed(str(reply["fault"]))
        if not (isinstance(samples, list) and isinstance(stamps, list) and len(samples) == len(stamps) == len(slots)):
            raise ProtocolError(f"the runner's {kind} batch reply does not hold one sample and one stamp per call")
        untimed = reply.get("untimed")
        if untimed is not None and not (isinstance(untimed, list) and len(untimed) == len(slots)
                                        and all(_is_stamp(u) for u in untimed)):
            raise ProtocolError(f"the runner's {kind} batch reply has malformed untimed-forward stamps")
        last, forward_ns = start, 0
        for i, (t, stamp) in enumerate(zip(samples, stamps)):
            ok = isinstance(t, float) and math.isfinite(t) and t >= 0 and _is_stamp(stamp)
            if not ok:
                raise ProtocolError(f"call {i + 1} of a {kind} batch has a malformed sample or stamp")
            begin, end = stamp
            if untimed is not None:  # the untimed forward of a split call: before its sample, after the last
                f_begin, f_end = untimed[i]
                if not last <= f_begin <= f_end <= begin:
                    raise CheckFailed(f"samples do not add up: the untimed forward of call {i + 1} of a {kind} "
                                      f"batch is stamped outside its place before the timed call (forged stamps)")
                forward_ns += f_end - f_begin
            if not last <= begin <= end <= stop:
                raise CheckFailed(f"samples do not add up: call {i + 1} of a {kind} batch claims to run outside the "
                                  f"parent's clock window of the batch (timers patched or samples forged)")
            if t > (end - begin) * 1e-9 + STAMP_SLACK:
                raise CheckFailed(f"samples do not add up: call {i + 1} of a {kind} batch reports {t:.3g} s in "
                                  f"{(end - begin) * 1e-9:.3g} s of its own stamps")
            last = end
        self.threads = reply.get("threads")
        # the untimed forwards (verified stamps, never overlapping a sample) are explained time, not the loop's
        return [float(t) for t in samples], (stop - start - forward_ns) * 1e-9

    def _outputs(self, slot: int) -> dict[str, np.ndarray]:
        return {name: np.array(view, copy=True) for name, view in self.layout.output_views(self.buf, slot).items()}

    # -- the phases ----------------------------------------------------------------------------

    def run(self, rec: dict[str, Any]) -> dict[str, Any]:
        ctx, case, op = self.ctx, self.case, self.ctx.op
        checks = [self.source.make("check", i) for i in range(ctx.check.seeds)]
        shapes, out_dtype = op.output_shapes(case), op.output_dtype(case)
        layout = Layout.plan(checks[0], shapes, out_dtype.numpy, 1)
        slots = pool_slots(layout.slot_bytes, len(checks))
        self.layout = layout = Layout.plan(checks[0], shapes, out_dtype.numpy, slots)
        fd = anonymous_file(layout.nbytes)
        try:
            self.buf = mmap.mmap(fd, layout.nbytes)
            job = {"case": case, "layout": layout, "forbidden_ops": () if self.trusted else forbidden_ops(ctx),
                   "required_features": tuple(sorted(op.required_features(case))),
                   "backward_inputs": tuple(op.backward_inputs(case)), "out_dtype": out_dtype.value}
            prepared = self._expect(self.channel.start(job, fd, self._remaining()), "prepared")
        finally:
            os.close(fd)
        if prepared.get("skip"):
            return {"status": Status.SKIPPED.value, "reason": str(prepared["skip"])}
        info = prepared.get("backend_info")
        rec["backend_info"] = info if isinstance(info, dict) else None
        if prepared.get("fault"):
            raise CheckFailed(str(prepared["fault"]))
        integrity = rec.setdefault("integrity", {"checks": []})
        rec["correctness"] = self.correctness(checks)
        timing, accounting = self.timing(rec["correctness"]["call_seconds"])
        rec["timing"] = {**timing.to_json(), "accounting": accounting}
        stats = summarize(timing.samples)
        rec["stats"] = stats
        integrity["threads"] = dict(zip(("python", "native"), self.threads or (None, None)))
        integrity["timed_inputs"] = "new content for every timed call"
        metrics = roofline_point(ctx.hardware, str(case.dtype), op.flops(case), op.min_bytes(case), stats["median"])
        metrics["footprint"] = op.footprint(case)
        rec["metrics"] = metrics
        integrity["checks"] += self.checks_ran(job, metrics)
        ended = self._expect(self.channel.request(("end",), self._remaining()), "ended")
        self.ended = True
        telemetry = ended.get("telemetry")
        rec["telemetry"] = telemetry if isinstance(telemetry, dict) else None
        if metrics.get("impossible"):
            raise CheckFailed(f"impossible rate: {metrics.get('impossible_reason')} (work skipped, cached or done "
                              f"outside the timed region)")
        return {"status": Status.PASSED.value}

    def checks_ran(self, job: Mapping[str, Any], metrics: Mapping[str, Any]) -> list[str]:
        """The integrity checks this record went through (docs/integrity.md): the suite's settings and the
        case decide some, and a record lists only those that ran."""
        settings = self.ctx.integrity
        ran = ["secret_inputs", "parent_verifies", "rows_after_output", "nan_every_element", "trivial_predictors",
               "parent_clock", "poisoned_output", "input_fingerprints", "no_aliasing", "late_writes"]
        if settings.verify_timed_outputs:
            ran.append("timed_outputs")
        if settings.check_threads:
            ran.append("threads")
        if settings.check_harness:
            ran.append("harness")
        if job.get("forbidden_ops"):
            ran.append("forbidden_ops")
        if "impossible" in metrics:  # a roof to judge the rate against (datasheet, or a calibrated GEMM rate)
            ran.append("roofline")
        return ran

    def correctness(self, checks: list[dict[str, np.ndarray]]) -> dict[str, Any]:
        """Every check set called once; every output judged here, on rows picked after it exists."""
        slots = list(range(len(checks)))
        for slot, inputs in zip(slots, checks):
            self._write(slot, inputs)
        durations, _ = self._batch(slots, "check")
        errors, rows_checked, per_output = [], None, {}
        for trial, slot in enumerate(slots):
            try:
                err, rows_checked, report = verify(self.ctx, self.case, self.held[slot], self._outputs(slot),
                                                   f"trial {trial}", self.rng)
            except CheckFailed as exc:
                if len(exc.args) > 1:
                    exc.args[1].update({"seeds": trial + 1, "per_seed": errors + [exc.args[1]["rel_l2"]]})
                raise
            errors.append(err)
            for name, got in report.items():
                if name not in per_output or got["rel_l2"] > per_output[name]["rel_l2"]:
                    per_output[name] = got
        record = {"rel_l2": max(errors), "bound": tolerance(self.ctx, self.case), "seeds": len(errors),
                  "rows_checked": rows_checked, "per_seed": errors, "call_seconds": durations}
        if len(per_output) > 1:  # each output's worst error over the seeds, with its own bound
            record["outputs"] = per_output
            worst = max(per_output, key=lambda n: per_output[n]["rel_l2"] / per_output[n]["bound"])
            record.update(rel_l2=per_output[worst]["rel_l2"], bound=per_output[worst]["bound"], worst_output=worst)
        return record

    def timing(self, check_seconds: list[float]) -> tuple[Timing, dict[str, Any]]:
        """Adaptive sampling in batches, every call on new content, accounted for by the parent's clock."""
        settings, layout = self.ctx.timing, self.layout
        guess = max(min(check_seconds), 1e-7)
        per_batch = int(min(layout.slots, max(1, math.ceil(TARGET_BATCH_SECONDS / guess))))
        slots = list(range(per_batch))
        # warm-up on the check sets (not verified: nothing of it is reported); a slot the check did not
        # fill gets a copy of one, never the arena's zeros (an all-zero offset or page table is no input)
        for s in slots:
            if s not in self.held:
                self._write(s, self.held[s % len(self.held)])
        clock = time.perf_counter
        begin = clock()
        warm = 0
        while warm < max(settings.warmup_calls, 1) or clock() - begin < settings.warmup_time:
            n = min(per_batch, max(1, max(settings.warmup_calls, 1) - warm)) if settings.warmup_time <= 0 else per_batch
            self._batch(slots[:n], "warmup")
            warm += n
        warm_time = clock() - begin
        samples: list[float] = []
        pairs: list[tuple[float, float, float]] = []   # (samples, timed batch wall, empty batch wall)
        self.counter = 0
        reason = "max_samples"
        begin = clock()
        while len(samples) < settings.max_samples:
            n = min(per_batch, settings.max_samples - len(samples))
            got, wall, empty_wall = self._timed_pair(slots[:n])
            pairs.append((sum(got), wall, empty_wall))
            samples += got
            if len(samples) >= settings.min_samples and sum(samples) >= settings.min_time:
                if rel_standard_error(samples) < settings.target_rel_se:
                    reason = "noise_target"
                    break
            if clock() - begin >= settings.max_time and len(samples) >= 2:
                reason = "time_limit"
                break
        sampling_time = clock() - begin
        audits = 0
        while not _accounted(pairs) and audits < AUDIT_PAIRS:
            # a burst of load can hit a timed batch and miss its empty twin: measure a few more pairs
            # (verified, not reported) before calling the samples forged
            got, wall, empty_wall = self._timed_pair(slots[:min(per_batch, len(slots))])
            pairs.append((sum(got), wall, empty_wall))
            audits += 1
        walls, overhead = sum(p[1] for p in pairs), sum(max(0.0, p[2]) for p in pairs)
        accounting = {"parent_seconds": walls, "sample_seconds": sum(p[0] for p in pairs),
                      "empty_seconds": overhead, "calls_per_batch": per_batch, "batches": len(pairs),
                      "audit_batches": audits, "accounted_batches": sum(_pair_ok(*p) for p in pairs),
                      "explained": sum(p[0] for p in pairs) / (walls - overhead) if walls > overhead else 1.0}
        if not _accounted(pairs):
            raise CheckFailed(f"samples do not add up: in {len(pairs) - accounting['accounted_batches']} of "
                              f"{len(pairs)} batches the runner reported less than {EXPLAINED_FRACTION:.0%} of "
                              f"the time the parent measured beyond {LOAD_FACTOR:g}x the same loop with an empty "
                              f"kernel ({accounting['sample_seconds']:.3g} s of samples in {walls:.3g} s; empty "
                              f"batches {overhead:.3g} s): timers patched or samples forged")
        return Timing(samples, reason, warm, warm_time, sampling_time), accounting

    def _timed_pair(self, slots: list[int]) -> tuple[list[float], float, float]:
        """One timed batch on new content, its outputs checked, then the same loop with an empty kernel."""
        n = len(slots)
        for slot in slots:
            self._write(slot, self.source.make("timed", self.counter))
            self.counter += 1
        got, wall = self._batch(slots, "timed")
        for i, slot in enumerate(slots):  # NaN/Inf over every element of every timed output
            try:
                finite_or_fail(self.layout.output_views(self.buf, slot), f"timed call {self.counter - n + i + 1}")
            except CheckFailed as exc:
                raise CheckFailed(f"timed output wrong although the checked calls were right (lazy, stale or "
                                  f"garbage results when timed): {exc.args[0].replace(' (never written, or overflow)', '')}") from None
        # verified after the reply: the first call (its slot served the correctness check: a cache keyed
        # by address answers it stale), the last, and one the runner could not know in advance
        # (integrity.verify_timed_outputs: false leaves only the NaN/Inf check above)
        verified = ({slots[0], slots[n - 1], slots[int(self.rng.integers(n))]}
                    if self.ctx.integrity.verify_timed_outputs else ())
        for slot in sorted(verified):
            try:
                # fewer rows (still picked after the fact) and no uniform-attention reference: the
                # correctness trials did the full check; these catch answers that change when timed
                verify(self.ctx, self.case, self.held[slot], self._outputs(slot), "a timed call", self.rng,
                       max_rows=min(self.ctx.check.max_rows, TIMED_ROWS), uniform=False)
            except CheckFailed as exc:
                raise CheckFailed(f"timed output wrong although the checked calls were right (lazy, stale or "
                                  f"garbage results when timed): {exc.args[0]}") from None
        # the same loop with an empty kernel, right after (its outputs overwrite the verified ones): the
        # loop's overhead under the load of this moment
        empty, empty_wall = self._batch(slots, "empty")
        return got, wall, empty_wall - sum(empty)

    def close(self) -> None:
        if self.buf is not None:
            try:
                self.buf.close()
            except BufferError:
                pass
            self.buf = None


def _is_stamp(stamp: Any) -> bool:
    return isinstance(stamp, (tuple, list)) and len(stamp) == 2 and all(isinstance(x, int) for x in stamp)


def _pair_ok(sampled: float, wall: float, empty: float) -> bool:
    """A timed batch whose samples explain the parent's time beyond its empty twin (with room for load)."""
    net = wall - LOAD_FACTOR * empty
    return net <= ACCOUNTING_FLOOR or sampled >= EXPLAINED_FRACTION * net


def _accounted(pairs: list[tuple[float, float, float]]) -> bool:
    """At least half the batches add up: a forger fakes them all, a burst of load hits a few."""
    return 2 * sum(_pair_ok(*p) for p in pairs) >= len(pairs)


def forbidden_ops(ctx) -> tuple[str, ...]:
    """Torch operators the runner watches for in an untrusted kernel's untimed calls (none when allowed)."""
    from kbench.integrity import FORBIDDEN_OPS

    allowed = ctx.integrity.allowed_calls
    return tuple(p for p in FORBIDDEN_OPS if not any(a in p or p in a for a in allowed))


def judge(ctx, channel, backend_name: str, case, *, timeout: float | None = None,
          trusted: bool = True) -> dict[str, Any]:
    """One record for (backend, case), made here from what the channel's runner reports."""
    from kbench.execute import base_record

    t0 = time.perf_counter()
    rec = base_record(backend_name, case, ctx.device.name)
    rec["integrity"] = {"checks": []}
    j = Judge(ctx, channel, case, timeout, trusted=trusted)
    try:
        rec.update(j.run(rec))
    except Abort as exc:
        keep = {k: v for k, v in rec.items() if k in ("backend_info", "correctness", "integrity")}
        rec = {**exc.record, **keep}
    except CheckFailed as exc:
        rec["status"], rec["reason"] = Status.FAILED.value, str(exc.args[0])
        if len(exc.args) > 1 and isinstance(exc.args[1], dict):
            rec["correctness"] = exc.args[1]
        _end(channel, j)
    except KernelError as exc:
        rec["status"] = Status.ERROR.value
        rec["reason"] = str(exc.reply.get("reason"))
        if exc.reply.get("failed"):  # refused by the worker's guard: the kernel did what it may not
            rec["status"] = Status.FAILED.value
        elif exc.reply.get("unsupported"):  # a library refused the case (kbench.unsupported)
            rec["status"] = Status.SKIPPED.value
        if exc.reply.get("traceback"):
            rec["traceback"] = str(exc.reply["traceback"])
        _end(channel, j)
    except MemoryError as exc:
        rec["status"], rec["reason"] = Status.ERROR.value, f"out of memory: {exc}".rstrip(": ")
        _end(channel, j)
    except OSError as exc:  # the parent's side: the arena could not be made (file-size limit, no memory)
        rec.update(status=Status.ERROR.value, cause="infrastructure",
                   reason=f"the judge could not set up the case's shared-memory arena: {exc} (a file-size "
                          f"or memory limit of this shell? `ulimit -f`/`ulimit -v`)")
        _end(channel, j)
    finally:
        j.close()
    if rec.get("status") == Status.SKIPPED.value:
        rec.pop("integrity", None)
    rec["duration"] = time.perf_counter() - t0
    return rec


def _end(channel, j: Judge) -> None:
    """Release the runner's kernel and arena after a failure (a runner that is gone needs nothing)."""
    if j.ended:
        return
    try:
        channel.request(("end",), j._remaining() or 5.0)
    except Exception:  # noqa: BLE001 - the record is decided; the channel's state is the worker's problem
        pass
