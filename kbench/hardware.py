"""Hardware profiles (peak rates, bandwidth, capacity) and where a measurement sits on the roofline."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Mapping


@dataclass(frozen=True)
class HardwareProfile:
    """Peak figures of one device. Rates in FLOP/s and B/s, sizes in bytes.

    ``peak_flops`` maps a dtype name (``fp64``, ``fp32``, ``tf32``, ``bf16``, ``fp16``, ``fp8``,
    ``fp4``) to dense FLOP/s. ``source`` says where the figures come from (datasheet URL or
    "measured by kbench calibrate on <date>").
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

    def peak(self, dtype: str) -> float | None:
        """Peak FLOP/s for a case dtype; fp32 inputs use the fp32 (not tf32) rate."""
        return self.peak_flops.get(dtype)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["peak_flops"] = dict(self.peak_flops)
        data["match"] = list(self.match)
        data["extra"] = dict(self.extra)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> HardwareProfile:
        data = dict(data)
        data["match"] = tuple(data.get("match", ()))
        return cls(**data)


def roofline_point(profile: HardwareProfile | None, dtype: str, flops: float, nbytes: float,
                   seconds: float) -> dict[str, Any]:
    """Attained rates, the binding roof and the fraction of it reached.

    A fraction above 1 is physically impossible: it means the measurement or the kernel is
    wrong (work skipped, cached, or done outside the timed region) and is flagged.
    """
    out: dict[str, Any] = {
        "flops": flops,
        "bytes": nbytes,
        "intensity": flops / nbytes if nbytes else None,
        "tflops": flops / seconds / 1e12 if seconds > 0 else None,
        "gbps": nbytes / seconds / 1e9 if seconds > 0 else None,
    }
    if profile is None or seconds <= 0:
        return out
    peak = profile.peak(dtype)
    bw = profile.bandwidth
    roofs = {}
    if peak:
        roofs["compute"] = peak
    if bw and nbytes:
        roofs["bandwidth"] = bw * flops / nbytes
    if not roofs:
        return out
    bound = min(roofs, key=roofs.get)
    attained = flops / seconds
    out.update({"hardware": profile.name, "bound": bound, "roof_tflops": roofs[bound] / 1e12,
                "roof_fraction": attained / roofs[bound]})
    if peak:
        out["compute_fraction"] = attained / peak
    if bw:
        out["bandwidth_fraction"] = nbytes / seconds / bw
    out["impossible"] = out["roof_fraction"] > 1.0
    return out
