"""One (case, backend) record of a result file as an object: typed fields, accessors, an exact JSON round trip.

Readers (show, compare, report, history, plan) take records through :class:`Record` instead of digging
through ``(rec.get("timing") or {}).get(...)``; the status is a :class:`~kbench.enums.Status`. The
nested sections (timing, stats, metrics, ...) stay the dicts the result format defines
(kbench/schemas/result.schema.json, docs/results.md): the accessors name what readers use of them.

``Record.from_json(d).to_json() == d``, keys in the same order: absent sections stay absent, a
``null`` stays ``null``, and keys kbench does not know (a plugin's, or a newer writer's) are kept in
``extra`` and written back where they were.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from kbench.enums import DType, Status
from kbench.errors import BadInput

#: fields every record has; ``reason`` too (null when there is none)
_REQUIRED = ("backend", "op", "case_id", "case", "device", "status", "reason")
#: optional fields in the order the runner writes them
_OPTIONAL = ("started", "integrity", "backend_info", "correctness", "timing", "stats", "metrics", "telemetry",
             "duration", "placement")
_FIELDS = _REQUIRED + _OPTIONAL


@dataclass(eq=True)
class Record:
    backend: str
    op: str
    case_id: str
    case: dict[str, Any]
    device: str
    status: Status
    reason: str | None = None
    started: str | None = None
    integrity: dict[str, Any] | None = None
    backend_info: dict[str, Any] | None = None
    correctness: dict[str, Any] | None = None
    timing: dict[str, Any] | None = None
    stats: dict[str, Any] | None = None
    metrics: dict[str, Any] | None = None
    telemetry: dict[str, Any] | None = None
    duration: float | None = None
    #: where the record was measured (executors: host, slot, device index, hardware ``profile``; docs/scale-out.md)
    placement: dict[str, Any] | None = None
    #: keys kbench does not define (plugins add fields): kept, and written back as they came
    extra: dict[str, Any] = field(default_factory=dict)
    #: the keys of the JSON object this record was read from, in order (empty: built in code)
    layout: tuple[str, ...] = field(default=(), repr=False, compare=False)

    # -- JSON ---------------------------------------------------------------------------------------

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, file: str | None = None, where: str = "record") -> Record:
        """A record from its JSON object. Nested sections are shared with ``data``, not copied."""
        if not isinstance(data, Mapping):
            raise BadInput(f"a record is a JSON object, got {type(data).__name__}", file=file, where=where,
                           fix="give a file written by `kbench run`")
        try:
            status = Status(data.get("status"))
        except ValueError:
            raise BadInput(f"record status {data.get('status')!r} is not one of "
                           f"{', '.join(s.value for s in Status)}", file=file, where=f"{where}.status",
                           fix="give a file written by `kbench run`") from None
        for key in ("backend", "case_id"):
            if not isinstance(data.get(key), str):
                raise BadInput(f"record has no string `{key}`", file=file, where=f"{where}.{key}",
                               fix="give a file written by `kbench run`")
        known = {k: data[k] for k in _FIELDS if k in data and k != "status"}
        known.setdefault("op", "")
        known.setdefault("case", {})
        known.setdefault("device", "")
        extra = {k: v for k, v in data.items() if k not in _FIELDS}
        return cls(status=status, **known, extra=extra, layout=tuple(data))

    @classmethod
    def of(cls, rec: Record | Mapping[str, Any]) -> Record:
        """``rec`` as a Record: a Record is returned as it is, a dict is read with :meth:`from_json`."""
        return rec if isinstance(rec, Record) else cls.from_json(rec)

    def to_json(self) -> dict[str, Any]:
        """The JSON object: the source's keys in its order, then fields and extras set since."""
        out: dict[str, Any] = {}
        present = set(self.layout)
        for key in self.layout:
            if key in self.extra:
                out[key] = self.extra[key]
            elif key in _FIELDS:
                out[key] = self._value(key)
        for key in _FIELDS:  # a record built in code has every required field; a read one what it had, and what was set
            value = getattr(self, key)
            if key not in present and ((key in _REQUIRED and not self.layout) or value not in (None, "", {})):
                out[key] = self._value(key)
        for key, value in self.extra.items():
            out.setdefault(key, value)
        return out

    def _value(self, key: str) -> Any:
        value = getattr(self, key)
        return value.value if isinstance(value, Status) else value

    def replace(self, **changes: Any) -> Record:
        """A copy with some fields changed (the layout kept)."""
        return dataclasses.replace(self, **changes)

    # -- what readers use -------------------------------------------------------------------------

    @property
    def key(self) -> tuple[str, str]:
        """(case id, backend): what pairs a record across runs (a backend with settings is its own name)."""
        return self.case_id, self.backend

    @property
    def passed(self) -> bool:
        return self.status is Status.PASSED

    @property
    def status_text(self) -> str:
        """``status: reason``, or the status alone when there is no reason."""
        return f"{self.status}: {self.reason}" if self.reason else str(self.status)

    @property
    def samples(self) -> list[float]:
        """Raw timing samples in seconds (empty when the record was not timed)."""
        return list((self.timing or {}).get("samples") or [])

    def stat(self, name: str) -> Any:
        """A summary statistic of the samples (``median``, ``min``, ``ci_low``, ``rel_spread``, ...) or None."""
        return (self.stats or {}).get(name)

    def metric(self, name: str) -> Any:
        """A derived figure (``tflops``, ``gbps``, ``intensity``, ``roof_fraction``, ``bound``, ...) or None."""
        return (self.metrics or {}).get(name)

    @property
    def median(self) -> float | None:
        """Median time in seconds, as the runner summarised it."""
        return self.stat("median")

    @property
    def spread(self) -> float | None:
        """IQR / median of the samples."""
        return self.stat("rel_spread")

    @property
    def tflops(self) -> float | None:
        return self.metric("tflops")

    @property
    def bandwidth(self) -> float | None:
        """Attained bandwidth in GB/s (bytes of minimum DRAM traffic over the median time)."""
        return self.metric("gbps")

    @property
    def intensity(self) -> float | None:
        return self.metric("intensity")

    @property
    def flops(self) -> float | None:
        return self.metric("flops")

    @property
    def rel_l2(self) -> float | None:
        """Relative L2 error against the float64 reference (the worst seed)."""
        return (self.correctness or {}).get("rel_l2")

    @property
    def tunables(self) -> dict[str, Any]:
        """The settings the backend ran with (``backend_info.tunables``); {} for a backend without tunables."""
        return dict((self.backend_info or {}).get("tunables") or {})

    @property
    def profile(self) -> str | None:
        """The hardware profile of the device the record ran on (``placement.profile``), or None (an older
        file: the result header's ``hardware`` stands for every record)."""
        return (self.placement or {}).get("profile")

    def telemetry_item(self, *path: str) -> Any:
        """An entry of the device telemetry (``"energy"``, ``"throttled_samples"``, ``"after", "power_limit_w"``,
        ...), or None where the path ends early."""
        value: Any = self.telemetry
        for name in path:
            if not isinstance(value, Mapping):
                return None
            value = value.get(name)
        return value

    @property
    def energy(self) -> dict[str, Any]:
        """Measured energy (``telemetry.energy`` with a non-zero ``average_w``), or {}."""
        energy = self.telemetry_item("energy") or {}
        return energy if energy.get("average_w") else {}

    @property
    def dtype(self) -> DType | None:
        """The case's element type as a :class:`~kbench.enums.DType`, or None (no dtype, or one kbench does not know)."""
        value = self.case.get("dtype")
        try:
            return DType(value) if value is not None else None
        except ValueError:
            return None

    def with_samples(self, samples: Iterable[float]) -> Record:
        """A copy whose timing has these samples (pooled runs); the other timing fields are kept."""
        return self.replace(timing={**(self.timing or {}), "samples": list(samples)})


def records_of(data: Mapping[str, Any], *, file: str | None = None) -> list[Record]:
    """The records of a loaded result file (``data["records"]``) as Records."""
    return [r if isinstance(r, Record) else Record.from_json(r, file=file, where=f"records[{i}]")
            for i, r in enumerate(data.get("records") or [])]


def as_records(records: Iterable[Record | Mapping[str, Any]]) -> list[Record]:
    """Records given as Records or JSON objects, as Records."""
    return [Record.of(r) for r in records]
