"""The worker pool: where each (backend, case) runs, and the parent's end of every worker's channel.

Each job goes in-process (trusted backends with ``--no-isolate``) or to a worker process the parent can
time out and replace. Trusted backends share one long-lived worker; every untrusted backend gets its own
sandboxed worker (bubblewrap, kbench.run.sandbox): a scratch directory as working directory and home,
an environment without secrets, limits on address space, file size and CPU time. A worker that dies
(segfault, abort, out of memory, CPU limit) or hangs past the case timeout becomes a ``crashed`` or
``timeout`` record carrying the signal and the tail of the worker's output; the next job starts a fresh
worker. Workers are started with ``subprocess`` (a fresh interpreter: spawn, never fork, so CUDA contexts
and threads of the parent are never inherited) as ``python -m kbench.worker FD``.

Either way the judge (kbench.judge) makes the record through the same messages: a worker's socket here,
or :class:`LocalChannel` to a call runner in this process.
"""
from __future__ import annotations

import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, Mapping

from kbench.backends import Backend
from kbench.enums import Status
from kbench.judge.context import RunContext, new_record
from kbench.judge.policy import static_failure
from kbench.kernelfile import KernelFileRef
from kbench.ops import Case
from kbench.protocol import MAX_REPLY_BYTES, STDERR_TAIL, BackendSpec, ProtocolError, WorkerSetup, decode_reply
# trusted backends in this process (re-exported: kbench.run.pool.LocalChannel and execute_in_process stay importable)
from kbench.run.inprocess import LocalChannel, execute_in_process
from kbench.text import safe_text
from kbench.run.sandbox import is_secret, sandbox_environment  # noqa: F401  (is_secret: re-exported for tests)
from kbench.timing import TimingSettings, estimated_seconds

STARTUP_TIMEOUT = 120.0      # seconds a worker may take to import kbench and its plugins
MAX_WORKERS = 32             # live workers at most (about 110 MB of memory each when idle)

#: Where a pool gets a worker it does not hold yet: None starts a fresh one. A long-lived service sets a
#: callable ``(setup, label) -> Worker | None`` (:func:`set_worker_source`) that hands out workers started ahead
#: of time with exactly that setup and never given a job, as clean as a fresh start (``kbench serve``'s warm
#: workers, docs/serve.md); it answers None when it has none ready.
worker_source = None


def set_worker_source(source) -> None:
    """Install (or, with None, remove) the process's source of ready workers (see :data:`worker_source`)."""
    global worker_source
    worker_source = source


def started_worker(setup: WorkerSetup, label: str = "ready") -> Worker | None:
    """A worker of ``setup`` started now (for a :data:`worker_source` to keep), or None when it did not start."""
    worker = Worker(setup, label)
    try:
        worker.start()
    except WorkerFailed:
        worker.close()
        return None
    return worker


def new_worker(setup: WorkerSetup, label: str) -> Worker:
    """A ready worker from :data:`worker_source` when it has one for ``setup``, else a fresh (unstarted) one."""
    source = worker_source
    worker = source(setup, label) if source is not None else None
    if worker is None:
        return Worker(setup, label)
    worker.label = label
    return worker


def default_case_timeout(timing: TimingSettings) -> float:
    """Seconds one (backend, case) may take when the suite and the command line say nothing."""
    return max(120.0, 20 * estimated_seconds(timing))


def worker_environment(base: Mapping[str, str], *, scratch: str | None) -> dict[str, str]:
    """A sandboxed worker's environment (``scratch`` given): only the allow-listed variables
    (:data:`kbench.run.sandbox.ENV_ALLOW`), the parent's import path, the scratch directory as home and temp.
    A trusted worker's: the same allow-list by name plus its home, temp and caches
    (:data:`kbench.run.sandbox.TRUSTED_ALLOW`), never the rest of the parent's environment. Both get the thread
    variables of :func:`kbench.threads.thread_environment`."""
    from kbench.run.sandbox import trusted_environment
    from kbench.threads import thread_environment  # the BLAS/OpenMP/torch threads kbench decides per worker

    if scratch:
        return {**sandbox_environment(base, scratch), **thread_environment(base)}
    env = trusted_environment(base)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONFAULTHANDLER"] = "1"
    env.update(thread_environment(base))
    return env


def total_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


# --------------------------------------------------------------------------------------------
# how a worker rebuilds a backend


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
            return safe_text(bytes(self.buf).decode("utf-8", "replace")[-STDERR_TAIL:])  # a worker's text, escaped


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
        self.ns_pid: int | None = None
        self.timeout = 0.0  # the case timeout of the current job (for its record)
        self.exit_sent = False
        self.stopped: list[int] = []   # processes stopped by freeze(), continued by thaw()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        """Start the worker process; an untrusted one under bubblewrap (:mod:`kbench.run.sandbox`).

        The channel is one end of a socketpair passed by fd number; bwrap keeps inherited fds open,
        so the protocol is the same inside the sandbox and out.
        """
        self.exit_sent = False
        from kbench.run.sandbox import SYSTEM_DIRS, readable_roots
        from kbench.run.scratch import make_worker_dir

        self.scratch = make_worker_dir()  # named after this process: the next run removes it if we are killed
        setup = WorkerSetup(**{**self.setup.__dict__, "scratch": self.scratch,
                               "readable_roots": tuple([*readable_roots(), *SYSTEM_DIRS])})
        parent_sock, child_sock = socket.socketpair()
        env = worker_environment(os.environ, scratch=self.scratch if setup.sandbox else None)
        env.update(dict(setup.device_env))
        # the channel arrives as the worker's standard input, so its number is the same in every worker whatever
        # this process has open (held-out and fuzz checks, scoring runs): nothing a kernel sees tells them apart;
        # the worker moves it to a number of its own and points 0 at /dev/null (kbench.worker.main)
        argv = [sys.executable, "-m", "kbench.worker", "0"]
        popen: type[subprocess.Popen] = subprocess.Popen
        if setup.bwrap:
            from kbench.run.sandbox import BwrapProcess, bwrap_command, probe

            status = probe()
            if not status.available:
                child_sock.close()
                parent_sock.close()
                raise WorkerFailed(f"the sandbox is unavailable: {status.reason}")
            limit = setup.scratch_limit if status.sized_tmpfs else None
            argv = bwrap_command(status.binary, argv, scratch=self.scratch, binds=setup.sandbox_binds,
                                 writable_limit=limit)
            popen = BwrapProcess
        try:
            self.proc = popen(
                argv, stdin=child_sock.fileno(), stdout=subprocess.PIPE,
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
        pid = payload.get("pid") if isinstance(payload, dict) else None
        self.ns_pid = pid if isinstance(pid, int) else None  # its pid inside its sandbox (strays are found by it)

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
        """Send one request (and the arena's descriptor), return the decoded reply (kbench.protocol).

        A timeout or a dead worker raises :class:`kbench.judge.judge.Abort` with the record of it; a reply
        that breaks the protocol (too large, too deep, not JSON) raises :class:`ProtocolError`.
        """
        from multiprocessing import reduction

        from kbench.judge.judge import Abort

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
        except OSError as exc:
            if self.alive and "bad message length" in str(exc):  # an oversized reply: the channel is unusable
                self.kill()
                raise ProtocolError(f"a reply longer than {MAX_REPLY_BYTES} bytes (the worker was restarted)") from None
            return self._broken(spec, case, exc)
        except (EOFError, ValueError) as exc:
            return self._broken(spec, case, exc)
        return decode_reply(data)

    def _broken(self, spec: BackendSpec, case: Case, exc: BaseException):
        """The worker died or its channel broke under a request: raise the ``crashed`` record of it."""
        from kbench.judge.judge import Abort

        how = self._death()
        self.kill()
        reason = f"worker {how} while running the case" if how != "unknown" else f"worker channel broke: {exc}"
        rec = self._failure(spec, case, Status.CRASHED, reason)
        if self.proc is not None and signal_name(self.proc.returncode or 0):
            rec["signal"] = signal_name(self.proc.returncode)
        raise Abort(rec) from None

    def _failure(self, spec: BackendSpec, case: Case, status: Status, reason: str) -> dict[str, Any]:
        if self.tail is not None:
            self.tail.thread.join(timeout=2)
        rec = new_record(spec.name, case, self.setup.device)
        rec.update(status=status.value, reason=reason)
        text = self.tail.text().strip() if self.tail else ""
        if text:
            rec["stderr_tail"] = text
        return rec

    def processes(self) -> list[int]:
        """The worker's process and every process under it (a sandbox: bwrap, its namespace's init, the worker
        and whatever they started), from /proc/PID/task/TID/children."""
        if self.proc is None or self.proc.poll() is not None:
            return []
        found, todo = [], [self.proc.pid]
        while todo:
            pid = todo.pop()
            found.append(pid)
            try:
                tasks = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tasks:
                try:
                    with open(f"/proc/{pid}/task/{tid}/children") as fh:
                        todo += [int(c) for c in fh.read().split()]
                except (OSError, ValueError):
                    pass
        return found

    def freeze(self) -> bool:
        """SIGSTOP every process of the worker (its sandbox's whole tree; its threads, native ones included,
        stop with their process). True when it was stopped."""
        self.stopped = self.processes()
        for pid in self.stopped:
            try:
                os.kill(pid, signal.SIGSTOP)
            except OSError:
                pass
        return bool(self.stopped)

    def thaw(self) -> None:
        """SIGCONT what :meth:`freeze` stopped (a stopped process cannot have started another)."""
        for pid in reversed(getattr(self, "stopped", [])):
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError:
                pass
        self.stopped = []

    def kill(self) -> None:
        """SIGKILL the worker's process group. Under bwrap that is bwrap itself: its PID namespace's init
        dies with it (--die-with-parent) and the kernel kills every process left in the namespace."""
        if self.proc is not None and self.proc.poll() is None:
            self.thaw()
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.proc.kill()
        if self.proc is not None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def ask_to_exit(self) -> None:
        """Send the exit message (the pool asks every worker before it waits for any: they exit together)."""
        if self.conn is not None and not self.exit_sent:
            self.exit_sent = True
            try:
                self.conn.send(("exit",))
            except (OSError, ValueError):
                pass

    def close(self) -> None:
        """Ask the worker to exit, kill it if it does not, remove its scratch directory."""
        self.thaw()
        if self.conn is not None:
            self.ask_to_exit()
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

    def __init__(self, worker: Worker, spec: BackendSpec, case: Case, cpu_seconds: float | None,
                 twin: Any = None) -> None:
        self.worker, self.spec, self.case, self.cpu_seconds = worker, spec, case, cpu_seconds
        self._twin = twin   # () -> the pool's harness twin worker (untrusted kernels' channels)

    def harness_twin(self) -> WorkerChannel | None:
        """A channel to the pool's harness twin: a worker of the same setup as this one that never loads candidate
        code (kbench.worker.calls.HarnessOnly); the judge measures the harness's own cost of a batch there."""
        if self._twin is None:
            return None
        worker = self._twin()
        return WorkerChannel(worker, BackendSpec("harness", "harness-only", True), self.case, None)

    def freeze(self) -> bool:
        return self.worker.freeze()

    def thaw(self) -> None:
        self.worker.thaw()

    def start(self, payload: dict[str, Any], fd: int, timeout: float | None) -> Any:
        job = {**payload, "spec": self.spec, "cpu_seconds": self.cpu_seconds}
        return self.worker.exchange(("job", job), timeout, self.spec, self.case, fd)

    def request(self, message: tuple, timeout: float | None) -> Any:
        return self.worker.exchange(message, timeout, self.spec, self.case)


def stops_after_timeout(backend: Backend) -> bool:
    """Whether a timeout of ``backend`` stops its remaining cases in the run: untrusted code (a kernel file, an
    evolver's candidate: an endless loop would cost the case timeout on every case) and callables."""
    return bool(getattr(backend, "stop_after_timeout", not backend.trusted))


def not_started(backend_name: str, case: Case, device: str, first: str) -> dict[str, Any]:
    """The record of a case not started because ``backend_name`` timed out on case ``first`` earlier in the run."""
    rec = new_record(backend_name, case, device)
    rec.update(status=Status.SKIPPED.value,
               reason=f"not started: this backend timed out on {first} earlier in this run, so its remaining cases "
                      f"are not run (a hang or an endless loop would cost the case timeout on each)")
    return rec


@dataclass
class WorkerPool:
    """The runner's executor: routes each (backend, case) in-process or to a worker.

    ``isolate``: trusted backends run in one shared worker (True) or in this process (False).
    Untrusted backends always run in their own sandboxed worker.
    """

    pm: Any
    ctx: RunContext
    isolate: bool = True
    case_timeout: float | None = None
    max_workers: int = 8
    workers: OrderedDict = field(default_factory=OrderedDict)
    #: run untrusted backends without bubblewrap where it does not work here (recorded in the result)
    allow_unsandboxed: bool = False
    #: environment of every worker of this pool, pinning it to one device (kbench.run.executors)
    device_env: dict = field(default_factory=dict)
    #: pools measuring at the same time on this host (kbench.run.executors): they share its memory
    concurrent: int = 1
    #: backend name -> the case it timed out on (:func:`stops_after_timeout`): its later jobs are not started
    stopped: dict = field(default_factory=dict)
    #: keep an untrusted backend's worker after a ``failed`` record (a wrong answer): ``kbench fuzz`` checks
    #: hundreds of cases with one worker; crashes, timeouts and errors still close it
    keep_failed: bool = False
    #: the harness twin (kbench.judge.accounting): one sandboxed worker that never runs candidate code
    twin: Any = None

    @property
    def timeout(self) -> float:
        return self.case_timeout or default_case_timeout(self.ctx.timing)

    def plugins(self) -> tuple[str, ...]:
        return tuple(i.module for i in self.pm.infos if i.source == "-p/KBENCH_PLUGINS")

    def _setup(self, sandbox: bool) -> WorkerSetup:
        """A worker's setup: every worker has a memory limit; an untrusted one the sandbox and the guard."""
        from kbench.run.sandbox import probe

        integ = self.ctx.integrity
        bwrap = sandbox and (probe().available or not self.allow_unsandboxed)
        return WorkerSetup(plugins=self.plugins(), device=self.ctx.device.name, op=self.ctx.op.name,
                           sandbox=sandbox, check_threads=integ.check_threads, check_harness=integ.check_harness,
                           memory_limit=self.memory_limit(), file_size_limit=integ.file_size_limit if sandbox else None,
                           bwrap=bwrap, guard=sandbox, device_env=tuple(sorted(self.device_env.items())),
                           scratch_limit=integ.scratch_limit,
                           sandbox_binds=tuple(self.ctx.device.sandbox_binds()) if bwrap else ())

    def memory_limit(self) -> int | None:
        """RLIMIT_AS of each worker: the suite's ``integrity.memory_limit``, else RAM shared by the live
        workers (:func:`kbench.run.sandbox.memory_limit`); none on CUDA, whose driver reserves huge address ranges."""
        from kbench.run.sandbox import memory_limit

        if self.ctx.integrity.memory_limit:
            return int(self.ctx.integrity.memory_limit)
        if not self.ctx.device.limits_address_space:
            return None
        total = total_memory()
        return memory_limit(total // self.concurrent if total else total, self.max_workers)

    def _refusal(self, backend: Backend, case: Case) -> dict[str, Any] | None:
        """The record of work refused before it starts: untrusted code with no sandbox (``cause``:
        infrastructure, the candidate is not to blame), a case too big for a worker's memory limit."""
        from kbench.run.sandbox import UNSANDBOXED_FIX, memory_refusal, probe

        rec = new_record(backend.name, case, self.ctx.device.name)
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
        """The record of (backend, case); whatever goes wrong in the parent's own handling of a job is an
        ``error`` record naming it, never the end of the run."""
        first = self.stopped.get(backend.name)
        if first is not None:
            return not_started(backend.name, case, self.ctx.device.name, first)
        try:
            rec = self._run(backend, case)
            if rec.get("status") == Status.TIMEOUT.value and stops_after_timeout(backend):
                self.stopped.setdefault(backend.name, case.id)
            return rec
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as exc:  # noqa: BLE001 - one job, one record
            rec = new_record(backend.name, case, self.ctx.device.name)
            rec.update(status=Status.ERROR.value, cause="infrastructure",
                       reason=f"the run failed on this job: {type(exc).__name__}: {str(exc)[:500]}")
            return rec

    def _run(self, backend: Backend, case: Case) -> dict[str, Any]:
        if (backend.trusted and not self.isolate) or backend.device != self.ctx.device.name:
            # in-process; a backend of another device is skipped there before any of its code runs
            return execute_in_process(self.ctx, backend, case)
        refusal = self._refusal(backend, case)  # no sandbox here, or too big for a worker's memory limit
        if refusal is not None:
            return refusal
        if not backend.trusted:
            static = static_failure(self.ctx.integrity, backend)
            if static:  # refused before any of its code runs
                rec = new_record(backend.name, case, self.ctx.device.name)
                rec.update(status=Status.FAILED.value, reason=static, integrity={"checks": ["static"]})
                return rec
        spec = spec_for(backend, self.pm.registry)
        if spec is None:
            if backend.trusted:  # a callable (kbench.api.measure): in a forked child this pool can kill
                from kbench.run.forked import execute_forked, forkable

                if forkable(self.ctx):
                    return execute_forked(self.ctx, backend, case, timeout=self.timeout,
                                          memory_limit=self.memory_limit())
                return execute_in_process(self.ctx, backend, case)
            rec = new_record(backend.name, case, self.ctx.device.name)
            rec.update(status=Status.ERROR.value,
                       reason="untrusted backend cannot be rebuilt in a worker (not registered, not a kernel "
                              "file, not picklable); untrusted code never runs in the parent")
            return rec
        key = "trusted" if backend.trusted else f"untrusted:{spec.key}"
        worker = self.workers.pop(key, None) or new_worker(self._setup(not backend.trusted), key)
        self.workers[key] = worker  # most recently used last
        while len(self.workers) > self.max_workers:
            _, old = self.workers.popitem(last=False)
            old.close()
        cpu = self.timeout * self.ctx.integrity.cpu_time_factor * (os.cpu_count() or 1) if not backend.trusted else None
        from kbench.judge.judge import judge

        channel = WorkerChannel(worker, spec, case, cpu, twin=None if backend.trusted else self._harness_twin)
        try:
            if not worker.alive:
                worker.close()
                worker.start()
        except WorkerFailed as exc:
            rec = new_record(backend.name, case, self.ctx.device.name)
            rec.update(status=Status.ERROR.value, reason=f"worker failed to start: {exc}", cause="infrastructure")
            return rec
        worker.tail.reset()
        worker.timeout = self.timeout
        rec = judge(self.ctx, channel, backend.name, case, timeout=self.timeout, trusted=backend.trusted)
        if rec.get("status") == Status.ERROR.value and "stderr_tail" not in rec:
            text = worker.tail.text().strip() if worker.tail else ""
            if text:
                rec["stderr_tail"] = text
        if worker.setup.bwrap and worker.alive:
            # processes the job left in the sandbox would burn CPU while the next backend is measured:
            # found and killed from here (the parent sees the sandbox's whole process tree)
            from kbench.run.sandbox import kill_strays

            strays = kill_strays(worker.proc.pid, worker.ns_pid)
            if strays and rec.get("status") in (Status.PASSED.value, Status.SKIPPED.value, None):
                rec.update(status=Status.FAILED.value, reason=strays)
        rec["worker"] = {"pid": worker.proc.pid if worker.proc else None, "sandbox": bool(worker.setup.bwrap),
                         "starts": worker.starts}
        if (backend.source_path and self.ctx.integrity.static_applies(backend.trusted)
                and isinstance(rec.get("integrity"), dict)):
            rec["integrity"]["checks"].insert(0, "static")  # its source was read and passed before it ran
        kept = (Status.PASSED.value, Status.SKIPPED.value) + ((Status.FAILED.value,) if self.keep_failed else ())
        if not backend.trusted and rec.get("status") not in kept:
            # threads a misbehaving kernel left behind would burn CPU while later backends are measured
            worker.close()
        return rec

    def _harness_twin(self) -> Worker:
        """The pool's harness twin, started on first use (the setup of an untrusted kernel's worker; it only ever
        runs the harness's empty loop, so it is kept for the whole run); raises WorkerFailed when it cannot start."""
        if self.twin is None:
            self.twin = Worker(self._setup(True), "harness-twin")
        if not self.twin.alive:
            self.twin.close()
            self.twin.start()
        self.twin.tail.reset()
        self.twin.timeout = self.timeout
        return self.twin

    def close(self) -> None:
        if self.twin is not None:
            self.twin.close()
            self.twin = None
        for worker in self.workers.values():
            worker.ask_to_exit()
        while self.workers:
            _, worker = self.workers.popitem()
            worker.close()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
