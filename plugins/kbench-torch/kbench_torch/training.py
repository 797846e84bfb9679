"""Backward passes through torch autograd for the torch-based backends, in the calling convention of
:class:`kbench.api.TrainingKernel` (docs/backward.md).

:class:`AutogradAttention` is a :class:`kbench.api.TrainingKernel` around a function ``attend(q, k, v)``
on torch tensors in kbench's layout (batch, seqlen, heads, head_dim):

``forward(q, k, v)`` (untimed in mode ``bwd``)
    makes fresh leaf tensors with ``requires_grad`` -- views of the harness's inputs, or float32
    copies when the backend computes in float32 -- and calls ``attend`` on them: autograd records
    the graph and keeps what the library saves for its backward (FlashAttention's log-sum-exp,
    cuDNN's softmax stats, the math path's probabilities). It never sees ``do``.
``backward(saved, do, out, dq, dk, dv)`` (timed)
    ``torch.autograd.grad`` of the output with ``grad_outputs=dO``, then the output and the three
    gradients copied into the harness's buffers (converted to the case dtype).

GQA: ``k`` and ``v`` keep heads_kv heads; however ``attend`` shares them among the query heads
(``enable_gqa``, ``repeat_interleave``, a library's native GQA), autograd sums the gradient of a kv
head over the query heads that read it, which is the op's definition of dK and dV.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable

from kbench.api import DType, TrainingKernel, as_torch, is_out_of_memory


@contextmanager
def memory_errors_named():
    """A GPU out-of-memory error becomes ``MemoryError`` (the record says "out of memory")."""
    try:
        yield
    except MemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - only out-of-memory is translated, the rest propagates
        if is_out_of_memory(exc):
            raise MemoryError(str(exc)) from exc
        raise


class AutogradAttention(TrainingKernel):
    """Forward by ``attend``, backward by torch autograd (module doc)."""

    def __init__(self, attend: Callable[..., Any], dtype: DType, *, compute=None) -> None:
        #: ``attend(q, k, v) -> out`` on (b, s, h, d) torch tensors
        self.attend = attend
        self.dtype = DType(dtype)
        #: the torch dtype the leaves are made in (None: the case dtype, no copy)
        self.compute = compute

    def _leaf(self, array):
        t = as_torch(array, self.dtype).detach()  # a new tensor object on the same memory
        if self.compute is not None and t.dtype != self.compute:
            t = t.to(self.compute)
        return t.requires_grad_(True)

    def forward(self, q, k, v):
        import torch

        with memory_errors_named(), torch.enable_grad():
            leaves = tuple(self._leaf(x) for x in (q, k, v))
            return leaves, self.attend(*leaves)

    def backward(self, saved, do, out, dq, dk, dv):
        import torch

        leaves, o = saved
        with memory_errors_named():
            grad_o = as_torch(do, self.dtype)
            if grad_o.dtype != o.dtype:
                grad_o = grad_o.to(o.dtype)
            grads = torch.autograd.grad(o, leaves, grad_outputs=grad_o)
            for buffer, value in zip((out, dq, dk, dv), (o.detach(), *grads)):
                as_torch(buffer, self.dtype).copy_(value)
        return None
