"""Zero-copy views between kbench's arrays and torch tensors.

kbench hands backends NumPy arrays (``cpu`` device) or CuPy arrays (``cuda`` device). bf16 is
``ml_dtypes.bfloat16`` on the host and ``uint16`` bit patterns on the GPU (CuPy has no bfloat16);
both become ``torch.bfloat16`` views here by reinterpreting the 16-bit words, never by copying.

``as_torch(array, dtype)``   NumPy / CuPy (or any DLPack producer) -> torch tensor sharing memory
``to_device_array(tensor)``  torch CUDA tensor -> CuPy array sharing memory (bf16 as uint16)
"""
from __future__ import annotations

from typing import Any

import numpy as np

from kbench.enums import DType


def _torch():
    import torch

    return torch


def _is_bf16_host(dtype: np.dtype) -> bool:
    return dtype.name == "bfloat16"


def as_torch(array: Any, dtype: DType | str | None = None):
    """A torch tensor sharing memory with ``array`` (no copy), with dtype ``dtype`` (the case dtype).

    ``array`` is a NumPy array (``ml_dtypes.bfloat16`` included), a CuPy array (bf16 stored as
    ``uint16``), or a torch tensor (returned as is, or reinterpreted when its storage is 16-bit
    integers and ``dtype`` is bf16). Raises ``TypeError`` when the view would need a copy.
    """
    torch = _torch()
    want = DType(dtype) if dtype is not None else None
    if isinstance(array, torch.Tensor):
        if want is DType.BF16 and array.dtype in (torch.int16, torch.uint16):
            return array.view(torch.bfloat16)
        return array
    if isinstance(array, np.ndarray):
        if _is_bf16_host(array.dtype) or (want is DType.BF16 and array.dtype == np.uint16):
            return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(array)
    # a device array: CuPy (or another DLPack producer with .view, like CuPy's)
    dt = str(getattr(array, "dtype", ""))
    if dt == "uint16" or (want is DType.BF16 and dt == "int16"):
        if want not in (None, DType.BF16):
            raise TypeError(f"uint16 device array given for a {want} case; kbench stores only bf16 as uint16")
        return torch.from_dlpack(array.view("int16")).view(torch.bfloat16)
    return torch.from_dlpack(array)


def to_device_array(tensor):
    """A CuPy array sharing memory with a CUDA tensor; bf16 becomes uint16 bit patterns."""
    import cupy

    torch = _torch()
    if tensor.dtype == torch.bfloat16:
        return cupy.from_dlpack(tensor.view(torch.int16)).view(cupy.uint16)
    return cupy.from_dlpack(tensor)


def torch_dtype(dtype: DType | str):
    """The torch dtype of a case dtype."""
    return getattr(_torch(), DType(dtype).torch_name)
