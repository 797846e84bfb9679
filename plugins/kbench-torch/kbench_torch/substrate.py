"""``SUBSTRATE = "torch"``: CPU kernel files written with torch tensor operations.

The kernel function receives torch CPU tensors that share memory with the harness's NumPy arrays
(``q, k, v, out``, layout ``(batch, seqlen, heads, head_dim)``; bf16 as ``torch.bfloat16``) and
writes ``out`` or returns a tensor of its shape. It competes with ``torch-sdpa`` on the same
library, so the core's static policy (``kbench.integrity.DEFAULT_FORBIDDEN_CALLS``) refuses
``scaled_dot_product_attention``, ``torch.nn.functional.*attention*``, ``MultiheadAttention``,
FlashAttention and cuDNN calls before any of the file runs: the kernel has to build attention from
matrix products, reductions and elementwise operations.

Threads: torch's intra-op thread count is the harness's business, never the kernel's. It is set
here to the same value ``torch-sdpa`` uses (``KBENCH_TORCH_THREADS``, default 1), so a comparison
of the two runs both with equal thread counts; :func:`torch_threads` is what is recorded.
"""
from __future__ import annotations

import os
from typing import Any, Callable

from kbench.api import Case, Substrate

#: torch-sdpa's default (kbench_torch.sdpa.TorchSDPA): one intra-op thread
DEFAULT_THREADS = 1


def torch_threads() -> int:
    """Intra-op threads for torch kernel files: ``KBENCH_TORCH_THREADS`` (0 = torch's default), else 1."""
    env = os.environ.get("KBENCH_TORCH_THREADS", "").strip()
    return int(env) if env.isdigit() else DEFAULT_THREADS


class TorchCPUSubstrate(Substrate):
    """Kernel files with ``SUBSTRATE = "torch"`` on the ``cpu`` device (torch tensors, zero-copy)."""

    name = "torch"
    device = "cpu"

    def available(self) -> str | None:
        from kbench_torch.common import torch_unavailable

        return torch_unavailable()

    def adapt(self, fn: Callable[..., Any], case: Case, kwargs: dict[str, Any]) -> Callable[..., Any]:
        import torch

        from kbench.api import as_torch

        dtype = case.dtype
        threads = torch_threads()
        if threads > 0:
            torch.set_num_threads(threads)

        def run(out, **inputs):
            tensors = [as_torch(x, dtype) for x in (*inputs.values(), out)]
            result = fn(*tensors, **kwargs)
            if result is None or result is tensors[-1]:
                return None
            if not isinstance(result, torch.Tensor) or tuple(result.shape) != tuple(tensors[-1].shape):
                raise TypeError(f"a torch kernel file must write `out` or return a tensor of shape "
                                f"{tuple(tensors[-1].shape)}, got {type(result).__name__} "
                                f"{tuple(getattr(result, 'shape', ()))}")
            tensors[-1].copy_(result)  # into the harness's buffer: a wrong dtype is converted, not hidden
            return None
        return run
