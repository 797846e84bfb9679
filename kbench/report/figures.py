"""The report's plots (matplotlib, no pyplot state): throughput, speedup, roofline, noise.

Each function returns a Figure, or ``None`` when the records hold nothing to plot. Colours are
fixed per series across figures so one backend is one colour everywhere.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import matplotlib
import numpy as np
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from kbench.record import Record

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
           "#7f7f7f", "#bcbd22")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
STYLE = {"font.family": "sans-serif", "font.size": 9, "axes.titlesize": 10, "axes.spines.top": False,
         "axes.spines.right": False, "axes.grid": True, "grid.alpha": 0.3, "svg.fonttype": "none",
         "svg.hashsalt": "kbench"}

#: case parameters that place a point (x axis, panel) rather than name a series; seqlen_q too, unless it
#: varies at one seqlen_kv (decode: 1, 4, 16 query tokens against one cache length are different lines)
_PLACED = ("batch", "seqlen_kv", "head_dim", "causal")


def colors(series: Sequence[str]) -> dict[str, str]:
    return {s: PALETTE[i % len(PALETTE)] for i, s in enumerate(dict.fromkeys(series))}


def short_case(case_id: str) -> str:
    """attention[b=1,sq=64,...] -> b=1,sq=64,... (the op name is the same everywhere)."""
    return case_id[case_id.find("[") + 1:-1] if case_id.endswith("]") and "[" in case_id else case_id


def _fmt_len(x: float, _pos=None) -> str:
    x = int(round(x))
    return f"{x // 1024}k" if x >= 1024 and x % 1024 == 0 else str(x)


def _new_figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), layout="constrained")
    return fig


def _rows(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The rows with ``rec`` as a Record (callers may hand records as JSON objects)."""
    return [{**r, "rec": Record.of(r["rec"])} for r in rows]


def _passed(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in _rows(rows) if r["rec"].passed and r["rec"].tflops]


def _tflops_interval(rec: Record) -> tuple[float, float] | None:
    """TFLOP/s at the ends of the median's 95% interval (a longer time is a lower rate), or None."""
    lo, hi, med, tf = rec.stat("ci_low"), rec.stat("ci_high"), rec.median, rec.tflops
    if not (lo and hi and med and tf) or lo <= 0:
        return None
    return tf * med / hi, tf * med / lo


#: a legend longer than this is not read: the entries past it are counted in one last entry
LEGEND_MAX = 12


def _legend_below(fig: Figure, axes: Sequence[Any], ncols: int = 3, entries: Mapping[str, Any] | None = None) -> None:
    """One legend for the whole figure, under the panels: never on top of a line or a point. ``entries``
    (label -> handle) replaces the axes' own; at most ``LEGEND_MAX`` entries, the rest counted in the last."""
    seen: dict[str, Any] = dict(entries) if entries is not None else {}
    if entries is None:
        for ax in axes:
            for handle, label in zip(*ax.get_legend_handles_labels()):
                seen.setdefault(label, handle)
    if len(seen) > LEGEND_MAX:
        from matplotlib.lines import Line2D

        kept = dict(list(seen.items())[:LEGEND_MAX - 1])
        kept[f"... and {len(seen) - len(kept)} more (the tables list every record)"] = Line2D([], [], linestyle="")
        seen = kept
    if seen:
        fig.legend(list(seen.values()), list(seen), loc="outside lower center", ncols=min(ncols, len(seen)),
                   fontsize=7.5, frameon=False)


def _nice_below(v: float) -> float:
    """The largest of 1, 2, 5 x 10^k at or below ``v`` (> 0)."""
    k = math.floor(math.log10(v))
    return max(m * 10.0 ** k for m in (1, 2, 5) if m * 10.0 ** k <= v * (1 + 1e-9))


def _nice_above(v: float) -> float:
    """The smallest of 1, 2, 5 x 10^k at or above ``v`` (> 0)."""
    k = math.floor(math.log10(v))
    return min(m * 10.0 ** j for j in (k, k + 1) for m in (1, 2, 5) if m * 10.0 ** j >= v * (1 - 1e-9))


def two_ticks_at_least(ax, low: float, high: float) -> None:
    """Limit a log y axis (1-2-5 ticks) to the data from ``low`` to ``high``, widened to the nearest ticks
    outside it, so every panel has at least two labelled ticks (a panel whose values lie between two ticks
    showed one or none, and could not be read)."""
    if not (low > 0 and high > 0):
        return
    lo, hi = _nice_below(low), _nice_above(high)
    if hi <= lo:
        hi = _nice_above(lo * 1.01)
    ax.set_ylim(lo / 1.15, hi * 1.15)


def _log_ticks(axis, fmt: str = "{:g}") -> None:
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: fmt.format(v)))
    axis.set_minor_formatter(NullFormatter())


def throughput(rows: Sequence[Mapping[str, Any]], palette: Mapping[str, str]) -> Figure | None:
    """TFLOP/s against sequence length, one panel per head_dim x causal (like FlashAttention-3 fig. 5).

    ``rows``: dicts with ``series`` (backend, with the run's label when several runs) and ``rec``.
    Parameters that vary inside a panel besides the placed ones (heads, dtype) split a series. Both axes
    are logarithmic (backends 10x apart stay readable), error bars are the 95% interval of the median
    time as a rate, and the legend sits under the panels.
    """
    rows = [r for r in _passed(rows) if {"head_dim", "seqlen_kv"} <= set(r["rec"].case)]
    if not rows:
        return None
    panels: dict[tuple, list] = {}
    for r in rows:
        c = r["rec"].case
        panels.setdefault((c["head_dim"], c.get("causal")), []).append(r)
    keys = sorted(panels, key=lambda k: (k[0], str(k[1])))
    # what splits a series is decided over every panel, so a line style and a legend entry mean one thing
    varying = [p for p in rows[0]["rec"].case if p not in _PLACED and p != "seqlen_q"
               and any(len({str(r["rec"].case.get(p)) for r in prows}) > 1 for prows in panels.values())]
    at_one_length: dict[tuple, set] = {}
    for r in rows:
        c = r["rec"].case
        at_one_length.setdefault((r["series"], c["head_dim"], c.get("causal"), c["seqlen_kv"]), set()).add(
            c.get("seqlen_q"))
    if any(len(v) > 1 for v in at_one_length.values()):
        varying.insert(0, "seqlen_q")
    extras = sorted({_extra(r, varying) for r in rows})
    styles = {e: MARKERS[i % len(MARKERS)] for i, e in enumerate(extras)}
    dashes = {e: ("-", "--", ":", "-.")[i % 4] for i, e in enumerate(extras)}
    ncols = 1 if len(keys) == 1 else 2
    nrows = math.ceil(len(keys) / ncols)
    n_lines = len({(r["series"], _extra(r, varying)) for r in rows})
    fig = _new_figure(11 if ncols == 2 else 7, 3.3 * nrows + 0.6 + 0.17 * math.ceil(n_lines / 3))
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False).ravel())
    for ax, key in zip(axes, keys):
        prows = panels[key]
        lines: dict[tuple, list] = {}
        for r in prows:  # a line joins one shape at several lengths, never different shapes (a trend is one shape)
            lines.setdefault((r["series"], _extra(r, varying), _shape(r, varying)), []).append(r)
        bottom, top = math.inf, 0.0
        for (series, extra, _), pts in sorted(lines.items(), key=lambda kv: tuple(map(str, kv[0]))):
            pts = sorted(pts, key=lambda r: r["rec"].case["seqlen_kv"])
            xs = [r["rec"].case["seqlen_kv"] for r in pts]
            ys = [r["rec"].tflops for r in pts]
            spans = [_tflops_interval(r["rec"]) for r in pts]
            err = [[y - s[0] if s else 0.0 for y, s in zip(ys, spans)],
                   [s[1] - y if s else 0.0 for y, s in zip(ys, spans)]]
            bottom = min([bottom] + [y - e for y, e in zip(ys, err[0]) if y - e > 0] + ys)
            top = max([top] + [y + e for y, e in zip(ys, err[1])])
            label = f"{series} {extra}".strip()
            ax.errorbar(xs, ys, yerr=err, marker=styles[extra], linestyle=dashes[extra], color=palette[series],
                        label=label, markersize=4.5, linewidth=1.3, elinewidth=0.9, capsize=2.5)
        xs_all = sorted({r["rec"].case["seqlen_kv"] for r in prows})
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs_all)
        ax.xaxis.set_major_formatter(FuncFormatter(_fmt_len))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_yscale("log")
        _log_ticks(ax.yaxis)
        two_ticks_at_least(ax, bottom, top)
        ax.grid(True, which="major", axis="y", alpha=0.3)
        mask = "" if key[1] is None else (", causal" if key[1] else ", non-causal")
        ax.set_title(f"head_dim {key[0]}{mask}")
        ax.set_xlabel("sequence length (keys)")
        ax.set_ylabel("TFLOP/s (log)")
    for ax in axes[len(keys):]:
        ax.set_visible(False)
    _legend_below(fig, axes[:len(keys)], entries=_throughput_legend(rows, varying, palette, styles, dashes))
    return fig


def _throughput_legend(rows, varying, palette, styles, dashes) -> dict[str, Any] | None:
    """The legend of series x line styles: one entry per pair while they are few; beyond ``LEGEND_MAX`` one
    entry per series (its colour) and one per style (its marker and dashes, in grey), so 3 backends in 6
    configurations are 9 entries, not 18. None: the axes' own entries."""
    from matplotlib.lines import Line2D

    pairs = {(r["series"], _extra(r, varying)) for r in rows}
    if len(pairs) <= LEGEND_MAX:
        return None
    out: dict[str, Any] = {s: Line2D([], [], color=palette[s], linewidth=2.5)
                           for s in dict.fromkeys(r["series"] for r in rows)}
    for extra in sorted({e for _, e in pairs}):
        out[extra or "(one configuration)"] = Line2D([], [], color="#555555", marker=styles[extra],
                                                     linestyle=dashes[extra], markersize=4.5)
    return out


def _extra(row: Mapping[str, Any], varying: Sequence[str]) -> str:
    return ",".join(f"{p}={row['rec'].case[p]}" for p in varying)


def _shape(row: Mapping[str, Any], varying: Sequence[str]) -> tuple:
    """What a line keeps the same along its sequence lengths: every parameter but the lengths and those the
    style already shows (batch, for one), and how the query length follows the key length (equal, or fixed)."""
    c = row["rec"].case
    same = tuple((p, str(v)) for p, v in sorted(c.items()) if p not in ("seqlen_q", "seqlen_kv") and p not in varying)
    query = "" if "seqlen_q" in varying else "sq=sk" if c.get("seqlen_q") == c.get("seqlen_kv") else c.get("seqlen_q")
    return same + (("seqlen_q", str(query)),)


def energy(rows: Sequence[Mapping[str, Any]], palette: Mapping[str, str]) -> Figure | None:
    """Joules per call and TFLOP/s per watt against sequence length, per backend (records with NVML energy).

    One line per (series, head_dim, masking); ``None`` when no passed record measured energy.
    """
    pts = [r for r in _passed(rows) if "seqlen_kv" in r["rec"].case and r["rec"].energy]
    if not pts:
        return None
    fig = _new_figure(11, 3.8)
    ax_j, ax_w = fig.subplots(1, 2)
    lines: dict[tuple, list] = {}
    for r in pts:
        c = r["rec"].case
        lines.setdefault((r["series"], c.get("head_dim"), c.get("causal")), []).append(r)
    for (series, d, causal), group in sorted(lines.items(), key=lambda kv: tuple(map(str, kv[0]))):
        group = sorted(group, key=lambda r: r["rec"].case["seqlen_kv"])
        xs = [r["rec"].case["seqlen_kv"] for r in group]
        e = [r["rec"].energy for r in group]
        label = f"{series} d={d}{' causal' if causal else ''}"
        style = dict(color=palette[series], marker="o", markersize=4, linewidth=1.3,
                     linestyle="--" if causal else "-")
        ax_j.plot(xs, [x.get("joules_per_call") for x in e], label=label, **style)
        ax_w.plot(xs, [r["rec"].tflops / x["average_w"] for r, x in zip(group, e)], label=label,
                  **style)
    for ax, ylabel in ((ax_j, "joules per call"), (ax_w, "TFLOP/s per watt")):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(_fmt_len))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("sequence length (keys)")
        ax.set_ylabel(ylabel)
    ax_j.set_yscale("log")
    ax_w.set_yscale("log")
    _legend_below(fig, (ax_j, ax_w))
    return fig


def speedup(table, palette: Mapping[str, str]) -> Figure | None:
    """Horizontal bars from 1x: each backend's speedup over the baseline per case on a logarithmic axis (a
    2x gain and a 2x loss are bars of one length; 76x and 0.5x fit one plot), 95% intervals as error bars;
    bars the statistics cannot call (within the noise, or too few samples) are pale."""
    from kbench.compare import fmt_speedup

    backends = [b for b in table.backends if any(s.speedup for (c, n), s in table.cells.items() if n == b)]
    cases = [c for c in table.cases if any((c, b) in table.cells and table.cells[(c, b)].speedup for b in backends)]
    if not backends or not cases:
        return None
    height = 0.8 / len(backends)
    fig = _new_figure(10, 0.3 * len(cases) * max(1.5, len(backends)) + 1.6)
    ax = fig.subplots()
    from matplotlib.patches import Patch

    values, handles = [], []
    for i, b in enumerate(backends):
        ys, vals, lo, hi, alpha = [], [], [], [], []
        for j, c in enumerate(cases):
            s = table.cells.get((c, b))
            if s is None or s.speedup is None:
                continue
            ys.append(j + (i - (len(backends) - 1) / 2) * height)
            vals.append(s.speedup)
            lo.append(max(s.speedup - (s.ci_low or s.speedup), 0.0))
            hi.append(max((s.ci_high or s.speedup) - s.speedup, 0.0))
            alpha.append(1.0 if s.significant else 0.4)
            values += [s.ci_low or s.speedup, s.ci_high or s.speedup]
        color = palette.get(b, PALETTE[i % len(PALETTE)])
        bars = ax.barh(ys, [v - 1 for v in vals], left=1, height=height * 0.9, color=color)
        handles.append(Patch(color=color, label=f"{b} (geomean {fmt_speedup(table.overall_geomean(b)) or 'n/a'})"))
        for bar, a in zip(bars, alpha):
            bar.set_alpha(a)
        ax.errorbar(vals, ys, xerr=[lo, hi], fmt="none", ecolor="black", elinewidth=0.8, capsize=2)
    ax.set_xscale("log")
    lo_x, hi_x = min(values + [1.0]) / 1.1, max(values + [1.0]) * 1.1
    ax.set_xlim(lo_x, hi_x)
    ticks = _ratio_ticks(lo_x, hi_x)
    ax.set_xticks(ticks)
    ax.set_xticklabels([f"{t:.3g}x" for t in ticks])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.axvline(1, color="black", linewidth=0.8)
    ax.set_yticks(range(len(cases)))
    ax.set_yticklabels([short_case(c) for c in cases], fontsize=7)
    ax.set_ylim(len(cases) - 0.5, -0.5)
    ax.set_xlabel(f"speedup over {table.baseline} (log scale): time of {table.baseline} / time of the backend; "
                  "right of 1x: faster")
    ax.set_title(f"speedup vs {table.baseline} per case (bars: 95% bootstrap CI; pale: not significant)")
    ax.grid(axis="y", visible=False)
    fig.legend(handles=handles, fontsize=8, frameon=False, loc="outside upper center", ncols=min(3, len(backends)))
    return fig


#: ratios worth a tick on a speedup axis (values a reader can read off without arithmetic)
_RATIOS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 0.8, 0.9, 0.95, 1.0, 1.05, 1.1, 1.25, 1.5, 2.0,
           3.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0)


def _ratio_ticks(lo: float, hi: float, most: int = 9) -> list[float]:
    """Ticks of a ratio axis from ``lo`` to ``hi``: 1 and the readable ratios in range, going out from 1 and
    keeping a tick only where it is at least 1/``most`` of the axis' (log) length from the last one kept."""
    span = math.log(hi / lo) / most
    ticks = [1.0] if lo <= 1.0 <= hi else []
    for side in ([r for r in _RATIOS if 1.0 < r <= hi], [r for r in reversed(_RATIOS) if lo <= r < 1.0]):
        last = 1.0
        for r in side:
            if abs(math.log(r / last)) >= span:
                ticks.append(r)
                last = r
    return sorted(ticks)


def roofs_of(hardware: Mapping[str, Any] | None, dtypes: Sequence[str]) -> list[tuple[str, str, float, float | None]]:
    """(kind, dtypes, peak FLOP/s, bandwidth B/s) for every distinct roof; kind datasheet/measured.

    Dtypes with the same figures share one roof ("bf16/fp16"), so identical lines are drawn once.
    """
    hw = hardware or {}
    out: list[tuple[str, str, float, float | None]] = []
    for kind, flops_key, bw_key in (("datasheet", "peak_flops", "bandwidth"),
                                    ("measured", "measured_flops", "measured_bandwidth")):
        peaks = hw.get(flops_key) or {}
        bw = hw.get(bw_key)
        same: dict[float, list[str]] = {}
        for dt in dtypes:
            if peaks.get(dt):
                same.setdefault(float(peaks[dt]), []).append(dt)
        for peak, names in same.items():
            out.append((kind, "/".join(names), peak, float(bw) if bw else None))
        if bw and not any(p for p in (peaks.get(dt) for dt in dtypes)):
            out.append((kind, "", math.nan, float(bw)))  # a bandwidth roof without a compute roof
    return out


def roofline(rows: Sequence[Mapping[str, Any]], hardware: Mapping[str, Any] | None,
             palette: Mapping[str, str]) -> Figure | None:
    """Every measured case as a point (intensity, TFLOP/s) on the hardware's roofs, log-log."""
    rows = [r for r in _passed(rows) if r["rec"].intensity]
    if not rows:
        return None
    fig = _new_figure(9, 5.2)
    ax = fig.subplots()
    dtypes = sorted({r["rec"].dtype.value for r in rows if r["rec"].dtype is not None})
    xs = [r["rec"].intensity for r in rows]
    ys = [r["rec"].tflops for r in rows]
    roofs = roofs_of(hardware, dtypes)
    x_lo, x_hi = min(xs) / 4, max(xs) * 4
    for _, _, peak, bw in roofs:
        if bw and peak == peak:
            x_hi = max(x_hi, peak / bw * 4)
    grid = np.geomspace(x_lo, x_hi, 200)
    top = max(ys)
    for kind, dt, peak, bw in roofs:
        style = "-" if kind == "datasheet" else "--"
        roof = np.full_like(grid, np.inf)
        if peak == peak:
            roof = np.minimum(roof, peak)
        if bw:
            roof = np.minimum(roof, bw * grid)
        label = f"{kind} {dt} roof".replace("  ", " ")
        if peak == peak:
            label += f" ({peak / 1e12:.4g} TFLOP/s"
            label += f", {bw / 1e9:.4g} GB/s)" if bw else ")"
        else:
            label += f" ({bw / 1e9:.4g} GB/s)"
        ax.plot(grid, roof / 1e12, style, color="#444444" if kind == "datasheet" else "#888888", linewidth=1.2,
                label=label)
        top = max(top, float(np.nanmax(roof[np.isfinite(roof)])) / 1e12) if np.isfinite(roof).any() else top
    # points of several series often coincide (one case, backends of like speed): each series its own marker,
    # a larger one drawn first, translucent fill with a solid edge, so a point under another still shows
    all_series = list(dict.fromkeys(r["series"] for r in rows))
    for i, series in enumerate(all_series):
        pts = [r for r in rows if r["series"] == series]
        ax.scatter([r["rec"].intensity for r in pts], [r["rec"].tflops for r in pts], label=series,
                   marker=MARKERS[i % len(MARKERS)], s=max(70 - 12 * i, 16), zorder=3 + i / 100,
                   facecolors=to_rgba(palette[series], 0.35), edgecolors=palette[series],
                   linewidths=1.1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(x_lo, x_hi)
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        axis.set_minor_formatter(NullFormatter())
    ax.set_ylim(min(ys) / 3, top * 2)
    ax.set_xlabel("operational intensity (FLOP / byte of minimum DRAM traffic)")
    ax.set_ylabel("attained TFLOP/s")
    title = (hardware or {}).get("title") or (hardware or {}).get("name") or "no hardware profile"
    ax.set_title(f"roofline: {title}")
    if not any(peak == peak for _, _, peak, _ in roofs):
        what = "no compute peak" + ("" if any(bw for *_, bw in roofs) else " and no bandwidth")
        ax.text(0.02, 0.97, f"{what} for {', '.join(dtypes)} in the hardware profile "
                f"({(hardware or {}).get('name', 'none')}): roofs not drawn.\n"
                "`kbench calibrate` measures them on this machine.", transform=ax.transAxes, va="top",
                fontsize=8, color="#a33", bbox={"facecolor": "#fff6f6", "edgecolor": "#e0b0b0", "boxstyle": "round"})
    _legend_below(fig, (ax,), ncols=2)
    return fig


#: matplotlib 3.10 renamed ``vert=False`` to ``orientation="horizontal"`` (and deprecated the old name)
_HORIZONTAL = ({"orientation": "horizontal"} if tuple(int(x) for x in matplotlib.__version__.split(".")[:2]) >= (3, 10)
               else {"vert": False})


def noise(rows: Sequence[Mapping[str, Any]], palette: Mapping[str, str], limit: int = 60) -> tuple[Figure | None, int]:
    """Samples / median per record as box plots (whiskers 5-95%): how much to trust each number.

    Shows the ``limit`` noisiest records (by IQR / median); returns the figure and how many were left out.
    """
    rows = [r for r in _rows(rows) if r["rec"].passed and len(r["rec"].samples) >= 2]
    if not rows:
        return None, 0
    rows = sorted(rows, key=lambda r: -(r["rec"].spread or 0))
    left_out = max(0, len(rows) - limit)
    rows = rows[:limit]
    data = []
    for r in rows:
        s = np.asarray(r["rec"].samples, dtype=float)
        data.append(100 * (s / np.median(s) - 1))
    fig = _new_figure(10, 0.24 * len(rows) + 1.3)
    ax = fig.subplots()
    box = ax.boxplot(data, whis=(5, 95), showfliers=False, patch_artist=True, widths=0.6,
                     medianprops={"color": "black", "linewidth": 1}, **_HORIZONTAL)
    for patch, r in zip(box["boxes"], rows):
        patch.set_facecolor(palette[r["series"]])
        patch.set_alpha(0.55)
    ax.set_yticks(range(1, len(rows) + 1))
    ax.set_yticklabels([f"{r['series']}  {short_case(r['rec'].case_id)}  "
                        f"(IQR {100 * (r['rec'].spread or 0):.1f}%, n={len(r['rec'].samples)})" for r in rows],
                       fontsize=7)
    ax.invert_yaxis()
    # a few samples many times the median (a descheduled process) would squash every box: clip the axis
    # and write the clipped whisker's value at the edge instead
    highs = [float(np.percentile(d, 95)) for d in data]
    right = min(max(highs), max(25.0, 3 * float(np.percentile([np.percentile(d, 75) for d in data], 90))))
    left = min(-5.0, min(float(np.percentile(d, 5)) for d in data) * 1.1)
    ax.set_xlim(left, right * 1.12)
    for i, hi in enumerate(highs, start=1):
        if hi > right * 1.12:
            ax.annotate(f"95th: +{hi:.0f}%", xy=(1.005, i), xycoords=("axes fraction", "data"), ha="left",
                        va="center", fontsize=6.5, color="#a33", annotation_clip=False)
    ax.axvline(0, color="black", linewidth=0.6)
    ax.set_xlabel("sample time relative to the record's median (%); box: quartiles, whiskers: 5th-95th percentile")
    ax.set_title("noise per record, noisiest first")
    ax.grid(axis="y", visible=False)
    return fig, left_out
