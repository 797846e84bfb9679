"""Executors: where the runner's (case, backend) jobs run, one or several at a time.

The runner (:func:`kbench.run.runner.run_suite`) hands each job to an executor and receives its record,
possibly out of order; it alone writes the result file, in the order of its list of jobs. An executor
may run several jobs at once, one per *slot* (a device: never two timed jobs on one device).

Built in: ``local``. Without ``--devices`` it is today's behaviour: one job at a time, in the calling
thread, through a :class:`kbench.run.pool.WorkerPool`. With ``--devices 0,1,...`` it runs one slot per
device, each a thread driving its own WorkerPool whose workers see only their device
(``CUDA_VISIBLE_DEVICES``); on the CPU the indices are slots (independent worker pools, not pinned to
cores), for tests and benchmarks. Other executors come from plugins through
``kbench_register_executors`` (``plugins/kbench-ray``).

A record carries ``placement``: where it ran (host, executor, slot, device, device index, hardware
profile), so records measured on different hardware are never mixed silently.
"""
from __future__ import annotations

import platform
import queue
import threading
import time
from abc import abstractmethod
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Callable

import kbench
from kbench.errors import BadInput
# the executor interface (re-exported here: kbench.run.executors.ExecutorFactory and the others stay importable)
from kbench.run.interface import Executor, ExecutorFactory, ExecutorOptions, Job, Planned

if TYPE_CHECKING:
    from kbench.backends import Backend
    from kbench.ops import Case
    from kbench.plugins import PluginManager


def placement(planned_ctx, *, executor: str, slot: int | None = None, index: str | None = None,
              host: str | None = None, hardware=None) -> dict[str, Any]:
    """Where a record was measured: host, executor, slot, device and its index, hardware profile and model.

    ``profile`` names the hardware profile (or the model where no profile matched): records of different
    profiles are different machines for compare, even in one result file."""
    hw = hardware if hardware is not None else planned_ctx.hardware
    out: dict[str, Any] = {"host": host or platform.node(), "executor": executor, "device": planned_ctx.device.name}
    if slot is not None:
        out["slot"] = slot
    if index is not None:
        out["index"] = index
    out["profile"] = hw.name if hw is not None else None
    out["model"] = hw.title if hw is not None else None
    return out


def profiles_note(records) -> str | None:
    """A warning when a run's records were measured on more than one hardware profile (``placement.profile``)."""
    profiles = sorted({str(r["placement"].get("profile")) for r in records if isinstance(r.get("placement"), dict)})
    if len(profiles) < 2:
        return None
    return (f"records measured on {len(profiles)} hardware profiles ({', '.join(profiles)}): compare timings only "
            "within one profile (each record's placement.profile; docs/scale-out.md)")


def placement_note(records) -> str | None:
    """The spread of a run's records over the nodes that measured them (``placement.node``: executors that
    run jobs on cluster nodes), and the jobs retried after their slot was lost (``attempts``); None when
    there is neither."""
    from collections import Counter

    nodes: Counter = Counter()
    for r in records:
        p = r.get("placement")
        if isinstance(p, dict) and p.get("node"):
            nodes[(str(p.get("host")), str(p.get("address") or "?"), str(p["node"]))] += 1
    retried = [r for r in records if r.get("attempts")]
    parts = []
    if nodes:
        spread = ", ".join(f"{host} ({address}, node {node[:8]}): {n}" for (host, address, node), n in sorted(nodes.items()))
        parts.append(f"records measured on {len(nodes)} node{'s' * (len(nodes) != 1)}: {spread}")
    if retried:
        lost = sum(len(r["attempts"]) for r in retried)
        passed = sum(r.get("status") == "passed" for r in retried)
        parts.append(f"{len(retried)} job{'s' * (len(retried) != 1)} retried after {lost} lost attempt"
                     f"{'s' * (lost != 1)} ({passed} then passed; each record's attempts say where and why)")
    return "; ".join(parts) or None


# --------------------------------------------------------------------------------------------
# one job at a time in the calling thread


class InlineExecutor(Executor):
    """Runs each job in :meth:`next_done`, in the calling thread (Ctrl-C reaches the job as today)."""

    name = "local"

    def __init__(self, run: Callable[[Backend, Case], dict[str, Any]], where: dict[str, Any] | None = None,
                 on_close: Callable[[], None] | None = None) -> None:
        self.run, self.where, self.on_close = run, where, on_close
        self.queue: list[Job] = []

    def submit(self, job: Job) -> None:
        self.queue.append(job)

    def next_done(self, timeout: float) -> tuple[Job, dict[str, Any]] | None:
        if not self.queue:
            return None
        job = self.queue.pop(0)
        rec = self.run(job.backend, job.case)
        if self.where is not None and isinstance(rec, dict):
            rec.setdefault("placement", dict(self.where))
        return job, rec

    def cancel(self) -> None:
        self.queue.clear()

    def close(self) -> None:
        if self.on_close is not None:
            self.on_close()


# --------------------------------------------------------------------------------------------
# several jobs at once: one thread per slot


class SlotLost(Exception):
    """The slot's machinery died under a job (a Ray actor or node): the job is retried once elsewhere."""

    def __init__(self, reason: str, record: dict[str, Any]) -> None:
        super().__init__(reason)
        self.reason, self.record = reason, record


class SlotRetired(Exception):
    """The slot cannot come back (its device left: a Ray node gone and no room for its actor elsewhere): the
    job goes back to the queue unchanged (no attempt spent) and the slot's thread ends. ``record``: the
    job's record should this be the last live slot (nothing left to run it)."""

    def __init__(self, reason: str, record: dict[str, Any]) -> None:
        super().__init__(reason)
        self.reason, self.record = reason, record


class SlotExecutor(Executor):
    """One thread per slot takes queued jobs and calls :meth:`run_on`. A slot lost under a job
    (:class:`SlotLost`) is replaced (:meth:`replace`) and the job retried once, on another slot when one is
    live; a second loss is the record (``crashed``, with both reasons in ``attempts``). A slot that cannot
    be replaced (:class:`SlotRetired`) hands its job back and stops; the last live slot answers the jobs
    left with the reason instead (records, never a hung run)."""

    #: seconds a retry waits for a slot other than the one it failed on
    RETRY_ELSEWHERE_WAIT = 5.0

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.todo: queue.Queue = queue.Queue()
        self.done: queue.Queue = queue.Queue()
        self.cancelled = threading.Event()
        self.threads: list[threading.Thread] = []
        #: slots still running jobs (a retired slot's thread has ended), and why each retired one did
        self.live = slots
        self.retired: dict[int, str] = {}
        self.lock = threading.Lock()

    def start(self) -> None:
        for i in range(self.slots):
            t = threading.Thread(target=self._loop, args=(i,), name=f"kbench-{self.name}-slot{i}", daemon=True)
            t.start()
            self.threads.append(t)

    @abstractmethod
    def run_on(self, slot: int, job: Job) -> dict[str, Any]:
        """The record of ``job`` measured on ``slot``; raises :class:`SlotLost` when the slot died under it."""

    def replace(self, slot: int) -> None:
        """Make a fresh slot after a loss (default: nothing to do)."""

    def submit(self, job: Job) -> None:
        self.todo.put(job)

    def next_done(self, timeout: float) -> tuple[Job, dict[str, Any]] | None:
        try:
            return self.done.get(timeout=timeout)
        except queue.Empty:
            return None

    def _loop(self, slot: int) -> None:
        while not self.cancelled.is_set():
            try:
                job = self.todo.get(timeout=0.1)
            except queue.Empty:
                continue
            if job is None:
                return
            if job.avoid == slot and self.slots > 1 and time.monotonic() < job.avoid_until:
                self.todo.put(job)  # leave it to another slot for a while
                time.sleep(0.05)
                continue
            try:
                rec = self.run_on(slot, job)
            except SlotRetired as gone:
                if self.cancelled.is_set():
                    return
                with self.lock:
                    last = self.live == 1
                    if not last:
                        self.live -= 1
                        self.retired[slot] = gone.reason
                if not last:
                    self.todo.put(job)  # unchanged: another slot runs it
                    return
                rec = dict(gone.record)
            except SlotLost as lost:
                if self.cancelled.is_set():
                    return
                self.replace(slot)
                attempt = {"status": lost.record.get("status"), "reason": lost.reason,
                           "placement": lost.record.get("placement")}
                if job.attempt == 1:
                    self.todo.put(Job(job.index, job.case, job.backend, attempt=2, avoid=slot, earlier=[attempt],
                                      avoid_until=time.monotonic() + self.RETRY_ELSEWHERE_WAIT))
                    continue
                rec = dict(lost.record)
                rec["reason"] = f"lost twice: {'; '.join(a['reason'] for a in [*job.earlier, attempt])}"
                job.earlier.append(attempt)
            except BaseException as exc:  # noqa: BLE001 - an executor bug is a record, not a hung run
                if self.cancelled.is_set():
                    return
                from kbench.enums import Status
                from kbench.judge.context import new_record

                rec = new_record(job.backend.name, job.case, "?")
                rec.update(status=Status.ERROR.value, reason=f"executor {self.name!r} failed: "
                                                             f"{type(exc).__name__}: {exc}", cause="infrastructure")
            if job.earlier:
                rec["attempts"] = list(job.earlier)
            if not self.cancelled.is_set():
                self.done.put((job, rec))

    def cancel(self) -> None:
        self.cancelled.set()
        while True:
            try:
                self.todo.get_nowait()
            except queue.Empty:
                break
        self.interrupt()

    def interrupt(self) -> None:
        """Stop what the slots are running now (kill their workers); called by :meth:`cancel`."""

    def close(self) -> None:
        self.cancelled.set()
        for _ in self.threads:
            self.todo.put(None)
        for t in self.threads:
            t.join(timeout=30)
        self.threads.clear()


# --------------------------------------------------------------------------------------------
# the built-in local executor


def parse_devices(devices: list[str] | str | None, *, where: str = "--devices") -> list[str] | None:
    """``"0,1,3"`` or ``["0", "1"]`` -> ``["0", "1", "3"]``; None or empty -> None. Indices are integers >= 0."""
    if devices is None:
        return None
    items = devices.split(",") if isinstance(devices, str) else [p for d in devices for p in str(d).split(",")]
    items = [i.strip() for i in items if i.strip()]
    if not items:
        return None
    bad = [i for i in items if not i.isdigit()]
    if bad or len(set(items)) != len(items):
        raise BadInput(f"bad device list {','.join(items)!r}" + (f": {bad[0]!r} is not an index" if bad
                                                                   else ": an index appears twice"),
                       where=where, fix="give distinct device indices, e.g. --devices 0,1,2,3")
    return items


class LocalDevicesExecutor(SlotExecutor):
    """``local`` with ``--devices``: one slot per device, each with its own WorkerPool pinned to it."""

    name = "local"

    def __init__(self, pm: PluginManager, planned: Planned, devices: list[str]) -> None:
        from kbench.run.pool import MAX_WORKERS, WorkerPool

        super().__init__(len(devices))
        self.devices = devices
        ctx = planned.ctx
        untrusted = sum(not b.trusted for b in planned.backends)
        per_pool = max(2, min(MAX_WORKERS // len(devices), untrusted + 1))
        pin = ctx.device.visible_env  # e.g. CUDA_VISIBLE_DEVICES; the CPU's slots are not pinned
        self.pools = [WorkerPool(pm, ctx, isolate=True, case_timeout=planned.case_timeout,
                                 allow_unsandboxed=planned.request.allow_unsandboxed, max_workers=per_pool,
                                 device_env={pin: d} if pin else {}, concurrent=len(devices))
                      for d in devices]
        self.where = [placement(ctx, executor="local", slot=i, index=d if pin else None)
                      for i, d in enumerate(devices)]
        self.start()

    def run_on(self, slot: int, job: Job) -> dict[str, Any]:
        rec = self.pools[slot](job.backend, job.case)
        rec["placement"] = dict(self.where[slot])
        return rec

    def interrupt(self) -> None:
        for pool in self.pools:
            for _ in range(3):  # a slot thread may be replacing a worker right now
                try:
                    workers = list(pool.workers.values())
                    break
                except RuntimeError:
                    continue
            else:
                workers = []
            for worker in workers:
                worker.kill()

    def close(self) -> None:
        super().close()
        for pool in self.pools:
            pool.close()

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "slots": self.slots, "devices": list(self.devices)}


class LocalExecutorFactory(ExecutorFactory):
    name = "local"
    description = "this host: one job at a time, or one per device with --devices 0,1,..."

    def check(self, options: ExecutorOptions) -> None:
        if options.address:
            raise BadInput("the local executor takes no --address", where="--address",
                           fix="use --executor ray for a cluster")
        if options.settings:
            raise BadInput(f"the local executor takes no --executor-opt ({sorted(options.settings)[0]!r})",
                           where="--executor-opt", fix="say how many devices with --devices 0,1,...")

    def create(self, pm: PluginManager, planned: Planned, options: ExecutorOptions) -> Executor:
        self.check(options)
        if options.devices:
            return LocalDevicesExecutor(pm, planned, options.devices)
        return local_inline(pm, planned)


def local_inline(pm: PluginManager, planned: Planned) -> InlineExecutor:
    """Today's executor: a WorkerPool called in the runner's thread, one job at a time."""
    from kbench.run.pool import MAX_WORKERS, WorkerPool

    untrusted = sum(not b.trusted for b in planned.backends)
    pool = WorkerPool(pm, planned.ctx, isolate=planned.request.isolate, case_timeout=planned.case_timeout,
                      allow_unsandboxed=planned.request.allow_unsandboxed,
                      max_workers=min(MAX_WORKERS, max(8, untrusted + 1)))
    ex = InlineExecutor(pool, placement(planned.ctx, executor="local"), on_close=pool.close)
    if untrusted + 1 > pool.max_workers:
        # more untrusted backends than live workers: case-major order would restart a worker per record,
        # so each untrusted backend runs all its cases in a row (after the trusted ones)
        order = {b.name: i for i, b in enumerate(planned.backends)}
        ex.order = lambda todo: sorted(todo, key=lambda cb: (0, 0) if cb[1].trusted else (1, order[cb[1].name]))
    return ex


@kbench.hookimpl
def kbench_register_executors(registry) -> None:
    registry.add_executor(LocalExecutorFactory())


# --------------------------------------------------------------------------------------------
# a remote node: what an executor plugin runs on another host (a Ray actor, ...)
#
# The node is trusted kbench code (the same kbench and plugins as the parent). It hosts the judge and a
# WorkerPool for its one device, so candidate code runs there in the same sandboxed workers as locally.
# What travels to it: the setup below (no secret), and per job the backend's spec (a registry name, a
# pickled trusted backend, or a kernel file's *text*) with the case and a per-case input key derived
# from the run's secret (never the secret itself: a node learns the inputs of its own cases only).

#: the per-case input key of a remote job: HMAC-SHA256(run secret, NODE_KEY_LABEL + case id)
NODE_KEY_LABEL = b"kbench-node\x00"


def node_key(secret: bytes, case_id: str) -> bytes:
    import hashlib
    import hmac

    return hmac.new(secret, NODE_KEY_LABEL + case_id.encode(), hashlib.sha256).digest()


@dataclass(frozen=True)
class NodeSetup:
    """Everything a node needs to rebuild the run's execution context (picklable; no secret)."""

    plugins: tuple[str, ...]
    device: str
    op: str
    check: Any
    timing: Any
    integrity: Any
    case_timeout: float | None
    allow_unsandboxed: bool
    #: nodes measuring at once on one host at most (they share its memory)
    concurrent: int = 1


def node_setup(pm: PluginManager, planned: Planned, concurrent: int = 1) -> NodeSetup:
    ctx = planned.ctx
    plugins = tuple(i.module for i in pm.infos if i.source == "-p/KBENCH_PLUGINS")
    return NodeSetup(plugins, ctx.device.name, ctx.op.name, ctx.check, ctx.timing, ctx.integrity,
                     planned.case_timeout, planned.request.allow_unsandboxed, concurrent)


def node_payload(pm: PluginManager, planned: Planned, job: Job) -> dict[str, Any] | None:
    """What a node needs for ``job`` (None: the backend cannot be rebuilt elsewhere, see :func:`unsendable`)."""
    from kbench.run.pool import spec_for

    spec = spec_for(job.backend, pm.registry)
    if spec is None:
        return None
    return {"spec": spec, "case": job.case, "key": node_key(planned.ctx.secret, job.case.id)}


def job_record(planned: Planned, job: Job, status: str, reason: str, **extra: Any) -> dict[str, Any]:
    """A record the executor writes itself (the job never ran, or its node was lost under it)."""
    from kbench.judge.context import new_record

    rec = new_record(job.backend.name, job.case, planned.ctx.device.name)
    rec.update(status=status, reason=reason, **extra)
    return rec


def unsendable(planned: Planned, job: Job) -> dict[str, Any]:
    return job_record(planned, job, "error", "backend cannot be sent to another host (not registered, not a kernel "
                                             "file, not picklable); run it with --executor local",
                      cause="infrastructure")


def job_timeout(planned: Planned) -> float:
    """Seconds a remote job may take before its node counts as lost: twice the case timeout (the node's own
    workers time out a hung kernel first) plus a worker's start-up."""
    from kbench.run.pool import STARTUP_TIMEOUT, default_case_timeout

    return 2 * (planned.case_timeout or default_case_timeout(planned.ctx.timing)) + 2 * STARTUP_TIMEOUT


class NodeRunner:
    """Runs jobs on a node's one device: the judge here, candidate code in this node's sandboxed workers."""

    def __init__(self, setup: NodeSetup, *, executor: str, slot: int | None = None) -> None:
        import os

        from kbench.judge.context import RunContext
        from kbench.plugins import get_plugin_manager
        from kbench.run.pool import WorkerPool

        self.setup = setup
        self.pm = get_plugin_manager(setup.plugins)
        reg = self.pm.registry
        device = reg.device(setup.device)
        why = device.available()
        if why:
            raise RuntimeError(f"device {setup.device!r} is not available on {platform.node()}: {why}")
        ctx = RunContext(op=reg.op(setup.op), device=device, check=setup.check, timing=setup.timing,
                          hardware=self.pm.detect_hardware(device), integrity=setup.integrity, secret=b"")
        self.pool = WorkerPool(self.pm, ctx, isolate=True, case_timeout=setup.case_timeout,
                               allow_unsandboxed=setup.allow_unsandboxed, concurrent=setup.concurrent)
        index = os.environ.get(device.visible_env) if device.visible_env else None
        self.where = {**placement(ctx, executor=executor, slot=slot, index=index), "pid": os.getpid(),
                      "inputs": "per-case key"}
        self.scratch = None

    def backend(self, spec) -> Backend:
        """The backend a spec names; an untrusted kernel file only as a reference to its text (never imported here)."""
        import tempfile
        from pathlib import Path

        from kbench.kernelfile import KernelFileRef
        from kbench.worker.main import build_backend

        if self.scratch is None:
            self.scratch = tempfile.mkdtemp(prefix="kbench-node-")
        if spec.kind == "file" and not spec.trusted:
            import hashlib

            copy = Path(self.scratch) / f"kernel_{hashlib.sha1(spec.text.encode()).hexdigest()[:12]}.py"
            copy.write_text(spec.text, encoding="utf-8")
            ref = KernelFileRef(copy, self.pm.registry, settings=dict(spec.settings), name=spec.name)
            ref.source_path = spec.path
            return ref
        return build_backend(spec, self.pm.registry, self.scratch)

    def run(self, payload: dict[str, Any]) -> dict[str, Any]:
        from kbench.enums import Status
        from kbench.judge.context import new_record

        case = payload["case"]
        try:
            backend = self.backend(payload["spec"])
        except Exception as exc:  # noqa: BLE001 - a backend that cannot be rebuilt here is a record
            rec = new_record(payload["spec"].name, case, self.setup.device)
            rec.update(status=Status.ERROR.value, reason=f"cannot rebuild the backend on {self.where['host']}: "
                                                         f"{type(exc).__name__}: {exc}")
        else:
            self.pool.ctx.secret = payload["key"]
            try:
                rec = self.pool(backend, case)
            finally:
                self.pool.ctx.secret = b""
        rec["placement"] = dict(self.where)
        return rec

    def close(self) -> None:
        import shutil

        self.pool.close()
        if self.scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)


#: what executor plugins use (``from kbench.api import executor_kit``): one name in kbench.api for all of it
PUBLIC = SimpleNamespace(Executor=Executor, ExecutorFactory=ExecutorFactory, ExecutorOptions=ExecutorOptions,
                         Job=Job, SlotExecutor=SlotExecutor, SlotLost=SlotLost, InlineExecutor=InlineExecutor,
                         placement=placement, parse_devices=parse_devices, NodeSetup=NodeSetup, node_setup=node_setup,
                         node_payload=node_payload, unsendable=unsendable, NodeRunner=NodeRunner, node_key=node_key,
                         job_record=job_record, job_timeout=job_timeout,
                         SlotRetired=SlotRetired, placement_note=placement_note)
