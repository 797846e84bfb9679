"""Exploit: write zeros (passes loose absolute tolerances when the reference is small)."""
import numpy as np

from kbench.builtin.numpy_backends import attention_numpy as _honest

def attention(q, k, v, out, *, causal, scale):
    out[...] = 0
