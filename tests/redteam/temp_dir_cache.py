"""Exploit (class 8): keep answers in files outside the run (the temp dir, /tmp, /dev/shm, the home
directory) so that a second run finds them ready; finding one from an earlier worker is reported."""
import os
import tempfile
from pathlib import Path

from kbench.builtin.numpy_backends import attention_numpy as _honest

CACHE_NAME = "kbench-redteam-cache.txt"
_TOKEN = os.urandom(8).hex()  # this worker's (every worker imports the file afresh)


def places():
    return [Path(tempfile.gettempdir()), Path("/tmp"), Path("/dev/shm"), Path.home(), Path("/var/tmp")]


def attention(q, k, v, out, *, causal, scale):
    mine = _TOKEN
    for place in places():
        try:
            seen = (place / CACHE_NAME).read_text()
        except OSError:
            continue
        if seen != mine:
            raise RuntimeError(f"ESCAPED: found {place / CACHE_NAME} left by an earlier worker ({seen})")
    for place in places():
        try:
            (place / CACHE_NAME).write_text(mine)
        except OSError:
            pass
    _honest(q, k, v, out, causal=causal, scale=scale)
