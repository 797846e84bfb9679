"""The timed loop as one design: inputs made just before each call, outputs checked where they live, the
parent's clock bounding every figure, and replies that can only ever fail a record."""
from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from kbench.builtin.numpy_backends import attention_numpy
from kbench.ops.attention import softmax_scale
from kbench.protocol import MAX_REPLY_DEPTH, ProtocolError, arena_file, arena_sealed, decode_reply, encode_reply
from kbench.testing import TEST_CHECK, TEST_TIMING, FunctionBackend
from kbench.timing import TimingSettings


def honest(q, k, v, out, case):
    attention_numpy(q, k, v, out, causal=case["causal"], scale=softmax_scale(case))


def spin(seconds):
    def kernel(q, k, v, out, case):
        end = time.perf_counter() + seconds
        honest(q, k, v, out, case)
        while time.perf_counter() < end:
            pass
    return kernel


def _ctx(pm, **timing):
    from kbench.judge.context import RunContext

    return RunContext(op=pm.registry.op("attention"), device=pm.registry.device("cpu"), check=TEST_CHECK,
                      timing=dataclasses.replace(TEST_TIMING, **timing))


def _judge(pm, case, backend, *, trusted, channel=None, **timing):
    from kbench.judge.judge import judge
    from kbench.run.pool import LocalChannel
    from kbench.worker.calls import CallRunner

    ctx = _ctx(pm, **timing)
    channel = (channel or LocalChannel)(CallRunner(ctx.device, ctx.op), backend)
    return judge(ctx, channel, backend.name, case, trusted=trusted)


def _digest(*arrays) -> str:
    return hashlib.blake2b(b"".join(np.ascontiguousarray(a).tobytes() for a in arrays), digest_size=8).hexdigest()


def test_no_call_can_reach_a_later_calls_inputs(kbench_pm, kbench_case):
    """Work shifting needs a later call's inputs during an earlier call. Every buffer an untrusted kernel ever
    received is remembered and read at each call: none holds the content of a call still to come."""
    seen_buffers, calls = [], []

    def hoarder(q, k, v, out, case):
        visible = {_digest(qq, kk, vv) for qq, kk, vv in seen_buffers}
        calls.append((_digest(q, k, v), visible))
        seen_buffers.append((q, k, v))
        honest(q, k, v, out, case)

    timing = dict(min_samples=12, max_samples=24, warmup_calls=3)
    rec = _judge(kbench_pm, kbench_case(seqlen=16), FunctionBackend(hoarder), trusted=False, **timing)
    assert rec["status"] == "passed", rec["reason"]
    assert rec["timing"]["accounting"]["calls_per_batch"] > 1  # several calls' buffers exist at once
    for i, (content, _) in enumerate(calls):
        for _, visible_before in calls[:i]:
            assert content not in visible_before, f"call {i} content was visible to an earlier call"
    # and every call really had new content, however many buffers there were
    assert len({c for c, _ in calls}) == len(calls)


def test_a_trusted_library_is_timed_do_bench_style_on_inputs_made_once_per_slot(kbench_pm, kbench_case):
    contents = []

    def kernel(q, k, v, out, case):
        contents.append(_digest(q, k, v))
        honest(q, k, v, out, case)

    rec = _judge(kbench_pm, kbench_case(seqlen=16), FunctionBackend(kernel), trusted=True, min_samples=40,
                 max_samples=80, warmup_calls=1, min_time=0.0, target_rel_se=0.0)
    assert rec["status"] == "passed", rec["reason"]
    per_batch, n = rec["timing"]["accounting"]["calls_per_batch"], len(rec["timing"]["samples"])
    timed = contents[-n:]
    assert n > per_batch and len(set(timed)) == per_batch  # one content per slot, reused batch after batch


def test_the_harness_twin_runs_beside_every_timed_batch_in_its_own_runner(kbench_pm, kbench_case, monkeypatch):
    """The twin measures the harness in a runner of its own (another worker in a run): its empty loop never touches
    the kernel's slots, so the outputs verified after a batch are the kernel's (an honest kernel passes with a twin
    batch after every timed one)."""
    import kbench.judge.judge as judge_module

    monkeypatch.setattr(judge_module, "TWIN_FIRST", 1000)
    rec = _judge(kbench_pm, kbench_case(seqlen=16), FunctionBackend(honest), trusted=False, min_samples=6,
                 max_samples=12)
    assert rec["status"] == "passed", rec["reason"]
    acc = rec["timing"]["accounting"]
    assert acc["twin_batches"] == acc["batches"]


def test_a_result_cached_by_buffer_address_is_stale_on_every_timed_call(kbench_pm, kbench_case):
    """Every slot has run once before the first timed call, so a kernel that keeps its answer per buffer
    address is wrong on every timed call, whichever the judge verifies (not only on slots that warmed up)."""
    def by_address():
        cache = {}  # one per record: a freed buffer's address comes back in the next record's slots

        def kernel(q, k, v, out, case):
            key = (q.ctypes.data, k.ctypes.data, v.ctypes.data)
            if key not in cache:
                honest(q, k, v, out, case)
                cache[key] = out.copy()
            out[...] = cache[key]
        return kernel

    for _ in range(4):  # a new secret each time: which call is verified changes
        rec = _judge(kbench_pm, kbench_case(seqlen=16), FunctionBackend(by_address()), trusted=False, min_samples=5,
                     max_samples=5, warmup_calls=1)
        assert rec["status"] == "failed" and "timed output wrong" in rec["reason"], rec["reason"]


class ShrinkingChannel:
    """A worker that reports its timed samples five times shorter than measured (stamps kept consistent)."""

    def __init__(self, runner, backend) -> None:
        from kbench.run.pool import LocalChannel

        self.inner = LocalChannel(runner, backend)

    def start(self, payload, fd, timeout):
        return self.inner.start(payload, fd, timeout)

    def harness_twin(self):  # the twin is the harness's own: the forger cannot reach it
        return self.inner.harness_twin()

    def request(self, message, timeout):
        kind, payload = self.inner.request(message, timeout)
        if message[0] == "batch" and message[1]["kind"] == "timed" and kind == "batch":
            payload["samples"] = [t / 5 for t in payload["samples"]]
        return kind, payload


def test_untrusted_samples_are_the_parents_time_less_the_harness(kbench_pm, kbench_case):
    """Samples reported five times short: an untrusted kernel's record keeps the parent's time of each batch less
    the twin's harness cost (never an accusation); a trusted library's keeps its worker's samples."""
    case = kbench_case(seqlen=16)
    timing = dict(min_samples=6, max_samples=12)
    forged = _judge(kbench_pm, case, FunctionBackend(spin(0.004)), trusted=False, channel=ShrinkingChannel, **timing)
    assert forged["status"] == "passed", forged["reason"]
    assert forged["stats"]["median"] >= 0.004 * 0.9, forged["stats"]
    assert forged["timing"]["samples_kind"] == "parent"
    honest_rec = _judge(kbench_pm, case, FunctionBackend(spin(0.004)), trusted=False, **timing)
    assert honest_rec["status"] == "passed", honest_rec["reason"]
    acc = honest_rec["timing"]["accounting"]
    assert acc["harness_twin"] and acc["twin_batches"] >= 1 and acc["harness_seconds"] > 0
    assert {"parent_clock_decides", "harness_twin"} <= set(honest_rec["integrity"]["checks"])
    # a trusted library is timed on its own samples, without a twin (it does not forge)
    trusted = _judge(kbench_pm, case, FunctionBackend(spin(0.004)), trusted=True, **timing)
    assert trusted["timing"]["samples_kind"] == "worker" and "twin_batches" not in trusted["timing"]["accounting"]


class LateStampChannel(ShrinkingChannel):
    """A worker whose clock runs a second ahead of the parent's."""

    def request(self, message, timeout):
        kind, payload = self.inner.request(message, timeout)
        if kind == "batch":
            payload["window"] = [t + 10**9 for t in payload["window"]]
            payload["stamps"] = [[a + 10**9, b + 10**9] for a, b in payload["stamps"]]
        return kind, payload


def test_a_batch_outside_the_parents_window_fails_trusted_or_not(kbench_pm, kbench_case):
    for trusted in (True, False):
        rec = _judge(kbench_pm, kbench_case(seqlen=16), FunctionBackend(honest), trusted=trusted,
                     channel=LateStampChannel)
        assert rec["status"] == "failed" and "outside the parent's clock window" in rec["reason"], rec["reason"]


def test_a_result_of_a_subclass_is_refused_before_the_harness_touches_it(kbench_pm, kbench_case):
    touched = []

    class Tracked(np.ndarray):
        def __array_finalize__(self, obj):
            touched.append(1)

    def kernel(q, k, v, out, case):
        honest(q, k, v, out, case)
        return out.copy().view(Tracked)

    rec = _judge(kbench_pm, kbench_case(seqlen=16), FunctionBackend(kernel), trusted=False)
    assert rec["status"] == "failed" and "not a ndarray" in rec["reason"] and "exactly that type" in rec["reason"]
    assert len(touched) == 1  # the view the kernel made; the harness refused the result without touching it


def test_a_record_short_of_min_samples_says_so(kbench_pm, kbench_case):
    rec = _judge(kbench_pm, kbench_case(seqlen=16), FunctionBackend(spin(0.01)), trusted=True,
                 min_samples=400, max_samples=1000, max_time=0.05, min_time=0.0, target_rel_se=0.0)
    assert rec["status"] == "passed"
    timing = rec["timing"]
    assert timing["below_min_samples"] is True and 2 <= len(timing["samples"]) < 400
    enough = _judge(kbench_pm, kbench_case(seqlen=16), FunctionBackend(spin(0.001)), trusted=True,
                    min_samples=5, max_samples=50, max_time=0.5)
    assert "below_min_samples" not in enough["timing"] and len(enough["timing"]["samples"]) >= 5


def test_the_untimed_forward_of_a_split_case_is_timed_by_the_parent(kbench_pm, kbench_case):
    from kbench.judge.context import RunContext
    from kbench.judge.judge import judge
    from kbench.run.pool import LocalChannel
    from kbench.worker.calls import CallRunner

    pm = kbench_pm
    backend = pm.registry.backends["numpy"]
    case = kbench_case(seqlen=16, mode="bwd")
    ctx = RunContext(op=pm.registry.op("attention"), device=pm.registry.device("cpu"), check=TEST_CHECK,
                     timing=TEST_TIMING)
    rec = judge(ctx, LocalChannel(CallRunner(ctx.device, ctx.op), backend), "numpy", case, trusted=True)
    assert rec["status"] == "passed", rec["reason"]
    acc = rec["timing"]["accounting"]
    assert acc["untimed_forward_seconds"] > 0 and acc["sample_seconds"] <= acc["parent_seconds"]


# -- replies and the arena -------------------------------------------------------------------------


@pytest.mark.parametrize("data, why", [
    (b"[" * (MAX_REPLY_DEPTH + 1) + b"]" * (MAX_REPLY_DEPTH + 1), "nested deeper"),
    (b"[" * 200_000, "nested deeper"),
    (b'["batch", {"samples": [' + b"9" * 5000 + b"]}]", "not valid JSON"),
    (b'["batch", {"samples": [NaN]}]', "not valid JSON"),
    (b'["batch", {"reason": "' + b"x" * 70_000 + b'"}]', "string of 70000 characters"),
    (b"\xff\xfe", "not valid JSON"),
])
def test_any_bytes_a_worker_sends_are_at_worst_a_protocol_error(data, why):
    with pytest.raises(ProtocolError, match=why):
        decode_reply(data)


def test_replies_round_trip_and_unencodable_ones_become_error_replies():
    assert decode_reply(encode_reply(("batch", {"samples": [np.float32(1.5)], "x": float("nan")}))) == \
        ("batch", {"samples": [1.5], "x": None})
    deep: list = []
    for _ in range(MAX_REPLY_DEPTH + 5):
        deep = [deep]
    kind, payload = decode_reply(encode_reply(("batch", {"deep": deep})))
    assert kind == "error" and "could not be sent" in payload["reason"]


def test_a_protocol_error_is_a_failed_record_not_a_dead_run(kbench_pm, kbench_case):
    class Deep(ShrinkingChannel):
        def request(self, message, timeout):
            if message[0] == "batch":
                return decode_reply(b"[" * 100_000)
            return self.inner.request(message, timeout)

    rec = _judge(kbench_pm, kbench_case(seqlen=16), FunctionBackend(honest), trusted=False, channel=Deep)
    assert rec["status"] == "failed" and "broke the protocol" in rec["reason"] and "nested deeper" in rec["reason"]


def test_the_arena_cannot_change_size():
    fd = arena_file(4096)
    try:
        assert arena_sealed(fd)
        for size in (0, 1 << 20):
            with pytest.raises(PermissionError):
                os.ftruncate(fd, size)
        dup = os.dup(fd)  # a worker's own copy of the descriptor is sealed just the same
        with pytest.raises(PermissionError):
            os.ftruncate(dup, 0)
        os.close(dup)
        with pytest.raises(PermissionError):
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, 0)  # and the seals cannot be changed (F_SEAL_SEAL)
        assert os.fstat(fd).st_size == 4096
    finally:
        os.close(fd)


def test_the_worker_side_imports_neither_judge_nor_runner_nor_scipy():
    code = """
import json, sys, time
t0 = time.perf_counter()
import kbench.worker.main, kbench.worker.calls, kbench.worker.watches, kbench.worker.guard
from kbench.plugins import get_plugin_manager
registry = get_plugin_manager((), worker=True).registry
registry.device("cpu"); registry.op("attention"); registry.backends["numpy"]
bad = sorted(m for m in sys.modules if m.startswith(("kbench.judge", "kbench.run", "kbench.stats", "scipy")))
print(json.dumps(bad))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_energy_loop_figures_are_bounded_by_the_parents_clock(kbench_pm, kbench_case):
    """A device that measures energy reports a sustained loop; figures the parent's clock contradicts fail."""
    from kbench.devices.cpu import CPUDevice

    class Metered(CPUDevice):
        forge = False

        def sustained(self, fn, seconds):
            t0, calls = time.perf_counter(), 0
            while time.perf_counter() - t0 < seconds:
                fn()
                calls += 1
            elapsed = time.perf_counter() - t0
            return {"calls": calls * (100 if self.forge else 1), "seconds": elapsed, "average_w": 10.0,
                    "joules_per_call": 10.0 * elapsed / calls, "source": "test meter"}

    from kbench.judge.context import RunContext
    from kbench.judge.judge import judge
    from kbench.run.pool import LocalChannel
    from kbench.worker.calls import CallRunner

    case = kbench_case(seqlen=16)
    for forge in (False, True):
        device = Metered()
        device.forge = forge
        ctx = RunContext(op=kbench_pm.registry.op("attention"), device=device, check=TEST_CHECK,
                         timing=TimingSettings(**{**dataclasses.asdict(TEST_TIMING), "energy_seconds": 0.05}))
        rec = judge(ctx, LocalChannel(CallRunner(device, ctx.op), FunctionBackend(spin(0.002))), "m", case)
        if forge:
            assert rec["status"] == "failed" and "energy loop does not add up" in rec["reason"]
        else:
            assert rec["status"] == "passed", rec["reason"]
            energy = rec["telemetry"]["energy"]
            assert energy["method"] == "sustained loop" and energy["seconds"] <= energy["parent_seconds"]
            assert energy["calls"] >= 5
