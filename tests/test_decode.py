"""decode_attention: costs by hand, causal-by-construction reference, the numpy-decode backend, the suite."""
from __future__ import annotations

import numpy as np
import pytest

from kbench.builtin.numpy_decode import decode_numpy
from kbench.hardware import builtin_profiles
from kbench.ops import CaseError
from kbench.ops.decode import DecodeAttentionOp
from kbench.plugins import PluginManager
from kbench.suite import load_suite
from kbench.testing import FunctionBackend, check_backend, make_case

OP = DecodeAttentionOp()


@pytest.fixture(scope="module")
def pm():
    return PluginManager(load_entry_points=False)


def case(**kw):
    base = {"seqlen_kv": 1000, "heads_q": 8, "heads_kv": 2, "head_dim": 64, "dtype": "fp16"}
    return OP.make_case({**base, **kw})


def test_flops_and_bytes_by_hand():
    c = case()
    # one query token sees all 1000 keys: 4 * b * hq * d * sk = 4 * 8 * 64 * 1000
    assert OP.flops(c) == 2_048_000
    # Q + O: 2 * 1 * 8 * 64; K + V: 2 * 1000 * 2 * 64; fp16 = 2 bytes
    assert OP.min_bytes(c) == (2 * 8 * 64 + 2 * 1000 * 2 * 64) * 2 == 514_048
    # four query tokens: rows see 997, 998, 999, 1000 keys = 3994
    c4 = case(seqlen_q=4)
    assert OP.visible_keys(c4) == 997 + 998 + 999 + 1000
    assert OP.flops(c4) == 4 * 8 * 64 * 3994
    assert c4.id == "decode_attention[b=1,sq=4,sk=1000,hq=8,hkv=2,d=64,fp16]"


def test_intensity_is_far_below_every_ridge():
    # decode at sq=1, bf16: intensity ~ 2 * hq/hkv / 2 bytes = hq/hkv FLOP/byte
    c = case(seqlen_kv=1_000_000, heads_q=64, heads_kv=8, head_dim=128, dtype="bf16")
    intensity = OP.flops(c) / OP.min_bytes(c)
    assert intensity == pytest.approx(8.0, rel=1e-3)
    for p in builtin_profiles():
        ridge = p.ridge("bf16")
        if ridge:
            assert intensity < ridge / 10, p.name


@pytest.mark.parametrize("bad, why", [({"seqlen_q": 17}, "1..16"), ({"seqlen_q": 8, "seqlen_kv": 4}, "cache"),
                                      ({"heads_q": 6, "heads_kv": 4}, "multiple")])
def test_invalid_cases(bad, why):
    with pytest.raises(CaseError, match=why):
        case(**bad)


def test_reference_is_bottom_right_causal():
    c = OP.make_case({"seqlen_q": 3, "seqlen_kv": 5, "heads_q": 2, "heads_kv": 1, "head_dim": 4, "dtype": "fp32"})
    x = OP.make_inputs(c, 0)
    ref = OP.reference(c, x, None)
    q, k, v = (x[n].astype(np.float64) for n in ("q", "k", "v"))
    scale = 1 / np.sqrt(4)
    for i in range(3):            # query row i is token 5 - 3 + i and sees keys 0 .. 2 + i
        for h in range(2):
            s = k[0, : 3 + i, 0] @ q[0, i, h] * scale
            p = np.exp(s - s.max())
            np.testing.assert_allclose(ref[0, i, h], p @ v[0, : 3 + i, 0] / p.sum(), rtol=1e-12)


@pytest.mark.parametrize("sq, sk, block", [(1, 300, 64), (3, 257, 64), (16, 100, 7), (5, 5, 2), (2, 40, 1024)])
def test_numpy_decode_matches_reference_across_block_edges(sq, sk, block):
    c = OP.make_case({"batch": 2, "seqlen_q": sq, "seqlen_kv": sk, "heads_q": 8, "heads_kv": 2, "head_dim": 16})
    x = OP.make_inputs(c, 1)
    out = np.full(OP.output_shape(c), np.nan, dtype=np.float32)
    decode_numpy(x["q"], x["k"], x["v"], out, scale=1 / 4, block_kv=block)
    ref = OP.reference(c, x, None)
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-5


@pytest.mark.parametrize("params", [
    {"seqlen_q": 1, "seqlen_kv": 4096, "heads_q": 8, "heads_kv": 1, "head_dim": 64, "dtype": "fp32"},
    {"seqlen_q": 16, "seqlen_kv": 600, "heads_q": 4, "heads_kv": 2, "head_dim": 32, "dtype": "bf16"},
    {"batch": 2, "seqlen_q": 4, "seqlen_kv": 300, "heads": 4, "head_dim": 32, "dtype": "fp16"},
])
def test_numpy_decode_backend_passes_the_harness(pm, params):
    c = make_case(pm, "decode_attention", **params)
    rec = check_backend(pm, pm.registry.backends["numpy-decode"], c)
    assert rec["status"] == "passed", rec.get("reason")
    assert rec["metrics"]["gbps"] > 0 and rec["metrics"]["footprint"] == OP.min_bytes(c)


def test_a_kernel_that_ignores_the_causal_mask_fails(pm):
    def no_mask(q, k, v, out, case):
        from kbench.builtin.numpy_backends import attention_numpy

        attention_numpy(q, k, v, out, causal=False, scale=1 / np.sqrt(case["head_dim"]))

    c = make_case(pm, "decode_attention", seqlen_q=8, seqlen_kv=16, heads_q=2, heads_kv=1, head_dim=16)
    rec = check_backend(pm, FunctionBackend(no_mask, op="decode_attention"), c)
    assert rec["status"] == "failed" and "relative L2 error" in rec["reason"]


def test_decode_suite_has_cpu_and_cuda_grids(pm):
    suite = load_suite("suites/decode.yaml")
    cpu = suite.plan("cpu", OP).cases
    cuda = suite.plan("cuda", OP).cases
    assert cpu and cuda and all(c.op == "decode_attention" for c in cpu + cuda)
    assert max(c["seqlen_kv"] for c in cuda) >= 1_000_000 > max(c["seqlen_kv"] for c in cpu)
    assert {c["seqlen_q"] for c in cpu} == {1, 4, 16}
    assert any(c["heads_q"] > c["heads_kv"] for c in cpu)
