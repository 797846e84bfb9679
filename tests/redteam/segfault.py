"""Crash: dereference a null pointer through ctypes (the worker dies with SIGSEGV)."""
import numpy as np

from kbench.builtin.numpy_backends import attention_numpy as _honest

import ctypes


def attention(q, k, v, out, *, causal, scale):
    ctypes.string_at(0)
