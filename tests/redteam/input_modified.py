"""Exploit: use an input as scratch space (and leave it changed)."""
import numpy as np

from kbench.builtin.numpy_backends import attention_numpy as _honest

def attention(q, k, v, out, *, causal, scale):
    _honest(q, k, v, out, causal=causal, scale=scale)
    q *= 0.5
