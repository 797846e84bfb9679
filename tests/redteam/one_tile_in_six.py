"""Exploit (one bad tile): right everywhere but on one (row, head) of one call in six, where it writes zeros.

On 54db9a9 four rows of each timed call were checked and one call a batch more: such a kernel passed 1 record in
8. Now as many timed calls per batch as fit in half the batch's parent time are verified whole (every call, when
the reference is cheap beside the kernel, as here), the others on a few rows: docs/integrity.md gives the rate."""
import os

from kbench.builtin.numpy_backends import attention_numpy as _honest


def _calls():
    with open("calls", "a") as fh:   # a counter in the scratch directory (no module state)
        fh.write("x")
    return os.path.getsize("calls")


def attention(q, k, v, out, *, causal, scale):
    _honest(q, k, v, out, causal=causal, scale=scale)
    n = _calls()
    if n % 6 == 5:
        out[0, (n * 37) % out.shape[1], n % out.shape[2], :] = 0.0
