"""A NumPy attention kernel file with a backward (FEATURES bwd, fwd_bwd): the kernel-file contract's example.

    kbench run suites/training.yaml --device cpu -b tests/kernels/numpy_training.py
"""
from kbench.builtin.numpy_backends import attention_backward_numpy, attention_numpy

FEATURES = ["bwd", "fwd_bwd"]


def attention(q, k, v, out, *, causal, scale):
    attention_numpy(q, k, v, out, causal=causal, scale=scale)


def attention_forward(q, k, v, *, causal, scale):
    """Untimed in mode bwd: keeps the inputs (the backward recomputes P, as FlashAttention does)."""
    return q, k, v


def _heads(x):
    """(b, hkv, group, s, d) -> (b, s, hkv * group, d)."""
    b, hkv, group, s, d = x.shape
    return x.transpose(0, 3, 1, 2, 4).reshape(b, s, hkv * group, d)


def attention_backward(saved, do, out, dq, dk, dv, *, causal, scale):
    q, k, v = saved
    grads = attention_backward_numpy(q, k, v, do, causal=causal, scale=scale)
    out[...] = _heads(grads["out"])
    dq[...] = _heads(grads["dq"])
    dk[...] = grads["dk"]
    dv[...] = grads["dv"]
