"""Plots of the capacity analysis (``kbench roofline --plots``): intensity against footprint, and KV cache
against context length. pyplot (Agg) is imported when a plot is drawn."""
from __future__ import annotations

import math
from typing import Sequence

from kbench.hardware import HardwareProfile
from kbench.roofline.analysis import RooflineRow, kv_bytes_per_token
from kbench.roofline.models import ModelConfig


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_quadrants(rows: Sequence[RooflineRow], hardware: Sequence[HardwareProfile], path: str) -> str:
    """Intensity x capacity footprint: each (model, context) as a prefill and a decode point.

    Horizontal lines: each device's ridge point (above: compute-bound, below: memory-bound). Vertical
    lines: each device's capacity (right of it: one request does not fit, the capacity wall).
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 7))
    seen: dict[tuple, RooflineRow] = {}
    for r in rows:
        seen.setdefault((r.model, r.context), r)
    models = sorted({r.model for r in seen.values()})
    colors = {name: plt.cm.tab10(i % 10) for i, name in enumerate(models)}
    contexts = sorted({r.context for r in seen.values()})
    sizes = {c: 30 + 170 * i / max(1, len(contexts) - 1) for i, c in enumerate(contexts)}
    for r in seen.values():
        x = r.one_request_bytes / 1e9
        ax.scatter([x], [r.prefill_intensity], marker="^", s=sizes[r.context], color=colors[r.model], alpha=0.8)
        ax.scatter([x], [r.decode_intensity], marker="o", s=sizes[r.context], color=colors[r.model], alpha=0.8)
    xs = [r.one_request_bytes / 1e9 for r in seen.values()]
    ys = [v for r in seen.values() for v in (r.prefill_intensity, r.decode_intensity)]
    for i, hw in enumerate(hardware):
        style = dict(color=plt.cm.Dark2(i % 8), linestyle="--", linewidth=1)
        ridge = next((r.ridge for r in rows if r.hardware == hw.name and r.ridge), None)
        # labels staggered by index so that devices with close ridges or capacities stay readable
        if ridge:
            ax.axhline(ridge, **style)
            ax.annotate(f"{hw.name} ridge {ridge:.0f}", (min(xs) * 0.8 * 1.9 ** i, ridge), fontsize=7,
                        va="bottom" if i % 2 == 0 else "top", color=style["color"])
            ys.append(ridge)
        if hw.capacity:
            ax.axvline(hw.capacity / 1e9, **style)
            ax.annotate(f"{hw.name} {hw.capacity / 1e9:.0f} GB", (hw.capacity / 1e9, max(ys) / 6 ** i), fontsize=7,
                        rotation=90, va="top", ha="right" if i % 2 == 0 else "left", color=style["color"])
            xs.append(hw.capacity / 1e9)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(min(xs) / 2, max(xs) * 2)
    ax.set_ylim(min(ys) / 3, max(ys) * 3)
    for (tx, ty, text) in ((0.02, 0.97, "compute-bound, fits"), (0.98, 0.97, "compute-bound, exceeds one device"),
                           (0.02, 0.03, "memory-bound, fits"), (0.98, 0.03, "memory-bound, exceeds one device\n(capacity wall)")):
        ax.text(tx, ty, text, transform=ax.transAxes, ha="left" if tx < 0.5 else "right",
                va="top" if ty > 0.5 else "bottom", fontsize=9, color="0.35", style="italic")
    handles = [plt.Line2D([], [], marker="s", linestyle="", color=colors[n], label=n) for n in models]
    handles += [plt.Line2D([], [], marker="^", linestyle="", color="0.4", label="prefill"),
                plt.Line2D([], [], marker="o", linestyle="", color="0.4", label="decode (batch 1)")]
    handles += [plt.Line2D([], [], marker="o", linestyle="", color="0.6", markersize=math.sqrt(sizes[c]) / 1.5,
                           label=f"context {c:,}") for c in contexts]
    ax.legend(handles=handles, fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.set_xlabel("capacity footprint of one request: weights + KV cache (GB)")
    ax.set_ylabel("operational intensity (FLOP / byte of DRAM traffic)")
    w = rows[0] if rows else None
    ax.set_title("Intensity x capacity footprint" + (f" (weights {w.weights_dtype}, KV {w.kv_dtype})" if w else ""))
    ax.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_footprint(models: Sequence[ModelConfig], hardware: Sequence[HardwareProfile], path: str, *,
                   kv: str = "bf16", max_context: int = 2_000_000) -> str:
    """KV cache per request against context length, MHA vs GQA vs MLA, with device capacities.

    Every GQA model also appears as its MHA counterpart (dashed), to show what sharing KV heads saves.
    """
    import numpy as np

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 6.5))
    ctx = np.logspace(3, math.log10(max_context), 60)
    for i, model in enumerate(models):
        variants = [(model, "-")] + ([(model.as_mha(), "--")] if model.attention == "gqa" else [])
        for m, style in variants:
            per_tok = kv_bytes_per_token(m, kv)
            ax.plot(ctx, ctx * per_tok / 1e9, style, color=plt.cm.tab10(i % 10),
                    label=f"{m.title} [{m.attention.upper()}, {per_tok / 1e3:.1f} KB/token]")
    for j, hw in enumerate(sorted((h for h in hardware if h.capacity), key=lambda h: h.capacity)):
        ax.axhline(hw.capacity / 1e9, color=plt.cm.Dark2(j % 8), linestyle=":", linewidth=1)
        # alternate label sides so that close capacities (128, 141 GB) stay readable
        ax.annotate(f"{hw.name} {hw.capacity / 1e9:.0f} GB", (ctx[-1] if j % 2 else ctx[0], hw.capacity / 1e9),
                    fontsize=7, va="bottom", ha="right" if j % 2 else "left", color=plt.cm.Dark2(j % 8))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel(f"KV cache per request ({kv}, GB)")
    ax.set_title("Capacity footprint vs context: MHA vs GQA vs MLA")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path

