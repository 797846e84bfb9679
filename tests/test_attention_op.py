"""The attention op: reference against an independent formula, masks, costs, inputs, and the large
references it offers to a plugin (``kbench_float64_reference``)."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

from kbench.enums import DType
from kbench.ops import CaseError
from kbench.ops.attention import OFFLOAD_REFERENCE_FLOPS, AttentionOp, reference_flops
from kbench.testing import make_case


@pytest.fixture(scope="module")
def op():
    return AttentionOp()


def naive_attention(q, k, v, causal):
    """Scalar loops with math.exp: shares nothing with the vectorised reference."""
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    out = np.zeros((b, sq, hq, d))
    for bi in range(b):
        for h in range(hq):
            hk = h // (hq // hkv)
            for i in range(sq):
                keys = [j for j in range(sk) if not causal or j <= i + sk - sq]
                if not keys:
                    continue
                scores = [sum(float(q[bi, i, h, t]) * float(k[bi, j, hk, t]) for t in range(d)) / math.sqrt(d)
                          for j in keys]
                top = max(scores)
                weights = [math.exp(s - top) for s in scores]
                total = sum(weights)
                for t in range(d):
                    out[bi, i, h, t] = sum(w * float(v[bi, j, hk, t]) for w, j in zip(weights, keys)) / total
    return out


@pytest.mark.parametrize("params", [
    dict(batch=2, seqlen=5, heads=2, head_dim=4, causal=False),
    dict(batch=1, seqlen_q=3, seqlen_kv=7, heads_q=4, heads_kv=2, head_dim=4, causal=True),
    dict(batch=1, seqlen_q=6, seqlen_kv=4, heads_q=2, heads_kv=1, head_dim=3, causal=True),
])
def test_reference_matches_naive_loops(op, params):
    case = op.make_case(params)
    inputs = op.make_inputs(case, seed=3)
    ref = op.reference(case, inputs, rows=None)
    assert np.allclose(ref, naive_attention(inputs["q"], inputs["k"], inputs["v"], params["causal"]), atol=1e-12)


def test_row_sampled_reference_equals_full(op):
    case = op.make_case(dict(batch=1, seqlen=40, heads=2, head_dim=8, causal=True))
    inputs = op.make_inputs(case, seed=1)
    rows = op.sample_rows(case, 8, np.random.default_rng(0))
    assert rows is not None and len(rows) == 8 and 0 in rows and 39 in rows
    full = op.reference(case, inputs, None)
    assert np.allclose(op.select(case, full, rows), op.reference(case, inputs, rows))
    assert op.sample_rows(case, 64, np.random.default_rng(0)) is None  # small cases are checked whole


def test_causal_bottom_right_alignment(op):
    # seqlen_q < seqlen_kv: the last query row sees every key, so it equals the non-causal result
    c = op.make_case(dict(seqlen_q=3, seqlen_kv=8, heads=1, head_dim=4, causal=True))
    n = op.make_case(dict(seqlen_q=3, seqlen_kv=8, heads=1, head_dim=4, causal=False))
    x = op.make_inputs(c, seed=0)
    assert np.allclose(op.reference(c, x, None)[:, -1], op.reference(n, x, None)[:, -1])
    assert not np.allclose(op.reference(c, x, None)[:, 0], op.reference(n, x, None)[:, 0])
    # seqlen_q > seqlen_kv: the first rows see no key and are zero
    c = op.make_case(dict(seqlen_q=6, seqlen_kv=2, heads=1, head_dim=4, causal=True))
    ref = op.reference(c, op.make_inputs(c, seed=0), None)
    assert np.all(ref[:, :4] == 0) and np.all(ref[:, 4:] != 0)


def test_flops_bytes_footprint_by_hand(op):
    case = op.make_case(dict(batch=2, seqlen=1024, heads=16, head_dim=128, dtype="bf16"))
    assert op.flops(case) == 4 * 2 * 16 * 1024 * 1024 * 128
    causal = op.make_case(dict(batch=2, seqlen=1024, heads=16, head_dim=128, dtype="bf16", causal=True))
    assert op.flops(causal) == op.flops(case) / 2
    # GQA: K and V are read with heads_kv
    gqa = op.make_case(dict(batch=1, seqlen=4096, heads_q=32, heads_kv=8, head_dim=128, dtype="bf16"))
    assert op.min_bytes(gqa) == 2 * (2 * 4096 * 32 * 128 + 2 * 4096 * 8 * 128)
    # causal with seqlen_q < seqlen_kv counts the visible band: avg_sk = (sk - sq + sk) / 2
    band = op.make_case(dict(seqlen_q=1024, seqlen_kv=4096, heads=1, head_dim=64, causal=True))
    assert op.flops(band) == 2 * 1024 * ((4096 - 1024 + 4096) / 2) * 128


def test_inputs_are_seeded_and_in_the_case_dtype(op):
    case = op.make_case(dict(seqlen=16, heads=2, head_dim=8, dtype="bf16"))
    a, b, c = op.make_inputs(case, 1), op.make_inputs(case, 1), op.make_inputs(case, 2)
    assert a["q"].dtype == DType.BF16.numpy
    assert np.array_equal(a["q"].view(np.uint16), b["q"].view(np.uint16))
    assert not np.array_equal(a["q"].view(np.uint16), c["q"].view(np.uint16))


@pytest.mark.parametrize("params, message", [
    (dict(seqlen=8, heads_q=6, heads_kv=4, head_dim=8), "not a multiple"),
    (dict(seqlen=8, heads=2, head_dim=8, dtype="fp8"), "must be one of"),
    (dict(seqlen=0, heads=2, head_dim=8), ">= 1"),
    (dict(seqlen=8, seqlen_q=4, heads=2, head_dim=8), "both given"),
    (dict(seqlen=8, heads=2, head_dim=8, causal="yes"), "true or false"),
    (dict(seqlen=8, heads=2), "head_dim"),
])
def test_invalid_cases_say_why(op, params, message):
    with pytest.raises(CaseError, match=message):
        op.make_case(params)


def test_large_cases_go_to_the_hook_small_ones_stay_on_the_host(kbench_pm, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    monkeypatch.setenv("KBENCH_PLUGINS", "reference_probe_plugin")
    probe = __import__("reference_probe_plugin")
    probe.CALLS.clear()
    op = kbench_pm.registry.ops["attention"]
    small = make_case(kbench_pm, batch=1, seqlen=64, heads=2, head_dim=32, dtype="fp32")
    inputs = op.make_inputs(small, 0)
    host = op.reference(small, inputs, None)
    assert probe.CALLS == []  # 1e6 flops: the host's
    assert reference_flops(small, None) < OFFLOAD_REFERENCE_FLOPS
    # large enough for the hook: 4 * 1 * 8 * 1024 rows * 2048 keys * 64 = 4.3e9 float64 flops
    large = make_case(kbench_pm, batch=1, seqlen=2048, heads=8, head_dim=64, dtype="fp16")
    rows = np.arange(0, 2048, 2)
    assert reference_flops(large, rows) >= OFFLOAD_REFERENCE_FLOPS
    offloaded = op.reference(large, {}, rows)  # the probe needs no inputs; the host path would fail on {}
    assert probe.CALLS == [large.id] and offloaded.shape == (1, 1024, 8, 64) and np.all(offloaded == probe.MARK)
    assert host.shape == (1, 64, 2, 32) and np.all(np.isfinite(host))
    sys.modules.pop("reference_probe_plugin", None)


@pytest.mark.parametrize("params", [
    dict(batch=2, seqlen=33, heads=2, head_dim=4, causal=False),
    dict(batch=1, seqlen_q=9, seqlen_kv=40, heads_q=4, heads_kv=2, head_dim=4, causal=True),
    dict(batch=1, seqlen_q=40, seqlen_kv=12, heads_q=2, heads_kv=1, head_dim=3, causal=True),
    dict(batch=2, seqlen=50, heads=2, head_dim=4, causal=False, window_left=7, window_right=3),
    dict(batch=1, seqlen=50, heads_q=4, heads_kv=1, head_dim=4, causal=True, window_left=5, window_right=-1),
    dict(batch=1, seqlen_q=30, seqlen_kv=60, heads=1, head_dim=2, causal=False, window_left=-1, window_right=0),
])
@pytest.mark.parametrize("sampled", [False, True])
def test_the_uniform_predictor_is_the_reference_with_q_zero(op, params, sampled):
    """uniform_outputs reads the mean of each row's visible values off prefix sums at the window edges; it must
    equal the full float64 reference run with q = 0 (every visible score equal), rows sampled or not."""
    case = op.make_case(params)
    inputs = op.make_inputs(case, seed=5)
    rows = np.sort(np.random.default_rng(1).choice(case["seqlen_q"], 6, replace=False)) if sampled else None
    fast = op.uniform_outputs(case, inputs, rows)["out"]
    slow = op.reference(case, {**inputs, "q": np.zeros_like(inputs["q"])}, rows)
    assert fast.shape == slow.shape
    assert np.allclose(fast, slow, atol=1e-12, rtol=1e-12)
