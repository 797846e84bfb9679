"""A trusted callable's record, made in a forked child the parent can kill, with everything it starts.

A callable given to :func:`kbench.api.measure` (or a ``Backend`` instance that cannot be pickled) is the
caller's own code: it cannot be sent to a spawned worker (a fresh interpreter cannot rebuild a closure), and
run in the caller's process it could hang it (an endless loop), end it (``sys.exit``) or exhaust its memory.
So it runs in a child made by ``fork()``, which inherits the callable as it is. Two processes:

- the **keeper**, forked from the caller: a process group of its own, a child subreaper
  (``PR_SET_CHILD_SUBREAPER``: whatever the callable starts and leaves, ``setsid`` included, stays its
  descendant), and SIGTERM when the caller dies (``PR_SET_PDEATHSIG``). It does nothing but wait for the
  worker; when the worker ends, or the caller asks (the record came, or the case timeout passed), or the caller
  dies, it kills every descendant (found in /proc, stopped then killed) and its group, then reports the
  worker's wait status and the kernel's out-of-memory count on a pipe only it holds, and exits;
- the **worker**, forked from the keeper, dies with it (``PR_SET_PDEATHSIG``: SIGKILL), ignores SIGINT (Ctrl-C
  reaches the caller), has an address-space limit set before any of its work (``RLIMIT_AS``: the caller's address
  space plus what one worker may map, :meth:`kbench.run.pool.WorkerPool.memory_limit`: a huge allocation is a
  ``MemoryError``, an ``error`` record), judges the record exactly as in-process
  (:func:`kbench.run.inprocess.execute_in_process`) and leaves by ``os._exit`` only (neither ``sys.exit`` nor an
  exception ever runs the caller's code, pytest's or a notebook's, in the child).

The record travels pickled in one length-prefixed message (both ends are this program: nothing untrusted is
unpickled). The caller stops reading when the message is whole or the keeper has ended, never waiting for the
pipe's end: a grandchild the callable left holding the pipe cannot keep the call waiting until the case timeout.
A worker that dies without a record is a ``crashed`` record whose reason names the real cause: the signal (by its
name, real-time signals as ``SIGRTMIN+3``), the out-of-memory killer only where the cgroup's count says so, a
callable that closed the record's descriptor.

Fork is used only on the CPU device: a CUDA context does not survive a fork, so a callable measured on a GPU runs
in the calling process (docs/evaluators.md says so).
"""
from __future__ import annotations

import errno
import os
import pickle
import select
import signal
import stat
import struct
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
#: seconds the keeper has to kill the callable's processes and report once asked, before it is killed itself
KEEPER_GRACE = 2.0
#: the worker's exit status when the descriptor its record travels on was closed or replaced by the callable
CLOSED_CHANNEL = 71
_HEADER = struct.Struct(">Q")
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


class _Stop(Exception):
    """Raised in the keeper by SIGTERM: the caller asks it (or the caller died) to end everything now."""


def _raise_stop(signum, frame):  # noqa: ARG001
    raise _Stop()


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


def signal_name(number: int) -> str:
    """``SIGKILL``, ``SIGRTMIN+3``, or ``signal 99``: the name of any signal number, real-time ones included."""
    try:
        return signal.Signals(number).name
    except ValueError:
        pass
    low, high = getattr(signal, "SIGRTMIN", None), getattr(signal, "SIGRTMAX", None)
    if low is not None and high is not None and low <= number <= high:
        return f"SIGRTMIN+{number - low}" if number - low <= high - number else f"SIGRTMAX-{high - number}"
    return f"signal {number}"


def execute_forked(ctx: RunContext, backend, case: Case, *, timeout: float,
                   memory_limit: int | None) -> dict[str, Any]:
    """The record of (backend, case), judged in a forked worker bounded by ``timeout`` seconds (plus
    :data:`GRACE`) and ``memory_limit`` bytes of new address space, its processes killed whole at the end (module
    doc). Never raises for the callable's doing."""
    cap = address_space() + memory_limit if memory_limit else None
    parent = os.getpid()
    result_r, result_w = os.pipe()
    status_r, status_w = os.pipe()
    for stream in (sys.stdout, sys.stderr):  # what the parent buffered is written once, by the parent
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    with warnings.catch_warnings():  # Python 3.12 warns of fork() beside threads; the child uses none of them
        warnings.simplefilter("ignore", DeprecationWarning)
        keeper = os.fork()
    if keeper == 0:  # never returns
        _keeper(parent, (result_r, result_w), (status_r, status_w),
                lambda: _work(ctx, backend, case, timeout, cap, result_w))
    os.close(result_w)
    os.close(status_w)
    report = b""
    try:
        data, report, timed_out = _collect(result_r, status_r, time.monotonic() + timeout + GRACE)
    finally:  # also on Ctrl-C in the parent: nothing the callable started outlives the record
        os.close(result_r)
        report += _end_keeper(keeper, status_r)
        os.close(status_r)
    if timed_out:
        return _record(ctx, backend, case, Status.TIMEOUT,
                       f"exceeded the case timeout of {timeout:g} s (a hang or an endless loop); the callable ran in "
                       f"a child process, which was killed with everything it started")
    rec = _unpickle(data)
    if isinstance(rec, dict):
        return rec
    wait_status, oom = _parse_report(report)
    rec = _record(ctx, backend, case, Status.CRASHED, f"the callable's process {_ending(wait_status, oom)} without a "
                                                       f"record")
    if wait_status is not None and os.WIFSIGNALED(wait_status):
        rec["signal"] = signal_name(os.WTERMSIG(wait_status))
    return rec


def _unpickle(data: bytes) -> Any:
    if len(data) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack_from(data)
    if len(data) < _HEADER.size + size:
        return None
    try:
        return pickle.loads(data[_HEADER.size:_HEADER.size + size])
    except Exception:  # noqa: BLE001 - a worker killed while writing
        return None


def _collect(result_r: int, status_r: int, deadline: float) -> tuple[bytes, bytes, bool]:
    """(the record's message, the keeper's report, timed out): read until the message is whole, the keeper has
    ended (its report pipe closed: only it holds it), or ``deadline``. The record pipe's end is never waited for."""
    data, report = bytearray(), bytearray()
    open_fds = [result_r, status_r]
    while True:
        if len(data) >= _HEADER.size and len(data) >= _HEADER.size + _HEADER.unpack_from(data)[0]:
            return bytes(data), bytes(report), False
        if status_r not in open_fds:  # the keeper ended: what the worker wrote is all there is
            if result_r in open_fds:
                data += _drain(result_r)
            return bytes(data), bytes(report), False
        left = deadline - time.monotonic()
        if left <= 0:
            return bytes(data), bytes(report), True
        ready, _, _ = select.select(open_fds, [], [], min(left, 1.0))
        for fd in ready:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                open_fds.remove(fd)
            elif fd == result_r:
                data += chunk
            else:
                report += chunk


def _drain(fd: int) -> bytes:
    """What is in the pipe now, without waiting for writers that may never close it."""
    out = bytearray()
    os.set_blocking(fd, False)
    try:
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            out += chunk
    except BlockingIOError:
        pass
    return bytes(out)


def _end_keeper(keeper: int, status_r: int) -> bytes:
    """End the keeper and everything under it; reap it. Returns the rest of its report."""
    report = bytearray()
    deadline = time.monotonic() + GRACE
    asked = False
    while True:  # the keeper ends by itself right after the worker has: wait a moment, then ask it
        left = deadline - time.monotonic()
        if left <= 0:
            if asked:
                break
            asked = True
            _signal(keeper, signal.SIGTERM)
            deadline = time.monotonic() + KEEPER_GRACE
            continue
        try:
            ready, _, _ = select.select([status_r], [], [], min(left, 0.2))
        except (OSError, ValueError):
            break
        if ready:
            chunk = os.read(status_r, 4096)
            if not chunk:
                break
            report += chunk
    # the keeper ended (it killed its tree) or did not answer: kill its group and its tree from here
    kill_tree(keeper)
    try:
        os.waitpid(keeper, 0)
    except ChildProcessError:
        pass
    return bytes(report)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _keeper(parent: int, result: tuple[int, int], status: tuple[int, int], work) -> None:
    """The keeper's life (module doc); leaves by ``os._exit`` only."""
    code = 70
    try:
        os.close(result[0])
        os.close(status[0])
        os.setpgid(0, 0)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, _raise_stop)
        _prctl(_PR_SET_CHILD_SUBREAPER, 1)
        _prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))
        wait_status, oom = None, False
        try:
            if os.getppid() != parent:  # the caller died before the request took effect
                raise _Stop()
            kills_before = oom_kills()
            me = os.getpid()
            worker = os.fork()
            if worker == 0:
                try:
                    os.close(status[1])
                    signal.signal(signal.SIGTERM, signal.SIG_DFL)
                    _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
                    if os.getppid() != me:
                        os._exit(70)
                finally:
                    work()  # never returns
            os.close(result[1])
            while True:  # reap the worker (and, as the subreaper, any orphan the callable left that exits)
                try:
                    pid, st = os.waitpid(-1, 0)
                except ChildProcessError:
                    break
                if pid == worker:
                    wait_status = st
                    break
            after = oom_kills()
            oom = kills_before is not None and after is not None and after > kills_before
        except _Stop:
            pass
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        kill_tree(os.getpid(), include_root=False)
        os.write(status[1], f"{'' if wait_status is None else wait_status} {int(oom)}\n".encode())
        code = 0
    except BaseException:  # noqa: BLE001 - the keeper leaves by os._exit only
        pass
    finally:
        os._exit(code)


def _work(ctx: RunContext, backend, case: Case, timeout: float, cap: int | None, result_w: int) -> None:
    """The worker's life: judge the record, send it, ``os._exit``."""
    from kbench.run.inprocess import execute_in_process

    status = 70
    try:
        channel = os.fstat(result_w)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
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
        try:
            now = os.fstat(result_w)
        except OSError:
            now = None
        if now is None or (now.st_ino, now.st_dev) != (channel.st_ino, channel.st_dev) or not stat.S_ISFIFO(
                now.st_mode):
            status = CLOSED_CHANNEL  # the callable closed (or reused) the descriptor: nothing to send on
            return
        view = memoryview(_HEADER.pack(len(data)) + data)
        try:
            while view:
                view = view[os.write(result_w, view):]
        except OSError as exc:
            status = CLOSED_CHANNEL if exc.errno in (errno.EBADF, errno.EPIPE) else 70
            return
        status = 0
    except BaseException:  # noqa: BLE001 - the worker leaves by os._exit only
        pass
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:  # noqa: BLE001
            pass
        os._exit(status)


def _prctl(option: int, value: int) -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _children_map() -> dict[int, list[int]]:
    """Parent pid -> child pids of every process this one can see in /proc."""
    out: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                text = fh.read()
        except OSError:
            continue
        try:
            ppid = int(text[text.rindex(b")") + 2:].split()[1])
        except (ValueError, IndexError):
            continue
        out.setdefault(ppid, []).append(int(name))
    return out


def descendants(root: int) -> list[int]:
    """Every process below ``root`` (children, their children...), from /proc."""
    children = _children_map()
    found, todo = [], list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        if pid in found:
            continue
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


def kill_tree(root: int, *, include_root: bool = True) -> None:
    """SIGKILL ``root``'s process group and every descendant of ``root``: stopped first, so none forks a new one
    between the walk and the kill, the walk repeated until it finds nothing new."""
    seen: set[int] = set()
    for _ in range(20):
        new = [p for p in descendants(root) if p not in seen]
        if not new:
            break
        for pid in new:
            _signal(pid, signal.SIGSTOP)
        seen.update(new)
    for pid in seen:
        _signal(pid, signal.SIGKILL)
    if include_root:
        try:
            os.killpg(root, signal.SIGKILL)
        except OSError:
            pass
        _signal(root, signal.SIGKILL)
    else:  # the keeper: its group holds itself; the others in it are killed, then the orphans reaped
        for pid in _group_members(os.getpgid(0)):
            if pid != os.getpid():
                _signal(pid, signal.SIGKILL)
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                time.sleep(0.01)


def _group_members(pgid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.getpgid(int(name)) == pgid:
                out.append(int(name))
        except OSError:
            continue
    return out


def oom_kills() -> int | None:
    """The kernel's count of out-of-memory kills in this process's cgroup (v2 ``memory.events``, v1
    ``memory.oom_control``), None where it cannot be read."""
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    candidates = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            candidates.append(f"/sys/fs/cgroup{path}/memory.events")
            candidates.append(f"/sys/fs/cgroup/unified{path}/memory.events")
        elif "memory" in controllers.split(","):
            candidates.append(f"/sys/fs/cgroup/memory{path}/memory.oom_control")
    for candidate in candidates:
        try:
            with open(candidate, encoding="ascii") as fh:
                for row in fh:
                    key, _, value = row.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            continue
    return None


def _parse_report(report: bytes) -> tuple[int | None, bool]:
    """(the worker's wait status, whether the out-of-memory killer's count rose) from the keeper's report."""
    try:
        text = report.decode("ascii")
    except UnicodeDecodeError:
        return None, False
    status, _, oom = text.strip("\n").partition(" ")
    try:
        return (int(status) if status.strip() else None), oom.strip() == "1"
    except ValueError:
        return None, False


def _ending(wait_status: int | None, oom: bool = False) -> str:
    if wait_status is None:
        return "ended"
    if os.WIFSIGNALED(wait_status):
        name = signal_name(os.WTERMSIG(wait_status))
        if name == "SIGKILL" and oom:
            return "was killed by SIGKILL: the kernel's out-of-memory killer (its count in the cgroup rose)"
        return f"was killed by {name}"
    code = os.WEXITSTATUS(wait_status)
    if code == CLOSED_CHANNEL:
        return ("closed or replaced the file descriptor its record is sent on (a callable that closes descriptors "
                "it did not open, e.g. os.closerange)")
    return f"exited with status {code}"


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
