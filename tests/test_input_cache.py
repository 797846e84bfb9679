"""The cache of drawn inputs (kbench.ops.inputs.HostInputCache): same bits as a fresh draw, bounded, read-only,
and off wherever an untrusted kernel runs."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kbench.builtin.numpy_backends import attention_numpy
from kbench.ops import inputs as drawn
from kbench.ops.attention import softmax_scale
from kbench.testing import TEST_CHECK, TEST_TIMING, FunctionBackend


@pytest.fixture
def cache(monkeypatch):
    fresh = drawn.HostInputCache(64 * 2**20)
    monkeypatch.setattr(drawn, "CACHE", fresh)
    return fresh


SPEC = drawn.unit_variance((2, 40, 3, 8), "float16")


def test_a_cached_input_is_the_fresh_draw_bit_for_bit(cache):
    key = (12345, 67890)
    first = drawn.generate(SPEC, key, 2)
    assert cache.misses == 1 and cache.hits == 0
    into = np.empty(SPEC.shape, dtype=np.float16)
    again = drawn.generate(SPEC, key, 2, out=into)
    assert again is into and cache.hits == 1
    plain = drawn._draw(SPEC, key, 2, None)
    assert first.tobytes() == plain.tobytes() == into.tobytes()
    assert drawn.generate(SPEC, key, 3).tobytes() != plain.tobytes()  # another stream, another input
    # the judge's row reads: from the cached whole input, equal to drawing only those rows
    specs = {"x": SPEC, "y": SPEC, "q": SPEC}  # q is stream 2, drawn whole above
    index = (slice(None), np.array([0, 7, 39]))
    hits = cache.hits
    cached_rows = drawn.RegeneratedInputs(specs, key).rows("q", index)
    assert cache.hits == hits + 1
    cache.clear()
    drawn_rows = drawn.RegeneratedInputs(specs, key).rows("q", index)
    assert drawn_rows.tobytes() == cached_rows.tobytes() == plain[index].tobytes()


def test_what_the_cache_hands_out_cannot_change_what_it_holds(cache):
    key = (1, 2)
    made = drawn.generate(SPEC, key, 0)
    made[...] = 0  # the caller's own copy
    assert drawn.generate(SPEC, key, 0).tobytes() == drawn._draw(SPEC, key, 0, None).tobytes()
    (kept,) = cache._items.values()
    assert not kept.flags.writeable


def test_the_cache_stays_within_its_bytes_and_drops_the_least_recently_used(cache):
    small = drawn.HostInputCache(4 * SPEC.nbytes)
    for k in range(10):
        small.put(small.ident(SPEC, (k, k), 0), drawn._draw(SPEC, (k, k), 0, None))
        assert small.bytes <= small.max_bytes
    assert small.get(small.ident(SPEC, (0, 0), 0)) is None and small.get(small.ident(SPEC, (9, 9), 0)) is not None
    big = drawn.unit_variance((4 * SPEC.size + 8,), "float16")  # more than a quarter of the limit: never kept
    small.put(small.ident(big, (1, 1), 0), drawn._draw(big, (1, 1), 0, None))
    assert small.get(small.ident(big, (1, 1), 0)) is None
    off = drawn.HostInputCache(2**20)
    off.enabled = False
    off.put(off.ident(SPEC, (1, 1), 0), drawn._draw(SPEC, (1, 1), 0, None))
    assert off.bytes == 0 and off.get(off.ident(SPEC, (1, 1), 0)) is None


def _judge(pm, case, fn, trusted):
    from kbench.judge.context import RunContext
    from kbench.judge.judge import judge
    from kbench.run.pool import LocalChannel
    from kbench.worker.calls import CallRunner

    ctx = RunContext(op=pm.registry.op("attention"), device=pm.registry.device("cpu"), check=TEST_CHECK,
                     timing=dataclasses.replace(TEST_TIMING))
    return judge(ctx, LocalChannel(CallRunner(ctx.device, ctx.op), FunctionBackend(fn)), "k", case, trusted=trusted)


@pytest.mark.parametrize("trusted", [True, False])
def test_an_untrusted_kernel_runs_with_the_cache_off(kbench_pm, kbench_case, cache, trusted):
    seen = []

    def kernel(q, k, v, out, case):
        seen.append(drawn.CACHE.enabled and bool(drawn.CACHE._items))
        attention_numpy(q, k, v, out, causal=case["causal"], scale=softmax_scale(case))

    rec = _judge(kbench_pm, kbench_case(seqlen=16), kernel, trusted)
    assert rec["status"] == "passed", rec["reason"]
    assert seen and all(s is trusted for s in seen[1:])


def test_an_untrusted_kernel_that_rewrites_its_input_and_every_cached_copy_is_still_caught(kbench_pm, kbench_case,
                                                                                           cache):
    def kernel(q, k, v, out, case):
        attention_numpy(q, k, v, out, causal=case["causal"], scale=softmax_scale(case))
        q[...] = 0
        for kept in drawn.CACHE._items.values():  # what a kernel in the worker's process could reach
            kept.flags.writeable = True
            kept[...] = 0

    rec = _judge(kbench_pm, kbench_case(seqlen=16), kernel, trusted=False)
    assert rec["status"] == "failed" and "input 'q' was modified" in rec["reason"], rec["reason"]


def test_in_a_capped_process_the_cache_takes_an_eighth_of_the_cap_at_most():
    assert drawn.cache_within(None) == drawn.CACHE_BYTES
    assert drawn.cache_within(2**40) == drawn.CACHE_BYTES
    assert drawn.cache_within(1 << 30) == (1 << 30) // 8
