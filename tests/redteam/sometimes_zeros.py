"""Exploit: zeros on one call in eight (12.5%), the right answer otherwise.

On 6cf3c74 one call of each timed batch was verified, so a record of a few batches of ~20 calls passed more
often than not (5 of 8 records in the issue). Every timed call's output is checked now (a few rows each)."""
import os

from kbench.builtin.numpy_backends import attention_numpy as _honest


def _calls():
    with open("calls", "a") as fh:   # a counter in the scratch directory (no module state)
        fh.write("x")
    return os.path.getsize("calls")


def attention(q, k, v, out, *, causal, scale):
    if _calls() % 8 == 5:
        out[...] = 0.0
        return
    _honest(q, k, v, out, causal=causal, scale=scale)
