"""Exploit (work between batches): write zeros and return at once; a raw thread (``_thread``, which
``threading.enumerate()`` does not list, like a native one) writes the right answer into the same buffer 2 ms
later: after the batch's shadow comparison, while the parent verifies or between batches. On 54db9a9 outputs were
copied only when the judge collected them after the reply, so the late answer could be what got verified. Now the
outputs are copied into the arena inside the batch's window and the worker is stopped from the reply until the
next request: the zeros are what is verified (or the answer lands early, inside the window, and the shadow
comparison sees the output change after the call returned)."""
import _thread
import time

from kbench.builtin.numpy_backends import attention_numpy as _honest


def _later(q, k, v, out, causal, scale):
    time.sleep(0.002)
    _honest(q, k, v, out, causal=causal, scale=scale)


def attention(q, k, v, out, *, causal, scale):
    out[...] = 0.0
    _thread.start_new_thread(_later, (q, k, v, out, causal, scale))
