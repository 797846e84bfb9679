"""Worker scratch directories: named after the run that owns them, removed by the next run when that one died.

A run killed with SIGKILL cannot clean up after itself, so its workers' directories would stay in the
temporary directory forever. Each directory is named ``kbench-worker-<owner pid>-<random>``; the next
``kbench run`` (in :func:`kbench.run.runner.plan_run`) removes those whose owner is no longer alive.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

PREFIX = "kbench-worker-"
_NAME = re.compile(rf"^{re.escape(PREFIX)}(\d+)-")


def worker_prefix() -> str:
    """The ``prefix=`` for ``tempfile.mkdtemp`` of a worker scratch dir owned by this process."""
    return f"{PREFIX}{os.getpid()}-"


def make_worker_dir() -> str:
    """A new scratch directory owned by this process."""
    return tempfile.mkdtemp(prefix=worker_prefix())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def remove_stale_worker_dirs(directory: str | Path | None = None) -> list[Path]:
    """Remove this user's worker scratch dirs whose owner process is dead; the removed paths."""
    root = Path(directory or tempfile.gettempdir())
    removed = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    uid = os.getuid()
    for entry in entries:
        match = _NAME.match(entry.name)
        if not match:
            continue
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat(follow_symlinks=False).st_uid != uid:
                continue
        except OSError:
            continue
        pid = int(match.group(1))
        if pid != os.getpid() and not _alive(pid):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(Path(entry.path))
    return removed
