"""Output paths of every command: checked before the work, written atomically, errors as clean messages.

One place decides what happens when an output cannot be written (read-only directory, disk full, the
file-size limit, a path under a regular file, a directory where a file is wanted): a
:class:`~kbench.errors.OutputError` (exit 2) that names the file, says why in words and what to do.
Result files also get an exclusive lock held for the whole run (:class:`ResultLock`), so two runs
never write one file.
"""
from __future__ import annotations

import atexit
import errno
import fcntl
import os
import secrets
import tempfile
from pathlib import Path
from typing import Any, Callable

from kbench.errors import BadInput, OutputError

_REASONS = {
    errno.ENOSPC: ("the disk is full", "free some space"),
    errno.EDQUOT: ("the disk quota is exhausted", "free some space or raise the quota"),
    errno.EFBIG: ("the file would exceed the file-size limit (ulimit -f)", "raise the limit (ulimit -f unlimited)"),
    errno.EROFS: ("the file system is read-only", "write somewhere else (-o PATH)"),
    errno.EACCES: ("permission denied", "write somewhere you may write (-o PATH), or fix the permissions"),
    errno.EPERM: ("permission denied", "write somewhere you may write (-o PATH), or fix the permissions"),
    errno.ENOTDIR: ("a part of the path is a file, not a directory", "give a path whose directories are directories"),
    # mkdir(exist_ok=True) over a regular file
    errno.EEXIST: ("a part of the path is a file, not a directory", "give a path whose directories are directories"),
    errno.EISDIR: ("it is a directory", "give a file name inside it"),
    errno.ENAMETOOLONG: ("the name is too long", "give a shorter path"),
}


def explain(exc: OSError) -> tuple[str, str]:
    """(why, fix) in words for an OSError from writing a file."""
    why, fix = _REASONS.get(exc.errno or 0, (exc.strerror or str(exc), "check the path and the disk"))
    return why, fix


def current_umask() -> int:
    """The process umask, read without changing it where Linux allows (os.umask alone must set it)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write(path: Path, write: Callable[[Any], None], *, mode: str = "w") -> None:
    """Write through ``write(fh)`` to a temporary file beside ``path``, fsync, then rename over it, so readers
    never see half a file. The file gets the permissions the umask gives a new file (mkstemp makes 0600).
    OSError propagates: callers turn it into their own message (see :func:`output_error`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def output_error(path: Path | str, exc: OSError, *, what: str = "cannot write", kept: str | None = None,
                 option: str | None = None) -> OutputError:
    why, fix = explain(exc)
    message = f"{what}: {why}" + (f" ({exc.strerror})" if exc.strerror and exc.strerror.lower() != why.lower() else "")
    if kept:
        message += f"; {kept}"
    return OutputError(message, file=str(path), where=option, fix=fix)


#: longest file name (bytes) where the file system does not say (NAME_MAX on Linux)
NAME_MAX = 255
#: what a result file's writer adds to its name beside it: ``.NAME.XXXXXXXX.tmp`` (the longest of .journal, .lock)
RESULT_NAME_EXTRA = len("..12345678.tmp")


def check_name_lengths(path: Path, *, option: str, extra: int = 0) -> None:
    """Refuse a path with a part longer than the file system allows (``extra``: bytes the writer adds to the
    last part, for the files it keeps beside it), before anything trips on it halfway."""
    try:
        name_max = os.pathconf(path.parent if path.parent.is_dir() else ".", "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = NAME_MAX
    for i, part in enumerate(path.parts):
        size = len(os.fsencode(part)) + (extra if i == len(path.parts) - 1 else 0)
        if size > name_max:
            beside = f" plus the {extra} kbench adds for the files it keeps beside it" if extra and i == len(path.parts) - 1 else ""
            raise OutputError(f"a name of the path is {len(os.fsencode(part)):,} bytes long{beside}; the file system "
                              f"allows {name_max}", file=_short_path(path), where=option, fix="give a shorter name")


def _short_path(path: Path) -> str:
    text = str(path)
    return text if len(text) <= 120 else f"{text[:60]}...{text[-40:]}"


def check_output_file(path: Path | str, *, option: str = "-o", extra: int = 0) -> Path:
    """Refuse, before any work, an output file that cannot be made: a name too long, a directory, or a parent
    that cannot be made."""
    path = Path(path)
    check_name_lengths(path, option=option, extra=extra)
    if path.is_dir():
        raise OutputError("is a directory; a file is written here", file=str(path), where=option,
                          fix=f"give a file name, e.g. {path / 'report.html'}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise output_error(path, exc, what="cannot create its directory", option=option) from None
    if not path.parent.is_dir():
        raise OutputError("its directory is a file", file=str(path), where=option,
                          fix="give a path whose directories are directories")
    return path


def check_output_dir(path: Path | str, *, option: str) -> Path:
    """Make ``path`` as a directory and prove it is writable (a probe file), before any work."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise OutputError("is a file; a directory is written here", file=str(path), where=option,
                          fix="give a directory path (it is created when missing)")
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".kbench-probe-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise output_error(path, exc, what="cannot write into this directory", option=option) from None
    return path


def write_text(path: Path | str, text: str, *, option: str = "-o") -> Path:
    """Write a text output (report page, calibration...) atomically; failures become an OutputError."""
    path = check_output_file(path, option=option)
    try:
        atomic_write(path, lambda fh: fh.write(text))
    except OSError as exc:
        raise output_error(path, exc, option=option) from None
    return path


def save_figure(fig: Any, path: Path | str, *, option: str, **kwargs: Any) -> Path:
    """``fig.savefig(path)`` with write failures as an OutputError."""
    path = Path(path)
    try:
        fig.savefig(path, **kwargs)
    except OSError as exc:
        raise output_error(path, exc, option=option) from None
    return path


# ------------------------------------------------------------------------------------------------
# Result files: unique default names, one owner at a time
# ------------------------------------------------------------------------------------------------

def unique_result_path(directory: Path, stem: str, stamp: str) -> Path:
    """``<dir>/<stem>-<stamp>-<6 hex>.json``: the random suffix keeps runs started in the same
    millisecond (two shells, a CI matrix) apart; the lock and the existence check catch the rest."""
    while True:
        path = directory / f"{stem}-{stamp}-{secrets.token_hex(3)}.json"
        if not path.exists():
            return path


def lock_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.lock")


class ResultLock:
    """An exclusive ``flock`` on ``.<name>.lock`` beside a result file, held while a run writes it.

    The lock file holds the owner's pid, so a second run names the first. It is removed on release;
    a lock file left by a killed run is not locked and is simply taken over.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.fd: int | None = None
        self.pid: int | None = None

    def acquire(self) -> None:
        lock = lock_path(self.path)
        while True:
            try:
                fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666 & ~current_umask())
            except OSError as exc:
                raise output_error(self.path, exc, what="cannot create the result file's lock",
                                   option="-o") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = _read_pid(fd)
                os.close(fd)
                raise BadInput(f"another kbench run{f' (pid {owner})' if owner else ''} is writing this result file",
                               file=str(self.path), where="-o",
                               fix="wait for it to finish, or write elsewhere (-o OTHER.json, or no -o for a new name)"
                               ) from None
            # the file may have been removed (released) between open and flock: lock the file at the path
            try:
                same = os.fstat(fd).st_ino == os.stat(lock).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd, self.pid = fd, os.getpid()

    def release(self) -> None:
        if self.fd is None or self.pid != os.getpid():  # a forked child never removes its parent's lock
            return
        try:
            os.unlink(lock_path(self.path))
        except OSError:
            pass
        os.close(self.fd)  # closing drops the flock
        self.fd = None


def _read_pid(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 32, 0).decode().strip() or 0) or None
    except (OSError, ValueError):
        return None


#: result locks this process holds, by resolved path: plan_run takes it, the ResultWriter keeps it
_held: dict[Path, ResultLock] = {}


@atexit.register
def _release_all() -> None:
    """A planned run that never wrote (a library caller that only plans) leaves no lock file behind."""
    for path in list(_held):
        release_result_lock(path)


def _key(path: Path) -> Path:
    return Path(os.path.abspath(path))


def hold_result_lock(path: Path) -> ResultLock:
    """The lock on ``path`` for this process: the one already held (taken by :func:`claim_result_file`), or a
    new one (refused with the other run's pid when another process holds it)."""
    key = _key(path)
    lock = _held.get(key)
    if lock is None or lock.fd is None:
        lock = ResultLock(path)
        lock.acquire()
        _held[key] = lock
    return lock


def release_result_lock(path: Path) -> None:
    lock = _held.pop(_key(path), None)
    if lock is not None:
        lock.release()


def claim_result_file(path: Path, *, force: bool = False, resuming: bool = False) -> ResultLock:
    """Before any work: ``path`` can be written, no other run writes it, and an existing file is not
    overwritten unless ``force`` (or it is the run being resumed)."""
    check_output_file(path, option="-o", extra=RESULT_NAME_EXTRA)
    lock = hold_result_lock(path)
    if path.exists() and not (force or resuming):
        release_result_lock(path)
        raise BadInput("the result file already exists", file=str(path), where="-o",
                       fix="give another name, leave out -o for a new unique name, add --force to overwrite it, "
                           "or --resume it to finish an interrupted run")
    return lock


def journal_path(path: Path) -> Path:
    """The append-only journal beside a result file that its run writes records to (kbench.results)."""
    return path.with_name(f".{path.name}.journal")
