"""Tasks: what the server evaluates, declared in YAML files the server loads (``kbench serve --tasks DIR``).

A task is an op and a suite (the cases a kernel is scored on), a baseline backend measured in the same run,
the held-out policy (how many hidden shapes near the suite's are checked), and the limits of a submission.
Clients name a task by id and never see its suite's settings beyond its description, nor any held-out shape.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema

from kbench.api import BadInput, Suite, suite_from_data

#: a task file's keys (one place: validated with jsonschema, documented in docs/serve.md)
TASK_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["id", "suite"],
    "properties": {
        "id": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"},
        "description": {"type": "string", "maxLength": 2000},
        "suite": {"type": ["string", "object"]},
        "baseline": {"type": ["string", "null"], "minLength": 1},
        "device": {"type": "string", "minLength": 1},
        "held_out": {"type": "integer", "minimum": 0, "maximum": 64},
        "case_timeout": {"type": "number", "exclusiveMinimum": 0, "maximum": 3600},
        "max_source_bytes": {"type": "integer", "minimum": 64, "maximum": 4_194_304},
    },
}

DEFAULT_MAX_SOURCE = 262_144  # bytes of kernel source a submission may carry (a kernel file is a few KiB)


@dataclass(frozen=True)
class Task:
    """One task of the server: its suite is resolved once, at start, so a bad file stops the server there."""

    id: str
    suite: Suite
    file: str
    description: str = ""
    baseline: str | None = None
    device: str = "cpu"
    held_out: int | None = None  # None: kbench's default number of held-out shapes
    case_timeout: float | None = None
    max_source_bytes: int = DEFAULT_MAX_SOURCE
    n_cases: int = 0
    data: dict = field(default_factory=dict, compare=False, repr=False)

    def public(self) -> dict[str, Any]:
        """What a client sees: enough to write a kernel (op, dtypes, what is scored), nothing about the
        held-out shapes; the suite's own cases are public as in any benchmark (they are in the records)."""
        return {"id": self.id, "description": self.description, "op": self.suite.op, "device": self.device,
                "baseline": self.baseline, "cases": self.n_cases,
                "held_out": "checked (hidden)" if self.held_out != 0 else "off",
                "max_source_bytes": self.max_source_bytes}


def describe_path(path: tuple, lines: dict) -> str:
    """``line N`` of a key path (the nearest enclosing key with a line), else the path itself."""
    for n in range(len(path), 0, -1):
        if path[:n] in lines:
            return f"line {lines[path[:n]]} ({'.'.join(map(str, path))})"
    return ".".join(map(str, path)) or "top level"


def _bad(file: Path, where: str, message: str, fix: str) -> BadInput:
    return BadInput(message, file=str(file), where=where, fix=fix)


def load_task(path: str | Path) -> Task:
    """One task file, validated: a bad key, a missing suite or a suite that is itself wrong raises
    :class:`kbench.api.BadInput` naming the file, the place and the fix."""
    from kbench.api import load_yaml

    path = Path(path)
    data, lines = load_yaml(path)
    if not isinstance(data, dict):
        raise _bad(path, "top level", "a task file must be a YAML mapping",
                   "write `id: NAME` and `suite: SUITE.yaml` (docs/serve.md, Tasks)")
    errors = sorted(jsonschema.Draft202012Validator(TASK_SCHEMA).iter_errors(data), key=lambda e: list(e.path))
    if errors:
        err = errors[0]
        where = describe_path(tuple(err.path), lines) if err.path else "top level"
        raise _bad(path, where, f"{err.message}",
                   "the keys are id, description, suite, baseline, device, held_out, case_timeout, "
                   "max_source_bytes (docs/serve.md, Tasks)")
    suite_spec = data["suite"]
    if isinstance(suite_spec, str):
        suite_path = (path.parent / suite_spec).resolve()
        if not suite_path.is_file():
            raise _bad(path, describe_path(("suite",), lines), f"the suite file {suite_spec!r} does not exist "
                       f"(looked for {suite_path})", "give a path relative to the task file, or the suite inline")
        from kbench.api import load_suite

        suite = load_suite(suite_path)  # its own errors name the suite file
    else:
        suite = suite_from_data(dict(suite_spec), path=f"{path} (suite)")
    from kbench.api import get_plugin_manager

    registry = get_plugin_manager().registry
    op = registry.op(suite.op)
    device = data.get("device", "cpu")
    n_cases = len(suite.plan(device, op).cases)  # a grid that does not expand stops the server here
    baseline = data.get("baseline")
    if baseline:
        names = [b.name for b in registry.backends.values() if b.op == op.name]
        if baseline not in names:
            raise _bad(path, describe_path(("baseline",), lines), f"no backend of op {op.name!r} is called "
                       f"{baseline!r}", f"one of: {', '.join(sorted(names)[:12])} (kbench list)")
    return Task(id=data["id"], suite=suite, file=str(path), description=data.get("description", ""),
                baseline=baseline, device=device, held_out=data.get("held_out"),
                case_timeout=data.get("case_timeout"),
                max_source_bytes=data.get("max_source_bytes", DEFAULT_MAX_SOURCE), n_cases=n_cases, data=data)


def load_tasks(directory: str | Path) -> dict[str, Task]:
    """Every ``*.yaml``/``*.yml`` task file of ``directory`` (not its subfolders: suites may live there)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise BadInput(f"{directory} is not a directory", where="--tasks",
                       fix="give the folder holding the task files (docs/serve.md, Tasks)")
    tasks: dict[str, Task] = {}
    files = sorted([*directory.glob("*.yaml"), *directory.glob("*.yml")])
    for file in files:
        try:
            head = file.read_text(encoding="utf-8", errors="replace")[:4096]
        except OSError as exc:
            raise BadInput(f"cannot read: {exc}", file=str(file), fix="make the task file readable") from None
        if "\nid:" not in "\n" + head:  # a suite kept beside the tasks, not a task
            continue
        task = load_task(file)
        if task.id in tasks:
            raise _bad(file, "id", f"the task id {task.id!r} is also declared by {tasks[task.id].file}",
                       "give each task file its own id")
        tasks[task.id] = task
    if not tasks:
        raise BadInput(f"no task file in {directory} (a YAML file with `id:` and `suite:`)", where="--tasks",
                       fix="write one, e.g. examples/rl-loop/tasks/attention-tiny.yaml (docs/serve.md, Tasks)")
    return tasks
