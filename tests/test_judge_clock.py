"""The clock a kernel cannot bend: timers checked before every read against the ones captured at the worker's
start, untrusted batches sized by the parent's clock, an untrusted kernel's time taken from the parent's clock
less the harness's own cost measured by a twin that never ran candidate code, and every candidate object let go
only inside a sample."""
from __future__ import annotations

import dataclasses
import threading
import time

import pytest

from kbench.builtin.numpy_backends import attention_numpy
from kbench.judge.accounting import Accounting
from kbench.ops.attention import softmax_scale
from kbench.testing import TEST_CHECK, TEST_TIMING, FunctionBackend
from test_timed_loop import ShrinkingChannel


def honest(q, k, v, out, case):
    attention_numpy(q, k, v, out, causal=case["causal"], scale=softmax_scale(case))


def _judge(pm, case, backend, *, trusted=False, channel=None, **timing):
    from kbench.judge.context import RunContext
    from kbench.judge.judge import judge
    from kbench.run.pool import LocalChannel
    from kbench.worker.calls import CallRunner

    ctx = RunContext(op=pm.registry.op("attention"), device=pm.registry.device("cpu"), check=TEST_CHECK,
                     timing=dataclasses.replace(TEST_TIMING, **timing))
    channel = (channel or LocalChannel)(CallRunner(ctx.device, ctx.op), backend)
    return judge(ctx, channel, backend.name, case, trusted=trusted)


def _put(owner, name, value):  # setattr through a parameter: no module is named where it happens
    setattr(owner, name, value)


def self_restoring(q, k, v, out, case):
    """Installs, at the end of each call, a perf_counter_ns that reports the call 70% short and puts the original
    back on the read that ends the sample: after the batch, everything is as it was."""
    real = time.perf_counter_ns
    start = real()
    honest(q, k, v, out, case)

    def short():
        _put(time, "perf_counter_ns", real)
        return start + (real() - start) * 3 // 10
    _put(time, "perf_counter_ns", short)


@pytest.mark.parametrize("trusted", [False, True])
def test_a_self_restoring_timer_is_a_fault_never_a_sample(kbench_pm, kbench_case, trusted):
    real = time.perf_counter_ns
    try:
        rec = _judge(kbench_pm, kbench_case(seqlen=16), FunctionBackend(self_restoring), trusted=trusted)
    finally:
        time.perf_counter_ns = real
    assert rec["status"] == "failed", rec["reason"]
    assert "harness tampering: time.perf_counter_ns replaced, seen before a clock read" in rec["reason"]
    assert "call 1 returned" in rec["reason"]   # the first call's stop mark: no sample was ever made with it


def test_a_self_restoring_stop_mark_is_a_fault(kbench_pm, kbench_case):
    """The sample clock's stop method swapped on its class (what the harness reads, beside the timer itself)."""
    import kbench.devices as devices

    real = devices.SampleClock.stop

    def kernel(q, k, v, out, case):
        honest(q, k, v, out, case)

        def stop(self, i):
            _put(devices.SampleClock, "stop", real)
            real(self, i)
            self.marks[i][1] = self.marks[i][0] + (self.marks[i][1] - self.marks[i][0]) // 2
        _put(devices.SampleClock, "stop", stop)
    try:
        rec = _judge(kbench_pm, kbench_case(seqlen=16), FunctionBackend(kernel))
    finally:
        devices.SampleClock.stop = real
    assert rec["status"] == "failed" and "harness tampering: SampleClock.stop replaced" in rec["reason"], \
        rec["reason"]


def test_the_clock_reference_is_the_one_captured_at_import():
    from kbench.worker.watches import CLOCK

    assert CLOCK.intact() and CLOCK.replaced() == []
    real = time.monotonic
    time.monotonic = lambda: 0.0
    try:
        assert CLOCK.replaced() == ["time.monotonic"]
    finally:
        time.monotonic = real
    assert CLOCK.replaced() == []


class ForgingChannel(ShrinkingChannel):
    """A worker whose timed samples come back 2 ms short (at most 70% of one): the lever of any forger (a timer
    trick, a patched clock method) that is not caught by its own check, left to the accounting."""

    def request(self, message, timeout):
        kind, payload = self.inner.request(message, timeout)
        if message[0] == "batch" and message[1]["kind"] == "timed" and kind == "batch":
            payload["samples"] = [t - min(0.002, 0.7 * t) for t in payload["samples"]]
        return kind, payload


def slow_when_checked(seconds=0.03):
    """Slow on its first two calls (the correctness trials), 4 ms afterwards."""
    calls = []

    def kernel(q, k, v, out, case):
        calls.append(1)
        end = time.perf_counter() + (seconds if len(calls) <= 2 else 0.004)
        honest(q, k, v, out, case)
        while time.perf_counter() < end:
            pass
    return kernel


def test_slow_correctness_calls_do_not_buy_one_call_batches(kbench_pm, kbench_case):
    """On 6cf3c74 the batch size came from the worker's correctness samples (30 ms: one call a batch). The
    parent's own clock of each timed batch sizes the next (about 5 calls)."""
    timing = dict(min_samples=40, max_samples=60, max_time=2.0)
    honest_rec = _judge(kbench_pm, kbench_case(seqlen=16), FunctionBackend(slow_when_checked()), **timing)
    assert honest_rec["status"] == "passed", honest_rec["reason"]
    assert honest_rec["timing"]["accounting"]["calls_per_batch"] >= 2


def test_shaved_samples_never_lower_the_parents_total(kbench_pm, kbench_case):
    """A worker whose timed samples come back 2 ms short (at most 70%) of 4 ms calls: the record keeps the
    parent's time less the twin's harness cost, batch by batch; the shaved samples only shape the spread. No
    accusation: the forger passes, at its real speed."""
    timing = dict(min_samples=40, max_samples=60, max_time=2.0)
    case = kbench_case(seqlen=16)
    rec = _judge(kbench_pm, case, FunctionBackend(slow_when_checked()), channel=ForgingChannel, **timing)
    assert rec["status"] == "passed", rec["reason"]
    acc = rec["timing"]["accounting"]
    assert rec["timing"]["samples_kind"] == "parent" and acc["harness_twin"] is True
    # every batch raised to its parent time less the harness's: the samples add up to that, not to the shaved sum
    assert acc["sample_seconds"] >= acc["parent_seconds"] - acc["harness_seconds"] - 1e-9
    assert acc["raised_batches"] >= acc["batches"] / 2   # (a batch whose shaved sum still exceeds W - H keeps it)
    assert rec["stats"]["median"] >= 0.004 * 0.9, rec["stats"]["median"]
    assert sum(rec["timing"]["samples"]) == pytest.approx(acc["sample_seconds"])


def test_the_harness_cost_is_never_above_what_the_twin_measured():
    acc = Accounting(parent_clock=True)
    acc.harness = [(1, 0.001), (8, 0.003), (8, 0.002)]
    assert acc.harness_cost(8) == 0.002          # the smallest measurement at that size
    assert acc.harness_cost(5) == 0.001          # the largest size below it, unscaled
    assert acc.harness_cost(16) == 0.002         # the largest size below it
    acc.harness = [(8, 0.004)]
    assert acc.harness_cost(2) == pytest.approx(0.001)   # only larger sizes: scaled down
    # a batch's samples: its mean, max(worker's sum, W - H) / n, once per call (a spread shaped by the worker could
    # put the batch's time on one call and lower the median)
    assert acc.credit(8, 0.010, [0.0005] * 8) == pytest.approx([0.00075] * 8)
    assert acc.credit(8, 0.010, [0.0001] * 7 + [0.0093]) == pytest.approx([0.00125] * 8)   # its sum is above W - H
    assert acc.summary()["raised_batches"] == 1
    assert acc.batch_means() == pytest.approx([0.00075, 0.00125])
    trusted = Accounting(parent_clock=False)
    assert trusted.credit(8, 1.0, [0.001] * 8) == [0.001] * 8


def finalizer_deferring():
    """Returns a fresh unfilled array each call; the finalizer of the slot's previous answer computes the current
    call's heads into it (tests/redteam/finalizer_shift.py as a callable)."""
    import weakref

    import numpy as np

    pending = {}

    def fill(key):
        item = pending.get(key)
        if item is not None:
            honest(*item)

    def kernel(q, k, v, out, case):
        res = np.empty_like(out)
        first = id(q) not in pending
        pending[id(q)] = (q, k, v, res, case)
        if first:
            honest(q, k, v, res, case)
        weakref.finalize(res, fill, id(q))
        return res
    return kernel


def test_a_finalizer_of_a_returned_array_runs_inside_a_sample(kbench_pm, kbench_case):
    """On 54db9a9 the previous answer of a slot was dropped after the stop mark: the finalizer did the call's
    work untimed and the record passed at a fraction of an honest kernel's time. Now it is dropped inside the next
    call's sample: the work is timed (and too early to help: the record fails, or passes at honest speed)."""
    case, timing = kbench_case(seqlen=128), dict(min_samples=40, max_samples=80, max_time=1.0)
    pairs = [(_judge(kbench_pm, case, FunctionBackend(honest), **timing),
              _judge(kbench_pm, case, FunctionBackend(finalizer_deferring()), **timing)) for _ in range(3)]
    assert all(h["status"] == "passed" for h, _ in pairs), [h["reason"] for h, _ in pairs]
    passed = [r["stats"]["median"] for _, r in pairs if r["status"] == "passed"]
    # the quickest of three, side by side (the machine is shared): no faster than the same maths done honestly
    if passed:
        assert min(passed) >= 0.5 * min(h["stats"]["median"] for h, _ in pairs), pairs


def _first_call_starts(thread_target):
    """A kernel that starts one long-lived thread on its first call (a "pool"), honest otherwise."""
    started = []

    def kernel(q, k, v, out, case):
        if not started:
            started.append(threading.Thread(target=thread_target, daemon=True, name="pool"))
            started[0].start()
        honest(q, k, v, out, case)
    return kernel, started


def test_no_thread_of_an_untrusted_kernel_outlives_its_call(kbench_pm, kbench_case):
    """A thread kept from the first call on (it could hold the GIL during empty batches only, raising the loop's
    cost the accounting allows): 6cf3c74 counted only growth from the second call, and passed it."""
    stop = threading.Event()
    kernel, started = _first_call_starts(lambda: stop.wait(30))
    try:
        rec = _judge(kbench_pm, kbench_case(seqlen=16), FunctionBackend(kernel))
    finally:
        stop.set()
        started[0].join(5)
    assert rec["status"] == "failed", rec["reason"]
    assert "left threads still running: a thread it started ('pool') is alive after call 1 of a check batch" \
        in rec["reason"]


def test_a_trusted_library_may_keep_a_pool(kbench_pm, kbench_case):
    stop = threading.Event()
    kernel, started = _first_call_starts(lambda: stop.wait(30))
    try:
        rec = _judge(kbench_pm, kbench_case(seqlen=16), FunctionBackend(kernel), trusted=True)
    finally:
        stop.set()
        started[0].join(5)
    assert rec["status"] == "passed", rec["reason"]


def test_a_hook_left_by_an_untrusted_kernel_is_a_fault(kbench_pm, kbench_case):
    """NumPy's error callback would run candidate code inside the harness's own NumPy calls (a hook that only
    burns while the harness works: the empty loop)."""
    import numpy as np

    def kernel(q, k, v, out, case):
        honest(q, k, v, out, case)
        np.seterrcall(lambda *a: None)
    saved = np.geterrcall()
    try:
        rec = _judge(kbench_pm, kbench_case(seqlen=16), FunctionBackend(kernel))
    finally:
        np.seterrcall(saved)
    assert rec["status"] == "failed" and "harness tampering: numpy.seterrcall set by the kernel" in rec["reason"], \
        rec["reason"]


class KindChannel(ShrinkingChannel):
    """Tells the kernel which kind of batch it runs in (a test's omniscience, so "wrong on 12% of its timed
    calls" means exactly that)."""

    kind = None

    def request(self, message, timeout):
        KindChannel.kind = message[1].get("kind") if message[0] == "batch" else None
        return self.inner.request(message, timeout)


def test_one_wrong_timed_call_fails_the_record(kbench_pm, kbench_case):
    """Right on every call but the 4th timed one, in a batch of many: that call's output is checked too."""
    tally = {"timed": 0}

    def kernel(q, k, v, out, case):
        honest(q, k, v, out, case)
        if KindChannel.kind == "timed":
            tally["timed"] += 1
            if tally["timed"] == 4:
                out[...] = 0.0
    rec = _judge(kbench_pm, kbench_case(seqlen=16), FunctionBackend(kernel), channel=KindChannel, min_samples=12,
                 max_samples=12)
    assert rec["status"] == "failed" and "on a timed call" in rec["reason"], rec["reason"]


@pytest.mark.slow
def test_a_kernel_wrong_on_a_few_timed_calls_fails_its_records(kbench_pm, kbench_case):
    """Zeros on 12% of the timed calls (a seeded draw per call): every record in which at least 5% of the timed
    calls were wrong fails (the issue asks >= 99%; on 6cf3c74, one verified call a batch, 5 of 8 passed)."""
    import numpy as np

    outcomes = []
    for seed in range(16):
        rng, tally = np.random.default_rng(seed), {"timed": 0, "wrong": 0}

        def kernel(q, k, v, out, case, rng=rng, tally=tally):
            honest(q, k, v, out, case)
            if KindChannel.kind == "timed":
                tally["timed"] += 1
                if rng.random() < 0.12:
                    tally["wrong"] += 1
                    out[...] = 0.0
        rec = _judge(kbench_pm, kbench_case(seqlen=16), FunctionBackend(kernel), channel=KindChannel,
                     min_samples=20, max_samples=30)
        outcomes.append((tally["wrong"] / max(tally["timed"], 1), rec["status"], rec["reason"]))
    wrong_enough = [o for o in outcomes if o[0] >= 0.05]
    assert len(wrong_enough) >= 12, outcomes
    assert all(status == "failed" and "on a timed call" in reason for _, status, reason in wrong_enough), outcomes


def test_one_bad_tile_in_six_timed_calls_fails_nearly_every_record(kbench_pm, kbench_case):
    """Wrong on one (row, head) of every sixth timed call: on 54db9a9 (4 rows a call, one call 32) 1 record in 8
    failed. As many calls a batch as fit in twice its parent time are verified whole, the others on 4 rows:
    docs/integrity.md gives the arithmetic (>= 95% of records: at most one of these 12 may pass)."""
    import numpy as np

    outcomes = []
    for seed in range(12):
        rng, tally = np.random.default_rng(seed), {"timed": 0}

        def kernel(q, k, v, out, case, rng=rng, tally=tally):
            honest(q, k, v, out, case)
            if KindChannel.kind == "timed":
                tally["timed"] += 1
                if tally["timed"] % 6 == 0:
                    out[0, int(rng.integers(out.shape[1])), int(rng.integers(out.shape[2])), :] = 0.0
        rec = _judge(kbench_pm, kbench_case(seqlen=128), FunctionBackend(kernel), channel=KindChannel,
                     min_samples=36, max_samples=48)
        outcomes.append((rec["status"], rec["reason"]))
    failed = [reason for status, reason in outcomes if status == "failed"]
    assert all("on a timed call" in reason for reason in failed), failed
    assert len(failed) >= 11, outcomes
