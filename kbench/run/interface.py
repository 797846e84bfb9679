"""The executor interface: what an executor plugin implements and what the registry checks it registers.

:class:`ExecutorFactory` (registered with ``registry.add_executor``), the :class:`Executor` it makes, the
:class:`Job` the runner hands it and the :class:`ExecutorOptions` of ``kbench run``. The built-in executors and
the helpers executor plugins share are :mod:`kbench.run.executors` (which re-exports these names; plugins use
``kbench.api.executor_kit``).

This module sits low (docs/architecture.md, "Layers"): :mod:`kbench.registry` imports it, so it imports nothing
above the registry. What the runner and the plugin manager pass down is typed here by :class:`Planned` (the
parts of :class:`kbench.run.runner.PlannedRun` an executor reads) and ``Any``.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from kbench.backends import Backend
    from kbench.ops import Case


class Planned(Protocol):
    """What an executor reads of the runner's :class:`kbench.run.runner.PlannedRun` (which sits above it)."""

    #: the run's :class:`kbench.judge.context.RunContext` (device, hardware profile, timing, integrity, secret)
    ctx: Any
    backends: list[Backend]
    #: the run's :class:`kbench.run.runner.RunRequest` (``isolate``, ``allow_unsandboxed``)
    request: Any
    case_timeout: float | None


@dataclass
class Job:
    """One (case, backend) of the run; ``index`` is its place in the runner's list."""

    index: int
    case: Case
    backend: Backend
    attempt: int = 1
    #: the slot a failed attempt ran on: a retry runs elsewhere when another slot is live before this time
    avoid: int | None = None
    avoid_until: float = 0.0
    #: what earlier attempts left: {"status", "reason", "placement"} each
    earlier: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class ExecutorOptions:
    """What ``kbench run`` passes to an executor's factory: ``--devices``, ``--address``, ``--executor-opt``."""

    devices: list[str] | None = None
    address: str | None = None
    settings: dict[str, str] = field(default_factory=dict)


class Executor(ABC):
    """Runs jobs and hands back their records (in completion order); see :mod:`kbench.run.executors`."""

    name: str = ""

    #: jobs it runs at once
    slots: int = 1

    @abstractmethod
    def submit(self, job: Job) -> None:
        """Queue a job; never blocks on its execution."""

    @abstractmethod
    def next_done(self, timeout: float) -> tuple[Job, dict[str, Any]] | None:
        """The next finished job and its record, or None after ``timeout`` seconds without one."""

    def order(self, todo: list) -> list:
        """The runner's (case, backend) list, reordered where this executor runs better so."""
        return todo

    def cancel(self) -> None:
        """Ctrl-C: stop the jobs in flight and drop the queued ones (their records are not written)."""

    def close(self) -> None:
        """Release workers, threads, connections."""

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "slots": self.slots}


class ExecutorFactory(ABC):
    """What a plugin registers with ``registry.add_executor``: makes the executor of one run."""

    name: str = ""
    description: str = ""
    #: it runs jobs away from this process: a named device need not be usable here
    remote: bool = False

    def available(self) -> str | None:
        """None when it can run here; else why not (a missing library), without importing it."""
        return None

    def status(self, options: ExecutorOptions | None = None) -> str | None:
        """For ``kbench list``, when available: what else to know (where it needs a cluster, whether one is
        reachable and why not); None: nothing."""
        return None

    def check(self, options: ExecutorOptions) -> None:
        """Refuse bad options (BadInput) before the run claims its result file; cheap, no engine import."""

    @abstractmethod
    def create(self, pm: Any, planned: Planned, options: ExecutorOptions) -> Executor:
        """The executor of ``planned`` (``pm``: the run's :class:`kbench.plugins.PluginManager`); bad options raise
        :class:`kbench.errors.BadInput`."""
