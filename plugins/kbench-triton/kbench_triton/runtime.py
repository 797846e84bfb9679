"""Lazy access to Triton and a CUDA build of torch: is the ``triton`` backend usable here, and why not."""
from __future__ import annotations

import importlib.util
import os
from functools import lru_cache

from kbench.api import torch_build


def triton_version() -> str | None:
    try:
        import triton
    except Exception:  # noqa: BLE001 - absent or broken: the reason comes from unavailable_reason()
        return None
    return triton.__version__


@lru_cache(maxsize=None)
def unavailable_reason() -> str | None:
    """``None`` when Triton can launch kernels on a CUDA GPU through torch, else the precise reason."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return "TRITON_INTERPRET is set: Triton's interpreter runs kernels on the CPU, for tests, not for timing"
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed: pip install triton"
    build = torch_build()  # without importing torch (seconds): the cheap answers first
    if isinstance(build, str):
        return build
    version, cuda = build
    if cuda is None:
        return f"torch {version} is a build without CUDA (Triton launches through a CUDA torch)"
    try:
        import torch
        import triton  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        return f"triton or torch is not importable: {type(exc).__name__}: {exc}"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA GPU (torch.cuda.is_available() is False)"
    return None


def capability_below(minimum: tuple[int, int], what: str) -> str | None:
    """Why the current CUDA GPU cannot run a kernel that needs compute capability ``minimum``, or None."""
    import torch

    major, minor = torch.cuda.get_device_capability()
    if (major, minor) < minimum:
        return f"{what} need compute capability {minimum[0]}.{minimum[1]}; this GPU is {major}.{minor}"
    return None


def environment() -> dict:
    version = triton_version()
    return {} if version is None else {"triton": version}
