"""Output paths of every command: checked before the work, written atomically, errors as clean messages.

One place decides what happens when an output cannot be written (read-only directory, disk full, the
file-size limit, a path under a regular file, a directory where a file is wanted): a
:class:`~kbench.errors.OutputError` (exit 2) that names the file, says why in words and what to do.
Result files also get an exclusive lock held for the whole run (:class:`ResultLock`), so two runs
never write one file.

The one rule for what an output path may be (:func:`output_target`), whatever ``--force`` says: a regular file
(replaced whole) or a new path. A device node, a named pipe, a socket or a directory at the path is refused, and so
is any path in /proc or /sys or on a kernel file system (proc, sysfs, devtmpfs, cgroup...): replacing a device node
with a JSON file breaks it for every user of the machine. A symbolic link is followed: the file it points at is
written (the link stays), under the same rule; a link whose target does not exist is refused, because the file
it would create lies wherever the link says, often far from where the user looked.
"""
from __future__ import annotations

import atexit
import errno
import fcntl
import os
import secrets
import stat
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


#: file systems that are kernel interfaces, not storage: no output is written there
KERNEL_FILE_SYSTEMS = frozenset({"proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "debugfs", "tracefs",
                                 "securityfs", "configfs", "bpf", "pstore", "efivarfs", "fusectl", "binfmt_misc",
                                 "mqueue", "autofs", "rpc_pipefs", "nsfs"})
#: folders whose files are kernel interfaces wherever the mounts say otherwise (/sys/fs/cgroup is often a tmpfs)
KERNEL_FOLDERS = ("/proc", "/sys")

_KINDS = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))
_TARGET_FIX = ("give the path of a regular file or of a new file (kbench never writes over a device, pipe, socket "
               "or directory, --force included); to see the output on the terminal, leave -o out or use --format json")


def _mount_types() -> list[tuple[str, str]]:
    """(mount point, file-system type) of this process's mounts, longest mount point first."""
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="replace") as fh:
            rows = [line.split()[1:3] for line in fh if len(line.split()) >= 3]
    except OSError:
        return []
    decoded = [(point.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\"), kind)
               for point, kind in rows]
    return sorted(decoded, key=lambda r: len(r[0]), reverse=True)


def _kernel_file_system(real: str) -> str | None:
    """The kernel file system (or folder) ``real`` (a resolved absolute path) lies in, or None for storage."""
    for folder in KERNEL_FOLDERS:
        if real == folder or real.startswith(folder + "/"):
            return folder
    for point, kind in _mount_types():
        if real == point or real.startswith(point.rstrip("/") + "/"):
            return f"a {kind} file system" if kind in KERNEL_FILE_SYSTEMS else None
    return None


def output_target(path: Path | str, *, option: str | None = "-o") -> Path:
    """The file an output at ``path`` is written to, after the one rule (module doc): ``path`` itself, or the
    file a symbolic link at ``path`` points at. Anything else raises an :class:`OutputError` (exit 2) naming the
    path, what is there and the fix."""
    path = Path(path)
    target = path
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        info = None
    except OSError:
        info = None  # ENOTDIR, EACCES...: the write itself says why, in words
    if info is not None and stat.S_ISLNK(info.st_mode):
        target = Path(os.path.realpath(path))
        try:
            info = os.stat(target)
        except FileNotFoundError:
            raise OutputError(f"is a symbolic link to {target}, which does not exist", file=str(path), where=option,
                              fix="give the path you mean (the link's target, or a new file), or remove the link"
                              ) from None
        except OSError:
            info = None
    if info is not None:
        for test, kind in _KINDS:
            if test(info.st_mode):
                raise OutputError(f"is {kind}" + (f" (through the link to {target})" if target != path else "")
                                  + "; only a regular file or a new path is written",
                                  file=str(path), where=option,
                                  fix=(f"give a file name inside it, e.g. {path / 'out.json'}"
                                       if kind == "a directory" else _TARGET_FIX))
    real = os.path.realpath(target)
    where = _kernel_file_system(real)
    if where is not None:
        raise OutputError(f"lies in {where} ({real}), a kernel interface, not storage", file=str(path), where=option,
                          fix="write the output to a regular file on a disk (e.g. -o results/out.json)")
    return target


def atomic_write(path: Path, write: Callable[[Any], None], *, mode: str = "w") -> None:
    """Write through ``write(fh)`` to a temporary file beside ``path``, fsync, then rename over it, so readers
    never see half a file. The file gets the permissions the umask gives a new file (mkstemp makes 0600).
    ``path`` must pass the one rule of output paths (:func:`output_target`: an OutputError otherwise, checked
    again just before the rename); a symbolic link's target is written. Other OSErrors propagate: callers turn
    them into their own message (see :func:`output_error`)."""
    path = output_target(path, option=None)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        output_target(path, option=None)  # something made at the path meanwhile is not replaced either
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


def check_output_file(path: Path | str, *, option: str = "-o", extra: int = RESULT_NAME_EXTRA) -> Path:
    """Refuse, before any work, an output file that cannot be made: a name too long, a directory, or a parent
    that cannot be made."""
    path = Path(path)
    check_name_lengths(path, option=option, extra=extra)
    if path.is_dir():
        raise OutputError("is a directory; a file is written here", file=str(path), where=option,
                          fix=f"give a file name, e.g. {path / 'report.html'}")
    output_target(path, option=option)
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
        raise OutputError("is not a directory; a directory is written here", file=str(path), where=option,
                          fix="give a directory path (it is created when missing)")
    where = _kernel_file_system(os.path.realpath(path))
    if where is not None:
        raise OutputError(f"lies in {where}, a kernel interface, not storage", file=str(path), where=option,
                          fix="give a directory on a disk")
    if os.path.islink(path) and not path.exists():
        raise OutputError(f"is a symbolic link to {os.path.realpath(path)}, which does not exist", file=str(path),
                          where=option, fix="give the path you mean (the link's target, or a new directory), or "
                                            "remove the link")
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
    """``fig.savefig(path)``, atomically and under the one rule of output paths; write failures as an
    OutputError."""
    path = Path(path)
    kwargs.setdefault("format", path.suffix.lstrip(".").lower() or "png")
    try:
        atomic_write(output_target(path, option=option), lambda fh: fig.savefig(fh, **kwargs), mode="wb")
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
    for beside in (lock_path(path), journal_path(path)):  # the files kept beside it, under the same rule (a FIFO
        output_target(beside, option="-o")               # planted as the journal would hang its first append)
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
