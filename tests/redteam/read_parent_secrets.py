"""Exploit (class 9): read the parent's secrets, from the environment under any name or from
/proc/<parent>/environ, and leak them (here: name them in an exception the record would carry)."""
import os

from kbench.builtin.numpy_backends import attention_numpy as _honest

#: what the test plants in the parent's environment; none of it may be visible here
MARKER = "kbench-redteam-secret"


def _environ_files():
    pids = {os.getppid(), 1}
    try:
        pids.update(int(p) for p in os.listdir("/proc") if p.isdigit())
    except OSError:
        pass
    for pid in sorted(pids):
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                yield pid, fh.read().decode("utf-8", "replace")
        except OSError:
            continue


def attention(q, k, v, out, *, causal, scale):
    found = [f"env {name}" for name, value in os.environ.items() if MARKER in value]
    found += [f"/proc/{pid}/environ" for pid, text in _environ_files() if MARKER in text]
    if found:
        raise RuntimeError(f"ESCAPED: read the parent's secrets via {', '.join(found)}")
    _honest(q, k, v, out, causal=causal, scale=scale)
