"""Exploit (work shifting): remember every buffer the harness hands over; during each call, compute the
answers of all the other remembered buffers as they are now, and answer later calls on those buffers from
that stash. It wins when a batch's inputs all exist before its first call (the median then shrinks while
the batch's total stays the same); with inputs generated just before each call, the stash is stale."""
import numpy as np

from kbench.builtin.numpy_backends import attention_numpy as _honest


class _Hoard:
    seen = []          # (q, k, v, out) buffers handed over so far
    answers = {}       # id(q) -> the answer computed ahead of time


def attention(q, k, v, out, *, causal, scale):
    ahead = _Hoard.answers.pop(id(q), None)
    if ahead is not None:
        out[...] = ahead
    else:
        _honest(q, k, v, out, causal=causal, scale=scale)
    for qq, kk, vv, oo in _Hoard.seen:
        if qq is not q and id(qq) not in _Hoard.answers:
            result = np.empty_like(oo)
            _honest(qq, kk, vv, result, causal=causal, scale=scale)
            _Hoard.answers[id(qq)] = result
    if not any(qq is q for qq, _, _, _ in _Hoard.seen):
        _Hoard.seen.append((q, k, v, out))
