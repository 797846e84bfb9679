"""Result files with known timing distributions, built through the real op, stats and roofline code.

Shared by test_compare.py and test_report.py (tests/ is on sys.path under pytest's default import mode).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from kbench.roofline.point import roofline_point
from kbench.plugins import PluginManager
from kbench.results import FORMAT, RESULT_VERSION, validate
from kbench.stats import summarize

_PM = PluginManager(load_entry_points=False)

CPU_MACHINE = {"id": "cpu-test-2c", "device": "cpu", "cpu": "Test CPU", "cores": 2}
H100 = {"name": "h100-sxm", "title": "NVIDIA H100 SXM", "kind": "gpu", "peak_flops": {"bf16": 989e12, "fp32": 67e12},
        "bandwidth": 3.35e12, "capacity": 80e9, "source": "datasheet"}


def lognormal(median: float, sigma: float, n: int, seed: int) -> list[float]:
    """n samples around ``median`` with multiplicative noise exp(N(0, sigma)) (time noise is skewed)."""
    rng = np.random.default_rng(seed)
    return list(median * np.exp(rng.normal(0.0, sigma, n)))


def record(backend: str, params: Mapping[str, Any], samples: Iterable[float] | None, *, status: str = "passed",
           hardware: Mapping[str, Any] | None = None, reason: str | None = None,
           op: str = "attention") -> dict[str, Any]:
    OP = _PM.registry.op(op)
    case = OP.make_case(params)
    rec: dict[str, Any] = {"backend": backend, "op": op, "case_id": case.id, "case": case.to_json(),
                           "device": "cpu", "status": status, "reason": reason}
    if status == "passed":
        samples = list(samples)
        stats = summarize(samples)
        rec["timing"] = {"samples": samples, "stop_reason": "time_limit"}
        rec["stats"] = stats
        from kbench.hardware import HardwareProfile

        profile = HardwareProfile.from_json(hardware) if hardware else None
        rec["metrics"] = roofline_point(profile, str(case.dtype), OP.flops(case), OP.min_bytes(case), stats["median"])
    return rec


def result(records: list[dict[str, Any]], *, machine: Mapping[str, Any] = CPU_MACHINE,
           hardware: Mapping[str, Any] | None = None, name: str = "synthetic") -> dict[str, Any]:
    data = {"format": FORMAT, "version": RESULT_VERSION, "id": name, "created": "2026-01-01T00:00:00+00:00",
            "complete": True, "interrupted": None, "machine": dict(machine), "hardware": hardware,
            "environment": {"kbench": "test", "python": "3"}, "suite": {"name": name, "path": None, "data": {}},
            "device": machine.get("device", "cpu"), "selection": {}, "records": records}
    validate(data)
    return data


def write(path: Path, data: Mapping[str, Any]) -> str:
    path.write_text(json.dumps(data))
    return str(path)
