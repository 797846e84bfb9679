"""Zero-copy views between the array libraries kernels use: NumPy, CuPy, torch, any DLPack producer.

kbench hands backends NumPy arrays (``cpu`` device) or CuPy arrays (``cuda`` device). bf16 is
``ml_dtypes.bfloat16`` on the host and ``uint16`` bit patterns on the GPU (CuPy has no bfloat16);
here they become ``torch.bfloat16`` (or back) by reinterpreting the 16-bit words, never by
converting. Every function returns a view sharing memory with its argument, or raises
``TypeError`` saying why a view is impossible (host <-> device needs a copy; ask for it with
``allow_copy=True``). torch and CuPy are imported only when an array of theirs is involved, so a
plugin importing this module stays light.

``as_torch(array, dtype)``   NumPy / CuPy / DLPack producer -> torch tensor
``as_numpy(array, dtype)``   torch CPU tensor / DLPack producer on the host -> NumPy array (bf16: ml_dtypes)
``as_cupy(array, dtype)``    torch CUDA tensor / DLPack or CUDA-array-interface producer -> CuPy (bf16: uint16)
``torch_dtype(dtype)``       the torch dtype of a case dtype
``oom_as_memory_error(fn)``  a kernel whose CuPy/torch out-of-memory errors become ``MemoryError``
``cuda_device_index()``      the CUDA device index kbench measures on (``KBENCH_CUDA_DEVICE``, default 0)
``cuda_unavailable_reason()`` ``None`` when that GPU is usable through CuPy, else why not
"""
from __future__ import annotations

import functools
import os
import sys
from typing import Any

import numpy as np

from kbench.enums import DType

__all__ = ["as_torch", "as_numpy", "as_cupy", "to_device_array", "torch_dtype", "is_out_of_memory",
           "oom_as_memory_error", "CUDA_DEVICE_ENV", "cuda_device_index", "cuda_unavailable_reason"]

#: environment variable choosing the CUDA device index kbench uses (default 0)
CUDA_DEVICE_ENV = "KBENCH_CUDA_DEVICE"


def _torch():
    import torch

    return torch


def _is_torch(array: Any) -> bool:
    # only a module already imported can have made the array: never import torch to ask
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(array, torch.Tensor)


def _is_cupy(array: Any) -> bool:
    cupy = sys.modules.get("cupy")
    return cupy is not None and isinstance(array, cupy.ndarray)


def _want(dtype: DType | str | None) -> DType | None:
    return DType(dtype) if dtype is not None else None


def torch_dtype(dtype: DType | str):
    """The torch dtype of a case dtype."""
    return getattr(_torch(), DType(dtype).torch_name)


# --------------------------------------------------------------------------------------------
# to torch


def as_torch(array: Any, dtype: DType | str | None = None):
    """A torch tensor sharing memory with ``array`` (no copy), with dtype ``dtype`` (the case dtype).

    ``array`` is a NumPy array (``ml_dtypes.bfloat16`` included), a CuPy array (bf16 stored as
    ``uint16``), any DLPack producer, or a torch tensor (returned as is, or reinterpreted when
    its storage is 16-bit integers and ``dtype`` is bf16).
    """
    torch = _torch()
    want = _want(dtype)
    if isinstance(array, torch.Tensor):
        if want is DType.BF16 and array.dtype in (torch.int16, torch.uint16):
            return array.view(torch.bfloat16)
        if want is DType.FP8_E4M3 and array.dtype == torch.uint8:  # fp8 stored as its bytes
            return array.view(torch.float8_e4m3fn)
        return array
    if isinstance(array, np.ndarray):
        if array.dtype.name == "bfloat16" or (want is DType.BF16 and array.dtype == np.uint16):
            return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
        if array.dtype.name == "float8_e4m3fn" or (want is DType.FP8_E4M3 and array.dtype == np.uint8):
            return torch.from_numpy(array.view(np.uint8)).view(torch.float8_e4m3fn)
        return torch.from_numpy(array)
    # a device array: CuPy, or another DLPack producer with a .view like CuPy's
    kind = str(getattr(array, "dtype", ""))
    if want is DType.FP8_E4M3 and kind == "uint8":
        return torch.from_dlpack(array).view(torch.float8_e4m3fn)
    if kind == "uint16" or (want is DType.BF16 and kind == "int16"):
        if want not in (None, DType.BF16):
            raise TypeError(f"uint16 device array given for a {want} case; kbench stores only bf16 as uint16")
        return torch.from_dlpack(array.view("int16")).view(torch.bfloat16)
    if not hasattr(array, "__dlpack__"):
        raise TypeError(f"cannot view a {type(array).__module__}.{type(array).__name__} as a torch tensor: "
                        "it is not a NumPy, CuPy or DLPack array")
    return torch.from_dlpack(array)


# --------------------------------------------------------------------------------------------
# to NumPy


def as_numpy(array: Any, dtype: DType | str | None = None, *, allow_copy: bool = False) -> np.ndarray:
    """A NumPy array sharing memory with ``array``: bf16 as ``ml_dtypes.bfloat16``.

    ``array`` is a NumPy array (uint16 bit patterns become bf16 when ``dtype`` is bf16), a torch
    CPU tensor, or a DLPack producer on the host. Device memory (CuPy, CUDA tensors) cannot be
    viewed from the host: a copy is made with ``allow_copy=True``, else ``TypeError``.
    """
    want = _want(dtype)
    bf16 = DType.BF16.numpy
    if isinstance(array, np.ndarray):
        if want is DType.BF16 and array.dtype in (np.uint16, np.int16):
            return array.view(bf16)
        return array
    if _is_torch(array):
        torch = _torch()
        if array.device.type != "cpu":
            if not allow_copy:
                raise TypeError(f"a torch tensor on {array.device} is not host memory: "
                                "pass allow_copy=True to copy it to the host")
            array = array.cpu()
        if array.dtype == torch.bfloat16:
            return array.view(torch.int16).numpy().view(bf16)
        if array.dtype == torch.float8_e4m3fn:
            return array.view(torch.uint8).numpy().view(DType.FP8_E4M3.numpy)
        host = array.numpy()
        return host.view(bf16) if want is DType.BF16 and host.dtype in (np.uint16, np.int16) else host
    if _is_cupy(array):
        if not allow_copy:
            raise TypeError("a CuPy array is device memory: pass allow_copy=True to copy it to the host")
        host = array.get()
        return host.view(bf16) if want is DType.BF16 and host.dtype in (np.uint16, np.int16) else host
    if hasattr(array, "__dlpack__"):
        host = np.from_dlpack(array)
        return host.view(bf16) if want is DType.BF16 and host.dtype in (np.uint16, np.int16) else host
    raise TypeError(f"cannot view a {type(array).__module__}.{type(array).__name__} as a NumPy array")


# --------------------------------------------------------------------------------------------
# to CuPy


def as_cupy(array: Any, dtype: DType | str | None = None, *, allow_copy: bool = False):
    """A CuPy array sharing memory with ``array``; bf16 becomes ``uint16`` bit patterns.

    ``array`` is a CuPy array, a torch CUDA tensor, or any DLPack / ``__cuda_array_interface__``
    producer on the GPU. Host memory (NumPy, CPU tensors) is copied to the device only with
    ``allow_copy=True``, else ``TypeError``.
    """
    want = _want(dtype)
    host_kind = None
    if isinstance(array, np.ndarray):
        host_kind = "a NumPy array"
    elif _is_torch(array) and array.device.type == "cpu":
        host_kind = "a torch CPU tensor"
    if host_kind is not None:
        if not allow_copy:
            raise TypeError(f"{host_kind} is host memory: pass allow_copy=True to copy it to the GPU")
        host = as_numpy(array, want)
        import cupy

        bits = host.view(np.uint16) if host.dtype.name == "bfloat16" else host
        return cupy.asarray(bits)
    import cupy

    if isinstance(array, cupy.ndarray):
        return array
    if _is_torch(array):
        torch = _torch()
        if array.dtype == torch.bfloat16:
            return cupy.from_dlpack(array.view(torch.int16)).view(cupy.uint16)
        return cupy.from_dlpack(array)
    if hasattr(array, "__dlpack__"):
        return cupy.from_dlpack(array)
    if hasattr(array, "__cuda_array_interface__"):
        return cupy.asarray(array)  # CuPy wraps a CUDA array interface without a copy
    raise TypeError(f"cannot view a {type(array).__module__}.{type(array).__name__} as a CuPy array")


def to_device_array(tensor: Any):
    """A CuPy array sharing memory with a CUDA tensor; bf16 becomes uint16 bit patterns."""
    return as_cupy(tensor)


# --------------------------------------------------------------------------------------------
# what the array libraries raise


def is_out_of_memory(exc: BaseException) -> bool:
    """CuPy's and torch's out-of-memory errors (and cuBLAS/cuDNN alloc failures) by name and message."""
    text = f"{type(exc).__name__}: {exc}".lower()
    return "outofmemory" in type(exc).__name__.lower() or "out of memory" in text or "alloc_failed" in text


def oom_as_memory_error(kernel):
    """Wrap a kernel so a GPU out-of-memory error becomes ``MemoryError``: the record says "out of memory"."""
    @functools.wraps(kernel)
    def run(*args, **kwargs):
        try:
            return kernel(*args, **kwargs)
        except MemoryError:
            raise
        except Exception as exc:  # noqa: BLE001 - only OOM is translated; the rest propagates unchanged
            if is_out_of_memory(exc):
                raise MemoryError(str(exc)) from exc
            raise
    return run


# --------------------------------------------------------------------------------------------
# which GPU, and whether it is usable: one answer for the cuda device and every GPU backend
# (kbench-cuda's device, the torch and Triton backends), so that plugins need not import each other


def cuda_device_index() -> int:
    """The CUDA device index kbench measures on (``KBENCH_CUDA_DEVICE``, default 0)."""
    raw = os.environ.get(CUDA_DEVICE_ENV, "0").strip() or "0"
    try:
        return int(raw)
    except ValueError:
        return 0


def cuda_unavailable_reason(index: int | None = None) -> str | None:
    """``None`` if CUDA device ``index`` (default: :func:`cuda_device_index`) is usable through CuPy,
    else why not, in the runtime's words. CuPy is imported here, on the first call."""
    return _cuda_unavailable_reason(cuda_device_index() if index is None else index)


def _no_driver() -> str | None:
    """Why there is no CUDA driver here, known without importing CuPy (0.6 s): on Linux the runtime loads the
    driver library ``libcuda.so.1``; when it cannot be loaded no CUDA call can succeed. None: it loads (or this is
    not Linux), so ask the runtime."""
    if not sys.platform.startswith("linux") or "cupy" in sys.modules:
        return None
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        return f"CUDA runtime: no NVIDIA driver on this machine (libcuda.so.1 cannot be loaded: {exc})"
    return None


@functools.lru_cache(maxsize=None)
def _cuda_unavailable_reason(index: int) -> str | None:
    missing = _no_driver()
    if missing:
        return missing
    try:
        import cupy as cp
    except Exception as exc:  # noqa: BLE001 - ImportError, or a CUDA library CuPy could not load
        return f"cupy is not importable: {type(exc).__name__}: {exc}"
    try:
        count = cp.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 - CUDARuntimeError: no driver, driver too old, no GPU
        return f"CUDA runtime: {exc}"
    if count == 0:
        return "CUDA runtime: no CUDA device is visible (CUDA_VISIBLE_DEVICES?)"
    if not 0 <= index < count:
        return f"{CUDA_DEVICE_ENV}={index} but only {count} CUDA device(s) are visible"
    try:
        with cp.cuda.Device(index):
            cp.zeros(1, dtype=cp.float32).sum().item()  # a real launch: catches a broken context early
    except Exception as exc:  # noqa: BLE001
        return f"CUDA device {index} is not usable: {type(exc).__name__}: {exc}"
    return None


@functools.lru_cache(maxsize=None)
def torch_build() -> tuple[str, str | None] | str:
    """(torch's version, its CUDA version or None for a CPU build), read from its installed ``version.py``
    without importing torch (seconds: ``kbench list`` asks every backend), or why torch is not there."""
    import importlib.util
    import re
    import sys
    from pathlib import Path

    torch = sys.modules.get("torch")
    if torch is not None:  # already imported: ask it
        return str(torch.__version__), torch.version.cuda
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError) as exc:
        return f"torch is not importable: {type(exc).__name__}: {exc}"
    if spec is None or not spec.submodule_search_locations:
        return "torch is not installed: pip install torch"
    try:
        text = (Path(next(iter(spec.submodule_search_locations))) / "version.py").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return f"torch is installed but its version.py is unreadable: {exc}"
    version = re.search(r"^__version__\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", text, re.M)
    cuda = re.search(r"^cuda\s*(?::[^=]*)?=\s*(?:None|['\"]([^'\"]*)['\"])", text, re.M)
    if version is None or cuda is None:
        return "torch is installed but its version.py does not say its version and CUDA build"
    return version.group(1), cuda.group(1) or None
