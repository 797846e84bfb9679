"""Lazy access to CuPy and the CUDA runtime: which GPU, is it usable, and why not.

Nothing here imports CuPy at module import time; every function that needs it imports it when
called and turns a missing library, driver or GPU into a reason string instead of an exception.
"""
from __future__ import annotations

import os
import re
from functools import lru_cache
from typing import Any

#: environment variable choosing the CUDA device index kbench uses (default 0)
DEVICE_ENV = "KBENCH_CUDA_DEVICE"

#: kbench stores bf16 on the GPU as uint16 CuPy arrays (CuPy has no bfloat16); see docs/gpu.md
BF16_STORAGE = "uint16"
#: a quiet-NaN bit pattern of bfloat16, used to poison bf16 output buffers
BF16_NAN_BITS = 0x7FC0


def device_index() -> int:
    """The CUDA device index kbench measures on (``KBENCH_CUDA_DEVICE``, default 0)."""
    raw = os.environ.get(DEVICE_ENV, "0").strip() or "0"
    try:
        return int(raw)
    except ValueError:
        return 0


def cupy():
    """The ``cupy`` module (imported on first use)."""
    import cupy as cp

    return cp


def unavailable_reason(index: int | None = None) -> str | None:
    """``None`` if CUDA device ``index`` is usable through CuPy, else why not, in the runtime's words."""
    return _unavailable_reason(device_index() if index is None else index)


@lru_cache(maxsize=None)
def _unavailable_reason(index: int) -> str | None:
    try:
        cp = cupy()
    except Exception as exc:  # noqa: BLE001 - ImportError, or a CUDA library CuPy could not load
        return f"cupy is not importable: {type(exc).__name__}: {exc}"
    try:
        count = cp.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 - CUDARuntimeError: no driver, driver too old, no GPU
        return f"CUDA runtime: {exc}"
    if count == 0:
        return "CUDA runtime: no CUDA device is visible (CUDA_VISIBLE_DEVICES?)"
    if not 0 <= index < count:
        return f"{DEVICE_ENV}={index} but only {count} CUDA device(s) are visible"
    try:
        with cp.cuda.Device(index):
            cp.zeros(1, dtype=cp.float32).sum().item()  # a real launch: catches a broken context early
    except Exception as exc:  # noqa: BLE001
        return f"CUDA device {index} is not usable: {type(exc).__name__}: {exc}"
    return None


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


def is_out_of_memory(exc: BaseException) -> bool:
    """CuPy's and torch's out-of-memory errors (and cuBLAS/cuDNN alloc failures) by name and message."""
    text = f"{type(exc).__name__}: {exc}".lower()
    return "outofmemory" in type(exc).__name__.lower() or "out of memory" in text or "alloc_failed" in text


def oom_as_memory_error(kernel):
    """Wrap a kernel so a GPU out-of-memory error becomes ``MemoryError``: the record says "out of memory"."""
    def run(**arrays):
        try:
            return kernel(**arrays)
        except MemoryError:
            raise
        except Exception as exc:  # noqa: BLE001 - only OOM is translated; the rest propagates unchanged
            if is_out_of_memory(exc):
                raise MemoryError(str(exc)) from exc
            raise
    return run
