"""`kbench plan --like aiconfigurator`: the mean-value figure under aiconfigurator's definitions, beside kbench's
own (docs/plan.md, "Like for like").

kbench's figure is the most a plan serves with the SLO met by the attainment share of requests under random
arrivals, judged on simulated percentiles. aiconfigurator's (NVIDIA, ai-dynamo/aiconfigurator) is a
deterministic steady state at a fixed concurrency: no queueing, every request alike. Here the same step model
answers that question, so that the two tools can be compared line by line:

* aggregated, ``b`` requests per replica: per ``osl`` steps the ``b`` new prompts are prefilled within the
  steps, so TPOT is the decode step at ``b`` plus ``b T_pre / osl``; TTFT a prefill and a decode step times
  aiconfigurator's queueing correction 1.8; throughput ``b osl / (TTFT + (osl - 1) TPOT)`` per replica;
* disaggregated: prefill workers busy back to back (``0.9 / T_pre`` requests/s each), TTFT 1.8 times the
  prefill plus the KV transfer; decode workers at the largest batch whose step meets the TPOT (``0.92 b / (osl
  T_step)`` requests/s); the split of the devices that serves the most.

Both modes: the best parallel configuration of each hardware type by output tokens per second per device.
"""
from __future__ import annotations

import math
from typing import Any

from kbench.plan.model import DeviceModel, Parallel, Planner


#: aiconfigurator's queueing correction of a prefill's latency (its TTFT is the prefill times this), and the
#: rate-matching degradation of disaggregated prefill and decode workers (pipeline bubbles, under-filled batches)
TTFT_FACTOR = 1.8
PREFILL_DEGRADATION = 0.9
DECODE_DEGRADATION = 0.92


def _aggregated(planner: Planner, dm: DeviceModel, par: Parallel, isl: float, osl: float) -> dict[str, Any] | None:
    """In-flight batching at ``b`` requests: per ``osl`` steps the ``b`` prompts that replace the finished
    requests are prefilled in the steps (their prefill time spread over the ``osl`` steps); TPOT the mean step,
    TTFT the prompt's prefill (with one decode step of the batch) times the queueing correction."""
    slo, best = planner.workload.slo, None
    ctx = isl + osl / 2
    b_max = min(planner.assume.max_batch, math.floor(dm.lane_tokens(par) / (isl + osl)))
    pre = dm.prefill(round(isl), par).seconds
    for b in range(1, b_max + 1):
        gen = dm.decode_step(b, ctx, par).seconds
        tpot = gen + b * pre / osl
        ttft = TTFT_FACTOR * (pre + gen)
        if tpot > slo.tpot or ttft > slo.ttft:
            break
        tok = b * osl / (ttft + (osl - 1) * tpot) / par.devices
        if best is None or tok > best["tokens_s_gpu"]:
            best = {"tokens_s_gpu": tok, "parallel": par.short, "batch": b, "ttft_s": ttft, "tpot_s": tpot,
                    "devices": par.devices}
    return best


def _decode_rate(planner: Planner, dm: DeviceModel, par: Parallel, isl: float, osl: float):
    """(requests/s, batch, TPOT) of one decode worker at the largest batch meeting the TPOT, or None."""
    b_max = min(planner.assume.max_batch, math.floor(dm.lane_tokens(par) / (isl + osl)))
    found = None
    for b in range(1, b_max + 1):
        step = dm.decode_step(b, isl + osl / 2, par).seconds
        if step > planner.workload.slo.tpot:
            break
        found = (DECODE_DEGRADATION * b / (osl * step), b, step)
    return found


def _disaggregated(planner: Planner, hw: str, pars: list[Parallel], devices: int, isl: float,
                   osl: float) -> dict[str, Any] | None:
    dm, slo, best = planner.devices[hw], planner.workload.slo, None
    links = [planner.interconnects[n] for n in (planner.links or []) if n in planner.interconnects] or \
        [x for x in (dm.net_link, dm.node_link) if x is not None]
    link = links[0] if links else None
    decoders = [(p, _decode_rate(planner, dm, p, isl, osl)) for p in pars]
    for pp in pars:
        if dm.kv_tokens(pp) < isl:
            continue
        pre = dm.prefill(round(isl), pp).seconds
        for dp, found in decoders:
            if found is None:
                continue
            bw = min(pp.tp * pp.dp, dp.tp * dp.dp) * link.bandwidth * planner.assume.link_efficiency if link else 0
            ttft = TTFT_FACTOR * pre + (isl * dm.kv_per_token / bw + link.latency if bw else 0.0)
            if ttft > slo.ttft:
                continue
            r_d, b, tpot = found
            for n_p in range(1, devices // pp.devices + 1):
                n_d = (devices - n_p * pp.devices) // dp.devices
                if n_d < 1:
                    break
                rate = min(n_p * PREFILL_DEGRADATION / pre, n_d * r_d)
                tok = rate * osl / (n_p * pp.devices + n_d * dp.devices)
                if best is None or tok > best["tokens_s_gpu"]:
                    best = {"tokens_s_gpu": tok, "parallel": f"P {n_p}x{pp.short} + D {n_d}x{dp.short}",
                            "batch": b, "ttft_s": ttft, "tpot_s": tpot, "devices": n_p * pp.devices + n_d * dp.devices}
    return best


def like_aiconfigurator(planner: Planner, devices: int | None) -> dict[str, dict[str, Any] | None]:
    """The best aggregated and disaggregated figure under aiconfigurator's definitions (see the module), over
    every hardware type and parallel configuration of the planner, on ``devices`` devices (default 64)."""
    devices = devices or 64
    isl = sum(c.share * (c.input - c.cached) for c in planner.mix)
    osl = max(1.0, planner.mean_output)
    out: dict[str, dict[str, Any] | None] = {"agg": None, "disagg": None}
    for hw in planner.hardware:
        dm = planner.devices[hw.name]
        if not dm.usable:
            continue
        pars = [p for p in planner.configs(hw) if p.devices <= devices and dm.kv_tokens(p) >= isl + osl]
        for p in pars:
            found = _aggregated(planner, dm, p, isl, osl)
            if found and (out["agg"] is None or found["tokens_s_gpu"] > out["agg"]["tokens_s_gpu"]):
                out["agg"] = dict(found, hardware=hw.name)
        found = _disaggregated(planner, hw.name, pars, devices, isl, osl)
        if found and (out["disagg"] is None or found["tokens_s_gpu"] > out["disagg"]["tokens_s_gpu"]):
            out["disagg"] = dict(found, hardware=hw.name)
    return out


def like_rows(like: dict[str, dict[str, Any] | None]) -> list[list[str]]:
    rows = []
    for mode, e in like.items():
        if e is None:
            rows.append([mode, "none meets the SLO", "-", "-", "-", "-", "-"])
            continue
        rows.append([mode, f"{e['hardware']} {e['parallel']}", f"{e['tokens_s_gpu']:.4g}", str(e["batch"]),
                     f"{e['ttft_s']:.3g} s", f"{e['tpot_s'] * 1e3:.3g} ms", str(e["devices"])])
    return rows
