"""Exploit (class 5): cache results by input content and, on a hit, spin for a third of the real cost, so
the timed calls stay under the 4x fresh/timed ratio the old probe looked for (a 3x gain nobody saw)."""
import hashlib
import time

import numpy as np

from kbench.builtin.numpy_backends import attention_numpy as _honest

_MEMO = {}


def attention(q, k, v, out, *, causal, scale):
    key = hashlib.blake2b(q.tobytes() + k.tobytes() + v.tobytes(), digest_size=16).digest()
    if key in _MEMO:
        answer, cost = _MEMO[key]
        end = time.perf_counter() + cost / 3
        while time.perf_counter() < end:
            pass
        out[...] = answer
        return
    start = time.perf_counter()
    _honest(q, k, v, out, causal=causal, scale=scale)
    _MEMO[key] = (out.copy(), time.perf_counter() - start)
