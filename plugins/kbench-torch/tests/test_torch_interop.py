"""as_torch: zero-copy views of kbench's arrays (NumPy incl. ml_dtypes bf16; CuPy on a GPU)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

from kbench.api import DType, as_torch, torch_dtype


@pytest.mark.parametrize("dtype", list(DType))
def test_numpy_views_share_memory(dtype):
    host = np.random.default_rng(1).standard_normal((2, 5, 3, 4)).astype(dtype.numpy)
    t = as_torch(host, dtype)
    assert t.dtype == torch_dtype(dtype) and tuple(t.shape) == host.shape
    assert t.data_ptr() == host.ctypes.data                       # the same memory
    assert np.array_equal(t.float().numpy(), host.astype(np.float32))
    t[0, 0, 0, 0] = 7.0                                           # a write through torch shows in NumPy
    assert float(host[0, 0, 0, 0]) == 7.0


def test_bf16_bits_are_reinterpreted_not_converted():
    host = np.array([1.0, -2.5, 3.140625, np.inf], dtype=ml_dtypes.bfloat16)
    t = as_torch(host)
    assert t.dtype == torch.bfloat16
    assert np.array_equal(t.view(torch.int16).numpy(), host.view(np.int16))
    bits = host.view(np.uint16)                                   # the device storage convention
    t2 = as_torch(bits, DType.BF16)
    assert t2.dtype == torch.bfloat16 and t2.data_ptr() == bits.ctypes.data
    assert t2.tolist() == [1.0, -2.5, 3.140625, float("inf")]


def test_strided_views_stay_views():
    host = np.zeros((2, 6, 4, 8), dtype=ml_dtypes.bfloat16)
    t = as_torch(host).transpose(1, 2)                           # (b, h, s, d) view of (b, s, h, d)
    t[1, 2, 3, 4] = 1.5
    assert float(host[1, 3, 2, 4]) == 1.5


def test_torch_tensors_pass_through():
    x = torch.arange(4, dtype=torch.int16)
    assert as_torch(x) is x
    assert as_torch(x, DType.BF16).dtype == torch.bfloat16


@pytest.mark.gpu
def test_cupy_views_share_memory():
    from kbench.api import cuda_unavailable_reason

    reason = cuda_unavailable_reason()
    if reason or torch.version.cuda is None:
        pytest.skip(f"no CUDA GPU for CuPy and torch: {reason or 'CPU-only torch'}")
    import cupy

    from kbench.api import to_device_array

    bits = cupy.asarray(np.array([1.0, 2.0], dtype=ml_dtypes.bfloat16).view(np.uint16))
    t = as_torch(bits, DType.BF16)
    assert t.dtype == torch.bfloat16 and t.data_ptr() == bits.data.ptr and t.tolist() == [1.0, 2.0]
    back = to_device_array(t)
    assert back.dtype == cupy.uint16 and back.data.ptr == bits.data.ptr
