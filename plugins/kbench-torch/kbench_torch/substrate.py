"""``SUBSTRATE = "torch"``: CPU kernel files written with torch tensor operations.

The kernel function receives torch CPU tensors that share memory with the harness's NumPy arrays
(``q, k, v, out``, layout ``(batch, seqlen, heads, head_dim)``; bf16 as ``torch.bfloat16``) and
writes ``out`` or returns a tensor of its shape. It competes with ``torch-sdpa`` on the same
library, so the core's static policy (``kbench.judge.policy.DEFAULT_FORBIDDEN_CALLS``) refuses
``scaled_dot_product_attention``, ``torch.nn.functional.*attention*``, ``MultiheadAttention``,
FlashAttention and cuDNN calls before any of the file runs: the kernel has to build attention from
matrix products, reductions and elementwise operations.

Backward (docs/backward.md): a file declaring ``FEATURES = ["bwd", "fwd_bwd"]`` defines
``attention_forward(q, k, v, *, causal, scale) -> saved`` and
``attention_backward(saved, do, out, dq, dk, dv, *, causal, scale)`` on torch tensors (or
``attention_fwd_bwd(q, k, v, do, out, dq, dk, dv, ...)``); each output is written in place or
returned (a dict name -> tensor when there are several), and copied into the harness's buffer.

Threads: torch's intra-op thread count is the harness's business, never the kernel's. It is set
here to the same value ``torch-sdpa`` uses (``KBENCH_TORCH_THREADS``, default 1), so a comparison
of the two runs both with equal thread counts; :func:`torch_threads` is what is recorded.
"""
from __future__ import annotations

import os
from typing import Any, Callable

from kbench.api import Case, Substrate, TrainingKernel

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
        tensors_of = _converter(case)
        names = _output_names(case)

        def run(**arrays):
            tensors = tensors_of(arrays)
            outputs = {n: tensors[n] for n in names}
            _store(fn(*tensors.values(), **kwargs), outputs)
            return None
        return run

    def adapt_training(self, forward: Callable[..., Any], backward: Callable[..., Any], case: Case,
                       kwargs: dict[str, Any]) -> TrainingKernel:
        return _TorchFileTraining(forward, backward, kwargs, _converter(case), _output_names(case))


def _output_names(case: Case) -> tuple[str, ...]:
    from kbench.api import get_plugin_manager

    return tuple(get_plugin_manager().registry.op(case.op).output_names(case))


def _converter(case: Case) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Sets the harness's thread count; returns name -> array to name -> torch tensor on the same memory."""
    import torch

    from kbench.api import as_torch
    from kbench_torch.common import as_torch_case

    threads = torch_threads()
    if threads > 0:
        torch.set_num_threads(threads)
    names = set(_output_names(case))
    dtype = case.dtype

    def convert(arrays: dict[str, Any]) -> dict[str, Any]:
        # outputs keep their own dtype (fp8 cases write bf16); inputs are the case's dtype
        return {n: as_torch(a) if n in names else as_torch_case(a, dtype) for n, a in arrays.items()}
    return convert


def _store(result: Any, outputs: dict[str, Any]) -> None:
    """Copy what a kernel returned into the harness's buffers (written in place: nothing to do)."""
    import torch

    if result is None:
        return
    if len(outputs) == 1 and not isinstance(result, dict):
        result = {next(iter(outputs)): result}
    if not isinstance(result, dict):
        raise TypeError(f"a torch kernel file with outputs {', '.join(outputs)} must write them or return a dict "
                        f"name -> tensor, got {type(result).__name__}")
    for name, value in result.items():
        if name not in outputs:
            raise TypeError(f"a torch kernel file returned {name!r}; its outputs are {', '.join(outputs)}")
        buffer = outputs[name]
        if value is buffer:
            continue
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != tuple(buffer.shape):
            raise TypeError(f"a torch kernel file must write `{name}` or return a tensor of shape "
                            f"{tuple(buffer.shape)}, got {type(value).__name__} {tuple(getattr(value, 'shape', ()))}")
        buffer.copy_(value)  # into the harness's buffer: a wrong dtype is converted, not hidden


class _TorchFileTraining(TrainingKernel):
    """A torch kernel file's ``attention_forward`` / ``attention_backward`` on torch tensors."""

    def __init__(self, forward, backward, kwargs, convert, output_names) -> None:
        self._forward, self._backward, self.kwargs = forward, backward, kwargs
        self.convert, self.output_names = convert, output_names

    def forward(self, q, k, v):
        t = self.convert({"q": q, "k": k, "v": v})
        return self._forward(t["q"], t["k"], t["v"], **self.kwargs)

    def backward(self, saved, do, *outputs):
        t = self.convert({"do": do, **dict(zip(self.output_names, outputs))})
        bufs = {n: t[n] for n in self.output_names}
        _store(self._backward(saved, t["do"], *bufs.values(), **self.kwargs), bufs)
        return None
