"""``kbench calibrate``: measure this device's attainable matmul rate per dtype and its copy bandwidth.

The measured figures are stored beside the results (``results/<machine>/calibration.json``) and
attached to whatever hardware profile detection returns (see kbench.builtin.hardware), so every
later record reports the fraction of the measured roof next to the datasheet one.

The same code runs on every device: operands are placed with ``device.from_host``, timed with the
device's own timer through :func:`kbench.timing.measure`, and multiplied with the array module the
device's arrays belong to (NumPy on the CPU, CuPy on CUDA).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from kbench.devices import Device
from kbench.errors import BadInput
from kbench.hardware import HardwareProfile
from kbench.results import results_root  # the one definition; re-exported here for older imports
from kbench.stats import summarize
from kbench.timing import TimingSettings, measure

CALIBRATION_FORMAT = "kbench-calibration"
CALIBRATION_VERSION = 1
CALIBRATION_FILE = "calibration.json"




def calibration_path(device: Device, root: Path | None = None) -> Path:
    return (root or results_root()) / device.machine_id() / CALIBRATION_FILE


# ---------------------------------------------------------------------------------------------
# What to measure
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MatmulSpec:
    """One matmul rate to measure: the dtype it is reported for, and how it is computed."""

    dtype: str            # the dtype the rate is reported for (a case dtype or fp64)
    storage: str          # numpy dtype name of the operands (or another library's, e.g. torch's "bfloat16")
    library: str          # "xp" (the device's array module), or a library the device's plugin runs it with
    note: str = ""


#: what a device without its own plan is calibrated with (a device plugin's ``calibration_matmuls()``
#: replaces it: kbench-cuda's measures cuBLAS GEMMs, and the bf16 one through torch)
CPU_MATMULS = (
    MatmulSpec("fp64", "float64", "xp"),
    MatmulSpec("fp32", "float32", "xp"),
    # NumPy has no fast half-precision GEMM (float16 matmul is a slow loop; bfloat16 has none) and the
    # NumPy kernels compute fp16/bf16 cases in float32, so their attainable rate is the fp32 GEMM's.
    MatmulSpec("fp16", "float32", "xp", note="float32 GEMM: NumPy has no half-precision GEMM; CPU kernels compute in fp32"),
    MatmulSpec("bf16", "float32", "xp", note="float32 GEMM: NumPy has no bf16 GEMM; CPU kernels compute in fp32"),
)

@dataclass(frozen=True)
class CalibrationSettings:
    matmul_size: int = 2048                        # n of the n x n x n GEMM
    copy_bytes: int = 256 * 2**20                  # size of the copied buffer (read once, written once)
    dtypes: tuple[str, ...] | None = None          # None: every dtype the device's plan has
    timing: TimingSettings = field(default_factory=lambda: TimingSettings(
        warmup_calls=2, warmup_time=0.05, min_samples=5, min_time=0.3, max_time=3.0, target_rel_se=0.01,
        rotate=1))


def default_settings(device: Device) -> CalibrationSettings:
    """The GEMM size and copied bytes the device asks for (a GPU needs a large GEMM to fill its SMs and a
    copy far larger than its L2: ``calibration_matmul_size``/``calibration_copy_bytes`` of its class)."""
    base = CalibrationSettings()
    return CalibrationSettings(matmul_size=int(getattr(device, "calibration_matmul_size", base.matmul_size)),
                               copy_bytes=int(getattr(device, "calibration_copy_bytes", base.copy_bytes)))


def matmul_plan(device: Device) -> tuple[MatmulSpec, ...]:
    """The device's own plan (``calibration_matmuls()``), else the host's."""
    own = getattr(device, "calibration_matmuls", None)
    return tuple(own()) if callable(own) else CPU_MATMULS


def array_module(array: Any):
    """NumPy or CuPy, whichever the array belongs to (imported only when needed)."""
    if type(array).__module__.split(".")[0] == "cupy":
        import cupy

        return cupy
    return np


# ---------------------------------------------------------------------------------------------
# Measurements
# ---------------------------------------------------------------------------------------------

def _operands(device: Device, spec: MatmulSpec, n: int, rng: np.random.Generator) -> Callable[[], Any]:
    if spec.library != "xp":  # another library's GEMM: the device's plugin builds it
        build = getattr(device, "matmul_operands", None)
        if not callable(build):
            raise RuntimeError(f"device {device.name!r} has no matmul_operands() for a {spec.library} GEMM")
        return build(spec, n, rng)
    a, b = (device.from_host(rng.standard_normal((n, n), dtype=np.float32).astype(spec.storage)) for _ in range(2))
    c = device.from_host(np.zeros((n, n), dtype=spec.storage))
    xp = array_module(a)
    return lambda: xp.matmul(a, b, out=c)


def measure_matmul(device: Device, spec: MatmulSpec, n: int, timing: TimingSettings,
                   rng: np.random.Generator | None = None) -> dict[str, Any]:
    """Time an n x n x n GEMM; the rate counts 2 n^3 FLOPs (one multiply and one add per term)."""
    call = _operands(device, spec, n, rng or np.random.default_rng(0))
    t = measure(device, [call], timing)
    stats = summarize(t.samples)
    flops = 2.0 * n ** 3
    return {"dtype": spec.dtype, "storage": spec.storage, "library": spec.library, "note": spec.note, "n": n,
            "flops": flops, "stats": stats, "stop_reason": t.stop_reason,
            "flops_per_s": flops / stats["median"], "best_flops_per_s": flops / stats["min"]}


def measure_copy(device: Device, nbytes: int, timing: TimingSettings) -> dict[str, Any]:
    """Time a device-to-device copy of ``nbytes``; bandwidth counts bytes read plus bytes written."""
    count = max(1, nbytes // 4)
    src = device.from_host(np.ones(count, dtype=np.float32))
    dst = device.from_host(np.zeros(count, dtype=np.float32))
    xp = array_module(src)
    t = measure(device, [lambda: xp.copyto(dst, src)], timing)
    stats = summarize(t.samples)
    moved = 2.0 * count * 4
    return {"buffer_bytes": count * 4, "bytes_moved": moved, "stats": stats, "stop_reason": t.stop_reason,
            "bytes_per_s": moved / stats["median"], "best_bytes_per_s": moved / stats["min"]}


def calibrate(device: Device, settings: CalibrationSettings | None = None,
              on_step: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Measure the matmul rates and the copy bandwidth; return the calibration document."""
    from kbench.results import now_iso

    settings = settings or default_settings(device)
    say = on_step or (lambda _msg: None)
    plan = [s for s in matmul_plan(device) if settings.dtypes is None or s.dtype in settings.dtypes]
    if settings.dtypes is not None:
        unknown = sorted(set(settings.dtypes) - {s.dtype for s in matmul_plan(device)})
        if unknown:
            raise BadInput(f"no matmul calibration for dtype(s) {', '.join(unknown)} on device {device.name!r}",
                           where="--dtype", fix=f"use some of: {', '.join(s.dtype for s in matmul_plan(device))}")
    matmuls, skipped = [], {}
    cache: dict[tuple[str, str], dict[str, Any]] = {}
    for spec in plan:
        key = (spec.storage, spec.library)
        try:
            if key not in cache:  # fp16/bf16 on the CPU reuse the fp32 GEMM: measured once
                say(f"matmul {spec.dtype} ({spec.storage}, n={settings.matmul_size})")
                cache[key] = measure_matmul(device, spec, settings.matmul_size, settings.timing)
            matmuls.append({**cache[key], "dtype": spec.dtype, "note": spec.note})
        except Exception as exc:  # noqa: BLE001 - a dtype the runtime lacks is a note, not the end
            skipped[spec.dtype] = f"{type(exc).__name__}: {exc}"
    say(f"copy {settings.copy_bytes / 2**20:.0f} MiB")
    copy = measure_copy(device, settings.copy_bytes, settings.timing)
    created = now_iso()
    return {
        "format": CALIBRATION_FORMAT, "version": CALIBRATION_VERSION, "created": created,
        "machine": device.machine_id(), "device": device.name, "description": device.describe(),
        "settings": {"matmul_size": settings.matmul_size, "copy_bytes": settings.copy_bytes,
                     "timing": settings.timing.__dict__},
        "matmul": matmuls, "skipped": skipped, "copy": copy,
        "flops": {m["dtype"]: m["flops_per_s"] for m in matmuls},
        "bandwidth": copy["bytes_per_s"],
    }


# ---------------------------------------------------------------------------------------------
# Storage and attachment to profiles
# ---------------------------------------------------------------------------------------------

def save_calibration(doc: dict[str, Any], path: Path) -> Path:
    from kbench.results import atomic_write_json, sanitize

    atomic_write_json(Path(path), sanitize(doc))
    return Path(path)


def load_calibration(path: Path) -> dict[str, Any] | None:
    """The calibration stored at ``path``; ``None`` if there is none; BadInput if it is damaged."""
    path = Path(path)
    if not path.is_file():
        return None
    fix = "delete it, or re-run `kbench calibrate` to rewrite it"
    from kbench.reader import read_json

    doc = read_json(path, limit=2**20, what="calibration file", fix=fix)  # the one reader: its limits, its messages
    if not isinstance(doc, dict) or doc.get("format") != CALIBRATION_FORMAT:
        raise BadInput(f"not a kbench calibration file (no `format: {CALIBRATION_FORMAT}`)", file=str(path), fix=fix)
    if doc.get("version") != CALIBRATION_VERSION:
        raise BadInput(f"calibration format version {doc.get('version')!r}; this kbench reads {CALIBRATION_VERSION}",
                       file=str(path), where="version", fix=fix)
    flops, bw = doc.get("flops"), doc.get("bandwidth")
    if not isinstance(flops, dict) or not all(isinstance(v, (int, float)) and v > 0 for v in flops.values()):
        raise BadInput("`flops` must map dtype names to positive FLOP/s", file=str(path), where="flops", fix=fix)
    if bw is not None and not (isinstance(bw, (int, float)) and bw > 0):
        raise BadInput("`bandwidth` must be positive bytes per second", file=str(path), where="bandwidth", fix=fix)
    return doc


def attach(profile: HardwareProfile, doc: dict[str, Any], path: Path | str) -> HardwareProfile:
    """``profile`` with the measured roofs of a calibration document attached."""
    return profile.with_measured(doc["flops"], doc.get("bandwidth"),
                                 f"measured by kbench calibrate on {doc.get('created', '?')} ({path})")


def measured_profile(device: Device, doc: dict[str, Any], path: Path | str) -> HardwareProfile:
    """A profile holding only measured roofs, for a device no datasheet profile matches."""
    desc = doc.get("description") or {}
    title = desc.get("name") or desc.get("cpu") or device.name
    base = HardwareProfile(name=f"measured-{device.name}", title=f"{title} (measured)", kind=device.name,
                           peak_flops={}, bandwidth=None, capacity=None, measured=True,
                           source="no datasheet profile matches this device; roofs measured by kbench calibrate")
    return attach(base, doc, path)


def with_calibration(profile: HardwareProfile | None, device: Device,
                     root: Path | None = None) -> HardwareProfile | None:
    """Detection's answer for ``device`` plus this machine's calibration, if one is stored."""
    path = calibration_path(device, root)
    doc = load_calibration(path)
    if doc is None or doc.get("device") not in (None, device.name):
        return profile
    return attach(profile, doc, path) if profile is not None else measured_profile(device, doc, path)
