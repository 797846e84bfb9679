"""dtype fp8_e4m3: inputs with per-tensor scales, descale kwargs, the reference from dequantised inputs, bf16 out."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from kbench.builtin.numpy_backends import NumpyAttention, NumpyFlashAttention, attention_numpy
from kbench.builtin.ops import AttentionOp
from kbench.enums import DType
from kbench.ops import CaseError
from kbench.ops.attention import FP8_AMAX, attention_float64, fp8_descale, softmax_scale

OP = AttentionOp()


def _case(kbench_case, **kw):
    return kbench_case(**{"seqlen": 40, "heads_q": 4, "heads_kv": 2, "head_dim": 16, "dtype": "fp8_e4m3", **kw})


def test_inputs_are_float8_within_range_with_fixed_per_tensor_scales(kbench_case):
    case = _case(kbench_case)
    inputs = OP.make_inputs(case, seed=7)
    assert all(a.dtype == np.dtype(ml_dtypes.float8_e4m3fn) for a in inputs.values())
    for name, arr in inputs.items():
        stored = arr.astype(np.float32)
        assert np.isfinite(stored).all() and np.abs(stored).max() <= 448
        assert np.abs(stored).max() > 100  # the range is used, not a few subnormals
        assert fp8_descale(name) == FP8_AMAX[name] / 448
    kw = OP.kernel_kwargs(case)
    assert kw["descale_q"] != kw["descale_k"] != kw["descale_v"]  # a kernel that mixes them up fails


def test_reference_is_attention_of_the_dequantised_inputs(kbench_case):
    case = _case(kbench_case, causal=True)
    inputs = OP.make_inputs(case, seed=3)
    real = {n: inputs[n].astype(np.float64) * fp8_descale(n) for n in ("q", "k", "v")}
    expected = attention_float64(real["q"], real["k"], real["v"], causal=True, scale=softmax_scale(case))
    np.testing.assert_allclose(OP.reference(case, inputs, None), expected, rtol=1e-12)


def test_output_is_bf16_and_bytes_count_one_byte_inputs(kbench_case):
    case = _case(kbench_case)
    assert OP.output_dtype(case) is DType.BF16
    tensor = 40 * 16  # per head, per batch
    assert OP.min_bytes(case) == 4 * tensor * 1 + 2 * tensor * 2 * 1 + 4 * tensor * 2  # q,k,v fp8; out bf16
    assert OP.required_features(case) == {"fp8"}


def test_fp8_is_forward_only(kbench_case):
    with pytest.raises(CaseError, match="fp8_e4m3 is forward only"):
        _case(kbench_case, mode="bwd")


@pytest.mark.parametrize("backend", [NumpyAttention(), NumpyFlashAttention()])
def test_cpu_backends_skip_fp8(kbench_case, kbench_check, backend):
    rec = kbench_check(backend, _case(kbench_case))
    assert rec["status"] == "skipped" and rec["reason"].startswith("does not implement fp8")


def _fp8_backend(fake_backend, descales):
    class Fp8(type(fake_backend(None))):
        features = frozenset({"fp8"})

    def run(q, k, v, out, case):
        kw = OP.kernel_kwargs(case)
        real = [x.astype(np.float32) * np.float32(kw[f"descale_{n}"] if descales else 1.0)
                for n, x in zip("qkv", (q, k, v))]
        got = np.empty(out.shape, np.float32)
        attention_numpy(*real, got, causal=kw["causal"], scale=kw["scale"])
        out[...] = got.astype(ml_dtypes.bfloat16)
    return Fp8(run)


def test_a_kernel_using_the_descales_passes_and_one_ignoring_them_fails(kbench_case, kbench_check, fake_backend):
    case = _case(kbench_case, causal=True)
    rec = kbench_check(_fp8_backend(fake_backend, True), case)
    assert rec["status"] == "passed", rec.get("reason")
    assert rec["correctness"]["bound"] == DType.FP8_E4M3.default_tolerance
    rec = kbench_check(_fp8_backend(fake_backend, False), case)
    assert rec["status"] == "failed"


def test_a_float32_output_is_refused(kbench_case, kbench_check, fake_backend):
    class Fp8(type(fake_backend(None))):
        features = frozenset({"fp8"})

    def run(q, k, v, out, case):
        return np.zeros(out.shape, np.float32)
    rec = kbench_check(Fp8(run), _case(kbench_case))
    assert rec["status"] == "failed" and "output dtype float32 differs" in rec["reason"]
