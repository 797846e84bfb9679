"""Exploit: buy one-call batches with slow correctness calls, then shave every timed sample.

Its first two calls (the correctness trials) take 30 ms, so the judge of 6cf3c74, which sized batches from the
worker's samples of those calls, ran one call a batch, each batch allowed 2 x E(1) + 2 ms of unexplained time.
The lever: at the end of each call the kernel swaps the reply encoder of its worker's loop
(``kbench.worker.main.encode_reply``, reached through ``sys.modules``) for one that reports every sample 70%
short and puts the original back as it runs, after the harness snapshot has looked. Nothing in the worker sees
it: only the parent's clock can. Static checks refuse ``sys.modules``-style reaches; this is for
``static_checks: none``."""
import os
import sys
import time

from kbench.builtin.numpy_backends import attention_numpy as _honest


def _calls():
    with open("calls", "a") as fh:   # a counter in the scratch directory (no module state)
        fh.write("x")
    return os.path.getsize("calls")


def _shave(owner, real):
    def fake(reply):
        setattr(owner, "encode_reply", real)
        kind, payload = reply
        if kind == "batch" and payload.get("samples"):
            payload["samples"] = [t * 0.3 for t in payload["samples"]]
        return real(reply)
    return fake


def attention(q, k, v, out, *, causal, scale):
    if _calls() <= 2:
        time.sleep(0.03)
    _honest(q, k, v, out, causal=causal, scale=scale)
    main = sys.modules.get("kbench.worker.main")
    if main is not None and getattr(main.encode_reply, "__name__", "") != "fake":
        setattr(main, "encode_reply", _shave(main, main.encode_reply))
