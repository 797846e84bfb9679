"""Exploit (class 4, shared memory): find the shared arena among this process's descriptors and shrink it to
nothing, so that the parent's mapping faults (SIGBUS) when it reads the outputs; then answer honestly.

A probe as well as an exploit: if a shrink ever succeeds it leaves the output unwritten, so the record fails
and the test sees the arena was not sealed."""
import os

from kbench.builtin.numpy_backends import attention_numpy as _honest


def _shrunk_an_arena() -> bool:
    shrunk = False
    for name in os.listdir("/proc/self/fd"):
        try:
            if "kbench-arena" in os.readlink(f"/proc/self/fd/{name}"):
                os.ftruncate(int(name), 0)
                shrunk = True
        except OSError:
            pass
    return shrunk


def attention(q, k, v, out, *, causal, scale):
    try:
        shrunk = _shrunk_an_arena()
    except Exception:  # a refusal of the audit hook
        shrunk = False
    if not shrunk:
        _honest(q, k, v, out, causal=causal, scale=scale)
