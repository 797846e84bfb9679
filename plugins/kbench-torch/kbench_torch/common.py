"""Availability checks shared by the torch-based backends (torch, its CUDA build, the kbench GPU)."""
from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=None)
def torch_unavailable() -> str | None:
    try:
        import torch  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - ImportError or a broken install
        return f"torch is not importable: {type(exc).__name__}: {exc}"
    return None


@lru_cache(maxsize=None)
def torch_cuda_unavailable() -> str | None:
    """None when torch can run on the GPU kbench's ``cuda`` device uses, else why not."""
    reason = torch_unavailable()
    if reason:
        return reason
    import torch

    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build (no CUDA)"
    from kbench.api import cuda_unavailable_reason

    reason = cuda_unavailable_reason()  # the core's answer, the one the cuda device gives too
    if reason:
        return reason
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no usable GPU"
    return None


def cuda_capability() -> tuple[int, int]:
    import torch

    from kbench.api import cuda_device_index

    return torch.cuda.get_device_capability(cuda_device_index())


def torch_device():
    import torch

    from kbench.api import cuda_device_index

    return torch.device("cuda", cuda_device_index())


def torch_info() -> dict:
    import torch

    info = {"torch": torch.__version__, "torch_cuda": torch.version.cuda}
    if torch.version.cuda is not None and torch.backends.cudnn.is_available():
        info["torch_cudnn"] = torch.backends.cudnn.version()
    return info
