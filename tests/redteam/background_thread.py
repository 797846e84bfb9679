"""Exploit: return at once and finish the work in a background thread (the timer stops too early)."""
import numpy as np

from kbench.builtin.numpy_backends import attention_numpy as _honest

import threading
import time


def attention(q, k, v, out, *, causal, scale):
    def late():
        time.sleep(0.002)
        _honest(q, k, v, out, causal=causal, scale=scale)
    threading.Thread(target=late, daemon=True).start()
