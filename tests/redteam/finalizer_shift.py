"""Exploit (finalizer shifting): every call returns a fresh, unfilled array and attaches a finalizer to it; the
finalizer of the slot's previous answer computes the current call's heads into the new array. On 54db9a9 the
harness dropped a slot's previous answer right after the stop mark (and in empty batches), so all the work ran
outside every sample, before the shadow copy: the record passed at a fraction of an honest kernel's time. The
previous answer is now let go inside the next call's sample: the finalizer's work is timed (and here it runs
before the new array exists, so the answer is wrong)."""
import weakref

import numpy as np

from kbench.builtin.numpy_backends import attention_numpy as _honest


class _Pending:
    calls = {}     # id(q) -> (q, k, v, causal, scale, the array the next finalizer fills)


def _fill(key):
    item = _Pending.calls.get(key)
    if item is not None:
        q, k, v, causal, scale, res = item
        _honest(q, k, v, res, causal=causal, scale=scale)


def attention(q, k, v, out, *, causal, scale):
    res = np.empty_like(out)
    first = id(q) not in _Pending.calls
    _Pending.calls[id(q)] = (q, k, v, causal, scale, res)
    if first:  # the slot's first call (correctness, warm-up): nothing to hand the work to yet
        _honest(q, k, v, res, causal=causal, scale=scale)
    weakref.finalize(res, _fill, id(q))
    return res
