"""One (backend, case) execution: correctness detection and records (in-process)."""
from __future__ import annotations

import numpy as np
import pytest

from kbench.builtin.numpy_backends import NumpyAttention, NumpyFlashAttention, attention_numpy
from kbench.enums import Status
from kbench.ops.attention import softmax_scale


def honest(q, k, v, out, case):
    attention_numpy(q, k, v, out, causal=case["causal"], scale=softmax_scale(case))


CASES = [
    dict(seqlen=32, heads=2, head_dim=16),
    dict(batch=2, seqlen_q=17, seqlen_kv=45, heads_q=4, heads_kv=2, head_dim=8, causal=True),
    dict(seqlen_q=30, seqlen_kv=9, heads_q=3, heads_kv=1, head_dim=8, causal=True),
    dict(seqlen=24, heads=2, head_dim=16, causal=True, dtype="fp16"),
    dict(seqlen=24, heads=4, head_dim=16, dtype="bf16"),
]


@pytest.mark.parametrize("params", CASES)
@pytest.mark.parametrize("backend", [NumpyAttention(), NumpyFlashAttention(block_q=8, block_k=16),
                                     NumpyFlashAttention()])
def test_numpy_backends_pass(kbench_case, kbench_check, backend, params):
    rec = kbench_check(backend, kbench_case(**params))
    assert rec["status"] == "passed", rec.get("reason")
    assert rec["correctness"]["rel_l2"] <= rec["correctness"]["bound"]
    assert rec["timing"]["samples"] and rec["stats"]["median"] > 0
    assert rec["metrics"]["tflops"] == pytest.approx(rec["metrics"]["flops"] / rec["stats"]["median"] / 1e12)


def test_honest_fake_backend_passes(kbench_case, kbench_check, fake_backend):
    rec = kbench_check(fake_backend(honest), kbench_case(causal=True))
    assert rec["status"] == Status.PASSED.value


def _wrong_scale(q, k, v, out, case):
    attention_numpy(q, k, v, out, causal=case["causal"], scale=1.0)


def _top_left_causal(q, k, v, out, case):
    # the classic mistake: torch-style top-left alignment when seqlen_q != seqlen_kv
    sq, sk = q.shape[1], k.shape[1]
    s = np.einsum("bqhd,bkhd->bhqk", q.astype(np.float32), k.astype(np.float32)) * softmax_scale(case)
    s = np.where(np.arange(sk)[None, :] <= np.arange(sq)[:, None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    out[...] = np.einsum("bhqk,bkhd->bqhd", p / p.sum(-1, keepdims=True), v.astype(np.float32))


def _half_written(q, k, v, out, case):
    honest(q, k, v, out, case)
    out[:, -1] = np.nan  # pretend the tail block was never written


def _zeros(q, k, v, out, case):
    out[...] = 0


def _modifies_input(q, k, v, out, case):
    honest(q, k, v, out, case)
    q[...] = 0


def _returns_input(q, k, v, out, case):
    return q


def _wrong_shape(q, k, v, out, case):
    return np.zeros(out.shape[:-1], dtype=out.dtype)


def _wrong_dtype(q, k, v, out, case):
    res = np.empty(out.shape, dtype=np.float64)
    attention_numpy(q, k, v, res, causal=case["causal"], scale=softmax_scale(case))
    return res


def _raises(q, k, v, out, case):
    raise RuntimeError("kernel exploded")


@pytest.mark.parametrize("fn, status, reason", [
    (_wrong_scale, "failed", "relative L2 error"),
    (_top_left_causal, "failed", "relative L2 error"),
    (_half_written, "failed", "NaN/Inf"),
    (_zeros, "failed", "relative L2 error"),
    (_modifies_input, "failed", "input 'q' was modified"),
    (_returns_input, "failed", "aliases input 'q'"),
    (_wrong_shape, "failed", "output shape"),
    (_wrong_dtype, "failed", "output dtype"),
    (_raises, "error", "RuntimeError: kernel exploded"),
])
def test_wrong_backends_are_caught(kbench_case, kbench_check, fake_backend, fn, status, reason):
    case = kbench_case(seqlen_q=12, seqlen_kv=20, heads=2, head_dim=8, causal=True)
    rec = kbench_check(fake_backend(fn), case)
    assert rec["status"] == status
    assert reason in rec["reason"]
    assert "timing" not in rec or rec.get("timing") is None  # nothing is timed after a wrong answer


def test_unavailable_and_unsupported_are_skipped_with_reasons(kbench_case, kbench_check, fake_backend):
    case = kbench_case()
    rec = kbench_check(fake_backend(honest, available="needs a GPU"), case)
    assert (rec["status"], rec["reason"]) == ("skipped", "needs a GPU")
    rec = kbench_check(fake_backend(honest, supports=lambda c: "head_dim 16 unsupported"), case)
    assert (rec["status"], rec["reason"]) == ("skipped", "head_dim 16 unsupported")


def test_raising_in_supports_is_an_error_record(kbench_case, kbench_check, fake_backend):
    def bad(case):
        raise ValueError("confused")
    rec = kbench_check(fake_backend(honest, supports=bad), kbench_case())
    assert rec["status"] == "error" and "ValueError: confused" in rec["reason"]


def test_backend_of_another_device_is_skipped(kbench_case, kbench_pm, fake_backend):
    from kbench.testing import check_backend

    rec = check_backend(kbench_pm, fake_backend(honest, device="cuda"), kbench_case(), device="cpu")
    assert rec["status"] == "skipped" and "'cuda'" in rec["reason"]


def test_each_trial_uses_fresh_inputs(kbench_case, kbench_check, fake_backend):
    seen = []

    def remember(q, k, v, out, case):
        seen.append(float(q.ravel()[0]))
        honest(q, k, v, out, case)
    rec = kbench_check(fake_backend(remember), kbench_case())
    assert rec["status"] == "passed"
    correctness_calls = seen[:rec["correctness"]["seeds"]]
    assert len(set(correctness_calls)) == len(correctness_calls) >= 2


def test_cached_result_keyed_by_input_identity_fails(kbench_case, kbench_check, fake_backend):
    cache = {}

    def cached(q, k, v, out, case):
        key = q.shape  # same shape on every trial: a cache keyed by shape returns the first answer
        if key not in cache:
            honest(q, k, v, out, case)
            cache[key] = out.copy()
        out[...] = cache[key]
    rec = kbench_check(fake_backend(cached), kbench_case())
    assert rec["status"] == "failed" and "trial 1" in rec["reason"]


def test_cache_by_content_never_hits_when_timed(kbench_case, kbench_check, fake_backend):
    """Every timed call of an untrusted kernel gets input content never seen before: a cache keyed by content
    cannot gain, whatever speed ratio it keeps (decided without measuring speed)."""
    import hashlib

    memo, hits = {}, []

    def cached(q, k, v, out, case):
        key = hashlib.blake2b(q.tobytes() + k.tobytes() + v.tobytes()).digest()
        if key in memo:
            hits.append(key)
            out[...] = memo[key]
            return
        honest(q, k, v, out, case)
        memo[key] = out.copy()
    backend = fake_backend(cached)
    backend.trusted = False  # judged as an untrusted kernel (in this process, for the test)
    rec = kbench_check(backend, kbench_case())
    assert rec["status"] == "passed", rec["reason"]
    timed = len(rec["timing"]["samples"])
    assert timed >= 3 and len(memo) >= timed
    # the warm-up calls precede the first refresh: their content may come back once, never a timed sample's
    assert len(hits) <= rec["timing"]["warmup_calls"]
    assert rec["integrity"]["timed_inputs"].startswith("generated on the device just before each call")


def test_inputs_come_from_the_run_secret_not_the_case_id(kbench_pm, kbench_case, fake_backend):
    """Class 1: the same case gives other inputs under another secret, the same under the same one."""
    from kbench.judge.context import RunContext
    from kbench.run.pool import execute_in_process
    from kbench.testing import TEST_CHECK, TEST_TIMING

    case = kbench_case()

    def first_inputs(secret: bytes) -> list[float]:
        seen = []

        def remember(q, k, v, out, case):
            seen.append(float(q.ravel()[0]))
            honest(q, k, v, out, case)
        ctx = RunContext(op=kbench_pm.registry.op("attention"), device=kbench_pm.registry.device("cpu"),
                         check=TEST_CHECK, timing=TEST_TIMING, secret=secret)
        assert execute_in_process(ctx, fake_backend(remember), case)["status"] == "passed"
        return seen[:TEST_CHECK.seeds]

    a, b = first_inputs(b"a" * 32), first_inputs(b"b" * 32)
    assert a == first_inputs(b"a" * 32) and not set(a) & set(b)


def test_a_worker_is_never_given_the_secret(kbench_pm):
    import pickle

    from kbench.judge.context import RunContext
    from kbench.run.pool import WorkerPool
    from kbench.testing import TEST_CHECK, TEST_TIMING

    ctx = RunContext(op=kbench_pm.registry.op("attention"), device=kbench_pm.registry.device("cpu"),
                     check=TEST_CHECK, timing=TEST_TIMING)
    for sandbox in (True, False):
        assert ctx.secret not in pickle.dumps(WorkerPool(kbench_pm, ctx)._setup(sandbox))


def test_rows_are_picked_after_the_output_exists(kbench_case, kbench_check, fake_backend):
    """Class 2: a kernel that computes a fixed subset of rows fails, whatever subset it bets on."""
    from kbench.suite import CheckSettings

    def some_rows(q, k, v, out, case):
        honest(q, k, v, out, case)
        out[:, 1:-1:2] = 0  # half the middle rows skipped; first and last (always checked) computed
    rec = kbench_check(fake_backend(some_rows), kbench_case(seqlen=256), check=CheckSettings(seeds=2, max_rows=16))
    assert rec["status"] == "failed" and "relative L2 error" in rec["reason"]
    assert rec["correctness"]["rows_checked"] == 16


def test_a_reply_that_is_not_the_protocol_fails_the_record(kbench_pm, kbench_case):
    """Class 4: whatever the runner sends is data; a forged verdict is refused, not believed."""
    from kbench.judge.context import RunContext
    from kbench.judge.judge import judge
    from kbench.run.pool import LocalChannel
    from kbench.testing import TEST_CHECK, TEST_TIMING, FunctionBackend
    from kbench.worker.calls import CallRunner

    class Forger(LocalChannel):
        def request(self, message, timeout):
            if message[0] == "batch":
                return ("record", {"status": "passed", "stats": {"median": 1e-9}})
            return super().request(message, timeout)

    ctx = RunContext(op=kbench_pm.registry.op("attention"), device=kbench_pm.registry.device("cpu"),
                     check=TEST_CHECK, timing=TEST_TIMING)
    backend = FunctionBackend(honest)
    rec = judge(ctx, Forger(CallRunner(ctx.device, ctx.op), backend), "forger", kbench_case())
    assert rec["status"] == "failed" and "the worker sent 'record' where 'batch' was expected" in rec["reason"]


def test_a_20ms_kernel_is_accounted_for_and_never_reported_faster(kbench_case, kbench_check, fake_backend):
    """The parent's accounting must not cost accuracy: a kernel that busy-waits 20 ms is never reported
    faster, and its samples add up on the parent's clock (load only ever adds, so no upper bound is
    asserted; the precision figure is measured by benchmarks/harness_overhead.py)."""
    import time

    from kbench.timing import TimingSettings

    def spin(q, k, v, out, case):
        end = time.perf_counter() + 0.02
        honest(q, k, v, out, case)
        while time.perf_counter() < end:
            pass
    timing = TimingSettings(warmup_calls=1, warmup_time=0.0, min_samples=5, max_samples=8, min_time=0.0,
                            max_time=5.0, target_rel_se=0.0, rotate=2)
    rec = kbench_check(fake_backend(spin), kbench_case(seqlen=16), timing=timing)
    assert rec["status"] == "passed", rec["reason"]
    assert 0.02 <= min(rec["timing"]["samples"])
    acc = rec["timing"]["accounting"]
    assert acc["sample_seconds"] <= acc["parent_seconds"] and acc["calls_per_batch"] == 1
