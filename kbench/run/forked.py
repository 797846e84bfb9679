"""A trusted callable's record, made in a forked child the parent can kill.

A callable given to :func:`kbench.api.measure` (or a ``Backend`` instance that cannot be pickled) is the
caller's own code: it cannot be sent to a spawned worker (a fresh interpreter cannot rebuild a closure), and
run in the caller's process it could hang it (an endless loop), end it (``sys.exit``) or exhaust its memory.
So it runs in a child made by ``fork()``, which inherits the callable as it is, with:

- an address-space limit set before any of its work (``RLIMIT_AS``: the parent's address space at the fork
  plus what one worker may map, :meth:`kbench.run.pool.WorkerPool.memory_limit`): a huge allocation is a
  ``MemoryError`` in the child, an ``error`` record here;
- a process group of its own, killed whole (the callable's own subprocesses too) when the record's case
  timeout plus :data:`GRACE` seconds has passed: a ``timeout`` record; and death with its parent
  (``PR_SET_PDEATHSIG``): a ``kill -9`` of the caller leaves no hung callable behind;
- SIGINT ignored and SIGTERM at its default: Ctrl-C reaches the parent, which kills the child;
- ``os._exit`` as its only way out: neither ``sys.exit`` nor an exception ever runs the parent's code
  (pytest's, a notebook's) in the child; a child that dies without a record is a ``crashed`` record.

The child judges the record exactly as in-process (:func:`kbench.run.inprocess.execute_in_process`) and sends it
back pickled through a pipe (both ends are this program: nothing untrusted is unpickled). Fork is used only
on the CPU device: a CUDA context does not survive a fork, so a callable measured on a GPU runs in the
calling process (docs/evaluators.md says so).
"""
from __future__ import annotations

import os
import pickle
import select
import signal
import sys
import time
import warnings
from typing import Any

from kbench.enums import Status
from kbench.judge.context import RunContext, new_record
from kbench.ops import Case

#: seconds after the case timeout before the child is killed (the judge in the child stops sampling before
#: the case timeout; this covers its last batch and the record's way back)
GRACE = 1.0


def forkable(ctx: RunContext) -> bool:
    """Whether a trusted in-process record may run in a forked child here (the CPU device, a POSIX host)."""
    return hasattr(os, "fork") and ctx.device.name == "cpu"


def address_space() -> int:
    """This process's mapped address space in bytes (``/proc/self/statm``), 0 where unknown."""
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            return int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def execute_forked(ctx: RunContext, backend, case: Case, *, timeout: float,
                   memory_limit: int | None) -> dict[str, Any]:
    """The record of (backend, case), judged in a forked child bounded by ``timeout`` seconds (plus
    :data:`GRACE`) and ``memory_limit`` bytes of new address space. Never raises for the callable's doing."""
    from kbench.run.inprocess import execute_in_process

    cap = address_space() + memory_limit if memory_limit else None
    parent = os.getpid()
    read_end, write_end = os.pipe()
    for stream in (sys.stdout, sys.stderr):  # what the parent buffered is written once, by the parent
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    with warnings.catch_warnings():  # Python 3.12 warns of fork() beside threads; the child uses none of them
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: never returns
        status = 70
        try:
            os.close(read_end)
            os.setpgid(0, 0)
            _die_with(parent)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            if cap:
                import resource

                resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
            try:
                rec = execute_in_process(ctx, backend, case, timeout=timeout)
            except SystemExit as exc:  # raised outside a call the judge made (prepare, supports...)
                rec = _record(ctx, backend, case, Status.ERROR, f"the callable called sys.exit({exc.code!r})")
            except MemoryError as exc:
                rec = _record(ctx, backend, case, Status.ERROR, f"out of memory: {exc}".rstrip(": "))
            except BaseException as exc:  # noqa: BLE001 - one record, whatever the callable did
                rec = _record(ctx, backend, case, Status.ERROR, f"{type(exc).__name__}: {exc}"[:2000])
            data = pickle.dumps(rec)
            view = memoryview(data)
            while view:
                view = view[os.write(write_end, view):]
            status = 0
        except BaseException:  # noqa: BLE001 - the child leaves by os._exit only
            pass
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            except BaseException:  # noqa: BLE001
                pass
            os._exit(status)
    os.close(write_end)
    try:
        data, timed_out = _read_until(read_end, time.monotonic() + timeout + GRACE)
    finally:  # also on Ctrl-C in the parent: the child never outlives the record
        os.close(read_end)
        _kill(pid)  # the child's whole group: a hung child, and whatever the callable started and left
        try:
            _, wait_status = os.waitpid(pid, 0)
        except ChildProcessError:
            wait_status = None
    if timed_out:
        return _record(ctx, backend, case, Status.TIMEOUT,
                       f"exceeded the case timeout of {timeout:g} s (a hang or an endless loop); the callable ran in "
                       f"a child process, which was killed")
    try:
        rec = pickle.loads(data) if data else None
    except Exception:  # noqa: BLE001 - a child killed while writing
        rec = None
    if isinstance(rec, dict):
        return rec
    how = _ending(wait_status)
    rec = _record(ctx, backend, case, Status.CRASHED, f"the callable's process {how} without a record")
    if wait_status is not None and os.WIFSIGNALED(wait_status):
        rec["signal"] = signal.Signals(os.WTERMSIG(wait_status)).name
    return rec


def _read_until(fd: int, deadline: float) -> tuple[bytes, bool]:
    """Everything written to ``fd`` until its end, or (what came, True) at ``deadline``."""
    chunks = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return b"".join(chunks), True
        ready, _, _ = select.select([fd], [], [], min(left, 1.0))
        if not ready:
            continue
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks), False
        chunks.append(chunk)


def _die_with(parent: int) -> None:
    """SIGKILL this child when its parent dies (Linux ``PR_SET_PDEATHSIG``): a parent killed with -9 leaves no
    hung callable behind holding the result file's lock."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(70)


def _kill(pid: int) -> None:
    for target in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            target()
            return
        except (ProcessLookupError, PermissionError):
            continue


def _ending(wait_status: int | None) -> str:
    if wait_status is None:
        return "ended"
    if os.WIFSIGNALED(wait_status):
        name = signal.Signals(os.WTERMSIG(wait_status)).name
        return f"was killed by {name}" + (" (out of memory?)" if name == "SIGKILL" else "")
    return f"exited with status {os.WEXITSTATUS(wait_status)}"


def _record(ctx: RunContext, backend, case: Case, status: Status, reason: str) -> dict[str, Any]:
    rec = new_record(backend.name, case, ctx.device.name)
    rec.update(status=status.value, reason=reason)
    info = getattr(backend, "info", None)
    if callable(info):
        try:
            rec["backend_info"] = info()
        except Exception:  # noqa: BLE001
            pass
    return rec
