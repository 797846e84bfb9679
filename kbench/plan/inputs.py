"""What `kbench plan` reads: workloads (request mix, arrival process, prefix caching, multi-turn conversations),
request traces, interconnect profiles, SLOs and price overrides (docs/plan.md)."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any, Mapping, Sequence

from kbench.errors import BadInput
from kbench.hardware import HardwareProfile, check_schema, parse_yaml_file

_NAME = {"type": "string", "pattern": "^[a-z0-9][a-z0-9._-]*$", "description": "a lower-case name such as my-workload"}
_POSITIVE = {"type": "number", "exclusiveMinimum": 0, "description": "a positive number"}
_TOKENS = {"type": "integer", "minimum": 1, "description": "a positive number of tokens"}


@dataclass(frozen=True)
class RequestClass:
    share: float          # fraction of requests
    input: int            # prompt tokens
    output: int           # generated tokens


@dataclass(frozen=True)
class SLO:
    ttft: float           # seconds to the first token
    tpot: float           # seconds per output token after the first


@dataclass(frozen=True)
class Trace:
    """Requests replayed from a file: arrival times (seconds from the first) and token counts."""
    path: str
    arrival: tuple[float, ...]
    input: tuple[int, ...]
    output: tuple[int, ...]

    @property
    def rate(self) -> float:
        span = self.arrival[-1] - self.arrival[0]
        return (len(self.arrival) - 1) / span if span > 0 else math.inf


@dataclass(frozen=True)
class Arrivals:
    """How requests arrive: ``poisson`` (exponential gaps), ``gamma`` (gaps with coefficient of variation
    ``cv``: burstier than Poisson above 1, smoother below) or ``trace`` (a file's arrival times and lengths)."""
    process: str = "poisson"
    cv: float = 1.0
    trace: Trace | None = None

    @property
    def label(self) -> str:
        if self.process == "gamma":
            return f"gamma arrivals (CV {self.cv:g})"
        if self.process == "trace" and self.trace is not None:
            return f"trace {self.trace.path} ({len(self.trace.arrival):,} requests)"
        return "Poisson arrivals"


@dataclass(frozen=True)
class ServedClass:
    """A request class as the servers see it: ``input`` tokens of context, of which ``cached`` are found in the
    prefix cache (not computed again), and ``output`` generated tokens; ``origin`` indexes the workload's mix."""
    share: float
    input: int
    cached: int
    output: int
    origin: int


@dataclass(frozen=True)
class Workload:
    name: str
    title: str
    rate: float                          # requests per second
    mix: tuple[RequestClass, ...]
    slo: SLO
    attainment: float                    # fraction of requests that must meet the SLO
    source: str = ""
    prefix_cache: float = 0.0            # fraction of each prompt found in the prefix cache (shared context)
    turns: int = 1                       # requests per conversation; later turns carry the earlier ones as context
    think_time: float = 0.0              # mean seconds between a turn's last token and the next turn
    turn_input: int | None = None        # new tokens a later turn brings (a tool result); default: the class's input
    arrivals: Arrivals = field(default_factory=Arrivals)

    def mean(self, what: str) -> float:
        return sum(c.share * getattr(c, what) for c in self.mix)

    def turn(self, c: RequestClass, j: int) -> tuple[int, int]:
        """(context, cached) tokens of turn j (0-based) of a conversation of class ``c``: the first turn's
        prompt has the prefix-cache fraction cached (shared context); a later turn carries every earlier prompt
        and answer as cached context and brings ``turn_input`` new tokens."""
        if j == 0:
            return c.input, int(self.prefix_cache * c.input)
        new = self.turn_input or c.input
        before = c.input + c.output + (j - 1) * (new + c.output)
        return before + new, before

    def served(self) -> tuple[ServedClass, ...]:
        """The mix as served: every turn of every class, each 1/turns of its class's share."""
        out = []
        for i, c in enumerate(self.mix):
            for j in range(self.turns):
                context, cached = self.turn(c, j)
                out.append(ServedClass(c.share / self.turns, context, cached, c.output, i))
        return tuple(out)


@dataclass(frozen=True)
class Interconnect:
    name: str
    title: str
    scope: str                           # "node" or "network"
    bandwidth: float                     # B/s per device, one direction
    latency: float                       # seconds per transfer
    source: str = ""


WORKLOAD_FILE_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["workloads"], "additionalProperties": False,
    "properties": {"version": {"const": 1, "description": "format version 1"},
                   "workloads": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/workload"}}},
    "$defs": {"workload": {
        "type": "object", "required": ["name", "rate", "mix", "slo"], "additionalProperties": False,
        "properties": {
            "name": _NAME, "title": {"type": "string"}, "source": {"type": "string"},
            "rate": {**_POSITIVE, "description": "requests per second, a positive number"},
            "attainment": {"type": "number", "exclusiveMinimum": 0, "maximum": 1,
                           "description": "a fraction in (0, 1], e.g. 0.9"},
            "prefix_cache": {"type": "number", "minimum": 0, "maximum": 0.999,
                             "description": "a fraction in [0, 1) of each prompt found in the prefix cache"},
            "turns": {"type": "integer", "minimum": 1, "maximum": 1000,
                      "description": "requests per conversation, 1 to 1000"},
            "think_time": {"type": "number", "minimum": 0,
                           "description": "mean seconds between a turn's answer and the next turn, >= 0"},
            "turn_input": {**_TOKENS, "description": "new tokens each later turn brings, a positive integer"},
            "arrivals": {"type": "object", "required": ["process"], "additionalProperties": False,
                         "properties": {"process": {"enum": ["poisson", "gamma", "trace"],
                                                    "description": "poisson, gamma or trace"},
                                        "cv": {**_POSITIVE, "description": "coefficient of variation of the gaps, > 0"},
                                        "file": {"type": "string", "minLength": 1,
                                                 "description": "a trace file (CSV or JSON lines), relative to this file"}}},
            "slo": {"type": "object", "required": ["ttft", "tpot"], "additionalProperties": False,
                    "properties": {"ttft": {**_POSITIVE, "description": "seconds, a positive number"},
                                   "tpot": {**_POSITIVE, "description": "seconds, a positive number"}}},
            "mix": {"type": "array", "minItems": 1, "items": {
                "type": "object", "required": ["share", "input", "output"], "additionalProperties": False,
                "properties": {"share": {"type": "number", "exclusiveMinimum": 0, "maximum": 1,
                                         "description": "a fraction of requests in (0, 1]"},
                               "input": _TOKENS, "output": _TOKENS}}},
        }}},
}

INTERCONNECT_FILE_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["interconnects"], "additionalProperties": False,
    "properties": {"version": {"const": 1, "description": "format version 1"},
                   "interconnects": {"type": "array", "items": {"$ref": "#/$defs/link"}}},
    "$defs": {"link": {
        "type": "object", "required": ["name", "title", "scope", "gbytes_per_s", "latency_us", "source"],
        "additionalProperties": False,
        "properties": {"name": _NAME, "title": {"type": "string"}, "source": {"type": "string", "minLength": 3},
                       "scope": {"enum": ["node", "network"], "description": "node or network"},
                       "gbytes_per_s": {**_POSITIVE, "description": "GB/s per device, one direction"},
                       "latency_us": {"type": "number", "minimum": 0, "description": "microseconds, >= 0"}}}},
}


def workloads_from_data(data: Any, *, file: str | None = None,
                        lines: Mapping[tuple, int] | None = None) -> list[Workload]:
    from kbench.yamlsource import describe_path

    check_schema(data, WORKLOAD_FILE_SCHEMA, file=file, lines=lines, what="workload file")
    out = []
    for i, item in enumerate(data["workloads"]):
        total = sum(c["share"] for c in item["mix"])
        if abs(total - 1.0) > 1e-6:
            raise BadInput(f"workload {item['name']!r}: the shares of mix sum to {total:g}, not 1", file=file,
                           where=describe_path(("workloads", i, "mix"), dict(lines or {})),
                           fix="make the shares of the request classes add up to 1")
        where = describe_path(("workloads", i, "arrivals"), dict(lines or {}))
        arrivals = _arrivals_from(item.get("arrivals"), file=file, where=where)
        out.append(Workload(
            name=item["name"], title=item.get("title", item["name"]), rate=float(item["rate"]),
            mix=tuple(RequestClass(float(c["share"]), int(c["input"]), int(c["output"])) for c in item["mix"]),
            slo=SLO(float(item["slo"]["ttft"]), float(item["slo"]["tpot"])),
            attainment=float(item.get("attainment", 0.9)), source=item.get("source", ""),
            prefix_cache=float(item.get("prefix_cache", 0.0)), turns=int(item.get("turns", 1)),
            think_time=float(item.get("think_time", 0.0)), turn_input=item.get("turn_input"), arrivals=arrivals))
    return out


def _arrivals_from(spec: Mapping[str, Any] | None, *, file: str | None, where: str) -> Arrivals:
    if not spec:
        return Arrivals()
    process = spec["process"]
    if process == "trace":
        if "file" not in spec:
            raise BadInput("trace arrivals without a file", file=file, where=where,
                           fix="add file: PATH (CSV or JSON lines of arrival, input, output)")
        path = Path(spec["file"])
        if not path.is_absolute() and file:
            path = Path(file).parent / path
        return Arrivals("trace", trace=load_trace(str(path)))
    if process == "gamma":
        return Arrivals("gamma", cv=float(spec.get("cv", 1.0)))
    return Arrivals()


# ---------------------------------------------------------------------------------------------
# Request traces
# ---------------------------------------------------------------------------------------------

#: most requests a trace file may hold (decided before reading it)
MAX_TRACE_ROWS = 1_000_000
#: accepted column names: ours, and those of the Azure LLM inference traces Splitwise published
_COLUMNS = {"arrival": ("arrival", "arrival_s", "timestamp", "time"),
            "input": ("input", "input_tokens", "contexttokens", "prompt_tokens"),
            "output": ("output", "output_tokens", "generatedtokens", "completion_tokens")}


def _seconds(value: Any) -> float:
    """A number of seconds, or an ISO date-time (the Azure traces': 2023-11-16 18:15:46.6805900)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        from datetime import datetime

        text = str(value).strip()
        head, dot, frac = text.partition(".")
        return datetime.fromisoformat(head + (dot + frac[:6] if dot else "")).timestamp()


def load_trace(path: str) -> Trace:
    """A request trace: CSV with a header, or JSON lines, with an arrival time (seconds, or an ISO date-time),
    input tokens and output tokens per request (column names in docs/plan.md). Sorted by arrival; times are
    made relative to the first request."""
    import csv
    import json

    p = Path(path)
    if not p.is_file():
        raise BadInput(f"trace file {path!r} not found", where="arrivals", fix="give the path of a CSV or JSON-lines trace")
    rows: list[tuple[float, int, int]] = []
    with p.open(encoding="utf-8", newline="") as f:
        first = f.readline()
        f.seek(0)
        if first.lstrip().startswith("{"):
            records: Any = (json.loads(line) for line in f if line.strip())
        else:
            records = csv.DictReader(f)
        keys: dict[str, str] | None = None
        for n, rec in enumerate(records, 2 if not first.lstrip().startswith("{") else 1):
            if keys is None:
                lower = {k.strip().lower(): k for k in rec}
                keys = {what: next((lower[a] for a in names if a in lower), "") for what, names in _COLUMNS.items()}
                missing = [w for w, k in keys.items() if not k]
                if missing:
                    raise BadInput(f"trace {path}: no column for {', '.join(missing)}", file=path, where="header",
                                   fix="name the columns arrival (seconds or date-time), input and output (tokens)")
            if len(rows) >= MAX_TRACE_ROWS:
                raise BadInput(f"trace {path} has more than {MAX_TRACE_ROWS:,} requests", file=path,
                               where=f"line {n}", fix="cut the trace (the simulation takes at most --requests of it)")
            try:
                row = (_seconds(rec[keys["arrival"]]), int(float(rec[keys["input"]])), int(float(rec[keys["output"]])))
            except (TypeError, ValueError, KeyError) as exc:
                raise BadInput(f"trace {path}: bad row ({exc})", file=path, where=f"line {n}",
                               fix="every row needs an arrival time and positive token counts") from None
            if row[1] < 1 or row[2] < 1 or not math.isfinite(row[0]):
                raise BadInput(f"trace {path}: token counts must be positive", file=path, where=f"line {n}",
                               fix="drop rows with 0 input or 0 output tokens")
            rows.append(row)
    if len(rows) < 2:
        raise BadInput(f"trace {path} holds {len(rows)} requests", file=path, where="rows",
                       fix="a trace needs at least 2 requests")
    rows.sort()
    t0 = rows[0][0]
    return Trace(str(path), tuple(r[0] - t0 for r in rows), tuple(r[1] for r in rows), tuple(r[2] for r in rows))


def mix_of_trace(trace: Trace, classes: int = 16) -> tuple[RequestClass, ...]:
    """The trace's lengths as at most ``classes`` request classes of equal share (by input length, the mean
    input and output of each slice): what the mean-value screen plans with; the simulation replays the trace."""
    order = sorted(range(len(trace.input)), key=lambda i: trace.input[i])
    k = min(classes, len(order))
    out = []
    for j in range(k):
        part = order[j * len(order) // k:(j + 1) * len(order) // k]
        out.append(RequestClass(len(part) / len(order), max(1, round(sum(trace.input[i] for i in part) / len(part))),
                                max(1, round(sum(trace.output[i] for i in part) / len(part)))))
    return tuple(out)


def parse_arrivals(text: str | None) -> Arrivals | None:
    """``poisson``, ``gamma:CV`` or ``trace:PATH`` (--arrivals)."""
    if not text:
        return None
    kind, _, arg = text.partition(":")
    kind = kind.strip().lower()
    if kind == "poisson" and not arg:
        return Arrivals()
    if kind == "gamma":
        try:
            cv = float(arg)
        except ValueError:
            cv = math.nan
        if cv > 0 and math.isfinite(cv):
            return Arrivals("gamma", cv=cv)
    if kind == "trace" and arg:
        return Arrivals("trace", trace=load_trace(arg))
    raise BadInput(f"bad --arrivals {text!r}", where="--arrivals",
                   fix="write poisson, gamma:CV (e.g. gamma:2) or trace:PATH")


def interconnects_from_data(data: Any, *, file: str | None = None,
                            lines: Mapping[tuple, int] | None = None) -> list[Interconnect]:
    check_schema(data, INTERCONNECT_FILE_SCHEMA, file=file, lines=lines, what="interconnect file")
    return [Interconnect(name=i["name"], title=i["title"], scope=i["scope"], bandwidth=float(i["gbytes_per_s"]) * 1e9,
                         latency=float(i["latency_us"]) * 1e-6, source=i["source"]) for i in data["interconnects"]]


def _package_file(name: str) -> str:
    return str(resources.files("kbench").joinpath("data", name))


def builtin_workloads() -> list[Workload]:
    return parse_yaml_file(_package_file("workloads.yaml"), workloads_from_data)


def builtin_interconnects() -> list[Interconnect]:
    return parse_yaml_file(_package_file("interconnects.yaml"), interconnects_from_data)


def load_workloads(path: str) -> list[Workload]:
    return parse_yaml_file(path, workloads_from_data)


def load_interconnects(path: str) -> list[Interconnect]:
    return parse_yaml_file(path, interconnects_from_data)


# ---------------------------------------------------------------------------------------------
# Command-line values
# ---------------------------------------------------------------------------------------------

_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(ms|us|s|min)?\s*$")
_SECONDS = {"s": 1.0, None: 1.0, "ms": 1e-3, "us": 1e-6, "min": 60.0}


def parse_duration(text: str, where: str) -> float:
    """``2s``, ``50ms``, ``0.05``, ``3min`` -> seconds (positive)."""
    m = _DURATION.match(text)
    value = float(m.group(1)) * _SECONDS[m.group(2)] if m else math.nan
    if not (value > 0 and math.isfinite(value)):
        raise BadInput(f"bad duration {text!r}", where=where,
                       fix="give a positive time such as 2s, 50ms, 0.05 (seconds) or 3min")
    return value


def parse_slo(text: str | None, default: SLO) -> SLO:
    """``ttft=2s,tpot=50ms`` over the workload's SLO; either key may be left out."""
    if not text:
        return default
    values = {"ttft": default.ttft, "tpot": default.tpot}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep or key not in values:
            raise BadInput(f"bad SLO item {part.strip()!r}", where="--slo",
                           fix="write ttft=DURATION,tpot=DURATION, e.g. --slo ttft=2s,tpot=50ms")
        values[key] = parse_duration(value, f"--slo {key}")
    return SLO(**values)


def parse_prices(items: Sequence[str], known: Mapping[str, HardwareProfile]) -> dict[str, float]:
    """``h100-sxm=2.5`` (USD per device-hour), comma-separated or repeated."""
    out: dict[str, float] = {}
    for item in (p.strip() for value in items for p in value.split(",") if p.strip()):
        name, sep, value = item.partition("=")
        name = name.strip().lower()
        try:
            price = float(value)
        except ValueError:
            price = math.nan
        if not sep or not (price > 0 and math.isfinite(price)):
            raise BadInput(f"bad price {item!r}", where="--price",
                           fix="write NAME=USD_PER_DEVICE_HOUR, e.g. --price h100-sxm=2.5")
        if name not in known:
            raise BadInput(f"--price names unknown hardware {name!r}", where="--price",
                           fix=f"use one of: {', '.join(sorted(known))}")
        out[name] = price
    return out


def with_price(profile: HardwareProfile, price: float) -> HardwareProfile:
    return replace(profile, price_per_hour=price, price_source="--price (user)")
