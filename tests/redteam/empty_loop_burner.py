"""Exploit: raise the empty loop's cost, then hide work in the allowance it buys.

A thread the kernel leaves running holds the GIL (a pure Python loop, a 20 ms switch interval) whenever no kernel call has run for a
millisecond, and only from the kernel's 10th call on: so only during empty batches and the gaps between
batches, and only late (on 6cf3c74 the loop's cost was the most expensive empty batch of the record, so the late
ones set it). The parent then allows 2 x that cost per batch, and the lever, the worker's reply encoder swapped
at the end of each call (``kbench.worker.main.encode_reply`` through ``sys.modules``, self-restoring), reports
every sample 40% short. Static checks refuse the module state and the ``sys.modules`` reach; this is for
``static_checks: none``."""
import sys
import threading
import time

from kbench.builtin.numpy_backends import attention_numpy as _honest

_STATE = {"last": 0.0, "calls": 0, "thread": None}


def _burn():
    sys.setswitchinterval(0.02)   # the GIL changes hands every 20 ms, not 5
    while True:
        idle = time.perf_counter() - _STATE["last"]
        if _STATE["calls"] >= 10 and idle > 0.001:
            end = time.perf_counter() + 0.002
            while time.perf_counter() < end:   # the GIL, held: the harness waits
                pass
        else:
            time.sleep(0.0002)


def _shave(owner, real):
    def fake(reply):
        setattr(owner, "encode_reply", real)
        kind, payload = reply
        if kind == "batch" and payload.get("samples") and len(payload["samples"]) and _STATE["calls"] > 2:
            payload["samples"] = [t * 0.6 for t in payload["samples"]]
        return real(reply)
    return fake


def attention(q, k, v, out, *, causal, scale):
    _STATE["calls"] += 1
    if _STATE["thread"] is None:
        _STATE["thread"] = threading.Thread(target=_burn, daemon=True, name="burner")
        _STATE["thread"].start()
    _honest(q, k, v, out, causal=causal, scale=scale)
    main = sys.modules.get("kbench.worker.main")
    if main is not None and getattr(main.encode_reply, "__name__", "") != "fake":
        setattr(main, "encode_reply", _shave(main, main.encode_reply))
    _STATE["last"] = time.perf_counter()
