"""Suite files: load, validate against the shipped JSON Schema, expand grids into cases."""
from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

import jsonschema

from kbench.errors import BadInput
from kbench.ops import Case, CaseError, Op
from kbench.selection import BackendPattern, backend_entries
from kbench.timing import TimingSettings
from kbench.yamlsource import describe_path, find_non_finite, load_yaml

SUITE_VERSION = 1
#: default of ``kbench run --max-cases``: a grid larger than this is refused before it is expanded
MAX_CASES = 100_000
#: largest value of one grid parameter: no dimension of a kernel reaches 2^31 (index arithmetic is 32-bit)
MAX_PARAMETER = 2**31 - 1


@lru_cache(maxsize=None)
def suite_schema() -> dict[str, Any]:
    return json.loads(resources.files("kbench").joinpath("schemas/suite.schema.json").read_text())


@lru_cache(maxsize=None)
def _suite_validator() -> jsonschema.Draft202012Validator:
    """The suite schema with its (non-recursive) ``$defs`` references inlined: resolving ``$ref`` per grid
    value was two thirds of validating a 10,000-entry grid (benchmarks/suite_load.py)."""
    schema = suite_schema()
    defs = schema.get("$defs", {})

    def inline(node: Any, depth: int = 0) -> Any:
        if depth > 32:  # a recursive schema would loop: keep the reference
            return node
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            if ref.startswith("#/$defs/") and ref[8:] in defs and len(node) == 1:
                return inline(defs[ref[8:]], depth + 1)
            return {k: inline(v, depth + 1) for k, v in node.items()}
        if isinstance(node, list):
            return [inline(v, depth + 1) for v in node]
        return node

    # a count is written as a count: JSON Schema's integers include 2.0, which then reached range() and slices
    # (rounds: 2.0, check.seeds: 2.0 ended runs with a TypeError); the grid's own check refuses 1.0 the same way
    counts = jsonschema.Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda checker, value: isinstance(value, int) and not isinstance(value, bool))
    validator = jsonschema.validators.extend(jsonschema.Draft202012Validator, type_checker=counts)
    return validator(inline(schema))


@dataclass(frozen=True)
class CheckSettings:
    seeds: int = 3
    max_rows: int = 256
    tolerance: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None, base: CheckSettings | None = None) -> CheckSettings:
        base = base or cls()
        data = data or {}
        return cls(seeds=data.get("seeds", base.seeds), max_rows=data.get("max_rows", base.max_rows),
                   tolerance={**base.tolerance, **data.get("tolerance", {})})

    def to_json(self) -> dict[str, Any]:
        return {"seeds": self.seeds, "max_rows": self.max_rows, "tolerance": dict(self.tolerance)}


@dataclass(frozen=True)
class DevicePlan:
    """What a suite asks for on one device: cases, backend patterns, check and timing settings."""

    device: str
    cases: list[Case]
    backends: list[BackendPattern]
    check: CheckSettings
    timing: TimingSettings
    case_timeout: float | None


@dataclass
class Suite:
    name: str
    op: str
    description: str
    path: str | None
    data: dict[str, Any]
    lines: dict[tuple, int] = field(default_factory=dict, repr=False)

    def devices(self) -> list[str]:
        return sorted(self.data.get("devices", {}))

    def plan(self, device: str, op: Op, *, max_cases: int | None = MAX_CASES) -> DevicePlan:
        """Resolve settings and expand the grid for ``device`` (its own grid, else the top-level one).

        The grid's size is computed from its axis lengths first: one over ``max_cases`` is refused
        before a single case is built (a million-case grid would otherwise take minutes and gigabytes)."""
        per = self.data.get("devices", {}).get(device, {})
        if "grid" in per:
            grid, where = per["grid"], ("devices", device, "grid")
        elif "grid" in self.data:
            grid, where = self.data["grid"], ("grid",)
        else:
            raise BadInput(f"suite has no grid for device {device!r}", file=self.path, where="devices",
                           fix=f"add `devices: {{{device}: {{grid: [...]}}}}` or a top-level `grid`, "
                               f"or pick one of: {', '.join(self.devices())}")
        timing_data = {**self.data.get("timing", {}), **per.get("timing", {})}
        check = CheckSettings.from_mapping(per.get("check"), CheckSettings.from_mapping(self.data.get("check")))
        count = count_cases(grid)
        if max_cases is not None and count > max_cases:
            raise BadInput(f"the grid expands to {count:,} cases, more than the limit of {max_cases:,}",
                           file=self.path, where=self.where(where),
                           fix="shrink the grid (tie axes with a key like 'batch,seqlen' instead of crossing them), "
                               "or raise the limit with --max-cases")
        return DevicePlan(device=device, cases=with_inputs(expand_grid(grid, op, self, where), op, self),
                          backends=backend_entries(per.get("backends", self.data.get("backends", ["*"])),
                                                   file=self.path, where=self.where,
                                                   place=("devices", device, "backends") if "backends" in per
                                                   else ("backends",)),
                          check=check, timing=TimingSettings.from_mapping(timing_data),
                          case_timeout=timing_data.get("case_timeout"))

    def where(self, path: tuple) -> str:
        return describe_path(path, self.lines)


def load_suite(path: str | Path) -> Suite:
    data, lines = load_yaml(path)
    return suite_from_data(data, path=str(path), lines=lines)


def suite_from_data(data: Any, *, path: str | None = None, lines: dict | None = None) -> Suite:
    lines = lines or {}
    if not isinstance(data, dict):
        raise BadInput("a suite must be a YAML mapping with at least `name` and `grid`", file=path,
                       fix="see docs/suites.md for the format")
    bad = find_non_finite(data)
    if bad is not None:
        raise BadInput("not a finite number (NaN or infinity)", file=path, where=describe_path(bad, lines),
                       fix="give a finite number")
    version = data.get("version", SUITE_VERSION)
    if isinstance(version, int) and version > SUITE_VERSION:
        raise BadInput(f"suite format version {version} is newer than this kbench reads ({SUITE_VERSION})",
                       file=path, where=describe_path(("version",), lines), fix="upgrade kbench")
    error = jsonschema.exceptions.best_match(_suite_validator().iter_errors(data))
    if error is not None:
        place = tuple(error.absolute_path)
        if error.validator == "additionalProperties" and isinstance(error.instance, dict):
            allowed = set(error.schema.get("properties", {}))
            extra = sorted((k for k in error.instance if k not in allowed), key=str)
            place += tuple(extra[:1])  # point at the offending key's own line
        raise BadInput(f"{_schema_message(error)}", file=path, where=describe_path(place, lines),
                       fix=_schema_fix(error))
    return Suite(name=data["name"], op=data.get("op", "attention"), description=data.get("description", ""),
                 path=path, data=data, lines=lines)


def _schema_message(error: jsonschema.ValidationError) -> str:
    if "propertyNames" in error.schema_path:
        return f"the key {error.instance!r} is not a name ({error.message})"
    if error.validator == "additionalProperties":
        return error.message.replace("Additional properties are not allowed", "unknown key")
    if error.validator in ("maxLength", "pattern") and isinstance(error.instance, str) and len(error.instance) > 60:
        # never the whole string: a 5,000-character name is not quoted back
        rule = (f"longer than {error.validator_value} characters" if error.validator == "maxLength"
                else f"not of the form {error.validator_value}")
        return f"{error.instance[:40]!r}... ({len(error.instance):,} characters) is {rule}"
    return error.message


def _schema_fix(error: jsonschema.ValidationError) -> str:
    desc = error.schema.get("description") if isinstance(error.schema, dict) else None
    if error.validator == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        return f"allowed keys here: {', '.join(allowed)}" if allowed else "remove the key"
    if error.validator == "anyOf" and not error.absolute_path:
        return "add a top-level `grid:` list, or `devices: {cpu: {grid: [...]}}`"
    return f"expected: {desc}" if desc else "see docs/suites.md for the format"


def with_inputs(cases: list[Case], op: Op, suite: Suite | None) -> list[Case]:
    """The cases crossed with the suite's ``inputs:`` value ranges (kbench.ops.inputs.VALUE_RANGES), each case
    first with ``unit`` where listed; a case that names its own ``values`` in the grid keeps it. No ``inputs:``:
    the cases as they are."""
    data = suite.data if suite is not None else {}
    if "inputs" not in data:
        return cases
    names = data["inputs"] if isinstance(data["inputs"], list) else [data["inputs"]]
    if not getattr(op, "takes_values", False):
        raise BadInput(f"op {op.name!r} has no value ranges", file=suite.path, where=suite.where(("inputs",)),
                       fix="remove `inputs:` (value ranges are for attention, attention_varlen and decode_attention)")
    out: dict[str, Case] = {}
    for case in cases:
        for i, name in enumerate(names):
            raw = dict(case.params)
            raw.setdefault("values", name)
            try:
                made = op.make_case(raw)
            except CaseError as exc:
                raise BadInput(f"{exc} (inputs: {name!r} with the case {case.id})", file=suite.path,
                               where=suite.where(("inputs", i) if isinstance(data["inputs"], list) else ("inputs",)),
                               fix="name a value range the case can take: unit, large_scores, outlier_channels, "
                                   "outlier_tokens, constant_rows, one_hot or std:S (S a power of two); "
                                   "fp8_e4m3 cases take unit only") from None
            out.setdefault(made.id, made)
    return list(out.values())


def count_cases(grid: list[Mapping[str, Any]]) -> int:
    """How many combinations ``grid`` expands to (before duplicates are merged), without expanding it."""
    total = 0
    for entry in grid:
        n = 1
        for value in entry.values():
            n *= len(value) if isinstance(value, list) else 1
        total += n
    return total


def expand_grid(grid: list[Mapping[str, Any]], op: Op, suite: Suite | None = None,
                where: tuple = ("grid",)) -> list[Case]:
    """Cases of a grid: each entry is a cartesian product of its axes; tied keys ('a,b') move together."""
    def place(*extra) -> str | None:
        return suite.where(where + extra) if suite else ".".join(map(str, where + extra))

    path = suite.path if suite else None
    cases: dict[str, Case] = {}
    for i, entry in enumerate(grid):
        axes: list[list[dict[str, Any]]] = []
        for key, value in entry.items():
            names = [n.strip() for n in key.split(",")]
            if len(names) > 1:
                rows = value if isinstance(value, list) else [value]
                for j, row in enumerate(rows):
                    if not isinstance(row, list) or len(row) != len(names):
                        raise BadInput(f"tied key {key!r} needs rows of {len(names)} values, got {row!r}",
                                       file=path, where=place(i, key, j),
                                       fix=f"write each row as [{', '.join(names)}]")
                axes.append([dict(zip(names, row)) for row in rows])
            else:
                values = value if isinstance(value, list) else [value]
                listed = key in getattr(op, "list_params", ())  # a list is one value (window: [128, 0])
                if listed and isinstance(value, list) and not any(isinstance(v, list) for v in value):
                    values = [value]
                for j, v in enumerate(values):
                    if isinstance(v, list) and not listed:
                        raise BadInput(f"{key!r} is not a tied key but has a list value {v!r}", file=path,
                                       where=place(i, key, j), fix="tie parameters with a key like 'batch,seqlen'")
                axes.append([{key: v} for v in values])
            for j, v in enumerate(value if isinstance(value, list) else [value]):
                for x in (v if isinstance(v, list) else [v]):
                    if isinstance(x, (int, float)) and not isinstance(x, bool) and abs(x) > MAX_PARAMETER:
                        raise BadInput(f"{key!r} = {x!r} is beyond any kernel's dimensions (at most {MAX_PARAMETER:,})",
                                       file=path, where=place(i, key, j) if isinstance(value, list) else place(i, key),
                                       fix="give a realistic size (a sequence of a million tokens is 1000000)")
        for combo in itertools.product(*axes):
            raw: dict[str, Any] = {}
            for part in combo:
                raw.update(part)
            try:
                case = op.make_case(raw)
            except CaseError as exc:
                raise BadInput(f"{exc} (in the case {raw})", file=path, where=place(i),
                               fix="change the grid entry so every combination is valid") from None
            cases.setdefault(case.id, case)
    return list(cases.values())
