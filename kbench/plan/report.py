"""Tables, the sensitivity to assumed efficiencies, and the plots of `kbench plan`: the cost/latency Pareto
front and the simulated TTFT/TPOT distributions."""
from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Sequence

from kbench.outputs import save_figure
from kbench.plan.model import Assumptions, Plan, Planner, best_per_choice

SIM_HEADERS = ("#", "plan", "pools (instances x devices)", "devices", "req/s", "out tok/s/dev", "req/$", "$/Mtok",
               "kWh/Mtok", "TTFT p50/p90/p99", "TPOT p50/p90/p99", "ITL p50/p99", "batch", "SLO met", "rates from")


def table_headers(attainment: float, simulated: bool = False) -> tuple[str, ...]:
    """The plan table's columns: simulated plans show latency percentiles; screened plans the TTFT that the
    attainment fraction of requests stay within."""
    if simulated:
        return SIM_HEADERS
    return ("#", "plan", "pools (instances x devices)", "P:D devices", "goodput req/s/dev", "out tok/s/dev", "req/$",
            "req/MJ", "$/Mtok", "kWh/Mtok", f"TTFT p{100 * attainment:.3g}", "TPOT", "batch",
            "wall prefill | decode", "SLO met", "rates from")


def _g(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}g}"


def _time(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "-"
    return f"{seconds:.3g} s" if seconds >= 1 else f"{seconds * 1e3:.3g} ms"


def _triple(values: Sequence[float], unit: str) -> str:
    if not all(math.isfinite(v) for v in values):
        return "/".join("inf" if not math.isfinite(v) else f"{v:.3g}" for v in values) + f" {unit}"
    scale = 1e3 if unit == "ms" else 1.0
    return "/".join(f"{v * scale:.3g}" for v in values) + f" {unit}"


def pools(p: Plan) -> str:
    if p.mode == "aggregated":
        return f"{p.prefill_instances} x {p.prefill_par.devices} (both phases)"
    return f"P {p.prefill_instances} x {p.prefill_par.devices} + D {p.decode_instances} x {p.decode_par.devices}"


def ratio(p: Plan) -> str:
    if p.mode == "aggregated" or not p.decode_devices:
        return "-"
    return f"{p.prefill_devices}:{p.decode_devices} ({p.prefill_devices / p.decode_devices:.2g}:1)"


def ttft_summary(p: Plan, shares: Sequence[float]) -> str:
    """The TTFT that the attainment fraction of requests stay within (p90 for 90%)."""
    if not p.ttft and p.sim is None:
        return "-"
    return _time(p.ttft_quantile(shares, p.attainment_target))


def latencies(p: Plan, what: str) -> list[float]:
    return [p.sim.percentile(what, q) for q in (50, 90, 99)]


def _itl(p: Plan) -> str:
    """Per-token inter-token latency, P50/P99 (ms), of the simulated decode steps."""
    lo, hi = p.sim.percentile("itl", 50), p.sim.percentile("itl", 99)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "-"
    return f"{lo * 1e3:.3g}/{hi * 1e3:.3g} ms"


def table_rows(plans: Sequence[Plan], shares: Sequence[float]) -> list[list[str]]:
    rows = []
    for i, p in enumerate(plans, 1):
        if p.sim is not None:
            energy = _g(p.kwh_per_mtok) + (" (TDP)" if p.power_source == "TDP" and p.kwh_per_mtok else "")
            rows.append([str(i), p.label, pools(p), str(p.devices), _g(p.rate), _g(p.output_per_device),
                         _g(p.per_dollar), _g(p.dollars_per_mtok), energy, _triple(latencies(p, "ttft"), "s"),
                         _triple(latencies(p, "tpot"), "ms"), _itl(p), f"{p.batch}/{p.max_batch}",
                         f"{p.attainment:.0%}",
                         "+".join(p.origins) or "-"])
            continue
        rows.append([str(i), p.label, pools(p) if p.devices else "-", ratio(p), _g(p.per_device),
                     _g(p.output_per_device), _g(p.per_dollar), _g(p.per_megajoule), _g(p.dollars_per_mtok),
                     _g(p.kwh_per_mtok), ttft_summary(p, shares), _time(p.tpot),
                     f"{p.batch}/{p.max_batch}" if p.devices else "-",
                     f"{p.prefill_wall} | {p.decode_wall}" if p.devices else "-", f"{p.attainment:.0%}",
                     "+".join(p.origins) or "-"])
    return rows


def plan_json(p: Plan, shares: Sequence[float]) -> dict[str, Any]:
    out = {"label": p.label, "mode": p.mode, "prefill_hardware": p.prefill_hw, "decode_hardware": p.decode_hw,
           "tp_prefill": p.tp_prefill, "pp_prefill": p.pp_prefill, "tp_decode": p.tp_decode,
           "ep_prefill": p.ep_prefill, "dp_prefill": p.dp_prefill, "ep_decode": p.ep_decode, "dp_decode": p.dp_decode,
           "parallel_prefill": p.prefill_par.short, "parallel_decode": p.decode_par.short,
           "pp_decode": p.pp_decode, "link": p.link,
           "prefill_instances": p.prefill_instances, "decode_instances": p.decode_instances,
           "prefill_devices": p.prefill_devices, "decode_devices": p.decode_devices, "devices": p.devices,
           "per_device_of": p.per_device_of,
           "rate_req_s": p.rate, "simulated": p.sim is not None,
           "ttft_s": [p.ttft[i] for i in sorted(p.ttft)],
           "ttft_at_attainment_s": p.ttft_quantile(shares, p.attainment_target) if (p.ttft or p.sim) else None,
           "kv_transfer_s": [p.transfer[i] for i in sorted(p.transfer)],
           "tpot_s": p.tpot if math.isfinite(p.tpot) else None, "batch": p.batch, "max_batch": p.max_batch,
           "attainment": p.attainment, "meets_slo": p.meets, "goodput_req_s": p.goodput,
           "goodput_per_device": p.per_device, "output_tokens_per_s_per_device": p.output_per_device,
           "requests_per_dollar": p.per_dollar,
           "requests_per_megajoule": p.per_megajoule, "dollars_per_mtok": p.dollars_per_mtok,
           "kwh_per_mtok": p.kwh_per_mtok, "price_per_hour": p.price_per_hour, "power_w": p.power,
           "power_from": p.power_source or None,
           "prefill_wall": p.prefill_wall, "decode_wall": p.decode_wall, "rates_from": list(p.origins),
           "reason": p.reason}
    if p.sim is not None:
        s = p.sim
        out["simulation"] = {
            "requests": s.requests, "measured": s.measured, "arrivals": s.source, "span_s": s.span,
            "stopped_early": s.stopped, "utilization": s.utilization, "mean_decode_batch": s.mean_batch,
            "ttft_met": s.ttft_met, "tpot_met": s.tpot_met, "steady_state": s.steady, "ttft_drift": s.drift,
            **{f"itl_p{q}_s": s.percentile("itl", q) for q in (50, 90, 99)},
            **{f"{what}_p{q}_s": s.percentile(what, q) for what in ("ttft", "tpot", "e2e") for q in (50, 90, 99)}}
    if p.screen is not None:
        out["screen"] = {"devices": p.screen.devices, "prefill_instances": p.screen.prefill_instances,
                         "decode_instances": p.screen.decode_instances,
                         "tpot_s": p.screen.tpot if math.isfinite(p.screen.tpot) else None}
    return out


PHASE_HEADERS = ("hardware", "TP needed", "prefill time per class", "prefill J/token", "KV room reqs",
                 "decode step b=1", "decode step full", "decode tok/s full", "decode J/token", "wall prefill | decode")


def phase_rows(planner: Planner) -> list[list[str]]:
    """Per hardware type at the smallest tensor-parallel degree that holds the weights and the largest request:
    the time of each class's prefill, a decode step at batch 1 and at the batch the KV room allows, the
    decode rate, and energy per token at TDP."""
    rows = []
    for hw in planner.hardware:
        dm = planner.devices[hw.name]
        if not dm.usable:
            continue
        par = next((c for c in planner.configs(hw) if dm.kv_tokens(c) >= planner.largest_request), None)
        if par is None:
            need = dm.weight_bytes + planner.largest_request * dm.kv_per_token
            top = max((c.devices for c in planner.configs(hw)), default=1)
            rows.append([hw.name, f"> {top} ({need / 1e9:.0f} GB)"] + ["-"] * 8)
            continue
        pre = [dm.prefill(c.input, par, c.cached) for c in planner.mix]
        b_max = max(1, min(planner.assume.max_batch, math.floor(dm.lane_tokens(par) / planner.slot_tokens)))
        one = dm.decode_step(1, planner.decode_context, par)
        full = dm.decode_step(b_max, planner.decode_context, par)
        watts = par.devices * hw.power_watts if hw.power_watts else None
        mean_s = sum(c.share * p.seconds for c, p in zip(planner.mix, pre))
        mean_in = sum(c.share * c.input for c in planner.mix)
        pre_j = None if watts is None else watts * mean_s / mean_in
        dec_j = None if watts is None else watts * full.seconds / b_max / par.pp
        rows.append([hw.name, par.label, " / ".join(_time(p.seconds) for p in pre), _g(pre_j), str(b_max),
                     _time(one.seconds), _time(full.seconds), _g(b_max * par.pp / full.seconds), _g(dec_j),
                     f"{'/'.join(sorted({p.wall for p in pre}))} | {full.wall}"])
    return rows


def input_rows(planner: Planner) -> list[list[str]]:
    """Per hardware type: each rate the plan uses, its value and whether it was measured."""
    rows = []
    lengths = sorted({c.input for c in planner.mix})
    for name, dm in planner.devices.items():
        if not dm.usable:
            rows.append([name, "all", "-", "unusable: no compute, bandwidth or capacity figure"])
            continue
        rows.append([name, "matmul FLOP/s", dm.compute.origin, dm.compute.detail])
        rows.append([name, "weight reads B/s", dm.memory.origin, dm.memory.detail])
        for length in lengths[:8]:
            r = dm.attention_rate(length)
            rows.append([name, f"prefill attention at {length:,} tokens", r.origin, r.detail])
        if len(lengths) > 8:
            rows.append([name, f"prefill attention at {len(lengths) - 8} more lengths", "-", "see --format json"])
        ctx = round(planner.decode_context)
        configs = planner.configs(dm.hw)
        par = next((c for c in configs if dm.kv_tokens(c) >= planner.largest_request), configs[0] if configs else None)
        tp = par.tp if par else 1
        full = max(1, min(planner.assume.max_batch, math.floor(dm.lane_tokens(par) / planner.slot_tokens))) if par else 1
        for b in sorted({1, full}):
            r = dm.kv_read_rate(ctx, dm.work(b, tp))
            rows.append([name, f"decode KV reads at {ctx:,} tokens, batch {b} (TP{tp})", r.origin, r.detail])
        if dm.node_link is not None:
            rows.append([name, "all-reduce link", "roofline", f"{dm.node_link.name}: {dm.node_link.bandwidth / 1e9:g} "
                         f"GB/s x assumed efficiency {planner.assume.link_efficiency:g}, "
                         f"{dm.node_link.latency * 1e6:g} us"])
        price = f"${dm.hw.price_per_hour:g}/h ({dm.hw.price_source})" if dm.hw.price_per_hour else "none: pass --price"
        rows.append([name, "price per device-hour", "list price" if dm.hw.price_per_hour else "-", price])
        measured = (planner.measured.power.get(name) if planner.measured is not None else None)
        if measured is not None:
            idle = f", {measured.idle_w:.0f} W idle" if measured.idle_w is not None else ""
            rows.append([name, "power per device", "measured",
                         f"{measured.prefill_w:.0f} W prefill / {measured.decode_w:.0f} W decode busy{idle} "
                         f"({measured.detail}), times the simulated utilization"])
        else:
            power = f"{dm.hw.power_watts:g} W, every device at TDP all the time" if dm.hw.power_watts else \
                "none in the profile"
            rows.append([name, "power per device", "TDP" if dm.hw.power_watts else "-", power])
    return rows


def sensitivity(planner_for: Callable[[Assumptions], Planner], base: Assumptions, by: str,
                factors: Iterable[float] = (0.75, 1.25)) -> list[str]:
    """How much the assumed efficiencies move the screen's answer: its top plan and figure with every assumed
    efficiency (matmul, bandwidth, link) scaled, measured and calibrated rates unchanged."""
    lines = []
    top0 = _top(planner_for(base).all_plans(), by)
    if top0 is None:
        return ["sensitivity: no plan meets the SLO at the assumed efficiencies"]
    v0 = top0.metric(by)
    if "roofline" not in top0.origins:
        return [f"the top plan ({top0.label}) uses no assumed efficiency (its rates are "
                f"{' and '.join(top0.origins)}): the assumptions do not move it"]
    for f in factors:
        top = _top(planner_for(base.scaled(f)).all_plans(), by)
        if top is None:
            lines.append(f"assumed efficiencies x{f:g}: no plan meets the SLO")
            continue
        v = top.metric(by)
        same = "same top plan" if top.label == top0.label else f"top plan becomes {top.label}"
        change = "" if v is None or v0 is None else f", {by} figure {100 * (v / v0 - 1):+.0f}%"
        lines.append(f"assumed efficiencies x{f:g} (compute {base.scaled(f).compute_efficiency:.2g}, "
                     f"bandwidth {base.scaled(f).bandwidth_efficiency:.2g}, link {base.scaled(f).link_efficiency:.2g}): "
                     f"{same}{change}")
    return lines


def _top(plans: list[Plan], by: str) -> Plan | None:
    ranked = best_per_choice(plans, by)
    return ranked[0] if ranked and ranked[0].meets else None


def pareto(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both coordinates (lower is better on both)."""
    front = []
    for i, (x, y) in enumerate(points):
        if not any((a <= x and b <= y) and (a < x or b < y) for j, (a, b) in enumerate(points) if j != i):
            front.append(i)
    return sorted(front, key=lambda i: points[i])


def _cost(p: Plan) -> tuple[float | None, str]:
    """Cost per million tokens of requests meeting the SLO: dollars where the plan has a price, else
    device-hours."""
    if p.dollars_per_mtok is not None:
        return p.dollars_per_mtok, "$"
    if p.good_tokens:
        return p.devices / 3600 / p.good_tokens * 1e6, "device-hours"
    return None, ""


def plot_pareto(plans: Sequence[Plan], shares: Sequence[float], path: str, *, title: str) -> str:
    """Cost per million tokens against the attainment-quantile TTFT and against TPOT (simulated percentiles
    where simulated), every plan that meets the SLO; the Pareto front (cheaper and faster than every other plan
    on that pair) is drawn as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    good = [p for p in plans if p.meets and _cost(p)[0] is not None]
    unit = "$" if good and all(_cost(p)[1] == "$" for p in good) else "device-hours"
    if unit == "device-hours":
        good = [p for p in good if p.good_tokens]
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.5))
    modes = {"aggregated": ("o", "tab:blue"), "disaggregated": ("^", "tab:orange")}
    pct = f"p{round(100 * good[0].attainment_target)}" if good else "p90"

    def cost(p: Plan) -> float:
        return p.dollars_per_mtok if unit == "$" else p.devices / 3600 / p.good_tokens * 1e6

    def tpot(p: Plan) -> float:
        return (p.sim.percentile("tpot", 100 * p.attainment_target) if p.sim is not None else p.tpot) * 1e3

    for ax, (name, latency) in zip(axes, ((f"TTFT {pct} (s)", lambda p: p.ttft_quantile(shares, p.attainment_target)),
                                          (f"TPOT {pct} (ms)", tpot))):
        pts = [(cost(p), latency(p)) for p in good]
        for mode, (marker, color) in modes.items():
            sel = [pt for p, pt in zip(good, pts) if p.mode == mode]
            if sel:
                ax.scatter([x for x, _ in sel], [y for _, y in sel], marker=marker, color=color, alpha=0.5, label=mode)
        front = pareto(pts)
        if front:
            ax.plot([pts[i][0] for i in front], [pts[i][1] for i in front], "-", color="black", linewidth=1,
                    label="Pareto front")
            labels: dict[tuple[float, float], list[str]] = {}
            for i in front:   # plans with the same figures (e.g. the same pools over different links) share a label
                labels.setdefault(pts[i], []).append(good[i].label)
            for pt, names in labels.items():
                more = f" (+{len(names) - 1} alike)" if len(names) > 1 else ""
                ax.annotate(names[0] + more, pt, fontsize=6, xytext=(4, 2), textcoords="offset points")
        ax.set_xlabel(f"cost per million tokens of requests meeting the SLO ({unit})")
        ax.set_ylabel(name)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    if not good:
        axes[0].text(0.5, 0.5, "no plan meets the SLO", transform=axes[0].transAxes, ha="center")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    save_figure(fig, path, option="--plots", dpi=120)
    plt.close(fig)
    return path


def plot_latency(plans: Sequence[Plan], path: str, *, title: str, top: int = 6) -> str:
    """The simulated distributions of TTFT and TPOT (cumulative, one line per plan, the SLO as a dashed
    line) for the first ``top`` simulated plans."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    sims = [p for p in plans if p.sim is not None][:top]
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.5))
    for ax, what, unit, scale in ((axes[0], "ttft", "s", 1.0), (axes[1], "tpot", "ms", 1e3)):
        for p in sims:
            values = np.sort(np.asarray(getattr(p.sim, what), dtype=float)) * scale
            values = values[np.isfinite(values)]
            if len(values):
                ax.plot(values, np.arange(1, len(values) + 1) / len(values), label=p.label, linewidth=1.2)
        if sims:
            limit = getattr(sims[0].sim.slo, what) * scale
            ax.axvline(limit, color="black", linestyle="--", linewidth=1, label=f"SLO {limit:g} {unit}")
            ax.axhline(sims[0].attainment_target, color="grey", linestyle=":", linewidth=1)
        ax.set_xlabel(f"{what.upper()} ({unit})")
        ax.set_ylabel("fraction of requests")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    if not sims:
        axes[0].text(0.5, 0.5, "no simulated plan", transform=axes[0].transAxes, ha="center")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    save_figure(fig, path, option="--plots", dpi=120)
    plt.close(fig)
    return path


__all__ = ["PHASE_HEADERS", "SIM_HEADERS", "input_rows", "pareto", "phase_rows", "plan_json", "plot_latency",
           "plot_pareto", "sensitivity", "table_headers", "table_rows"]
