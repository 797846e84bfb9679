"""A worker process: the entry point and request loop of everything that runs beside candidate code.

Started by the parent (kbench.run.pool) as ``python -m kbench.worker FD`` (under bubblewrap when
untrusted), it reads its :class:`kbench.protocol.WorkerSetup`, sets its limits, loads the plugins,
snapshots the harness, installs the audit hook (untrusted workers) and then serves the judge's requests
with a :class:`kbench.worker.calls.CallRunner`. Requests arrive pickled from the trusted parent; replies
leave as bounded JSON (kbench.protocol), so nothing a kernel puts on the socket can run code in the
parent. This package never imports the judge, the runner or SciPy (tests/test_worker_imports.py).
"""
from __future__ import annotations

import faulthandler
import hashlib
import os
import pickle
import signal
import socket
import tempfile
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from kbench.protocol import BackendSpec, WorkerSetup, encode_reply


def _die_with_parent() -> None:
    """Linux: SIGKILL this worker when the parent dies, so a killed run leaves no orphans."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - not Linux: the worker exits at EOF on its channel instead
        pass


def hard_limits(*, memory: int | None, file_size: int | None, cpu_count: int | None = None) -> dict[int, int]:
    """The rlimits of a sandboxed worker (soft = hard, so candidate code cannot raise them)."""
    import resource

    nproc = NPROC_BASE + 8 * (cpu_count or os.cpu_count() or 1)
    limits = {resource.RLIMIT_NOFILE: NOFILE, resource.RLIMIT_NPROC: nproc, resource.RLIMIT_CORE: 0}
    if memory:
        limits[resource.RLIMIT_AS] = int(memory)
    if file_size:
        limits[resource.RLIMIT_FSIZE] = int(file_size)
    return limits


#: processes (threads count) a sandboxed worker may have at once, beyond the BLAS/OpenMP threads per core
NPROC_BASE = 256
#: open files a sandboxed worker may have at once
NOFILE = 4096


def apply_limits(limits: dict[int, int]) -> None:
    """Set each limit as soft = hard, never above an existing hard limit."""
    import resource

    for which, value in limits.items():
        _, hard = resource.getrlimit(which)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(which, (value, value))


def _set_limits(setup: WorkerSetup) -> None:
    """Every worker gets its address-space limit; an untrusted one also the file size, open files and
    process count limits of :func:`hard_limits`."""
    import resource

    if setup.sandbox:
        apply_limits(hard_limits(memory=setup.memory_limit, file_size=setup.file_size_limit))
    elif setup.memory_limit:
        apply_limits({resource.RLIMIT_AS: int(setup.memory_limit)})


def _set_cpu_budget(seconds: float | None) -> None:
    import resource

    if not seconds:
        return
    usage = resource.getrusage(resource.RUSAGE_SELF)
    soft = int(usage.ru_utime + usage.ru_stime + seconds) + 1
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def build_backend(spec: BackendSpec, registry, scratch: str):
    """The backend a spec names: from the registry, by pickle, or from a kernel file's exact text."""
    if spec.kind == "registry":
        if spec.name not in registry.backends:
            from kbench.errors import BadInput

            raise BadInput(f"backend {spec.name!r} is not registered in the worker",
                           fix="load its plugin through an entry point, -p or KBENCH_PLUGINS")
        return registry.backends[spec.name]
    if spec.kind == "harness":  # a harness twin's: no candidate code (kbench.worker.calls.HarnessOnly)
        from kbench.worker.calls import HarnessOnly

        return HarnessOnly()
    if spec.kind == "pickle":
        return pickle.loads(spec.blob)
    from kbench.kernelfile import KernelFileBackend

    copy = Path(scratch) / f"kernel_{hashlib.sha1(spec.text.encode()).hexdigest()[:12]}.py"
    copy.write_text(spec.text, encoding="utf-8")
    backend = KernelFileBackend(copy, registry, name=spec.name, settings=dict(spec.settings), trusted=spec.trusted)
    backend.source_path = spec.path
    return backend


def forget_file(fd: int) -> list[int]:
    """Leave no descriptor of ``fd``'s file open but ``fd`` itself (which the caller closes): the numbers that
    were one now name ``/dev/null``. Returns them.

    Before Python 3.13 an ``mmap`` keeps a duplicate of the descriptor it maps for as long as the mapping lives
    (3.13's ``trackfd=False`` keeps none), so closing the arena's descriptor left a copy open while candidate code
    ran: a kernel could find it in ``/proc/self/fd`` and write through it, or ``fstat`` the arena. Closing that
    copy outright would leave the ``mmap`` owning a number the next ``open`` reuses (and closes when the mapping
    goes); ``dup2`` of ``/dev/null`` onto it drops the file and keeps the number the ``mmap``'s. The mapping
    itself, which the worker copies outputs into, stays. Found by ``(st_dev, st_ino)`` through ``/proc/self/fd``
    (Linux, where the arena is a memfd; elsewhere nothing is found and the copy stays: docs/integrity.md)."""
    try:
        target = os.fstat(fd)
        numbers = [int(n) for n in os.listdir("/proc/self/fd")]
    except (OSError, ValueError):
        return []
    null, changed = -1, []
    try:
        for number in numbers:
            if number == fd:
                continue
            try:
                st = os.fstat(number)
            except OSError:
                continue  # the directory's own descriptor, already closed
            if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
                if null < 0:
                    null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
                os.dup2(null, number, inheritable=False)
                changed.append(number)
    finally:
        if null >= 0:
            os.close(null)
    return changed


def _install_guard(setup: WorkerSetup):
    """The audit hook of kbench.worker.guard, scoped to this worker's scratch directory and the read-only
    places the parent gave the sandbox."""
    import platform

    import kbench.kernelfile  # noqa: F401 - loaded now: the guard refuses kbench imports from candidate code
    from kbench.worker import guard

    # Python's platform module runs `uname -p` once and caches it; libraries (torch at import) ask for it.
    # Asked here, while subprocesses are still allowed, so no library's call later meets the guard.
    platform.uname().processor  # noqa: B018

    return guard.install(setup.scratch or tempfile.gettempdir(), system_roots=list(setup.readable_roots))


def child_main(fd: int, receiver: socket.socket | None = None) -> None:
    conn = Connection(fd)
    _die_with_parent()
    faulthandler.enable()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business
    try:
        _, setup = conn.recv()
    except (EOFError, OSError):
        return
    try:
        _set_limits(setup)
        from kbench.plugins import get_plugin_manager
        from kbench.worker.watches import HarnessSnapshot

        registry = get_plugin_manager(setup.plugins, worker=True).registry
        device = registry.device(setup.device)
        op = registry.op(setup.op)
        # plugins are trusted and loaded; candidate code is not loaded yet: capture timers and harness now
        snapshot = HarnessSnapshot(device) if setup.check_harness else None
        # last: every harness module this worker needs is loaded; from here on candidate code may run
        guard = _install_guard(setup) if setup.guard else None
    except BaseException as exc:  # noqa: BLE001 - report why this worker cannot work, then stop
        conn.send(("fatal", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", {"pid": os.getpid()}))
    serve(conn, setup, registry, device, op, snapshot, guard, receiver)


def serve(conn: Connection, setup: WorkerSetup, registry, device, op, snapshot, guard,
          receiver: socket.socket | None) -> None:
    """The worker's loop: a :class:`kbench.worker.calls.CallRunner` driven by the judge in the parent."""
    from multiprocessing import reduction

    from kbench.worker.calls import CallRunner

    scratch = setup.scratch or tempfile.mkdtemp(prefix="kbench-worker-")
    backends: dict[str, Any] = {}
    runner = CallRunner(device, op, check_threads=setup.check_threads, harness=snapshot)
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        kind = msg[0] if isinstance(msg, tuple) and msg else None
        if kind == "job":
            payload = msg[1]
            fd = reduction.recvfds(receiver or socket.socket(fileno=os.dup(conn.fileno())), 1)[0]
            try:
                runner.attach(payload["layout"], fd)  # mapped, and the descriptor closed, before candidate code
                forget_file(fd)
            finally:
                os.close(fd)
            try:
                _set_cpu_budget(payload.get("cpu_seconds"))
                spec = payload["spec"]
                if spec.key not in backends:
                    backends[spec.key] = build_backend(spec, registry, scratch)
                reply = runner.handle(msg, backends[spec.key])
            except BaseException as exc:  # noqa: BLE001 - a backend that cannot even be built is a record
                reply = ("error", {"reason": f"{type(exc).__name__}: {exc}"[:2000]})
        elif kind in ("batch", "forward", "collect", "sustain", "end"):
            reply = runner.handle(msg)
        else:
            return
        if guard is not None:  # facts for the judge: refused events fail the record there
            refused = guard.drain()
            if refused:
                reply = (reply[0], {**reply[1], "audit": refused[:8], "audit_count": len(refused)})
        conn.send_bytes(encode_reply(reply))


def main(argv: list[str]) -> None:
    fd = int(argv[1])
    if fd == 0:  # the channel came as standard input (kbench.run.pool): a number of its own, stdin is /dev/null
        fd = os.dup(0)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
    # the socket that receives arena descriptors: made before the audit guard is installed (it refuses
    # new sockets, and receiving a descriptor on an existing one raises no audit event)
    receiver = socket.socket(fileno=os.dup(fd))
    child_main(fd, receiver)

