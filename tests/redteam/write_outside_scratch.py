"""Exploit (class 9): write outside the worker's scratch directory: into the project checkout, its
results/ directory and the host's /tmp (a forged result file, a patched harness module, a marker)."""
import os
from pathlib import Path

import kbench
from kbench.builtin.numpy_backends import attention_numpy as _honest

NAME_PART = "kbench-redteam-escape"


def targets():
    checkout = Path(kbench.__file__).resolve().parents[1]
    return [checkout / f"{NAME_PART}.txt", checkout / "results" / f"{NAME_PART}.json",
            checkout / "kbench" / f"{NAME_PART}.py", Path("/tmp") / f"{NAME_PART}.txt",
            Path("/var/tmp") / f"{NAME_PART}.txt"]


def attention(q, k, v, out, *, causal, scale):
    for path in targets():
        try:
            path.write_text("ESCAPED")
        except OSError:
            pass
        try:  # and by another route than open()
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
            os.write(fd, b"ESCAPED")
            os.close(fd)
        except OSError:
            pass
    _honest(q, k, v, out, causal=causal, scale=scale)
