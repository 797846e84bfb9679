"""Hardware profiles (peak rates, bandwidth, capacity): the data, the file format, and matching a device.

A profile carries up to two sets of roofs: the datasheet's (``peak_flops``, ``bandwidth``) and the
ones ``kbench calibrate`` measured on this machine (``measured_flops``, ``measured_bandwidth``).
Where a measurement sits against them is :func:`kbench.roofline.point.roofline_point`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Mapping, Protocol

#: dtype names a profile may give a rate for, in the order tables show them
DTYPES = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "fp4")


@dataclass(frozen=True)
class HardwareProfile:
    """Peak figures of one device. Rates in FLOP/s and B/s, sizes in bytes.

    ``peak_flops`` maps a dtype name (``fp64``, ``fp32``, ``tf32``, ``bf16``, ``fp16``, ``fp8``,
    ``fp4``) to dense FLOP/s. ``source`` says where the figures come from (datasheet URL or
    "measured by kbench calibrate on <date>"); ``sources`` may name a source per figure.
    ``measured_flops`` / ``measured_bandwidth`` are this machine's calibrated roofs, if any.
    """

    name: str
    title: str
    kind: str                                   # "gpu" or "cpu"
    peak_flops: Mapping[str, float]
    bandwidth: float | None                     # DRAM/HBM bytes per second
    capacity: float | None                      # device memory in bytes
    l2_bytes: float | None = None
    source: str = ""
    measured: bool = False
    match: tuple[str, ...] = ()                 # substrings of the device name that identify it
    notes: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)
    sources: Mapping[str, str] = field(default_factory=dict)     # figure name -> where it comes from
    measured_flops: Mapping[str, float] = field(default_factory=dict)
    measured_bandwidth: float | None = None
    measured_source: str = ""                   # "kbench calibrate on <date>, <file>"
    # what `kbench plan` needs (docs/plan.md); None where no public figure is known
    price_per_hour: float | None = None         # USD per device-hour (cloud list price)
    price_source: str = ""                      # where and when the price was listed
    power_watts: float | None = None            # TDP (board power) per device
    interconnects: tuple[str, ...] = ()         # names in kbench/data/interconnects.yaml

    def peak(self, dtype: str) -> float | None:
        """Peak FLOP/s for a case dtype; fp32 inputs use the fp32 (not tf32) rate; fp8_e4m3 the fp8 rate."""
        return self.peak_flops.get(dtype, self.peak_flops.get(dtype.partition("_")[0]))

    def measured_peak(self, dtype: str) -> float | None:
        return self.measured_flops.get(dtype, self.measured_flops.get(dtype.partition("_")[0]))

    @property
    def has_measured(self) -> bool:
        return bool(self.measured_flops) or bool(self.measured_bandwidth)

    def ridge(self, dtype: str, *, measured: bool = False) -> float | None:
        """Intensity (FLOP/byte) where the compute and bandwidth roofs meet."""
        peak = self.measured_peak(dtype) if measured else self.peak(dtype)
        bw = self.measured_bandwidth if measured else self.bandwidth
        return peak / bw if peak and bw else None

    def with_measured(self, flops: Mapping[str, float], bandwidth: float | None, source: str) -> HardwareProfile:
        """This profile with calibrated roofs attached (datasheet figures unchanged)."""
        return replace(self, measured_flops=dict(flops), measured_bandwidth=bandwidth, measured_source=source)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("peak_flops", "extra", "sources", "measured_flops"):
            data[key] = dict(getattr(self, key))
        data["match"] = list(self.match)
        data["interconnects"] = list(self.interconnects)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> HardwareProfile:
        data = dict(data)
        data["match"] = tuple(data.get("match", ()))
        data["interconnects"] = tuple(data.get("interconnects", ()))
        return cls(**data)


class HasProfiles(Protocol):
    """What :func:`match_profile` reads of a :class:`kbench.registry.Registry` (which sits above this module)."""

    hardware: Mapping[str, HardwareProfile]


def match_profile(registry: HasProfiles, device_name: str) -> HardwareProfile | None:
    """The registered profile whose ``match`` substrings best fit a device name (e.g. from NVML).

    Case-insensitive; the longest matching substring wins, so "NVIDIA GB200" picks ``gb200``
    (matches "GB200") over ``b200`` (matches "B200"). ``None`` when nothing matches.
    """
    name = device_name.lower()
    best: tuple[int, str] | None = None
    for profile in registry.hardware.values():
        for pattern in profile.match:
            if pattern and pattern.lower() in name:
                key = (len(pattern), profile.name)
                if best is None or key[0] > best[0]:
                    best = key
    return None if best is None else registry.hardware[best[1]]


# ---------------------------------------------------------------------------------------------
# Profiles as data: kbench/data/hardware.yaml and third-party files in the same format.
# ---------------------------------------------------------------------------------------------

_UNITS = {"peak_tflops": 1e12, "bandwidth_tbps": 1e12, "capacity_gb": 1e9, "l2_mb": 1e6}

PROFILE_FILE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["profiles"],
    "additionalProperties": False,
    "properties": {
        "version": {"const": 1, "description": "format version 1"},
        "profiles": {"type": "array", "items": {"$ref": "#/$defs/profile"},
                     "description": "a list of hardware profiles"},
    },
    "$defs": {"profile": {
        "type": "object",
        "required": ["name", "title", "peak_tflops", "bandwidth_tbps", "capacity_gb", "source"],
        "additionalProperties": False,
        "properties": {
            "name": {"type": "string", "pattern": "^[a-z0-9][a-z0-9._-]*$",
                     "description": "a lower-case name such as h200"},
            "title": {"type": "string"},
            "kind": {"enum": ["gpu", "cpu", "accelerator"]},
            "match": {"type": "array", "items": {"type": "string", "minLength": 2},
                      "description": "substrings of the device name"},
            "peak_tflops": {"type": "object", "propertyNames": {"enum": list(DTYPES)},
                            "additionalProperties": {"type": "number", "exclusiveMinimum": 0},
                            "description": f"dense TFLOP/s per dtype, dtypes among {', '.join(DTYPES)}"},
            "bandwidth_tbps": {"type": ["number", "null"], "exclusiveMinimum": 0,
                               "description": "memory bandwidth in TB/s (10^12 B/s)"},
            "capacity_gb": {"type": ["number", "null"], "exclusiveMinimum": 0,
                            "description": "device memory in GB (10^9 B)"},
            "l2_mb": {"type": ["number", "null"], "exclusiveMinimum": 0},
            "source": {"type": "string", "minLength": 3, "description": "the datasheet the figures come from"},
            "sources": {"type": "object", "additionalProperties": {"type": "string"}},
            "notes": {"type": "string"},
            "price": {"type": "object", "additionalProperties": False,
                      "required": ["usd_per_hour", "source", "date"],
                      "properties": {"usd_per_hour": {"type": "number", "exclusiveMinimum": 0},
                                     "source": {"type": "string", "minLength": 3},
                                     "date": {"type": "string", "minLength": 4}},
                      "description": "{usd_per_hour: 2.99, source: 'provider list price page', date: '2025-06'}"},
            "power_w": {"type": "number", "exclusiveMinimum": 0,
                        "description": "board power (TDP) per device in watts"},
            "interconnects": {"type": "array", "items": {"type": "string", "pattern": "^[a-z0-9][a-z0-9._-]*$"},
                              "description": "interconnect profile names (kbench/data/interconnects.yaml)"},
        },
    }},
}


def check_schema(data: Any, schema: Mapping[str, Any], *, file: str | None, lines: Mapping[tuple, int] | None = None,
                 what: str) -> None:
    """Validate ``data`` with jsonschema; the error names the file, the place (with line) and the fix."""
    import jsonschema

    from kbench.errors import BadInput
    from kbench.yamlsource import describe_path

    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(data))
    if error is None:
        return
    desc = error.schema.get("description") if isinstance(error.schema, dict) else None
    if error.validator == "additionalProperties" and isinstance(error.schema, dict):
        fix = f"allowed keys here: {', '.join(sorted(error.schema.get('properties', {})))}"
    elif error.validator == "required":
        fix = "add the missing key (the built-in files kbench/data/*.yaml are examples)"
    else:
        fix = f"expected {desc}" if desc else f"see docs/roofline.md for the {what} format"
    raise BadInput(f"invalid {what}: {error.message}", file=file,
                   where=describe_path(tuple(error.absolute_path), dict(lines or {})), fix=fix)


def profiles_from_data(data: Any, *, file: str | None = None, lines: Mapping[tuple, int] | None = None,
                       check: bool = True) -> list[HardwareProfile]:
    """Hardware profiles from a parsed profile file (units as in kbench/data/hardware.yaml); ``check=False``
    skips the schema for the file kbench ships (checked by its tests: every start-up need not import jsonschema)."""
    if check:
        check_schema(data, PROFILE_FILE_SCHEMA, file=file, lines=lines, what="hardware profile file")
    out = []
    for item in data["profiles"]:
        def scaled(key: str) -> float | None:
            value = item.get(key)
            return None if value is None else round(float(value) * _UNITS[key], 3)
        out.append(HardwareProfile(
            name=item["name"], title=item["title"], kind=item.get("kind", "gpu"),
            peak_flops={k: round(float(v) * _UNITS["peak_tflops"], 3) for k, v in item["peak_tflops"].items()},
            bandwidth=scaled("bandwidth_tbps"), capacity=scaled("capacity_gb"), l2_bytes=scaled("l2_mb"),
            source=item["source"], match=tuple(item.get("match", ())), notes=item.get("notes", ""),
            sources=dict(item.get("sources", {})),
            price_per_hour=item["price"]["usd_per_hour"] if "price" in item else None,
            price_source=f"{item['price']['source']} ({item['price']['date']})" if "price" in item else "",
            power_watts=item.get("power_w"), interconnects=tuple(item.get("interconnects", ()))))
    return out


def parse_yaml_file(path: str, parse):
    """``parse(data, file=, lines=)`` of a YAML file, so errors name its lines."""
    from kbench.yamlsource import load_yaml

    data, lines = load_yaml(path)
    return parse(data, file=str(path), lines=lines)


def parse_package_data(name: str, parse):
    """``parse(data, file=)`` of a YAML file shipped in kbench/data/."""
    from importlib import resources

    from kbench.yamlsource import load_package_yaml

    return parse(load_package_yaml(name), file=str(resources.files("kbench").joinpath("data", name)))


def load_profiles(path: str) -> list[HardwareProfile]:
    """Profiles from a YAML file in the format of kbench/data/hardware.yaml."""
    return parse_yaml_file(path, profiles_from_data)


def builtin_profiles(*, check: bool = False) -> list[HardwareProfile]:
    """The datasheet profiles shipped in kbench/data/hardware.yaml (``check``: against the file schema too)."""
    return parse_package_data("hardware.yaml", lambda data, file: profiles_from_data(data, file=file, check=check))
