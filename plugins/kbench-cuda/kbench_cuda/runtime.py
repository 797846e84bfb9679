"""Lazy access to CuPy and the CUDA runtime: which GPU, is it usable, and why not.

Nothing here imports CuPy at module import time; every function that needs it imports it when
called and turns a missing library, driver or GPU into a reason string instead of an exception.
"""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

# which GPU, whether it is usable, and out-of-memory errors: the core's answers (kbench.devices.interop),
# shared with the torch and Triton backends; re-exported under this module's historical names
from kbench.api import (cuda_device_index as device_index, cuda_unavailable_reason as unavailable_reason,
                        is_out_of_memory, oom_as_memory_error)

#: environment variable choosing the CUDA device index kbench uses (default 0); read by device_index()
DEVICE_ENV = "KBENCH_CUDA_DEVICE"

__all__ = ["DEVICE_ENV", "BF16_STORAGE", "BF16_NAN_BITS", "device_index", "cupy", "unavailable_reason", "properties",
           "gpu_name", "slug", "versions", "is_out_of_memory", "oom_as_memory_error"]

#: kbench stores bf16 on the GPU as uint16 CuPy arrays (CuPy has no bfloat16); see docs/gpu.md
BF16_STORAGE = "uint16"
#: a quiet-NaN bit pattern of bfloat16, used to poison bf16 output buffers
BF16_NAN_BITS = 0x7FC0


def cupy():
    """The ``cupy`` module (imported on first use)."""
    import cupy as cp

    return cp


@lru_cache(maxsize=None)
def properties(index: int) -> dict[str, Any]:
    """CUDA device properties of ``index`` as a plain dict (names decoded); the device must be available."""
    cp = cupy()
    props = dict(cp.cuda.runtime.getDeviceProperties(index))
    name = props.get("name", b"")
    props["name"] = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
    try:
        props["pci_bus_id"] = cp.cuda.Device(index).pci_bus_id
    except Exception:  # noqa: BLE001 - only used to find the same GPU in NVML
        props["pci_bus_id"] = None
    return props


def gpu_name(index: int) -> str:
    return properties(index)["name"]


def slug(text: str) -> str:
    """A filesystem-safe lower-case name: ``NVIDIA H200`` -> ``nvidia-h200``."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "gpu"


def versions() -> dict[str, Any]:
    """CuPy, CUDA runtime and driver versions, without importing CuPy if nothing else has."""
    import importlib.metadata as md
    import sys

    out: dict[str, Any] = {}
    for dist in ("cupy-cuda13x", "cupy-cuda12x", "cupy", "nvidia-ml-py"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            continue
    cp = sys.modules.get("cupy")
    if cp is not None and unavailable_reason() is None:
        try:
            out["cuda_runtime"] = cp.cuda.runtime.runtimeGetVersion()
            out["cuda_driver"] = cp.cuda.runtime.driverGetVersion()
        except Exception:  # noqa: BLE001 - environment facts must never fail
            pass
    return out
