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
    def repro(self) -> str | None:
        """The command that measures this one (case, backend) again (``kbench run SUITE -b BACKEND -k CASE_ID``),
        or None: a record of a suite made in code, of a callable, or of a file written before records had it."""
        value = self.extra.get("repro")
        return value if isinstance(value, str) else None

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


def repro_command(*, suite: str | None, backend: str, case_id: str, device: str, kernel_file: bool = False,
                  trusted_file: bool = False) -> str | None:
    """The one line that measures one (case, backend) again, as FlashInfer's benchmark rows carry their
    ``repro_command``: ``kbench run SUITE -b BACKEND -k CASE_ID --device DEVICE``. ``backend`` is a registered
    name (with its settings, ``numpy-flash[block_q=64]``) or, with ``kernel_file``, the kernel file's path. None
    when no command line can: the suite was made in code (no file), or the backend is an object of a Python
    program (a callable given to ``measure``)."""
    import shlex

    if not suite or not backend or backend.startswith("fn:"):
        return None
    line = f"kbench run {shlex.quote(str(suite))} -b {shlex.quote(backend)} -k {shlex.quote(case_id)}"
    if trusted_file and kernel_file:
        line += " --trust-kernel-files"
    return line + f" --device {shlex.quote(device)}"


def run_repro(request: Any, backend: Any, case_id: str, device: str) -> str | None:
    """:func:`repro_command` of a record of a ``kbench run`` request (a :class:`kbench.run.runner.RunRequest`)."""
    from pathlib import Path

    source = getattr(backend, "source_path", None)
    is_file = bool(source) and any(Path(f) == Path(source) for f in request.kernel_files)
    return repro_command(suite=request.suite.path, backend=source if is_file else backend.name, case_id=case_id,
                         device=device, kernel_file=is_file, trusted_file=request.trust_kernel_files)


def repro_lines(records: Iterable[Record]) -> str:
    """``kbench show --repro``: one line per record, ``backend @ case id (status): command``."""
    return "\n".join(f"{r.backend} @ {r.case_id} ({r.status}): "
                     + (r.repro or "no command line (a suite made in code, a callable, or an older file)")
                     for r in records)


def records_of(data: Mapping[str, Any], *, file: str | None = None) -> list[Record]:
    """The records of a loaded result file (``data["records"]``) as Records."""
    return [r if isinstance(r, Record) else Record.from_json(r, file=file, where=f"records[{i}]")
            for i, r in enumerate(data.get("records") or [])]


def as_records(records: Iterable[Record | Mapping[str, Any]]) -> list[Record]:
    """Records given as Records or JSON objects, as Records."""
    return [Record.of(r) for r in records]
