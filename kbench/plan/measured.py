"""Measured kernel rates and power from result files: the best passing backend at the nearest shape,
interpolated in sequence length and, for decode, in the parallel work of the step (batch x KV heads per
device); sustained-loop power where the measurement engine recorded it (docs/plan.md, "Measured inputs").
"""
from __future__ import annotations

import math
import statistics
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from kbench.errors import BadInput
from kbench.hardware import HardwareProfile
from kbench.record import records_of

#: result-file op -> (planner component, metric key, scale to per-second units, the sequence length key)
OPS = {"attention": ("prefill-attention", "tflops", 1e12, "seqlen_kv"),
       "decode_attention": ("decode-attention", "gbps", 1e9, "seqlen_kv")}
#: the energy method whose figures stand for a device busy with the kernel (the measurement engine's loop that
#: runs the kernel back to back for seconds, so that the board power settles)
SUSTAINED = "sustained loop"


@dataclass(frozen=True)
class Point:
    seqlen: int
    rate: float               # FLOP/s (prefill attention) or B/s (decode attention), one device
    backend: str
    case_id: str
    work: int = 0             # decode: (request, KV head) pairs one call works on (batch x heads_kv); prefill: 0


def _log_between(x: float, x0: float, x1: float, y0: float, y1: float) -> float:
    w = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
    return y0 + w * (y1 - y0)


@dataclass(frozen=True)
class Curve:
    """Best rate per measured (work, sequence length) for one (hardware, component, shape)."""
    hardware: str
    component: str
    shape: tuple              # (heads_q / heads_kv, head_dim, causal, dtype)
    points: tuple[Point, ...]  # sorted by (work, seqlen)
    file: str

    @property
    def works(self) -> list[int]:
        return sorted({p.work for p in self.points})

    def _along_seqlen(self, pts: list[Point], seqlen: int) -> tuple[float, str]:
        """Rate at ``seqlen`` on one work level: linear in log(seqlen) between the two nearest measured
        lengths, held at the end points outside them."""
        if len(pts) == 1 or seqlen <= pts[0].seqlen:
            p = pts[0]
            held = "" if seqlen == p.seqlen else f", held from seqlen {p.seqlen:,}"
            return p.rate, f"{p.backend} {p.case_id}{held}"
        if seqlen >= pts[-1].seqlen:
            p = pts[-1]
            held = "" if seqlen == p.seqlen else f", held from seqlen {p.seqlen:,} (extrapolated)"
            return p.rate, f"{p.backend} {p.case_id}{held}"
        i = bisect_left([p.seqlen for p in pts], seqlen)
        lo, hi = pts[i - 1], pts[i]
        if hi.seqlen == seqlen:
            return hi.rate, f"{hi.backend} {hi.case_id}"
        return (_log_between(seqlen, lo.seqlen, hi.seqlen, lo.rate, hi.rate),
                f"interpolated between seqlen {lo.seqlen:,} ({lo.backend}) and {hi.seqlen:,} ({hi.backend})")

    def at(self, seqlen: int, work: float | None = None) -> tuple[float, str] | None:
        """Rate at ``seqlen`` and (decode) ``work`` (request x KV-head pairs per device), with a description of
        where it came from. Work levels are interpolated linearly in log(work); below the smallest measured
        level the rate is held (marked), above the largest there is no measured rate (None): a figure measured
        at batch 1 is never used at batch 39."""
        levels = self.works
        if work is None or levels == [0]:
            return self._along_seqlen([p for p in self.points if p.work == levels[0]], seqlen)
        if work > levels[-1] * (1 + 1e-9):
            return None
        if work <= levels[0]:
            rate, where = self._along_seqlen([p for p in self.points if p.work == levels[0]], seqlen)
            held = "" if math.isclose(work, levels[0]) else f", held from {levels[0]} heads x requests"
            return rate, where + held
        i = bisect_left(levels, work)
        lo, hi = levels[i - 1], levels[i]
        r_hi, w_hi = self._along_seqlen([p for p in self.points if p.work == hi], seqlen)
        if math.isclose(work, hi):
            return r_hi, w_hi
        r_lo, _ = self._along_seqlen([p for p in self.points if p.work == lo], seqlen)
        return (_log_between(work, lo, hi, r_lo, r_hi),
                f"interpolated between {lo} and {hi} heads x requests per device; at {hi}: {w_hi}")


@dataclass(frozen=True)
class Power:
    """Power of one hardware type busy with kernels and idle, from sustained-loop energy records."""
    prefill_w: float          # busy with compute-bound work (attention records), watts per device
    decode_w: float           # busy with memory-bound work (decode attention records)
    idle_w: float | None      # between kernels (the engine's idle reading), None where not recorded
    records: int
    detail: str


@dataclass
class MeasuredRates:
    """Every curve from the given result files, keyed by hardware profile name."""
    curves: dict[tuple[str, str], list[Curve]]
    profiles: dict[str, HardwareProfile]      # the profile each file recorded (with calibrated roofs)
    power: dict[str, Power] = field(default_factory=dict)
    #: per hardware: the median coefficient of variation (std / mean) of the timed calls of the attention and decode
    #: records: a step's time jitter in the simulation's per-token latencies
    jitter: dict[str, float] = field(default_factory=dict)

    def curve(self, hardware: str, component: str, *, group: float, head_dim: int,
              dtype: str) -> Curve | None:
        """The curve nearest the model's shape: same GQA group size and head_dim if measured, else the
        nearest (log distance); causal before non-causal; the plan's dtype before others."""
        found = self.curves.get((hardware, component), [])
        if not found:
            return None

        def distance(c: Curve) -> tuple:
            g, d, causal, dt = c.shape
            return (abs(math.log(g / group)) + abs(math.log(d / head_dim)), causal is False, dt != dtype)
        return min(found, key=distance)


def _group(case: Mapping[str, Any]) -> float:
    hq = case.get("heads_q") or 1
    return hq / (case.get("heads_kv") or hq)


def _power(name: str, energies: list[tuple[str, Mapping[str, Any]]]) -> Power:
    by_op: dict[str, list[float]] = {}
    idle = [float(e["idle_w"]) for _, e in energies if e.get("idle_w")]
    for op, e in energies:
        by_op.setdefault(op, []).append(float(e["average_w"]))
    pre = statistics.fmean(by_op["attention"]) if "attention" in by_op else None
    dec = statistics.fmean(by_op["decode_attention"]) if "decode_attention" in by_op else None
    parts = []
    if pre is not None:
        parts.append(f"{pre:.0f} W busy over {len(by_op['attention'])} attention records")
    if dec is not None:
        parts.append(f"{dec:.0f} W busy over {len(by_op['decode_attention'])} decode records")
    if pre is None or dec is None:
        parts.append("the same figure for both phases")
    if idle:
        parts.append(f"{statistics.median(idle):.0f} W idle")
    return Power(prefill_w=pre if pre is not None else dec, decode_w=dec if dec is not None else pre,
                 idle_w=statistics.median(idle) if idle else None, records=len(energies),
                 detail=f"{SUSTAINED}: " + ", ".join(parts))


def rates_from_results(results: Iterable[tuple[str, Mapping[str, Any]]]) -> MeasuredRates:
    """Curves from loaded result files ``(path, data)``: passed records of the attention and decode
    attention ops; per (hardware, shape, work, seqlen) the fastest backend; and the sustained-loop power of
    every passed record that has it."""
    best: dict[tuple, dict[tuple[int, int], Point]] = {}
    files: dict[tuple, str] = {}
    profiles: dict[str, HardwareProfile] = {}
    energies: dict[str, list[tuple[str, Mapping[str, Any]]]] = {}
    spreads: dict[str, list[float]] = {}
    for path, data in results:
        hw = data.get("hardware") or {}
        name = hw.get("name")
        if not name:
            raise BadInput("result file has no hardware profile", file=path, where="hardware",
                           fix="use a result file written by `kbench run` on a detected device")
        try:
            profiles.setdefault(name, HardwareProfile.from_json(hw))
        except TypeError:
            pass  # an older profile layout: keep the rates, the planner uses the registered profile
        for rec in records_of(data, file=path):
            if not rec.passed or rec.op not in OPS:
                continue
            hw_name = rec.profile or name
            std, mean = rec.stat("std"), rec.stat("mean")
            if std is not None and mean:
                spreads.setdefault(hw_name, []).append(float(std) / float(mean))
            energy = rec.energy
            if energy.get("method") == SUSTAINED:
                energies.setdefault(hw_name, []).append((rec.op, energy))
            component, metric, scale, key = OPS[rec.op]
            case, value = rec.case, rec.metric(metric)
            if not value or key not in case:
                continue
            work = 0
            if rec.op == "decode_attention":
                if case.get("seqlen_q", 1) != 1:
                    continue  # a decode step generates one token per request; multi-token (speculative) steps differ
                work = int(case.get("batch", 1) or 1) * int(case.get("heads_kv") or case.get("heads_q") or 1)
            shape = (_group(case), int(case.get("head_dim", 0) or 0), bool(case.get("causal", True)),
                     rec.dtype.value if rec.dtype is not None else "")
            slot = (hw_name, component, shape)
            point = Point(int(case[key]), float(value) * scale, rec.backend, rec.case_id, work)
            per_pt = best.setdefault(slot, {})
            at = (work, point.seqlen)
            if at not in per_pt or point.rate > per_pt[at].rate:
                per_pt[at] = point
            files.setdefault(slot, path)
    curves: dict[tuple[str, str], list[Curve]] = {}
    for (name, component, shape), per_pt in best.items():
        pts = tuple(sorted(per_pt.values(), key=lambda p: (p.work, p.seqlen)))
        curves.setdefault((name, component), []).append(
            Curve(name, component, shape, pts, files[(name, component, shape)]))
    power = {name: _power(name, found) for name, found in energies.items()}
    jitter = {name: statistics.median(found) for name, found in spreads.items()}
    return MeasuredRates(curves, profiles, power, jitter)


def load_rates(paths: Iterable[str]) -> MeasuredRates:
    from kbench.results import load_result

    return rates_from_results((str(p), load_result(p)) for p in paths)
