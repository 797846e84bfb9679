"""``kbench plan``: aggregated vs disaggregated serving plans per hardware type, ranked by goodput per device,
per dollar and per joule (model, assumptions and a worked example: docs/plan.md)."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import click

from kbench.tables import FORMATS, render

RANK_BY = ("dollar", "device", "joule")


@click.command("plan")
@click.option("-m", "--model", "model_name", required=True, metavar="NAME",
              help="A built-in model (see `kbench roofline`) or one from --model-file.")
@click.option("--model-file", "model_files", multiple=True, type=click.Path(dir_okay=False),
              help="YAML file of model configurations (format of kbench/data/models.yaml).")
@click.option("--hardware", "hardware", multiple=True, metavar="NAME[,NAME]",
              help="Hardware types to plan over (comma-separated; default: every GPU profile). `cpu`: the machine "
                   "of a --results file, with its calibrated roofs.")
@click.option("--hardware-file", "hardware_files", multiple=True, type=click.Path(dir_okay=False),
              help="YAML file of extra hardware profiles (format of kbench/data/hardware.yaml).")
@click.option("-w", "--workload", "workload_name", required=True, metavar="NAME",
              help="chat, rag, coding-agent, splitwise-coding, splitwise-conversation, or one from --workload-file.")
@click.option("--workload-file", "workload_files", multiple=True, type=click.Path(dir_okay=False),
              help="YAML file of workloads (format of kbench/data/workloads.yaml).")
@click.option("--slo", "slo", metavar="ttft=T,tpot=T", help="Override the workload's SLOs, e.g. ttft=2s,tpot=50ms.")
@click.option("--attainment", type=click.FloatRange(0.01, 1.0), help="Fraction of requests that must meet the SLO "
              "(default: the workload's, usually 0.9).")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True),
              help="Requests per second (default: the workload's).")
@click.option("--results", "results", multiple=True, type=click.Path(dir_okay=False),
              help="Result files of `kbench run`: measured attention and decode rates replace roofline figures "
                   "on the hardware they were measured on. Repeatable.")
@click.option("--price", "prices", multiple=True, metavar="NAME=USD",
              help="Price per device-hour, overriding the profile's list price, e.g. h100-sxm=2.5. Repeatable.")
@click.option("--interconnect", "links", multiple=True, metavar="NAME[,NAME]",
              help="Links for KV transfer between pools (default: every link both hardware types list).")
@click.option("--interconnect-file", "link_files", multiple=True, type=click.Path(dir_okay=False),
              help="YAML file of interconnect profiles (format of kbench/data/interconnects.yaml).")
@click.option("--rank-by", type=click.Choice(RANK_BY), default="dollar", show_default=True,
              help="Goodput per dollar, per device or per joule.")
@click.option("--weights", default="bf16", show_default=True, help="Weight precision: fp32 bf16 fp16 fp8 fp4.")
@click.option("--kv", default="bf16", show_default=True, help="KV-cache precision: fp32 bf16 fp16 fp8 fp4.")
@click.option("--compute-efficiency", type=click.FloatRange(0.01, 1.0), default=0.6, show_default=True,
              help="Assumed fraction of the datasheet matmul peak (where nothing was measured).")
@click.option("--bandwidth-efficiency", type=click.FloatRange(0.01, 1.0), default=0.8, show_default=True,
              help="Assumed fraction of the datasheet memory bandwidth (where nothing was measured).")
@click.option("--link-efficiency", type=click.FloatRange(0.01, 1.0), default=0.8, show_default=True,
              help="Assumed fraction of an interconnect's bandwidth a KV transfer reaches.")
@click.option("--usable", type=click.FloatRange(0.05, 1.0), default=0.9, show_default=True,
              help="Fraction of device memory for weights and KV cache.")
@click.option("--tp", "tp", metavar="N[,N]", help="Tensor-parallel degrees to try per instance (default 1,2,4,8; "
              "1 on CPUs).")
@click.option("--top", type=click.IntRange(min=0), default=12, show_default=True,
              help="Plans to print (0: all).")
@click.option("--plots", "plot_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Write plan-pareto.png (cost vs TTFT and TPOT, Pareto front) into this directory.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True)
@click.pass_obj
def plan_command(pm, model_name, model_files, hardware, hardware_files, workload_name, workload_files, slo,
                 attainment, rate, results, prices, links, link_files, rank_by, weights, kv, compute_efficiency,
                 bandwidth_efficiency, link_efficiency, usable, tp, top, plot_dir, fmt):
    """Serving plans for MODEL under WORKLOAD: every hardware type aggregated (both phases on one pool) and
    every disaggregated pair (prefill pool on X, decode pool on Y, KV cache moved over an interconnect),
    with pool sizes, TTFT/TPOT against the SLO, goodput per device, per dollar and per joule, cost and
    energy per million tokens and the binding wall of each phase. Exit 2 with the closest plans when no
    plan meets the SLO.
    """
    from kbench.errors import BadInput
    from kbench.hardware import load_profiles
    from kbench.plan.inputs import (builtin_interconnects, builtin_workloads, load_interconnects, load_workloads,
                                    parse_prices, parse_slo, with_price)
    from kbench.plan.measured import MeasuredRates, load_rates
    from kbench.plan.model import Assumptions, Planner, best_per_choice
    from kbench.plan.report import (PHASE_HEADERS, input_rows, phase_rows, plan_json, plot_pareto, sensitivity,
                                    table_headers, table_rows)
    from kbench.roofline import builtin_models, check_dtype, load_models, pick, split_names

    known_models = {m.name: m for m in builtin_models()}
    for path in model_files:
        known_models.update({m.name: m for m in load_models(path)})
    model = pick([model_name], known_models, "model", "--model")[0]
    known_wl = {w.name: w for w in builtin_workloads()}
    for path in workload_files:
        known_wl.update({w.name: w for w in load_workloads(path)})
    workload = pick([workload_name], known_wl, "workload", "--workload")[0]
    workload = replace(workload, slo=parse_slo(slo, workload.slo), attainment=attainment or workload.attainment,
                       rate=rate or workload.rate)
    known_links = {i.name: i for i in builtin_interconnects()}
    for path in link_files:
        known_links.update({i.name: i for i in load_interconnects(path)})
    chosen_links = [i.name for i in pick(split_names(links), known_links, "interconnect", "--interconnect")]
    check_dtype(weights, "--weights")
    check_dtype(kv, "--kv")
    degrees = None
    if tp:
        try:
            degrees = sorted({int(x) for x in split_names([tp])})
        except ValueError:
            degrees = [0]
        if not degrees or min(degrees) < 1:
            raise BadInput(f"bad --tp {tp!r}", where="--tp", fix="give positive integers, e.g. --tp 1,2,4,8")

    measured = load_rates(results) if results else MeasuredRates({}, {})
    known_hw = dict(pm.registry.hardware)
    for path in hardware_files:
        known_hw.update({p.name: p for p in load_profiles(path)})
    for name, recorded in measured.profiles.items():
        # a machine without datasheet rates (a CPU) plans with the roofs calibrated on the machine that ran
        base = known_hw.get(name)
        if base is None or not base.peak_flops:
            known_hw[name] = recorded if base is None else replace(
                recorded, price_per_hour=base.price_per_hour, price_source=base.price_source,
                power_watts=base.power_watts, interconnects=base.interconnects)
    for name, price in parse_prices(prices, known_hw).items():
        known_hw[name] = with_price(known_hw[name], price)
    hw_names = split_names(hardware) or [n for n, p in known_hw.items() if p.kind == "gpu" and p.capacity]
    chosen_hw = pick(hw_names, known_hw, "hardware profile", "--hardware")

    assume = Assumptions(compute_efficiency=compute_efficiency, bandwidth_efficiency=bandwidth_efficiency,
                         link_efficiency=link_efficiency, usable_memory=usable, weights=weights, kv=kv)

    def planner_for(a: Assumptions) -> Planner:
        return Planner(model, workload, chosen_hw, known_links, a, measured, links=chosen_links or None,
                       tp_degrees=degrees)

    if not split_names(hardware):   # by default, every GPU profile that has the figures for this precision
        from kbench.plan.model import DeviceModel

        chosen_hw = [hw for hw in chosen_hw if DeviceModel(hw, model, assume).usable]
    planner = planner_for(assume)
    for name, dm in planner.devices.items():
        if not dm.usable:
            raise BadInput(f"hardware {name!r} has no {weights} compute rate, bandwidth or capacity to plan with",
                           where="--hardware",
                           fix="pick a datasheet profile (`kbench list`), or for this machine give --results of a "
                               "`kbench run` after `kbench calibrate`")
    plans = planner.all_plans()
    if not any(p.devices for p in plans):
        reasons = sorted({p.reason for p in plans if p.reason})
        raise BadInput(f"workload {workload.name!r} does not fit any plan of {model.name}: " + "; ".join(reasons[:4]),
                       where="--workload",
                       fix="add hardware with more memory, a larger --tp, --kv fp8, or a workload with shorter "
                           "requests")
    shares = [c.share for c in workload.mix]
    ranked = best_per_choice(plans, rank_by)
    meeting = [p for p in ranked if p.meets]
    shown = (meeting or ranked)[: top or None]
    if fmt == "json":
        click.echo(json.dumps({"model": model.name, "workload": workload.name, "rate": workload.rate,
                               "slo": {"ttft_s": workload.slo.ttft, "tpot_s": workload.slo.tpot,
                                       "attainment": workload.attainment}, "rank_by": rank_by,
                               "assumptions": assume.__dict__, "meets_slo": bool(meeting),
                               "plans": [plan_json(p, shares) for p in shown],
                               "phases": [dict(zip(PHASE_HEADERS, r)) for r in phase_rows(planner)],
                               "inputs": [dict(zip(("hardware", "rate", "origin", "detail"), r))
                                          for r in input_rows(planner)]}, indent=1))
    else:
        mix = ", ".join(f"{c.share:.0%} {c.input:,} in / {c.output:,} out" for c in workload.mix)
        click.echo(f"{model.title} on {workload.title}: {workload.rate:g} req/s ({mix}); SLO TTFT <= "
                   f"{workload.slo.ttft:g} s, TPOT <= {workload.slo.tpot * 1e3:g} ms for {workload.attainment:.0%} "
                   f"of requests; weights {weights}, KV {kv}; ranked by goodput per {rank_by}\n")
        if not meeting:
            click.echo("no plan meets the SLO; the closest plans:\n")
        click.echo(render(table_headers(workload.attainment), table_rows(shown, shares), fmt))
        if fmt in ("table", "markdown"):
            if not meeting:
                for i, p in enumerate(shown, 1):
                    click.echo(f"{i}: {p.reason}")
            else:
                missing = [p for p in ranked if not p.meets]
                if missing:
                    click.echo(f"\n{len(missing)} other choices do not meet the SLO, e.g.:")
                    for p in missing[:3]:
                        click.echo(f"  {p.label}: {p.reason}")
            click.echo("\ngoodput: requests/s meeting the SLO. req/$: per dollar of device-hours; req/MJ: per "
                       "megajoule at every device's TDP. $/Mtok, kWh/Mtok: per million tokens (input + output) of "
                       "requests meeting the SLO. TTFT pNN: mean wait + prefill (+ KV transfer) of the class within which NN% of "
                       "requests fall (the attainment). batch: "
                       "decode batch per instance / the most the KV room allows. wall: the roof binding each phase "
                       "(capacity: the decode batch is limited by memory).")
            click.echo("\nper hardware type and phase (at the smallest tensor-parallel degree holding the weights and "
                       "the largest request; full: the batch the KV room allows; J at TDP):")
            click.echo(render(PHASE_HEADERS, phase_rows(planner), fmt))
            click.echo("\nrates used (measured: a result file; calibrated: `kbench calibrate` roofs; roofline: the "
                       "datasheet times an assumed efficiency):")
            click.echo(render(("hardware", "rate", "from", "value"), input_rows(planner), fmt))
            if meeting:
                click.echo("\nhow much the assumed efficiencies move the answer:")
                for line in sensitivity(planner_for, assume, rank_by):
                    click.echo(f"  {line}")
    if plot_dir is not None:
        plot_dir.mkdir(parents=True, exist_ok=True)
        path = plot_pareto(plans, shares, str(plot_dir / "plan-pareto.png"),
                           title=f"{model.title}, {workload.title}: plans meeting the SLO")
        click.echo(f"\nplot: {path}", err=True)
    if not meeting:
        raise BadInput(f"no plan meets the SLO (TTFT <= {workload.slo.ttft:g} s, TPOT <= {workload.slo.tpot * 1e3:g} "
                       f"ms for {workload.attainment:.0%} of requests); the closest plans are listed above",
                       where="--slo", fix="relax --slo or --attainment, add faster hardware, or lower --rate")
