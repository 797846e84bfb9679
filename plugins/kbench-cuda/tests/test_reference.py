"""kbench-cuda's float64 reference of large cases (its ``kbench_float64_reference``): the same numbers as the
host's, on the GPU or through the array module it is given."""
from __future__ import annotations

import numpy as np
import pytest

from kbench.api import attention_float64, softmax_scale
from kbench.testing import make_case
from kbench_cuda import reference


@pytest.mark.parametrize("causal", [False, True])
def test_array_module_reference_equals_the_host_one(causal):
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, s, h, 32)).astype(np.float16) for s, h in ((40, 6), (70, 2), (70, 2)))
    rows = np.array([0, 5, 17, 39])
    want = attention_float64(q[:, rows], k, v, causal=causal, scale=0.2, rows=rows, seqlen_q=40)
    got = reference.attention_float64(np, q[:, rows], k, v, causal=causal, scale=0.2, rows=rows, seqlen_q=40)
    assert got.dtype == np.float64 and np.abs(got - want).max() < 1e-12


def test_rows_that_see_no_key_are_zero():
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((1, s, 2, 16)).astype(np.float32) for s in (9, 3, 3))
    got = reference.attention_float64(np, q, k, v, causal=True, scale=0.25)
    assert np.all(got[:, :6] == 0) and np.all(np.isfinite(got))  # rows 0..5 see no key (sq - sk = 6)


def test_no_gpu_means_no_offloaded_reference(kbench_pm):
    pytest.importorskip("cupy")
    from kbench_cuda import runtime

    if runtime.unavailable_reason() is None:
        pytest.skip("a GPU is present")
    case = make_case(kbench_pm, batch=1, seqlen=4096, heads=16, head_dim=128, dtype="bf16")
    assert reference.gpu_reference(case, {}, None) is None


@pytest.mark.gpu
def test_gpu_reference_equals_the_host_one_on_a_gpu(kbench_pm):
    pytest.importorskip("cupy")
    from kbench_cuda import runtime

    if runtime.unavailable_reason() is not None:
        pytest.skip(f"no usable CUDA GPU: {runtime.unavailable_reason()}")
    op = kbench_pm.registry.ops["attention"]
    case = make_case(kbench_pm, batch=1, seqlen_q=1000, seqlen_kv=1500, heads_q=8, heads_kv=2, head_dim=128,
                     causal=True, dtype="bf16")
    inputs = op.make_inputs(case, 0)
    rows = np.array([0, 1, 500, 998, 999])
    got = reference.gpu_reference(case, inputs, rows)
    q = inputs["q"][:, rows]
    want = attention_float64(q, inputs["k"], inputs["v"], causal=True, scale=softmax_scale(case), rows=rows,
                             seqlen_q=1000)
    assert got.dtype == np.float64 and np.abs(got - want).max() < 1e-10


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_inputs_widen_to_float32_exactly_from_their_bytes(dtype):
    """What the GPU reference uploads: the input's own bytes, widened on the device (NumPy stands in for CuPy)."""
    from kbench.api import DType

    wide = np.random.default_rng(5).standard_normal((3, 7, 2, 5)).astype(np.float32) * 100
    host = wide.astype(DType(dtype).numpy)
    got = reference.device_float32(np, host[:, 1:])  # a strided view, as the checked rows are
    assert got.dtype == np.float32 and got.shape == host[:, 1:].shape
    assert np.array_equal(got, host[:, 1:].astype(np.float32))  # bit for bit
