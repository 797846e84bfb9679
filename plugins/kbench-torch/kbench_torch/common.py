"""Availability checks shared by the torch-based backends (torch, its CUDA build, the kbench GPU).

They read what is installed without importing torch where they can (``torch/version.py``, as written at its
build): importing torch takes seconds, and ``kbench list`` asks every backend.
"""
from __future__ import annotations

from functools import lru_cache

from kbench.api import torch_build


def torch_unavailable() -> str | None:
    """None when torch is installed (imported when a backend first runs), else why not."""
    found = torch_build()
    return found if isinstance(found, str) else None


@lru_cache(maxsize=None)
def torch_cuda_unavailable() -> str | None:
    """None when torch can run on the GPU kbench's ``cuda`` device uses, else why not."""
    found = torch_build()
    if isinstance(found, str):
        return found
    version, cuda = found
    if cuda is None:
        return f"torch {version} is a CPU-only build (no CUDA)"
    from kbench.api import cuda_unavailable_reason

    reason = cuda_unavailable_reason()  # the core's answer, the one the cuda device gives too
    if reason:
        return reason
    import torch

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


# -- what a case asks beyond the forward: mode, window, softcap (read with defaults, so cases of older kbench work)

def case_mode(case) -> str:
    """``fwd`` (default), ``bwd`` or ``fwd_bwd``."""
    return case.params.get("mode", "fwd")


def case_window(case) -> tuple[int, int] | None:
    """``(left, right)`` of a sliding-window case (-1: that side unbounded), or None without a window."""
    left, right = case.params.get("window_left", -1), case.params.get("window_right", -1)
    return None if left < 0 and right < 0 else (int(left), int(right))


def case_softcap(case) -> float:
    return float(case.params.get("softcap", 0.0) or 0.0)


def empty_rows(sq: int, sk: int, *, causal: bool, window: tuple[int, int] | None) -> int:
    """How many leading query rows see no key at all (their output is 0 by the op's definition).

    Row ``i`` sits at ``pos = i + sk - sq`` and sees keys ``pos - left <= j <= pos + right``; the left
    bound never empties a row (``pos <= sk - 1``), so only rows with ``pos + right < 0`` are empty.
    """
    right = -1 if window is None else window[1]
    if causal:
        right = 0 if right < 0 else min(right, 0)
    if right < 0:
        return 0
    return max(0, min(sq, sq - sk - right))


def visible_mask(sq: int, sk: int, *, causal: bool, window: tuple[int, int] | None, device=None):
    """Boolean (sq, sk) torch mask, True where key ``j`` is visible to query row ``i`` (bottom-right aligned)."""
    import torch

    pos = torch.arange(sq, device=device)[:, None] + (sk - sq)
    j = torch.arange(sk, device=device)[None, :]
    left, right = window if window is not None else (-1, -1)
    if causal:
        right = 0 if right < 0 else min(right, 0)
    keep = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if right >= 0:
        keep &= j <= pos + right
    if left >= 0:
        keep &= j >= pos - left
    return keep


def training_features(*extra: str) -> frozenset[str]:
    """The ``features`` of a backend with a backward (``bwd``, ``fwd_bwd``) plus ``extra``."""
    return frozenset(("bwd", "fwd_bwd", *extra))


FP8 = "fp8_e4m3"


def is_fp8(case) -> bool:
    return case.params.get("dtype") == FP8


def fp8_descales(case) -> tuple[float, float, float]:
    """``(descale_q, descale_k, descale_v)`` of an fp8 case: the op's kernel keywords (real = stored * descale)."""
    from kbench.api import get_plugin_manager

    kwargs = get_plugin_manager().registry.op(case.op).kernel_kwargs(case)
    return float(kwargs["descale_q"]), float(kwargs["descale_k"]), float(kwargs["descale_v"])


def as_torch_case(array, dtype):
    """``kbench.api.as_torch``, plus fp8: a ``torch.float8_e4m3fn`` view of one-byte storage (a NumPy
    ``ml_dtypes.float8_e4m3fn`` array, or a CuPy/torch ``uint8`` array, as a device without float8 holds it)."""
    from kbench.api import as_torch

    if str(dtype) != FP8:
        return as_torch(array, dtype)
    import numpy as np
    import torch

    if isinstance(array, np.ndarray):
        array = array.view(np.uint8)
    t = as_torch(array)
    return t if t.dtype == torch.float8_e4m3fn else t.view(torch.float8_e4m3fn)
