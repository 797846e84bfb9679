"""``kbench roofline``: operational intensity and capacity footprint of model configurations (no kernels run)."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import click

from kbench.options import Finite

from kbench.errors import BadInput
from kbench.tables import FORMATS, render

DEFAULT_CONTEXTS = ("8192", "131072", "1000000")

# -- option parsing (kbench plan uses these too) ---------------------------------------------------

_SUFFIX = {"k": 10**3, "m": 10**6, "ki": 2**10, "mi": 2**20}
#: longest context --context accepts (10^12 tokens: far beyond any model, still exact in a float)
MAX_CONTEXT = 10**12


def parse_context(text: str) -> int:
    """``1000000``, ``1_000_000``, ``128k`` (x1000), ``1M`` (x10^6), ``128Ki`` (x1024), ``1Mi`` (x2^20)."""
    raw = text.strip().replace("_", "").replace(",", "")
    low = raw.lower()
    for suffix in ("ki", "mi", "k", "m"):
        if low.endswith(suffix):
            try:
                value = float(low[: -len(suffix)]) * _SUFFIX[suffix]
            except ValueError:
                break
            # 1e400k is inf, and 1e30k is no context length: refuse both instead of overflowing below
            if math.isfinite(value) and 1 <= value <= MAX_CONTEXT and value == int(value):
                return int(value)
            break
    else:
        if raw.isdigit() and len(raw) <= 16 and 1 <= int(raw) <= MAX_CONTEXT:
            return int(raw)
    raise BadInput(f"bad context length {text!r}", where="--context",
                   fix=f"give a positive integer of tokens up to {MAX_CONTEXT:,}, e.g. 1000000, 128k (x1000), "
                       "1M (x10^6), 128Ki (x1024)")


def split_names(values: Iterable[str]) -> list[str]:
    return [v.strip() for value in values for v in value.split(",") if v.strip()]


def pick(names: Sequence[str], known: Mapping[str, Any], what: str, option: str) -> list[Any]:
    out = []
    for name in names:
        key = name.lower()
        if key not in known:
            raise BadInput(f"unknown {what} {name!r}", where=option, fix=f"use one of: {', '.join(sorted(known))}")
        out.append(known[key])
    return out


def check_dtype(value: str, option: str) -> str:
    """A precision of weights or KV cache the analysis knows (kbench.roofline.DTYPE_BYTES)."""
    from kbench.roofline.analysis import DTYPE_BYTES

    if value not in DTYPE_BYTES:
        raise BadInput(f"unknown precision {value!r}", where=option, fix=f"use one of: {', '.join(DTYPE_BYTES)}")
    return value


@click.command("roofline")
@click.option("-m", "--model", "models", multiple=True, metavar="NAME[,NAME]",
              help="Built-in or --model-file models (repeatable, comma-separated; default: every model).")
@click.option("--model-file", "model_files", multiple=True, type=click.Path(dir_okay=False),
              help="YAML file of model configurations (format of kbench/data/models.yaml); repeatable.")
@click.option("-c", "--context", "contexts", multiple=True, metavar="TOKENS[,TOKENS]",
              help="Context lengths: 1000000, 128k (x1000), 1M (x10^6), 128Ki (x1024). Default 8192,131072,1000000.")
@click.option("--hardware", "hardware", multiple=True, metavar="NAME[,NAME]",
              help="Hardware profiles (repeatable, comma-separated; default: every GPU profile; `this`: this machine "
                   "as detected, with its calibrated roofs). See `kbench list`.")
@click.option("--hardware-file", "hardware_files", multiple=True, type=click.Path(dir_okay=False),
              help="YAML file of extra hardware profiles (format of kbench/data/hardware.yaml).")
@click.option("--weights", "weights", default="bf16", show_default=True, help="Weight precision: fp32 bf16 fp16 fp8 fp4.")
@click.option("--kv", "kv", default="bf16", show_default=True, help="KV-cache precision: fp32 bf16 fp16 fp8 fp4.")
@click.option("--usable", type=Finite(0.05, 1.0), default=1.0, show_default=True,
              help="Fraction of device memory available to weights and KV cache.")
@click.option("--plots", "plot_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Write roofline-quadrants.png and footprint-vs-context.png into this directory.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True)
@click.pass_obj
def roofline_command(pm, models, model_files, contexts, hardware, hardware_files, weights, kv, usable, plot_dir, fmt):
    """Prefill/decode intensity, KV-cache and capacity footprint, fits and the binding wall, per
    (model, context, hardware). Nothing is run: the figures come from the model shapes and the
    hardware profiles. Formulas and a worked example: docs/roofline.md.
    """
    from kbench.hardware import load_profiles
    from kbench.report.capacity import plot_footprint, plot_quadrants
    from kbench.roofline import TABLE_HEADERS, analyze_all, builtin_models, load_models, table_rows

    from kbench.outputs import check_output_dir, output_error

    if plot_dir is not None:  # before the analysis: an unwritable directory is refused up front
        check_output_dir(plot_dir, option="--plots")
    known_models = {m.name: m for m in builtin_models()}
    for path in model_files:
        for m in load_models(path):
            known_models[m.name] = m  # a user file may redefine a built-in model
    known_hw = dict(pm.registry.hardware)
    if "this" in [n.lower() for n in split_names(hardware)]:
        from kbench.run.runner import pick_device

        # this machine as detected, with the roofs `kbench calibrate` measured
        known_hw["this"] = pm.detect_hardware(pm.registry.device(pick_device(pm, "auto")))
    for path in hardware_files:
        known_hw.update({p.name: p for p in load_profiles(path)})
    names = split_names(models)
    if not names:
        names = list(known_models) if not model_files else [m.name for p in model_files for m in load_models(p)]
    chosen_models = pick(names, known_models, "model", "--model")
    hw_names = split_names(hardware)
    if not hw_names or hw_names == ["all"]:
        hw_names = [n for n, p in known_hw.items() if p.kind != "cpu" and p.capacity]
    chosen_hw = pick(hw_names, known_hw, "hardware profile", "--hardware")
    for p in chosen_hw:
        if not p.capacity:
            raise BadInput(f"hardware profile {p.name!r} has no memory capacity", where="--hardware",
                           fix="pick a profile with a capacity (see `kbench list`), or add one with --hardware-file")
    ctx = [parse_context(c) for c in split_names(contexts or DEFAULT_CONTEXTS)]
    check_dtype(weights, "--weights")
    check_dtype(kv, "--kv")
    rows = analyze_all(chosen_models, ctx, chosen_hw, weights=weights, kv=kv, usable=usable)

    if fmt == "json":
        click.echo(json.dumps([r.to_json() for r in rows], indent=1))
    else:
        if fmt in ("table", "markdown"):
            click.echo(f"weights {weights}, KV cache {kv}, {usable:.0%} of device memory usable; "
                       "GB = 10^9 bytes; FLOP/B = operational intensity (decode at batch 1)\n")
        click.echo(render(TABLE_HEADERS, table_rows(rows), fmt))
        if fmt in ("table", "markdown"):
            click.echo("\n1 req GB: weights + one request's KV cache. devices/req: devices whose memory holds that. "
                       "reqs/device: requests that fit one device beside the weights. reqs/group: on devices/req "
                       "devices. wall: capacity if one request needs more than one device, else the roof binding a "
                       "decode step at the batch that fits. decode tok/s: roofline bound for that batch on that group.")
            for note in dict.fromkeys(f"note: {r.hardware}: {r.notes}" for r in rows if r.notes):
                click.echo(note)
    if plot_dir is not None:
        from kbench.outputs import check_output_file

        for name in ("roofline-quadrants.png", "footprint-vs-context.png"):
            check_output_file(plot_dir / name, option="--plots")
        target = plot_dir / "roofline-quadrants.png"
        try:
            quad = plot_quadrants(rows, chosen_hw, str(target))
            target = plot_dir / "footprint-vs-context.png"
            foot = plot_footprint(chosen_models, chosen_hw, str(target), kv=kv, max_context=max(2_000_000, max(ctx)))
        except OSError as exc:
            raise output_error(target, exc, option="--plots", kept="the table above is complete") from None
        click.echo(f"\nplots: {quad}, {foot}", err=True)
