"""Zero-copy views between kbench's arrays and torch tensors: the core's (``kbench.api``), re-exported.

The interop lives in the core (``kbench.devices.interop``, public through ``kbench.api``) so that every
plugin shares it without importing this one; this module keeps the names importable from here for code
written against earlier releases. ``as_torch(array, dtype)``: NumPy / CuPy / DLPack -> torch tensor;
``to_device_array(tensor)``: torch CUDA tensor -> CuPy array (bf16 as uint16 bit patterns).
"""
from __future__ import annotations

from kbench.api import as_cupy, as_numpy, as_torch, to_device_array, torch_dtype

__all__ = ["as_torch", "as_numpy", "as_cupy", "to_device_array", "torch_dtype"]
