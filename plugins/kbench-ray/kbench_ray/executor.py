"""The Ray executor proper (imports ray: loaded only by ``RayExecutorFactory.create``).

One slot per device of the cluster: a Ray actor that asks for one device (``num_gpus=1``, or one unit of
a custom resource such as ``kdev``; ``num_cpus=1`` on a CPU cluster) and hosts a
:class:`kbench.api.executor_kit.NodeRunner`: the judge and a WorkerPool on that device, so candidate code
runs in the node's own sandboxed workers, exactly as locally. A slot runs one job at a time; Ray never
places two such actors on one device. The parent keeps the run's secret: a job carries its case's
derived input key only.

Faults: an actor or node lost under a job (killed, out of memory, node gone) is :class:`SlotLost`:
the slot gets a fresh actor and the job is retried once, on another slot when one is live; a job
that outlasts :func:`kbench.api.executor_kit.job_timeout` counts as lost too (the run never hangs).
A slot whose fresh actor finds no room in the cluster (a node gone for good) retires
(:class:`SlotRetired`): its jobs go to the other slots. Ctrl-C kills every actor (their workers die
with them).

A cluster this executor starts itself listens on loopback only (node address 127.0.0.1:
:mod:`kbench_ray.loopback`).
"""
from __future__ import annotations

import platform
import re
import threading
import time
from typing import Any

import ray
import ray.exceptions as rex

from kbench.api import BadInput, KbenchError, Status
from kbench.api import executor_kit as kx
from kbench_ray.loopback import LOOPBACK, keep_loopback
from kbench_ray.plugin import init_address
from kbench_ray.settings import check_settings

#: what losing an actor or its node raises
LOST = (rex.RayActorError, rex.NodeDiedError, rex.WorkerCrashedError, rex.ObjectLostError)
#: seconds between checks for Ctrl-C while a job runs
POLL = 0.25


class Node:
    """The Ray actor of one slot (decorated with ``ray.remote`` when a run starts). A node that cannot
    measure (its device missing, a plugin failing) answers every job with why, instead of dying: that is
    the same on every attempt, so retrying elsewhere would not help."""

    def __init__(self, setup, slot: int) -> None:
        self.runner, self.broken = None, None
        try:
            self.runner = kx.NodeRunner(setup, executor="ray", slot=slot)
            self.runner.where["node"] = ray.get_runtime_context().get_node_id()
            self.runner.where["address"] = ray.util.get_node_ip_address()
        except Exception as exc:  # noqa: BLE001 - reported with every job
            self.broken = {"host": platform.node(), "node_error": f"{type(exc).__name__}: {exc}"}

    def run(self, payload: dict[str, Any]) -> dict[str, Any]:
        return dict(self.broken) if self.broken else self.runner.run(payload)

    def close(self) -> None:
        if self.runner is not None:
            self.runner.close()


def _bad(message: str, fix: str, where: str = "--executor-opt") -> BadInput:
    return BadInput(message, where=where, fix=fix)


class RayExecutor(kx.SlotExecutor):
    name = "ray"

    def __init__(self, pm, planned, options) -> None:
        check_settings(options)
        settings = dict(options.settings)
        self.pm, self.planned = pm, planned
        self.started_ray = False
        _connect(options)
        self.started_ray = True
        try:
            self._configure(settings)
        except BaseException:
            self.close_ray()
            raise
        super().__init__(self.slots)
        self.actors: list[Any] = [None] * self.slots
        self.start()

    def _configure(self, settings: dict[str, str]) -> None:
        device = self.planned.ctx.device.name
        self.resource = settings.get("resource") or ("CPU" if device == "cpu" else "GPU")
        have = ray.cluster_resources()
        total = int(have.get(self.resource, 0))
        if total < 1:
            listed = ", ".join(f"{k}={v:g}" for k, v in sorted(have.items()) if not k.startswith("node:")
                               and "memory" not in k)
            raise _bad(f"the Ray cluster has no {self.resource!r} resource (it has {listed})",
                       "start nodes with it, or name another with --executor-opt resource=NAME")
        slots = int(float(settings.get("slots") or total))
        self.job_timeout = float(settings.get("job_timeout") or kx.job_timeout(self.planned))
        if slots > total:
            raise _bad(f"slots={slots} but the cluster has {total} {self.resource!r}",
                       f"at most --executor-opt slots={total}: never two timed jobs on one device")
        self.slots = slots
        if self.resource == "GPU":
            self.options = {"num_gpus": 1, "num_cpus": 0}
        elif self.resource == "CPU":
            self.options = {"num_cpus": 1}
        else:
            self.options = {"resources": {self.resource: 1}, "num_cpus": 0}
        # one actor per node before two on one: jobs use every node with a free device
        self.options["scheduling_strategy"] = "SPREAD"
        self.setup = kx.node_setup(self.pm, self.planned, concurrent=slots)

    # -- slots ------------------------------------------------------------------------------------

    def _actor(self, slot: int, job):
        """The slot's actor, started and placed. A fresh actor waits for room in the cluster; when the cluster
        no longer has a device for every live slot (a node gone), the slot retires instead."""
        if self.actors[slot] is not None:
            return self.actors[slot]
        remote = ray.remote(max_restarts=0, max_task_retries=0)(Node)
        actor = self.actors[slot] = remote.options(**self.options).remote(self.setup, slot)
        ready = actor.__ray_ready__.remote()
        deadline = time.monotonic() + self.job_timeout
        where = {"executor": "ray", "slot": slot, "host": "?", "device": self.planned.ctx.device.name}
        while not ray.wait([ready], timeout=POLL)[0]:
            if self.cancelled.is_set():
                raise kx.SlotRetired("cancelled", {})
            have = int(ray.cluster_resources().get(self.resource, 0))
            if have < self.live:
                self.replace(slot)
                reason = (f"slot {slot} retired: the Ray cluster has {have} {self.resource!r} left for "
                          f"{self.live} slots (a node left)")
                raise kx.SlotRetired(reason, kx.job_record(self.planned, job, Status.ERROR.value,
                                                           f"no Ray node left to run it: {reason}",
                                                           cause="infrastructure", placement=where))
            if time.monotonic() > deadline:
                reason = f"the Ray actor of slot {slot} was not placed within {self.job_timeout:g} s"
                raise kx.SlotLost(reason, kx.job_record(self.planned, job, Status.TIMEOUT.value, reason,
                                                       cause="infrastructure", placement=where))
        try:
            ray.get(ready)
        except LOST as exc:
            reason = f"the Ray actor of slot {slot} was lost while starting: {_first_line(exc)}"
            raise kx.SlotLost(reason, kx.job_record(self.planned, job, Status.CRASHED.value, reason,
                                                   cause="infrastructure", placement=where)) from None
        return actor

    def _wait(self, ref, deadline: float) -> bool:
        while time.monotonic() < deadline:
            if self.cancelled.is_set():
                return False
            ready, _ = ray.wait([ref], timeout=POLL)
            if ready:
                return True
        return False

    def run_on(self, slot: int, job) -> dict[str, Any]:
        payload = kx.node_payload(self.pm, self.planned, job)
        if payload is None:
            return kx.unsendable(self.planned, job)
        actor = self._actor(slot, job)
        ref = actor.run.remote(payload)
        where = {"executor": "ray", "slot": slot, "host": "?", "device": self.planned.ctx.device.name}
        if not self._wait(ref, time.monotonic() + self.job_timeout):
            status = Status.TIMEOUT.value
            reason = (f"the job's Ray actor (slot {slot}) did not answer within {self.job_timeout:g} s "
                      "(node hung or unreachable); it was killed")
            raise kx.SlotLost(reason, kx.job_record(self.planned, job, status, reason, cause="infrastructure",
                                                   placement=where))
        try:
            rec = ray.get(ref)
        except LOST as exc:
            reason = f"the job's Ray actor (slot {slot}) was lost: {_first_line(exc)}"
            raise kx.SlotLost(reason, kx.job_record(self.planned, job, Status.CRASHED.value, reason,
                                                   cause="infrastructure", placement=where)) from None
        except rex.RayTaskError as exc:  # kbench's node code raised: a record, the slot is fine
            return kx.job_record(self.planned, job, Status.ERROR.value,
                                 f"the Ray node failed: {_first_line(exc)}", cause="infrastructure",
                                 placement=where)
        if "node_error" in rec:
            where["host"] = rec["host"]
            return kx.job_record(self.planned, job, Status.ERROR.value, f"the Ray node on {rec['host']} cannot "
                                 f"measure: {rec['node_error']}", cause="infrastructure", placement=where)
        return rec

    def replace(self, slot: int) -> None:
        actor, self.actors[slot] = self.actors[slot], None
        if actor is not None:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass

    def interrupt(self) -> None:
        for slot in range(self.slots):
            self.replace(slot)

    def close(self) -> None:
        super().close()
        for slot, actor in enumerate(self.actors):
            if actor is not None:
                try:
                    ray.get(actor.close.remote(), timeout=30)
                except Exception:  # noqa: BLE001 - lost or hung: killed below
                    pass
                self.replace(slot)
        self.close_ray()

    def close_ray(self) -> None:
        if self.started_ray:
            self.started_ray = False
            _disconnect()

    def describe(self) -> dict[str, Any]:
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        return {"name": self.name, "slots": self.slots, "resource": self.resource, "driver": platform.node(),
                "nodes": [{"node": n["NodeID"], "address": n["NodeManagerAddress"],
                           self.resource: n.get("Resources", {}).get(self.resource, 0)} for n in nodes]}


#: this process's connection to Ray, shared by the executors of concurrent runs (``kbench evolve run
#: --parallel N --executor ray``: one run per screening, in threads): the first connects, the last one
#: done disconnects, and only when it was kbench that connected (a driver's own ray.init stays as it is)
_SHARED = {"users": 0, "ours": False}
_SHARED_LOCK = threading.Lock()


def _connect(options) -> None:
    with _SHARED_LOCK:
        if _SHARED["users"] == 0 and not ray.is_initialized():
            address = init_address(options.address)
            keep_loopback()  # a loopback address stays one (a cluster at 127.0.0.1 listens there only)
            local = {"_node_ip_address": LOOPBACK} if address == "local" else {}
            try:
                ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level="warning",
                         **local)
            except (ConnectionError, RuntimeError, ValueError, TimeoutError) as exc:
                if address == "local":
                    raise KbenchError(f"cannot start a local Ray cluster: {exc}",
                                      fix="see Ray's logs in its temporary directory, or give --address of a "
                                          "running cluster") from None
                raise _bad(f"cannot reach the Ray cluster at {address}: {exc}",
                           "check the address (ray status on the head node), or leave out --address "
                           "to start a local cluster", where="--address" if options.address else "RAY_ADDRESS") from None
            _SHARED["ours"] = True
        _SHARED["users"] += 1


def _disconnect() -> None:
    with _SHARED_LOCK:
        _SHARED["users"] -= 1
        if _SHARED["users"] == 0 and _SHARED["ours"]:
            _SHARED["ours"] = False
            ray.shutdown()


def _first_line(exc: BaseException) -> str:
    """Ray's message without colour codes and object reprs: its first line."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    line = re.sub(r", repr=<[^>]*>", "", lines[0] if lines else type(exc).__name__)
    return line[:500]
