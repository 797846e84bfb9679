"""Measured kernel rates from result files: the best passing backend at the nearest shape, interpolated in
sequence length (docs/plan.md, "Measured inputs")."""
from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from kbench.errors import BadInput
from kbench.hardware import HardwareProfile
from kbench.record import records_of

#: result-file op -> (planner component, metric key, scale to per-second units, the sequence length key)
OPS = {"attention": ("prefill-attention", "tflops", 1e12, "seqlen_kv"),
       "decode_attention": ("decode-attention", "gbps", 1e9, "seqlen_kv")}


@dataclass(frozen=True)
class Point:
    seqlen: int
    rate: float               # FLOP/s (prefill attention) or B/s (decode attention), one device
    backend: str
    case_id: str


@dataclass(frozen=True)
class Curve:
    """Best rate per measured sequence length for one (hardware, component, shape)."""
    hardware: str
    component: str
    shape: tuple              # (heads_q / heads_kv, head_dim, causal, dtype)
    points: tuple[Point, ...]  # sorted by seqlen
    file: str

    def at(self, seqlen: int) -> tuple[float, str]:
        """Rate at ``seqlen``: linear in log(seqlen) between the two nearest measured lengths, held at the
        end points outside them. Returns the rate and a description of where it came from."""
        pts = self.points
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
        w = (math.log(seqlen) - math.log(lo.seqlen)) / (math.log(hi.seqlen) - math.log(lo.seqlen))
        return (lo.rate + w * (hi.rate - lo.rate),
                f"interpolated between seqlen {lo.seqlen:,} ({lo.backend}) and {hi.seqlen:,} ({hi.backend})")


@dataclass
class MeasuredRates:
    """Every curve from the given result files, keyed by hardware profile name."""
    curves: dict[tuple[str, str], list[Curve]]
    profiles: dict[str, HardwareProfile]      # the profile each file recorded (with calibrated roofs)

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


def rates_from_results(results: Iterable[tuple[str, Mapping[str, Any]]]) -> MeasuredRates:
    """Curves from loaded result files ``(path, data)``: passed records of the attention and decode
    attention ops; per (hardware, shape, seqlen) the fastest backend."""
    best: dict[tuple, dict[int, Point]] = {}
    files: dict[tuple, str] = {}
    profiles: dict[str, HardwareProfile] = {}
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
            component, metric, scale, key = OPS[rec.op]
            case, value = rec.case, rec.metric(metric)
            if not value or key not in case:
                continue
            if rec.op == "decode_attention" and case.get("seqlen_q", 1) != 1:
                continue  # a decode step generates one token per request; multi-token (speculative) steps differ
            shape = (_group(case), int(case.get("head_dim", 0) or 0), bool(case.get("causal", True)),
                     rec.dtype.value if rec.dtype is not None else "")
            slot = (name, component, shape)
            point = Point(int(case[key]), float(value) * scale, rec.backend, rec.case_id)
            per_len = best.setdefault(slot, {})
            if point.seqlen not in per_len or point.rate > per_len[point.seqlen].rate:
                per_len[point.seqlen] = point
            files.setdefault(slot, path)
    curves: dict[tuple[str, str], list[Curve]] = {}
    for (name, component, shape), per_len in best.items():
        pts = tuple(sorted(per_len.values(), key=lambda p: p.seqlen))
        curves.setdefault((name, component), []).append(
            Curve(name, component, shape, pts, files[(name, component, shape)]))
    return MeasuredRates(curves, profiles)


def load_rates(paths: Iterable[str]) -> MeasuredRates:
    from kbench.results import load_result

    return rates_from_results((str(p), load_result(p)) for p in paths)
