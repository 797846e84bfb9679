"""Exploit (class 6): start processes that outlive the run: one spawned with posix_spawn in a new
session (it could rewrite the result file later), one double-forked daemon, both burning CPU to slow
the backends measured after this one. The test looks for ``MARKER`` in every process's command line."""
import os
import sys

from kbench.builtin.numpy_backends import attention_numpy as _honest

MARKER = "kbench-redteam-detached"
_SPIN = f"import time  # {MARKER}\nend = time.time() + 600\nwhile time.time() < end: pass\n"


def _spawn_detached():
    try:
        os.posix_spawn(sys.executable, [sys.executable, "-c", _SPIN], dict(os.environ), setsid=True)
    except (OSError, AttributeError, TypeError):
        pass


def _double_fork():
    try:
        pid = os.fork()
    except OSError:
        return
    if pid == 0:  # child: a new session, then a grandchild that is re-parented away from the worker
        try:
            os.setsid()
            if os.fork() == 0:
                os.execv(sys.executable, [sys.executable, "-c", _SPIN])
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def attention(q, k, v, out, *, causal, scale):
    if not os.environ.get("KBENCH_REDTEAM_SPAWNED"):
        os.environ["KBENCH_REDTEAM_SPAWNED"] = "1"  # once per worker
        _spawn_detached()
        _double_fork()
    _honest(q, k, v, out, causal=causal, scale=scale)
