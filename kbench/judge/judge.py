"""The judge: one (backend, case) driven through a worker's call runner, and the record it earns.

The judge runs in the parent and never imports candidate code. For one (backend, case) it:

1. sends the worker the job (case, arena layout) and, batch by batch, input **keys** derived from the run's
   secret (kbench.judge.inputs): the worker generates each call's inputs on its device just before the
   call, so the content of a call exists only from then on and the parent ships no array;
2. runs the correctness trials (several keys), has their outputs copied into the sealed arena and verifies
   them here: NaN/Inf over every element, relative L2 against the float64 reference of inputs it
   regenerates itself, on rows picked after the outputs exist, and the trivial predictors;
3. warms up, then samples in batches of back-to-back calls until the noise target (or a time limit after
   ``min_samples``); after each batch it checks the worker's clock against its own (kbench.judge.accounting)
   and the non-finite counts of every call, and verifies outputs of calls it picks after the reply
   (one call of every batch of an untrusted kernel; one of the last batch of a trusted library);
4. for untrusted kernels, measures the same loop with an empty call and requires the samples to explain the
   parent's time (kbench.judge.accounting); optionally runs a sustained loop for energy and clocks;
5. decides the record. A reply is data to verify, never a verdict: anything malformed fails the record.
"""
from __future__ import annotations

import math
import mmap
import os
import secrets
import time
from typing import Any

import numpy as np

from kbench.enums import Status
import kbench.judge.replies as replies
from kbench.judge.accounting import TWIN_EVERY, TWIN_FIRST, Accounting, check_clock
from kbench.judge.context import new_record
from kbench.judge.inputs import InputSource
from kbench.judge.replies import KernelError, expect
from kbench.judge.verify import CheckFailed, tolerance, verify
from kbench.protocol import Layout, ProtocolError, arena_file
from kbench.timing import Timing

#: most calls in one batch (slots held at once)
MAX_POOL = 64
#: a batch of timed calls lasts about this long (fewer round trips for fast kernels)
TARGET_BATCH_SECONDS = 0.02
#: the slot a failed timed call is run again in, as a checked call: buffers the kernel has never seen
RECHECK_SLOT = 2 * MAX_POOL
#: an untrusted kernel's batch size changes when the parent's clock asks for this factor more or fewer calls
RESIZE_RATIO = 1.5
#: bytes of outputs collected from one batch at most: beyond it (huge outputs on a large GPU pool) a random part
#: of the batch's calls, picked after the reply, is checked instead of every call
COLLECT_BYTES = 256 * 2**20
#: rows of each other timed call of an untrusted kernel's batch verified (picked after the reply)
CALL_ROWS = 4
#: the parent verifies whole (every row) as many of an untrusted kernel's timed calls per batch as fit in this
#: share of the batch's parent time (one at least; the worker is stopped meanwhile): every call, when the
#: reference is cheap beside the kernel. The rate it buys is in docs/integrity.md ("Checks that see every call")
VERIFY_SHARE = 2.0
#: max_rows that means "every row" (the op still bounds a huge case's reference: kbench.ops.attention)
WHOLE = 1 << 30
#: rows of a timed output verified (picked after the reply; the correctness trials use check.max_rows)
TIMED_ROWS = 32
#: sampling goes on past ``max_time`` to reach ``min_samples``, up to this many times ``max_time`` (and never
#: closer to the case timeout than a few batches): only then is a record below min_samples, and says so
HARD_TIME_FACTOR = 10.0


class Abort(Exception):
    """The worker is gone (crash, timeout, broken channel): ``record`` holds what the channel knows."""

    def __init__(self, record: dict[str, Any]) -> None:
        super().__init__(record.get("reason"))
        self.record = record


class Judge:
    """One (backend, case) judged through ``channel`` (a worker's, or an in-process runner's)."""

    def __init__(self, ctx, channel, case, timeout: float | None = None, *, trusted: bool = True) -> None:
        self.ctx, self.channel, self.case, self.trusted = ctx, channel, case, trusted
        self.deadline = time.monotonic() + timeout if timeout else None
        # an untrusted kernel's keys are its job's own: judged again in this run (rounds), it meets new inputs
        self.source = InputSource(ctx.secret, ctx.op, case, b"" if trusted else secrets.token_bytes(16))
        self.rng = np.random.default_rng(secrets.randbits(128))   # rows and verified calls: after the fact
        self.buf: mmap.mmap | None = None
        self.layout: Layout | None = None
        self.accounting = Accounting(parent_clock=not trusted)
        # an untrusted kernel's harness twin (kbench.judge.accounting): a channel to a worker of the same setup
        # that never ran candidate code, its own arena, its own keys
        self.twin = None   # made in run() for an untrusted kernel's timed record
        self.twin_buf: mmap.mmap | None = None
        self.twin_counter = 0
        self.whole_cost: float | None = None      # the parent's seconds to verify one timed call whole
        self.frozen = False
        self.host_clock = bool(getattr(ctx.device, "host_clock", True))
        self.split = bool(ctx.op.backward_inputs(case))
        self.outputs = len(ctx.op.output_shapes(case))
        self.counter = {"warmup": 0, "timed": 0}
        self.threads: tuple[int | None, int | None] = (None, None)
        self.phases: dict[str, float] = {}
        self.checked: list[tuple[tuple[int, int], dict[str, np.ndarray]]] = []   # correctness calls' outputs
        self.check_wall = 0.0
        self.collect_cap = 1
        self.ended = False

    # -- the channel ---------------------------------------------------------------------------

    def _phase(self, name: str, since: float) -> float:
        """Add the time since ``since`` to phase ``name`` (the record's ``timing.accounting.phases``)."""
        now = time.perf_counter()
        self.phases[name] = self.phases.get(name, 0.0) + now - since
        return now

    def _remaining(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def _thaw(self) -> None:
        """An untrusted kernel's worker runs only while a request of the judge is out (SIGCONT now)."""
        if self.frozen:
            self.frozen = False
            self.channel.thaw()

    def _freeze(self) -> None:
        """Stop an untrusted kernel's worker (its whole sandbox) from the reply until the next request: no thread
        of it, native or not, works between batches, while its outputs are verified or while the twin measures."""
        freeze = getattr(self.channel, "freeze", None)
        if not self.trusted and callable(freeze):
            self.frozen = bool(freeze())

    def _request(self, message: tuple, kind: str) -> tuple[dict[str, Any], int, int]:
        self._thaw()
        sent = time.perf_counter_ns()
        try:
            answer = self.channel.request(message, self._remaining())
        finally:
            received = time.perf_counter_ns()
            if message[0] != "end":
                self._freeze()
        payload = expect(answer, kind)
        why = replies.fault(payload)
        if why:
            raise CheckFailed(why)
        return payload, sent, received

    def _keys(self, purpose: str, n: int) -> list[tuple[int, int]]:
        start = self.counter[purpose]
        self.counter[purpose] += n
        return [self.source.key(purpose, start + i) for i in range(n)]

    def _forward(self, kind: str, calls: list) -> None:
        """Split cases: the untimed forwards of the named calls, in a request of their own timed by the parent."""
        _, sent, received = self._request(("forward", {"kind": kind, "calls": calls}), "forward")
        if kind == "timed":
            self.accounting.forward_seconds += (received - sent) * 1e-9

    def _batch(self, kind: str, calls: list) -> tuple[list[float], float, list[list[int]]]:
        """Samples of one batch, the parent's wall time of it, the non-finite counts; clock checked."""
        if self.split:
            self._forward(kind, calls)
        # an untrusted kernel's every call is scanned where it lives (shadows, NaN/Inf); a trusted library's
        # timed and warm-up calls are not (do_bench-style), the calls the judge collects are scanned here
        scan = not self.trusted or kind == "check"
        message = {"kind": kind, "calls": calls, "scan": scan}
        if not self.trusted and kind == "timed":  # outputs into the arena inside the window: verified frozen
            message.update(self._timed_message(len(calls)))
        payload, sent, received = self._request(("batch", message), "batch")
        n = len(calls)
        got = replies.samples(payload, n, kind)
        check_clock(kind, got, replies.window(payload, kind), replies.stamps(payload, n, kind), sent, received,
                    self.host_clock)
        counts = (replies.nonfinite(payload, n, self.outputs, kind) if message["scan"]
                  else [[] for _ in range(n)])
        self.threads = replies.threads(payload)
        return got, (received - sent) * 1e-9, counts

    def _timed_message(self, n: int) -> dict[str, Any]:
        """How an untrusted kernel's timed batch of ``n`` calls (and its twin's) is run: every output copied into
        the arena inside the window; where all of them fit, no shadows or NaN/Inf counts in the worker (the parent
        scans every element of what it copied, and a write after the copy changes nothing that is verified)."""
        copy = min(n, self.layout.slots)
        return {"copy": copy, "scan": copy < n}

    def _collect(self, slots: list[int], inputs: bool = True) -> list[dict[str, np.ndarray]]:
        """Outputs of the named slots' last calls, copied by the worker into the arena, copied again here;
        ``inputs``: the worker also checks those calls' inputs are unchanged."""
        self._request(("collect", {"slots": slots, "inputs": inputs}), "collected")
        return [{name: np.array(view, copy=True) for name, view in self.layout.output_views(self.buf, j).items()}
                for j in range(len(slots))]

    # -- the record ----------------------------------------------------------------------------

    def run(self, rec: dict[str, Any]) -> dict[str, Any]:
        from kbench.roofline.point import roofline_point
        from kbench.stats import summarize

        ctx, case, op = self.ctx, self.case, self.ctx.op
        out_dtype = op.output_dtype(case)
        # an untrusted kernel's every timed call is collected after its batch: room for a whole batch's outputs
        begun = time.perf_counter()
        per_call = Layout.plan(op.output_shapes(case), out_dtype.numpy, 1).nbytes
        self.collect_cap = max(1, min(self._pool_cap(), COLLECT_BYTES // max(per_call, 1)))
        slots = max(ctx.check.seeds, 1) if self.trusted else max(ctx.check.seeds, 1, self.collect_cap)
        self.layout = Layout.plan(op.output_shapes(case), out_dtype.numpy, slots)
        fd = arena_file(self.layout.nbytes)
        try:
            self.buf = mmap.mmap(fd, self.layout.nbytes)
            job = {"case": case, "layout": self.layout, "forbidden_ops": () if self.trusted else forbidden_ops(ctx),
                   "strict": not self.trusted,
                   "required_features": tuple(sorted(op.required_features(case))),
                   "backward_inputs": tuple(op.backward_inputs(case)), "out_dtype": out_dtype.value}
            prepared = expect(self.channel.start(job, fd, self._remaining()), "prepared")
        finally:
            os.close(fd)
        if prepared.get("skip"):
            return {"status": Status.SKIPPED.value, "reason": str(prepared["skip"])[:2000]}
        info = prepared.get("backend_info")
        rec["backend_info"] = info if isinstance(info, dict) else None
        why = replies.fault(prepared)
        if why:
            raise CheckFailed(why)
        self._phase("prepare", begun)
        integrity = rec.setdefault("integrity", {"checks": []})
        if not self.trusted and not ctx.correctness_only:
            since = time.perf_counter()
            self.twin = _harness_twin(self.channel)
            if self.twin is not None:
                self._start_twin(job)
            self._phase("harness twin start", since)
        started = time.perf_counter()
        rec["correctness"] = self.correctness()
        if ctx.correctness_only:  # kbench fuzz, held-out shapes: the verdict is the correctness trials'
            self._request(("end",), "ended")
            self.ended = True
            return {"status": Status.PASSED.value}
        timing = self.timing(rec["correctness"]["call_seconds"])
        rec["timing"] = {**timing.to_json(), "samples_kind": "parent" if self.accounting.parent_clock else "worker",
                         "accounting": self.accounting.summary()}
        if timing.below_min_samples:
            rec["timing"]["below_min_samples"] = True
        stats = summarize(timing.samples)
        rec["stats"] = stats
        integrity["threads"] = dict(zip(("python", "native"), self.threads))
        integrity["timed_inputs"] = "generated on the device just before each call, from keys of the run's secret"
        if self.source.nonce:  # with the run's secret (published when it ends) it regenerates every input
            integrity["input_nonce"] = self.source.nonce.hex()
        metrics = roofline_point(ctx.hardware, str(case.dtype), op.flops(case), op.min_bytes(case), stats["median"])
        metrics["footprint"] = op.footprint(case)
        rec["metrics"] = metrics
        integrity["checks"] += self.checks_ran(job, metrics)
        if ctx.timing.energy_seconds > 0:
            since = time.perf_counter()
            rec["energy_loop"] = self.sustain(ctx.timing.energy_seconds, stats["median"])
            self._phase("energy", since)
        ended, _, _ = self._request(("end",), "ended")
        self.ended = True
        telemetry = ended.get("telemetry")
        rec["telemetry"] = telemetry if isinstance(telemetry, dict) else None
        if rec.get("energy_loop") and isinstance(rec["telemetry"], dict):
            rec["telemetry"]["energy"] = rec.pop("energy_loop")
        else:
            rec.pop("energy_loop", None)
        rec["timing"]["accounting"]["judged_seconds"] = time.perf_counter() - started
        rec["timing"]["accounting"]["phases"] = {k: round(v, 6) for k, v in self.phases.items()}
        if metrics.get("impossible"):
            raise CheckFailed(f"impossible rate: {metrics.get('impossible_reason')} (work skipped, cached or done "
                              f"outside the timed region)")
        return {"status": Status.PASSED.value}

    def checks_ran(self, job: dict[str, Any], metrics: dict[str, Any]) -> list[str]:
        """The integrity checks this record went through (docs/integrity.md): the suite's settings and the
        case decide some, and a record lists only those that ran."""
        settings = self.ctx.integrity
        ran = ["secret_inputs", "parent_verifies", "rows_after_output", "nan_every_element", "trivial_predictors",
               "parent_clock", "poisoned_output", "inputs_unchanged", "no_aliasing", "late_writes",
               "inputs_just_in_time"]
        if not self.trusted:
            ran += ["parent_clock_decides", "harness_twin"] if self.accounting.twin else ["parent_clock_decides"]
            if self.frozen or getattr(self.channel, "freeze", None) is not None:
                ran.append("stopped_between_batches")
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

    def correctness(self) -> dict[str, Any]:
        """Every check key called once; every output judged here, on rows picked after it exists."""
        ctx = self.ctx
        keys = [self.source.key("check", i) for i in range(ctx.check.seeds)]
        calls = [[slot, key] for slot, key in enumerate(keys)]
        since = time.perf_counter()
        durations, wall, _ = self._batch("check", calls)
        self.check_wall = wall / max(len(calls), 1)   # the parent's time per call: untrusted batches are sized by it
        outputs = self._collect(list(range(len(keys))))
        self.checked = list(zip(keys, outputs))
        since = self._phase("correctness calls", since)
        errors: list[float] = []
        rows_checked, per_output = None, {}
        for trial, (key, got) in enumerate(zip(keys, outputs)):
            try:
                err, rows_checked, report = verify(ctx, self.case, self.source.inputs(key), got, f"trial {trial}",
                                                   self.rng)
            except CheckFailed as exc:
                if len(exc.args) > 1:
                    exc.args[1].update({"seeds": trial + 1, "per_seed": errors + [exc.args[1]["rel_l2"]]})
                raise
            errors.append(err)
            for name, value in report.items():
                if name not in per_output or value["rel_l2"] > per_output[name]["rel_l2"]:
                    per_output[name] = value
        self._phase("correctness verification", since)
        record = {"rel_l2": max(errors), "bound": tolerance(ctx, self.case), "seeds": len(errors),
                  "rows_checked": rows_checked, "per_seed": errors, "call_seconds": durations}
        if len(per_output) > 1:  # each output's worst error over the seeds, with its own bound
            record["outputs"] = per_output
            worst = max(per_output, key=lambda n: per_output[n]["rel_l2"] / per_output[n]["bound"])
            record.update(rel_l2=per_output[worst]["rel_l2"], bound=per_output[worst]["bound"], worst_output=worst)
        return record

    def _calls_per_batch(self, guess: float) -> int:
        """Calls per batch for a call of about ``guess`` seconds: enough that a batch lasts
        TARGET_BATCH_SECONDS (the round trip and the batch's other fixed costs a few percent of it), within the
        pool's memory and MAX_POOL. An untrusted kernel's guess is the parent's own clock (its time per call of
        the correctness batch, then of each timed batch), never a figure its worker reported: a kernel slow only
        in its correctness calls does not get one-call batches (each with its round trip in the allowance)."""
        if self.split and not self.trusted:
            return 1  # a split call's saved state exists before its sample: one call per batch (docs/integrity.md)
        return int(max(1, min(self._pool_cap(), math.ceil(TARGET_BATCH_SECONDS / max(guess, 1e-7)))))

    def _pool_cap(self) -> int:
        """The most calls one batch may hold: MAX_POOL, and the slots the device's pool memory has room for."""
        budget = max(1, int(getattr(self.ctx.device, "pool_memory", 256 * 2**20) // max(self.source.slot_bytes(), 1)))
        return int(min(MAX_POOL, budget))

    def _resize(self, per_batch: int, calls: int, wall: float) -> int:
        """An untrusted kernel's batch size again from the parent's time of its last timed batch (``calls`` calls
        in ``wall`` s); a new size gets its own empty-loop measurement before it is timed."""
        if self.trusted or self.split or calls <= 0:
            return per_batch
        new = self._calls_per_batch(wall / calls)
        if per_batch / RESIZE_RATIO <= new <= per_batch * RESIZE_RATIO:
            return per_batch
        return new

    def timing(self, check_seconds: list[float]) -> Timing:
        """Warm-up, then adaptive sampling in batches of back-to-back calls (module doc)."""
        from kbench.stats import rel_standard_error

        settings = self.ctx.timing
        # trusted libraries: from their own samples (they do not forge); untrusted kernels: the parent's clock
        per_batch = self._calls_per_batch(max(min(check_seconds), 1e-7) if self.trusted else self.check_wall)
        clock = time.perf_counter
        begin = clock()
        # the correctness calls came first and already warmed the kernel (compilation, autotuning, handles):
        # they count towards the warm-up, which runs only what the settings ask for beyond them
        warm, checked = len(check_seconds), sum(check_seconds)
        want = max(settings.warmup_calls, 1)
        # an untrusted kernel has run on every slot before its first timed call: what it could keep per buffer
        # (a result cached by address) is stale on every timed call, not only on the slots that warmed up
        covered = 0 if not self.trusted else per_batch
        while warm < want or covered < per_batch or checked + clock() - begin < settings.warmup_time:
            n = per_batch if settings.warmup_time > 0 or covered < per_batch else min(per_batch, max(1, want - warm))
            self._batch("warmup", self._slots("warmup", n))
            warm, covered = warm + n, max(covered, n)
        warm_time = clock() - begin
        self._phase("warmup", begin)
        samples: list[float] = []
        reason, below = "max_samples", False
        begin = clock()
        while len(samples) < settings.max_samples:
            n = min(per_batch, settings.max_samples - len(samples))
            since = clock()
            got, wall, counts, calls = self._timed(n)
            self._phase("timed batches", since)
            samples += got
            elapsed = clock() - begin
            stop = None
            if len(samples) >= settings.min_samples and sum(samples) >= settings.min_time:
                # a record judged on the parent's clock: the noise of its batches' means (its samples repeat them)
                spread = self.accounting.batch_means() if self.accounting.parent_clock else samples
                if len(spread) >= 2 and rel_standard_error(spread) < settings.target_rel_se:
                    stop = "noise_target"
            if stop is None and elapsed >= settings.max_time and len(samples) >= settings.min_samples:
                stop = "time_limit"
            if stop is None and len(samples) >= 2 and (elapsed >= HARD_TIME_FACTOR * settings.max_time
                                                       or self._near_deadline(wall)):
                stop, below = "time_limit", len(samples) < settings.min_samples
            if stop is None and len(samples) >= settings.max_samples:
                stop = "max_samples"
            # verified after the reply: one call of every batch of an untrusted kernel; one of a trusted
            # library's last batch (integrity.verify_timed_outputs: false leaves the NaN/Inf counts)
            if self.ctx.integrity.verify_timed_outputs and (not self.trusted or stop is not None):
                since = clock()
                self._verify_timed(calls, wall)
                self._phase("verification", since)
            if stop is not None:
                reason = stop
                break
            per_batch = self._resize(per_batch, n, wall)
        sampling_time = clock() - begin
        return Timing(samples, reason, warm, warm_time, sampling_time, below)

    def _near_deadline(self, batch_seconds: float) -> bool:
        """Whether another batch (and the record's end) might not fit before the case timeout."""
        left = self._remaining()
        return left is not None and left < 3 * batch_seconds + 5.0

    def _slots(self, purpose: str, n: int) -> list:
        """``n`` calls on slots 0.. with their input keys: a new key for every call of an untrusted kernel (its
        inputs made just before it); for a trusted library one key per slot, kept for the whole record (inputs
        made once per slot, do_bench-style: a library does not cache by content)."""
        if self.trusted and purpose in ("warmup", "timed"):
            return [[slot, self.source.key("slot", slot)] for slot in range(n)]
        return [[slot, key] for slot, key in enumerate(self._keys(purpose, n))]

    def _timed(self, n: int) -> tuple[list[float], float, list[list[int]], list]:
        calls = self._slots("timed", n)
        got, wall, counts = self._batch("timed", calls)
        if self.twin is not None:
            measured = sum(1 for m, _ in self.accounting.harness if m == n)
            at_size = sum(1 for t in self.accounting.timed if t[0] == n)
            if measured < TWIN_FIRST or at_size % TWIN_EVERY == 0:
                since = time.perf_counter()
                self._twin_batch(n)   # right after, while the candidate's worker is stopped
                self._phase("harness twin", since)
        got = self.accounting.credit(n, wall, got)
        for i, row in enumerate(counts):  # NaN/Inf over every element of every timed output, where it lives
            if any(row):
                raise CheckFailed(f"timed output wrong although the checked calls were right (lazy, stale or "
                                  f"garbage results when timed): {sum(row)} output elements are NaN/Inf on timed "
                                  f"call {self.counter['timed'] - n + i + 1}")
        return got, wall, counts, calls

    # -- the harness twin ----------------------------------------------------------------------

    def _start_twin(self, job: dict[str, Any]) -> None:
        """The twin's job: the same case, layout and strictness as the kernel's, no backend code. A twin that
        cannot start leaves H = 0 (the kernel's time is then the parent's whole batch time: never short)."""
        fd = arena_file(self.layout.nbytes)
        try:
            self.twin_buf = mmap.mmap(fd, self.layout.nbytes)
            _thaw_twin(self.twin)
            reply = expect(self.twin.start({**job, "required_features": ()}, fd, self._remaining()), "prepared")
        except Exception:  # noqa: BLE001 - no twin: the conservative figure, never a failed record
            self._drop_twin()
            return
        finally:
            os.close(fd)
        if reply.get("skip") or replies.fault(reply):
            self._drop_twin()
            return
        self.accounting.twin = True

    def _drop_twin(self) -> None:
        twin, self.twin = self.twin, None
        if twin is not None:
            try:
                _thaw_twin(twin)  # stopped after its last batch: it must run to hear the end
                twin.request(("end",), 5.0)
            except Exception:  # noqa: BLE001 - a twin's end is best effort
                pass

    def _twin_batch(self, n: int) -> None:
        """The harness's cost of a timed batch of ``n`` calls: the same loop with an empty call in the twin (new
        keys every call, outputs poisoned, shadowed, scanned and copied into its arena), the parent's time of it
        less the twin's own samples."""
        calls = [[slot, self.source.key("twin", self.twin_counter + slot)] for slot in range(n)]
        self.twin_counter += n
        message = {"kind": "empty", "calls": calls, **self._timed_message(n)}
        freeze = getattr(self.twin, "freeze", None)
        try:
            _thaw_twin(self.twin)  # stopped and continued like the kernel's worker: the same wake-up in its time
            sent = time.perf_counter_ns()
            answer = self.twin.request(("batch", message), self._remaining())
            received = time.perf_counter_ns()
            if callable(freeze):
                freeze()
            payload = expect(answer, "batch")
            if replies.fault(payload):
                raise CheckFailed(replies.fault(payload))
            got = replies.samples(payload, n, "empty")
        except Exception:  # noqa: BLE001 - the twin is the harness's own: it failing is never the kernel's record
            self._drop_twin()
            return
        self.accounting.harness.append((n, max(0.0, (received - sent) * 1e-9 - sum(got))))

    def _verify_timed(self, calls: list, wall: float = 0.0) -> None:
        """A timed batch's outputs, judged after its reply: a trusted library's one call, picked now, on rows
        picked now; an untrusted kernel's every call, each on CALL_ROWS rows picked now, and one of them, picked
        now, on TIMED_ROWS rows with its inputs checked unchanged. So a kernel wrong on a few percent of its timed
        calls fails every record that holds one such call (docs/integrity.md, "Every timed call is checked")."""
        if not self.trusted:
            self._verify_untrusted(calls, wall)
            return
        full = int(self.rng.integers(len(calls)))
        slot, key = calls[full]
        # a trusted library's inputs were checked unchanged on the correctness calls; an untrusted kernel's are
        # checked on the call verified in full
        (got,) = self._collect([slot], inputs=not self.trusted)
        # fewer rows and no uniform-attention reference: the correctness trials did the full check;
        # these catch answers that change when timed
        self._judge_timed(key, got, min(self.ctx.check.max_rows, TIMED_ROWS))
        if self.trusted:
            return
        rest = [c for i, c in enumerate(calls) if i != full]
        if len(rest) > self.collect_cap:  # outputs too large to copy a whole batch's: as many as fit, picked now
            picked = sorted(self.rng.choice(len(rest), size=self.collect_cap, replace=False))
            rest = [rest[int(i)] for i in picked]
        if rest:
            outputs = self._collect([s for s, _ in rest], inputs=False)
            for (_, key), got in zip(rest, outputs):
                self._judge_timed(key, got, min(self.ctx.check.max_rows, CALL_ROWS))

    def _verify_untrusted(self, calls: list, wall: float) -> None:
        """An untrusted kernel's timed batch, verified while its worker is stopped, from the arena its outputs were
        copied into inside the batch's window: as many calls whole as fit in VERIFY_SHARE of the batch's parent
        time (one at least, picked now), the others on CALL_ROWS rows picked now; NaN/Inf over every element of
        each. Then the arena is read again: changed while the worker was stopped, it was written from outside the
        stopped processes. Last (the worker running again), the inputs of one call verified whole are compared with
        a regeneration."""
        copied = min(len(calls), self.layout.slots)
        order = [int(i) for i in self.rng.permutation(copied)]
        outputs = {}
        for j in order:
            outputs[j] = {name: np.array(view, copy=True) for name, view in self.layout.output_views(self.buf, j).items()}
        whole = 1
        for rank, j in enumerate(order):
            rows = WHOLE if rank < whole else min(self.ctx.check.max_rows, CALL_ROWS)
            since = time.perf_counter()
            self._judge_timed(calls[j][1], outputs[j], rows)
            if rank == 0:  # the first call (picked at random) verified whole sets how many more are
                cost = max(time.perf_counter() - since, 1e-6)
                self.whole_cost = cost if self.whole_cost is None else min(self.whole_cost, cost)
                whole = int(max(1, min(copied, VERIFY_SHARE * wall / self.whole_cost)))
        if self.frozen:
            for j in order:
                for name, view in self.layout.output_views(self.buf, j).items():
                    if not np.array_equal(view, outputs[j][name], equal_nan=True):
                        raise CheckFailed(f"outputs forged: timed call {j + 1}'s output {name!r} changed in the "
                                          f"arena while the worker was stopped (a process outside the stopped "
                                          f"sandbox wrote it)")
        # outputs too large for the arena to hold a whole batch's (huge cases on a large GPU pool): the calls past
        # it are counted for NaN/Inf where they live (the batch's scan), not verified on rows
        self._request(("collect", {"slots": [calls[order[0]][0]], "inputs": True, "outputs": False}), "collected")

    def _judge_timed(self, key, got: dict[str, np.ndarray], rows: int) -> None:
        try:
            verify(self.ctx, self.case, self.source.inputs(key), got, "a timed call", self.rng, max_rows=rows,
                   uniform=False)
        except CheckFailed as exc:
            raise self._timed_wrong(exc, key) from None

    def _timed_wrong(self, exc: CheckFailed, key) -> CheckFailed:
        """The failure of a timed call's output, named for what it is. "Lazy or stale" only when the output is
        wrong beyond what the same backend showed on the same rows: its correctness calls' outputs (kept) are
        judged on those rows, and the same call (same inputs) is run again as a checked call in buffers the
        kernel never saw; if either is as wrong, the kernel is simply inaccurate there (rows near a zero
        reference, inputs it handles badly): an accuracy failure, not an integrity accusation."""
        if hasattr(exc, "rows"):  # a relative L2 or trivial-predictor failure on these rows (not NaN/Inf)
            rows = exc.rows
            try:
                for trial, (check_key, got) in enumerate(self.checked):
                    verify(self.ctx, self.case, self.source.inputs(check_key), got, f"trial {trial} on the same rows",
                           self.rng, uniform=False, rows=rows)
                self._batch("check", [[RECHECK_SLOT, key]])
                (again,) = self._collect([RECHECK_SLOT], inputs=not self.trusted)
                verify(self.ctx, self.case, self.source.inputs(key), again, "the same call checked untimed",
                       self.rng, uniform=False, rows=rows)
            except CheckFailed as recheck:
                return CheckFailed(f"{exc.args[0]}, and {recheck.args[0]}: the output is wrong there, timed or "
                                   f"not", *exc.args[1:2])
        return CheckFailed(f"timed output wrong although the checked calls were right (lazy, stale or garbage "
                           f"results when timed): {exc.args[0]}", *exc.args[1:2])

    def sustain(self, seconds: float, median: float) -> dict[str, Any] | None:
        """Energy, power and clocks over a sustained loop of back-to-back calls, bounded by the parent's clock."""
        payload, sent, received = self._request(("sustain", {"seconds": float(seconds)}), "sustained")
        facts = payload.get("energy")
        if not isinstance(facts, dict):
            return None
        wall = (received - sent) * 1e-9
        calls, window = facts.get("calls"), facts.get("seconds")
        ok = (isinstance(calls, int) and calls > 0 and isinstance(window, (int, float)) and 0 < window <= wall
              and calls * median * 0.5 <= window)
        if not ok:
            raise CheckFailed(f"energy loop does not add up: {calls!r} calls in {window!r} s reported, "
                              f"{wall:.3g} s on the parent's clock, median {median:.3g} s per call")
        return {**facts, "method": "sustained loop", "parent_seconds": wall}

    def close(self) -> None:
        self._thaw()
        if self.twin is not None:
            self._drop_twin()
        if self.twin_buf is not None:
            try:
                self.twin_buf.close()
            except BufferError:
                pass
            self.twin_buf = None
        if self.buf is not None:
            try:
                self.buf.close()
            except BufferError:
                pass
            self.buf = None


def _thaw_twin(twin) -> None:
    thaw = getattr(twin, "thaw", None)
    if callable(thaw):
        thaw()


def _harness_twin(channel):
    """The channel's harness twin (kbench.judge.accounting), or None where it has none."""
    make = getattr(channel, "harness_twin", None)
    if not callable(make):
        return None
    try:
        return make()
    except Exception:  # noqa: BLE001 - no twin: H = 0, the conservative figure
        return None


def forbidden_ops(ctx) -> tuple[str, ...]:
    """Torch operators the worker watches for in an untrusted kernel's untimed calls (none when allowed)."""
    from kbench.judge.policy import FORBIDDEN_OPS

    allowed = ctx.integrity.allowed_calls
    return tuple(p for p in FORBIDDEN_OPS if not any(a in p or p in a for a in allowed))


def judge(ctx, channel, backend_name: str, case, *, timeout: float | None = None,
          trusted: bool = True) -> dict[str, Any]:
    """One record for (backend, case), made here from what the channel's worker reports.

    Never raises for anything the worker or its kernel did: every outcome is a record.
    """
    t0 = time.perf_counter()
    rec = new_record(backend_name, case, ctx.device.name)
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
    except ProtocolError as exc:
        rec["status"], rec["reason"] = Status.FAILED.value, f"the worker's reply broke the protocol: {exc}"
        _end(channel, j)
    except KernelError as exc:
        rec["status"] = Status.ERROR.value
        rec["reason"] = str(exc.reply.get("reason"))
        if exc.reply.get("audit"):  # refused by the worker's audit hook: the kernel did what it may not
            rec["status"], rec["reason"] = Status.FAILED.value, exc.reply["audit"][0]
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
    except Exception as exc:  # noqa: BLE001 - a bug of ours on data a worker sent: this record, not the run
        rec.update(status=Status.ERROR.value, cause="infrastructure",
                   reason=f"the judge failed on this record: {type(exc).__name__}: {str(exc)[:500]}")
        _end(channel, j)
    finally:
        j.close()
    if rec.get("status") == Status.SKIPPED.value:
        rec.pop("integrity", None)
    rec["duration"] = time.perf_counter() - t0
    accounting = (rec.get("timing") or {}).get("accounting")
    if isinstance(accounting, dict) and rec["duration"] > 0:
        # the kernel's share of everything this record cost the parent (worker start-up excluded)
        accounting["kernel_fraction"] = accounting["sample_seconds"] / rec["duration"]
    return rec


def _end(channel, j: Judge) -> None:
    """Release the worker's kernel and buffers after a failure (a worker that is gone needs nothing)."""
    j._thaw()  # a worker stopped after its last reply hears the end (or is killed) running
    if j.ended:
        return
    try:
        channel.request(("end",), j._remaining() or 5.0)
    except Exception:  # noqa: BLE001 - the record is decided; the channel's state is the worker's problem
        pass
