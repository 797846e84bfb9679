"""Exploit (guard laundering): ``timeit.timeit(SRC)`` registered as the finalizer of an array the kernel returns,
so it runs when the harness lets that array go, with no candidate frame on the stack: the audit hook attributes
its ``gc.get_objects``, compile and exec to timeit.py, and the static check never reads SRC. SRC finds the worker's
call runner and sets an *instance* attribute ``batch`` that reports every timed sample at 30% (stamps stay in
order, inside the window). On 54db9a9 the harness snapshot checked module-level names only, and the record passed
at 0.22-0.38x of an honest kernel. Now the runner's instance attributes are part of the snapshot (harness
tampering), and the parent's clock decides the time anyway: the shaved samples could not lower it."""
import timeit
import weakref

import numpy as np

from kbench.builtin.numpy_backends import attention_numpy as _honest

SRC = '''
import gc
for o in gc.get_objects():
    if type(o).__name__ == "CallRunner" and "batch" not in vars(o):
        real = o.batch
        def batch(kind, calls, scan=True, copy=0, _real=real):
            reply = _real(kind, calls, scan, copy)
            if kind == "timed" and reply.get("samples"):
                reply["samples"] = [t * 0.3 for t in reply["samples"]]
            return reply
        o.batch = batch
'''


def attention(q, k, v, out, *, causal, scale):
    res = np.empty_like(out)
    _honest(q, k, v, res, causal=causal, scale=scale)
    weakref.finalize(res, timeit.timeit, SRC, number=1)
    return res
