"""The float64 reference of large cases through ``kbench_float64_reference`` and kbench-cuda's GPU one."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from kbench.ops import attention as attention_op
from kbench.testing import make_case
from kbench_cuda import reference


@pytest.mark.parametrize("causal", [False, True])
def test_array_module_reference_equals_the_host_one(causal):
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, s, h, 32)).astype(np.float16) for s, h in ((40, 6), (70, 2), (70, 2)))
    rows = np.array([0, 5, 17, 39])
    want = attention_op.attention_float64(q[:, rows], k, v, causal=causal, scale=0.2, rows=rows, seqlen_q=40)
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
    assert attention_op.reference_flops(small, None) < attention_op.OFFLOAD_REFERENCE_FLOPS
    # large enough for the hook: 4 * 1 * 8 * 1024 rows * 2048 keys * 64 = 4.3e9 float64 flops
    large = make_case(kbench_pm, batch=1, seqlen=2048, heads=8, head_dim=64, dtype="fp16")
    rows = np.arange(0, 2048, 2)
    assert attention_op.reference_flops(large, rows) >= attention_op.OFFLOAD_REFERENCE_FLOPS
    offloaded = op.reference(large, {}, rows)  # the probe needs no inputs; the host path would fail on {}
    assert probe.CALLS == [large.id] and offloaded.shape == (1, 1024, 8, 64) and np.all(offloaded == probe.MARK)
    assert host.shape == (1, 64, 2, 32) and np.all(np.isfinite(host))
    sys.modules.pop("reference_probe_plugin", None)


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
    want = attention_op.attention_float64(q, inputs["k"], inputs["v"], causal=True,
                                          scale=attention_op.softmax_scale(case), rows=rows, seqlen_q=1000)
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
