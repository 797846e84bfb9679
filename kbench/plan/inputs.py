"""What `kbench plan` reads: workloads, interconnect profiles, SLOs and price overrides (docs/plan.md)."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from importlib import resources
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
class Workload:
    name: str
    title: str
    rate: float                          # requests per second
    mix: tuple[RequestClass, ...]
    slo: SLO
    attainment: float                    # fraction of requests that must meet the SLO
    source: str = ""

    def mean(self, what: str) -> float:
        return sum(c.share * getattr(c, what) for c in self.mix)


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
        out.append(Workload(
            name=item["name"], title=item.get("title", item["name"]), rate=float(item["rate"]),
            mix=tuple(RequestClass(float(c["share"]), int(c["input"]), int(c["output"])) for c in item["mix"]),
            slo=SLO(float(item["slo"]["ttft"]), float(item["slo"]["tpot"])),
            attainment=float(item.get("attainment", 0.9)), source=item.get("source", "")))
    return out


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
