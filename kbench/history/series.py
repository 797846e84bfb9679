"""Time series of a history: one per (machine, op, case, backend, measuring method), the runs in history order.

Histories keep machines apart (a series is one machine's): a time measured on another machine is
another quantity. ``mix_machines=True`` joins them into one history ordered by time, for a person who
asks for it (e.g. a fleet of identical machines), and every point still says which machine made it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from kbench.history.runs import EnvChange, Point, Run, environment_changes
from kbench.timing import MEASURING_METHOD

ALL_MACHINES = "all machines"


@dataclass
class Series:
    """The median time of one (case, backend) over the runs of one history."""

    machine: str
    op: str
    case_id: str
    case: Mapping[str, Any]
    backend: str
    runs: list[int] = field(default_factory=list)     # index of each point's run in ``History.runs``
    points: list[Point] = field(default_factory=list)
    #: how its times were made (kbench.timing.MEASURING_METHOD): runs of another method are another series
    method: str = str(MEASURING_METHOD)

    @property
    def key(self) -> str:
        key = f"{self.machine}|{self.backend}|{self.case_id}"
        return key if self.method == str(MEASURING_METHOD) else f"{key}|method {self.method}"

    @property
    def title(self) -> str:
        title = f"{self.backend} \u00b7 {self.case_id}"
        return title if self.method == str(MEASURING_METHOD) else f"{title} (measuring method {self.method})"


@dataclass
class History:
    """The runs of one machine (or of every machine, when mixed), in history order, and their series."""

    machine: str
    runs: list[Run]
    series: list[Series]
    env_changes: list[EnvChange]

    @property
    def mixed(self) -> bool:
        return self.machine == ALL_MACHINES


def build_history(machine: str, runs: Sequence[Run]) -> History:
    by_key: dict[tuple[str, str, str, str], Series] = {}
    for i, run in enumerate(runs):
        for p in run.points:
            # a new measuring method is a new ruler: its times start a series of their own, never a step
            key = (p.op, p.case_id, p.backend, run.method)
            s = by_key.get(key)
            if s is None:
                s = by_key[key] = Series(machine, p.op, p.case_id, p.case, p.backend, method=run.method)
            s.runs.append(i)
            s.points.append(p)
    series = sorted(by_key.values(), key=lambda s: (s.op, s.backend, s.case_id, s.method))
    # a mixed history's "environment changes" would mark every switch between machines: not drawn
    changes = [] if machine == ALL_MACHINES else environment_changes(runs)
    return History(machine, list(runs), series, changes)


def histories(runs: Sequence[Run], *, mix_machines: bool = False) -> list[History]:
    """One history per machine id (runs already in history order), or one of all of them when mixed."""
    if mix_machines:
        return [build_history(ALL_MACHINES, runs)]
    per_machine: dict[str, list[Run]] = {}
    for r in runs:
        per_machine.setdefault(r.machine_id, []).append(r)
    return [build_history(m, rs) for m, rs in sorted(per_machine.items())]
