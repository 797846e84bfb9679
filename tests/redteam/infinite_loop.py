"""Exploit (or bug): never return."""
import numpy as np

from kbench.builtin.numpy_backends import attention_numpy as _honest

def attention(q, k, v, out, *, causal, scale):
    while True:
        pass
