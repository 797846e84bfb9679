"""Worker processes: each (backend, case) runs in a spawned process the parent can time out and replace.

The parent sends a job over a private socket (never the worker's stdout, which kernels may print to)
and gets a record back. A worker that dies (segfault, abort, out of memory, CPU limit) or hangs past
the case timeout becomes a ``crashed`` or ``timeout`` record carrying the signal and the tail of the
worker's output; the next job starts a fresh worker. Trusted backends share one long-lived worker;
every untrusted backend gets its own sandboxed worker: a scratch directory as working directory and
home, an environment without secrets, and limits on address space, file size and CPU time.

Workers are started with ``subprocess`` (a fresh interpreter: spawn, never fork, so CUDA contexts and
threads of the parent are never inherited) and rebuild backends by registry name (with the same
plugins: ``-p`` modules, entry points, ``KBENCH_PLUGINS``), from a kernel file's text, or by pickle.
"""
from __future__ import annotations

import faulthandler
import fnmatch
import hashlib
import json
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Mapping

from kbench.backends import Backend
from kbench.enums import Status
from kbench.errors import BadInput
from kbench.execute import ExecContext, base_record, execute
from kbench.integrity import IntegritySettings, literal_globals, static_failure
from kbench.ops import Case
from kbench.sandbox import ENV_DENY, sandbox_environment
from kbench.suite import CheckSettings
from kbench.timing import TimingSettings, estimated_seconds

STDERR_TAIL = 4000           # characters of a worker's output kept for a record
STARTUP_TIMEOUT = 120.0      # seconds a worker may take to import kbench and its plugins
MAX_WORKERS = 32             # live workers at most (about 110 MB of memory each when idle)


def default_case_timeout(timing: TimingSettings) -> float:
    """Seconds one (backend, case) may take when the suite and the command line say nothing."""
    return max(120.0, 20 * estimated_seconds(timing))


#: credentials whose names :data:`kbench.sandbox.ENV_DENY` does not catch (trusted workers get the parent's
#: environment without these; sandboxed ones get only the allow-list)
CREDENTIAL_NAMES: tuple[str, ...] = ("DATABASE_URL", "*_DSN", "*PWD*", "NETRC", "KUBECONFIG", "DOCKER_*", "*PRIVATE*",
                                     "*PASSPHRASE*", "*CRED*")


def is_secret(name: str, value: str = "") -> bool:
    """A variable that looks like a credential, by its name or its value (never handed to any worker)."""
    from kbench.sandbox import credential_value

    upper = name.upper()
    return (any(fnmatch.fnmatchcase(upper, p) for p in ENV_DENY if "*" in p)
            or any(fnmatch.fnmatchcase(upper, p) for p in CREDENTIAL_NAMES) or credential_value(value))


def worker_environment(base: Mapping[str, str], *, scratch: str | None) -> dict[str, str]:
    """A sandboxed worker's environment (``scratch`` given): only the allow-listed variables
    (:data:`kbench.sandbox.ENV_ALLOW`), the parent's import path, the scratch directory as home and temp.
    A trusted worker's: the parent's environment without credential-like names."""
    if scratch:
        return sandbox_environment(base, scratch)
    env = {k: v for k, v in base.items() if not is_secret(k, v)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONFAULTHANDLER"] = "1"
    return env


def total_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


# --------------------------------------------------------------------------------------------
# how a worker rebuilds a backend


@dataclass(frozen=True)
class BackendSpec:
    kind: str                      # registry | file | pickle
    name: str
    trusted: bool = True
    path: str | None = None        # file: the kernel file as the user named it
    text: str | None = None        # file: the exact text the parent read and checked
    settings: tuple = ()           # file: tunable settings as sorted (name, value) pairs
    blob: bytes | None = None      # pickle

    @property
    def key(self) -> str:
        digest = hashlib.sha1(repr((self.kind, self.name, self.path, self.text, self.settings, self.blob))
                              .encode()).hexdigest()[:12]
        return f"{self.kind}:{self.name}:{digest}"


class KernelFileRef(Backend):
    """A kernel file known to the parent only by its text: never imported here, run in a worker.

    ``NAME``, ``OP`` and ``SUBSTRATE`` are read as literals from the source without running it; the
    worker loads the very text read here (so the file cannot change between the check and the run).
    """

    def __init__(self, path: str | Path, registry, *, settings: Mapping[str, Any] | None = None,
                 name: str | None = None, trusted: bool = False) -> None:
        path = Path(path)
        if not path.is_file():
            raise BadInput("kernel file not found", file=str(path), fix="give the path of a .py file")
        try:
            self.source_text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise BadInput(f"cannot read kernel file: {exc}", file=str(path), fix="give a readable UTF-8 file") from None
        meta = literal_globals(self.source_text, ("NAME", "OP", "SUBSTRATE"))
        for key, value in meta.items():
            if not isinstance(value, str):
                raise BadInput(f"{key} must be a string literal", file=str(path), where=key,
                               fix=f'write e.g. {key} = "..." (it is read without running the file)')
        self.op = meta.get("OP", "attention")
        registry.op(self.op)
        sub = meta.get("SUBSTRATE", "numpy")
        if sub not in registry.substrates:
            raise BadInput(f"unknown SUBSTRATE {sub!r}", file=str(path),
                           fix=f"use one of: {', '.join(sorted(registry.substrates))} (or install its plugin)")
        self.substrate = registry.substrates[sub]
        self.device = self.substrate.device
        self.name = name or meta.get("NAME") or f"file:{path.stem}"
        self.source_path = str(path)
        self.settings = dict(settings or {})
        self.trusted = trusted
        self.description = f"kernel file {path} (runs in a worker)"

    def available(self) -> str | None:
        return self.substrate.available()

    def prepare(self, case: Case):
        raise RuntimeError("a kernel file referenced by text runs only in a worker")

    def info(self) -> dict[str, Any]:
        return {"kernel_file": self.source_path, "sha256": hashlib.sha256(self.source_text.encode()).hexdigest(),
                "substrate": self.substrate.name, "tunables": dict(self.settings)}


def spec_for(backend: Backend, registry) -> BackendSpec | None:
    """How a worker can rebuild ``backend``, or None when it cannot."""
    from kbench.kernelfile import KernelFileBackend

    if isinstance(backend, KernelFileRef):
        return BackendSpec("file", backend.name, backend.trusted, backend.source_path, backend.source_text,
                           tuple(sorted(backend.settings.items())))
    if isinstance(backend, KernelFileBackend):
        return BackendSpec("file", backend.name, backend.trusted, backend.source_path, backend.source.text,
                           tuple(sorted(backend.settings.items())))
    if registry.backends.get(backend.name) is backend:
        return BackendSpec("registry", backend.name, backend.trusted)
    try:
        return BackendSpec("pickle", backend.name, backend.trusted, blob=pickle.dumps(backend))
    except Exception:  # noqa: BLE001 - closures, locks, device handles: not rebuildable
        return None


def build_backend(spec: BackendSpec, registry, scratch: str) -> Backend:
    if spec.kind == "registry":
        if spec.name not in registry.backends:
            raise BadInput(f"backend {spec.name!r} is not registered in the worker",
                           fix="load its plugin through an entry point, -p or KBENCH_PLUGINS")
        return registry.backends[spec.name]
    if spec.kind == "pickle":
        return pickle.loads(spec.blob)
    from kbench.kernelfile import KernelFileBackend

    copy = Path(scratch) / f"kernel_{hashlib.sha1(spec.text.encode()).hexdigest()[:12]}.py"
    copy.write_text(spec.text, encoding="utf-8")
    backend = KernelFileBackend(copy, registry, name=spec.name, settings=dict(spec.settings), trusted=spec.trusted)
    backend.source_path = spec.path
    return backend


# --------------------------------------------------------------------------------------------
# the worker process


@dataclass
class WorkerSetup:
    """What a worker needs to rebuild the parent's execution context."""

    plugins: tuple[str, ...]
    device: str
    op: str
    check: CheckSettings
    timing: TimingSettings
    hardware: Any
    integrity: IntegritySettings
    sandbox: bool
    memory_limit: int | None = None
    file_size_limit: int | None = None
    scratch: str | None = None
    #: start under bubblewrap (kbench.sandbox); False for trusted workers and with --allow-unsandboxed
    bwrap: bool = False
    #: install the audit hook (kbench.guard) before candidate code loads: every untrusted worker
    guard: bool = False
    #: environment pinning the worker to its device, e.g. (("CUDA_VISIBLE_DEVICES", "1"),) (kbench.executors)
    device_env: tuple = ()


def _die_with_parent() -> None:
    """Linux: SIGKILL this worker when the parent dies, so a killed run leaves no orphans."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - not Linux: the worker exits at EOF on its channel instead
        pass


def _set_limits(setup: WorkerSetup) -> None:
    """Hard rlimits (soft = hard: candidate code cannot raise them again).

    Every worker gets its address-space limit (``memory_limit``, decided by the pool); an untrusted
    one also the file size, open files and process count limits of :func:`kbench.sandbox.hard_limits`.
    """
    import resource

    from kbench.sandbox import apply_limits, hard_limits

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


def _install_guard(setup: WorkerSetup):
    """The audit hook of kbench.guard, scoped to this worker's scratch directory."""
    import kbench.kernelfile  # noqa: F401 - loaded now: the guard refuses kbench imports from candidate code
    from kbench import guard
    from kbench.sandbox import SYSTEM_DIRS, readable_roots

    return guard.install(setup.scratch or tempfile.gettempdir(), system_roots=[*readable_roots(), *SYSTEM_DIRS])


def _after_job(setup: WorkerSetup, guard, record: dict[str, Any]) -> dict[str, Any]:
    """An untrusted job's record fails when it left processes running in the sandbox (they are
    killed: nothing may burn CPU while the next backend is measured) or the audit hook refused an event."""
    if setup.bwrap:
        from kbench.sandbox import kill_strays

        strays = kill_strays()
        if strays:
            record.update(status=Status.FAILED.value, reason=strays)
    return guard.verdict(record) if guard is not None else record


def child_main(fd: int) -> None:
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
        from kbench.integrity import HarnessSnapshot
        from kbench.plugins import get_plugin_manager

        pm = get_plugin_manager(setup.plugins)
        reg = pm.registry
        device = reg.device(setup.device)
        # plugins are trusted and loaded; candidate code is not loaded yet: capture timers and harness now
        snapshot = HarnessSnapshot(device) if setup.integrity.check_harness else None
        ctx = ExecContext(op=reg.op(setup.op), device=device, check=setup.check, timing=setup.timing,
                          hardware=setup.hardware, integrity=setup.integrity, harness=snapshot)
        # last: every harness module this worker needs is loaded; from here on candidate code may run
        guard = _install_guard(setup) if setup.guard else None
    except BaseException as exc:  # noqa: BLE001 - report why this worker cannot work, then stop
        conn.send(("fatal", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", {"pid": os.getpid()}))
    serve(conn, setup, reg, device, snapshot, guard)


#: largest reply a worker may send (samples, stamps and a few strings; never arrays)
MAX_REPLY_BYTES = 16 * 2**20


def serve(conn: Connection, setup: WorkerSetup, reg, device, snapshot, guard) -> None:
    """The worker's loop: a :class:`kbench.calls.CallRunner` driven by the judge in the parent.

    Requests arrive pickled (from the trusted parent); replies leave as JSON, so nothing a kernel puts
    on this socket can run code in the parent, and a reply is only data the judge verifies.
    """
    from multiprocessing import reduction

    from kbench.calls import CallRunner

    scratch = setup.scratch or tempfile.mkdtemp(prefix="kbench-worker-")
    backends: dict[str, Backend] = {}
    runner = CallRunner(device, check_threads=setup.integrity.check_threads, harness=snapshot)
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        kind = msg[0] if isinstance(msg, tuple) and msg else None
        if kind == "job":
            payload = msg[1]
            receiver = _FD_RECEIVER or socket.socket(fileno=os.dup(conn.fileno()))
            fd = reduction.recvfds(receiver, 1)[0]
            _set_cpu_budget(payload.get("cpu_seconds"))
            spec = payload["spec"]
            try:
                if spec.key not in backends:
                    backends[spec.key] = build_backend(spec, reg, scratch)
                reply = runner.handle(msg, backends[spec.key], fd)
            except BaseException as exc:  # noqa: BLE001 - a backend that cannot even be built is a record
                reply = ("error", {"reason": f"{type(exc).__name__}: {exc}"})
            finally:
                os.close(fd)  # the runner's mapping holds its own reference
        elif kind in ("batch", "end"):
            reply = runner.handle(msg)
        else:
            return
        reply = _judged_by_guard(setup, guard, reply, ended=kind == "end")
        try:
            data = json.dumps(reply, default=lambda v: v.item() if hasattr(v, "item") else str(v)).encode()
        except (TypeError, ValueError) as exc:
            data = json.dumps(("error", {"reason": f"the reply could not be sent to the parent: {exc}"})).encode()
        conn.send_bytes(data)


def _judged_by_guard(setup: WorkerSetup, guard, reply: tuple, *, ended: bool) -> tuple:
    """Refused audit events and processes left running (A1's :func:`_after_job`) fail the job."""
    kind, payload = reply
    if kind != "error" and not ended:
        return reply
    record = {"status": (Status.ERROR if kind == "error" else Status.PASSED).value, "reason": payload.get("reason")}
    record = _after_job(setup, guard, record)
    if record.get("status") == Status.FAILED.value:
        return "error", {**payload, "reason": record.get("reason"), "failed": True}
    return reply


# --------------------------------------------------------------------------------------------
# the parent's side


class _Tail:
    """Drains a worker's merged stdout/stderr in a thread, keeping the last few thousand characters."""

    def __init__(self, stream) -> None:
        self.buf = bytearray()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._drain, args=(stream,), daemon=True)
        self.thread.start()

    def _drain(self, stream) -> None:
        fd = stream.fileno()
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            with self.lock:
                self.buf += chunk
                del self.buf[:-STDERR_TAIL * 2]

    def reset(self) -> None:
        with self.lock:
            self.buf.clear()

    def text(self) -> str:
        with self.lock:
            return bytes(self.buf).decode("utf-8", "replace")[-STDERR_TAIL:]


class WorkerFailed(Exception):
    """A worker could not be started or set up."""


def signal_name(returncode: int) -> str | None:
    if returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


_SIGNAL_HINTS = {"SIGSEGV": "segmentation fault", "SIGBUS": "bus error", "SIGABRT": "abort",
                 "SIGKILL": "killed; out of memory?", "SIGXCPU": "CPU time limit exceeded",
                 "SIGXFSZ": "file size limit exceeded", "SIGFPE": "arithmetic fault", "SIGILL": "illegal instruction"}


class Worker:
    """One worker process and its channel; restarted by ``run`` after it died or was killed."""

    def __init__(self, setup: WorkerSetup, label: str) -> None:
        self.setup, self.label = setup, label
        self.proc: subprocess.Popen | None = None
        self.conn: Connection | None = None
        self.tail: _Tail | None = None
        self.scratch: str | None = None
        self.starts = 0
        self.timeout = 0.0  # the case timeout of the current job (for its record)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        """Start the worker process; an untrusted one under bubblewrap (:mod:`kbench.sandbox`).

        The channel is one end of a socketpair passed by fd number; bwrap keeps inherited fds open,
        so the protocol is the same inside the sandbox and out.
        """
        from kbench.scratch import make_worker_dir

        self.scratch = make_worker_dir()  # named after this process: the next run removes it if we are killed
        setup = WorkerSetup(**{**self.setup.__dict__, "scratch": self.scratch})
        parent_sock, child_sock = socket.socketpair()
        env = worker_environment(os.environ, scratch=self.scratch if setup.sandbox else None)
        env.update(dict(setup.device_env))
        argv = [sys.executable, "-m", "kbench.workers", str(child_sock.fileno())]
        popen: type[subprocess.Popen] = subprocess.Popen
        if setup.bwrap:
            from kbench.sandbox import BwrapProcess, bwrap_command, probe

            status = probe()
            if not status.available:
                child_sock.close()
                parent_sock.close()
                raise WorkerFailed(f"the sandbox is unavailable: {status.reason}")
            limit = setup.integrity.scratch_limit if status.sized_tmpfs else None
            argv = bwrap_command(status.binary, argv, scratch=self.scratch, cuda=setup.device == "cuda",
                                 writable_limit=limit)
            popen = BwrapProcess
        try:
            self.proc = popen(
                argv, pass_fds=(child_sock.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, cwd=self.scratch if setup.sandbox else None, env=env,
                start_new_session=True)  # own process group: no terminal Ctrl-C, killed as a group
        finally:
            child_sock.close()
        self.starts += 1
        self.conn = Connection(parent_sock.detach())
        self.tail = _Tail(self.proc.stdout)
        try:
            self.conn.send(("setup", setup))
            if not self.conn.poll(STARTUP_TIMEOUT):
                raise WorkerFailed(f"worker did not start within {STARTUP_TIMEOUT:g} s")
            kind, payload = self.conn.recv()
        except (EOFError, OSError) as exc:
            self.kill()
            raise WorkerFailed(f"worker died while starting ({self._death()}): {exc}\n{self.tail.text()}") from None
        except WorkerFailed:
            self.kill()
            raise
        if kind != "ready":
            self.kill()
            raise WorkerFailed(f"worker could not set up: {payload}")

    def _death(self) -> str:
        rc = self.proc.wait(timeout=5) if self.proc else None
        if rc is None:
            return "unknown"
        sig = signal_name(rc)
        if sig:
            hint = _SIGNAL_HINTS.get(sig)
            return f"killed by {sig}" + (f" ({hint})" if hint else "")
        return f"exited with status {rc}"

    def exchange(self, message: tuple, timeout: float | None, spec: BackendSpec, case: Case,
                 fd: int | None = None) -> Any:
        """Send one request (and the arena's descriptor), return the decoded JSON reply.

        A timeout or a dead worker raises :class:`kbench.judge.Abort` with the record of it.
        """
        from multiprocessing import reduction

        from kbench.judge import Abort

        try:
            self.conn.send(message)
            if fd is not None:
                reduction.send_handle(self.conn, fd, self.proc.pid)
            if not self.conn.poll(timeout):
                self.kill()
                raise Abort(self._failure(spec, case, Status.TIMEOUT,
                                          f"exceeded the case timeout of {self.timeout:g} s (a hang or an endless "
                                          f"loop); the worker was killed and will be restarted"))
            data = self.conn.recv_bytes(MAX_REPLY_BYTES)
        except (EOFError, OSError, ValueError) as exc:
            how = self._death()
            self.kill()
            reason = f"worker {how} while running the case" if how != "unknown" else f"worker channel broke: {exc}"
            rec = self._failure(spec, case, Status.CRASHED, reason)
            if self.proc is not None and signal_name(self.proc.returncode or 0):
                rec["signal"] = signal_name(self.proc.returncode)
            raise Abort(rec) from None
        try:
            reply = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            reply = None  # the judge names it a malformed reply
        return tuple(reply) if isinstance(reply, list) else reply

    def _failure(self, spec: BackendSpec, case: Case, status: Status, reason: str) -> dict[str, Any]:
        if self.tail is not None:
            self.tail.thread.join(timeout=2)
        rec = base_record(spec.name, case, self.setup.device)
        rec.update(status=status.value, reason=reason)
        text = self.tail.text().strip() if self.tail else ""
        if text:
            rec["stderr_tail"] = text
        return rec

    def kill(self) -> None:
        """SIGKILL the worker's process group. Under bwrap that is bwrap itself: its PID namespace's init
        dies with it (--die-with-parent) and the kernel kills every process left in the namespace."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.proc.kill()
        if self.proc is not None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def close(self) -> None:
        """Ask the worker to exit, kill it if it does not, remove its scratch directory."""
        if self.conn is not None:
            try:
                self.conn.send(("exit",))
            except (OSError, ValueError):
                pass
            if self.proc is not None:
                try:
                    self.proc.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    pass
            self.kill()
            self.conn.close()
            self.conn = None
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()
        if self.scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None


class WorkerChannel:
    """The judge's channel to a worker (:mod:`kbench.judge`): job, batches, end; replies decoded from JSON."""

    def __init__(self, worker: Worker, spec: BackendSpec, case: Case, cpu_seconds: float | None) -> None:
        self.worker, self.spec, self.case, self.cpu_seconds = worker, spec, case, cpu_seconds

    def start(self, payload: dict[str, Any], fd: int, timeout: float | None) -> Any:
        job = {**payload, "spec": self.spec, "cpu_seconds": self.cpu_seconds}
        return self.worker.exchange(("job", job), timeout, self.spec, self.case, fd)

    def request(self, message: tuple, timeout: float | None) -> Any:
        return self.worker.exchange(message, timeout, self.spec, self.case)


@dataclass
class WorkerPool:
    """The runner's executor: routes each (backend, case) in-process or to a worker.

    ``isolate``: trusted backends run in one shared worker (True) or in this process (False).
    Untrusted backends always run in their own sandboxed worker.
    """

    pm: Any
    ctx: ExecContext
    isolate: bool = True
    case_timeout: float | None = None
    max_workers: int = 8
    workers: OrderedDict = field(default_factory=OrderedDict)
    #: run untrusted backends without bubblewrap where it does not work here (recorded in the result)
    allow_unsandboxed: bool = False
    #: environment of every worker of this pool, pinning it to one device (kbench.executors)
    device_env: dict = field(default_factory=dict)
    #: pools measuring at the same time on this host (kbench.executors): they share its memory
    concurrent: int = 1

    @property
    def timeout(self) -> float:
        return self.case_timeout or default_case_timeout(self.ctx.timing)

    def plugins(self) -> tuple[str, ...]:
        return tuple(i.module for i in self.pm.infos if i.source == "-p/KBENCH_PLUGINS")

    def _setup(self, sandbox: bool) -> WorkerSetup:
        """A worker's setup: every worker has a memory limit; an untrusted one the sandbox and the guard."""
        from kbench.sandbox import probe

        integ = self.ctx.integrity
        bwrap = sandbox and (probe().available or not self.allow_unsandboxed)
        return WorkerSetup(plugins=self.plugins(), device=self.ctx.device.name, op=self.ctx.op.name,
                           check=self.ctx.check, timing=self.ctx.timing, hardware=self.ctx.hardware, integrity=integ,
                           sandbox=sandbox, memory_limit=self.memory_limit(),
                           file_size_limit=integ.file_size_limit if sandbox else None, bwrap=bwrap, guard=sandbox,
                           device_env=tuple(sorted(self.device_env.items())))

    def memory_limit(self) -> int | None:
        """RLIMIT_AS of each worker: the suite's ``integrity.memory_limit``, else RAM shared by the live
        workers (:func:`kbench.sandbox.memory_limit`); none on CUDA, whose driver reserves huge address ranges."""
        from kbench.sandbox import memory_limit

        if self.ctx.integrity.memory_limit:
            return int(self.ctx.integrity.memory_limit)
        if self.ctx.device.name != "cpu":
            return None
        total = total_memory()
        return memory_limit(total // self.concurrent if total else total, self.max_workers)

    def _refusal(self, backend: Backend, case: Case) -> dict[str, Any] | None:
        """The record of work refused before it starts: untrusted code with no sandbox (``cause``:
        infrastructure, the candidate is not to blame), a case too big for a worker's memory limit."""
        from kbench.sandbox import UNSANDBOXED_FIX, memory_refusal, probe

        rec = base_record(backend.name, case, self.ctx.device.name)
        if not backend.trusted and not self.allow_unsandboxed:
            status = probe()
            if not status.available:
                rec.update(status=Status.ERROR.value, reason=f"sandbox {status.describe()}; {UNSANDBOXED_FIX}",
                           cause="infrastructure")
                return rec
        why = memory_refusal(self.ctx.op.footprint(case), self.memory_limit())
        if why:
            rec.update(status=Status.SKIPPED.value, reason=f"memory: {why}")
            return rec
        return None

    def __call__(self, backend: Backend, case: Case) -> dict[str, Any]:
        if (backend.trusted and not self.isolate) or backend.device != self.ctx.device.name:
            # in-process; a backend of another device is skipped by execute() before any of its code runs
            return execute(self.ctx, backend, case)
        refusal = self._refusal(backend, case)  # no sandbox here, or too big for a worker's memory limit
        if refusal is not None:
            return refusal
        if not backend.trusted:
            static = static_failure(self.ctx.integrity, backend)
            if static:  # refused before any of its code runs
                rec = base_record(backend.name, case, self.ctx.device.name)
                rec.update(status=Status.FAILED.value, reason=static, integrity={"checks": ["static"]})
                return rec
        spec = spec_for(backend, self.pm.registry)
        if spec is None:
            if backend.trusted:
                return execute(self.ctx, backend, case)
            rec = base_record(backend.name, case, self.ctx.device.name)
            rec.update(status=Status.ERROR.value,
                       reason="untrusted backend cannot be rebuilt in a worker (not registered, not a kernel "
                              "file, not picklable); untrusted code never runs in the parent")
            return rec
        key = "trusted" if backend.trusted else f"untrusted:{spec.key}"
        worker = self.workers.pop(key, None) or Worker(self._setup(not backend.trusted), key)
        self.workers[key] = worker  # most recently used last
        while len(self.workers) > self.max_workers:
            _, old = self.workers.popitem(last=False)
            old.close()
        cpu = self.timeout * self.ctx.integrity.cpu_time_factor * (os.cpu_count() or 1) if not backend.trusted else None
        from kbench.judge import judge

        channel = WorkerChannel(worker, spec, case, cpu)
        try:
            if not worker.alive:
                worker.close()
                worker.start()
        except WorkerFailed as exc:
            rec = base_record(backend.name, case, self.ctx.device.name)
            rec.update(status=Status.ERROR.value, reason=f"worker failed to start: {exc}", cause="infrastructure")
            return rec
        worker.tail.reset()
        worker.timeout = self.timeout
        rec = judge(self.ctx, channel, backend.name, case, timeout=self.timeout, trusted=backend.trusted)
        if rec.get("status") == Status.ERROR.value and "stderr_tail" not in rec:
            text = worker.tail.text().strip() if worker.tail else ""
            if text:
                rec["stderr_tail"] = text
        rec["worker"] = {"pid": worker.proc.pid if worker.proc else None, "sandbox": bool(worker.setup.bwrap),
                         "starts": worker.starts}
        if not backend.trusted and rec.get("status") not in (Status.PASSED.value, Status.SKIPPED.value):
            # threads a misbehaving kernel left behind would burn CPU while later backends are measured
            worker.close()
        return rec

    def close(self) -> None:
        while self.workers:
            _, worker = self.workers.popitem()
            worker.close()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


#: the socket that receives arena descriptors: made before the audit guard is installed (it refuses
#: new sockets, and receiving a descriptor on an existing one raises no audit event)
_FD_RECEIVER: socket.socket | None = None

if __name__ == "__main__":
    _FD_RECEIVER = socket.socket(fileno=os.dup(int(sys.argv[1])))
    child_main(int(sys.argv[1]))
