"""Crash: read far outside an array through a strided view (native code faults: the worker dies with SIGSEGV).

No ctypes: the audit hook refuses that before it can crash, while a kernel's own native bug looks like this.
"""
import numpy as np

from kbench.builtin.numpy_backends import attention_numpy as _honest


def attention(q, k, v, out, *, causal, scale):
    wild = np.lib.stride_tricks.as_strided(q, shape=(2,), strides=(1 << 46,))
    out[...] = float(wild[1])
