"""``kbench plan``: aggregated vs disaggregated serving plans per hardware type, screened by a mean-value model
and decided by an iteration-level simulation (tail latencies, SLO attainment), ranked by goodput per device,
per dollar, per joule or output tokens per device (model, assumptions, validation: docs/plan.md)."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import click

from kbench.options import Finite

from kbench.tables import FORMATS, render

RANK_BY = ("dollar", "device", "joule", "output")


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
@click.option("-w", "--workload", "workload_name", metavar="NAME",
              help="chat, rag, coding-agent, coding-agent-session, chat-multiturn, splitwise-coding, "
                   "splitwise-conversation, or one from --workload-file (or give --isl/--osl, or --arrivals trace:).")
@click.option("--workload-file", "workload_files", multiple=True, type=click.Path(dir_okay=False),
              help="YAML file of workloads (format of kbench/data/workloads.yaml).")
@click.option("--isl", type=click.IntRange(min=1, max=10**8), help="Input tokens per request: a one-class workload (with --osl).")
@click.option("--osl", type=click.IntRange(min=1, max=10**8), help="Output tokens per request (with --isl).")
@click.option("--slo", "slo", metavar="ttft=T,tpot=T", help="Override the workload's SLOs, e.g. ttft=2s,tpot=50ms.")
@click.option("--attainment", type=Finite(0.01, 1.0), help="Fraction of requests that must meet the SLO "
              "(default: the workload's, usually 0.9).")
@click.option("--rate", type=Finite(min=0, min_open=True),
              help="Requests per second (default: the workload's; a trace's own rate).")
@click.option("--arrivals", metavar="poisson|gamma:CV|trace:PATH",
              help="Arrival process: Poisson, Gamma gaps with coefficient of variation CV, or a replayed trace "
                   "(CSV/JSON lines of arrival, input, output).")
@click.option("--prefix-cache", type=Finite(0.0, 0.999), help="Fraction of each prompt found in the "
              "prefix cache (shared context), overriding the workload's.")
@click.option("--turns", type=click.IntRange(1, 1000), help="Requests per conversation; later turns carry the "
              "earlier ones as cached context.")
@click.option("--think-time", metavar="DURATION", help="Mean time between a turn's answer and the next turn.")
@click.option("--results", "results", multiple=True, type=click.Path(dir_okay=False),
              help="Result files of `kbench run`: measured attention and decode rates (and sustained-loop power) "
                   "replace roofline figures on the hardware they were measured on. Repeatable.")
@click.option("--price", "prices", multiple=True, metavar="NAME=USD",
              help="Price per device-hour, overriding the profile's list price, e.g. h100-sxm=2.5. Repeatable.")
@click.option("--interconnect", "links", multiple=True, metavar="NAME[,NAME]",
              help="Links for KV transfer between pools (default: every link both hardware types list).")
@click.option("--interconnect-file", "link_files", multiple=True, type=click.Path(dir_okay=False),
              help="YAML file of interconnect profiles (format of kbench/data/interconnects.yaml).")
@click.option("--rank-by", type=click.Choice(RANK_BY), default="dollar", show_default=True,
              help="Goodput per dollar, per device or per joule, or output tokens per second per device.")
@click.option("--devices", type=click.IntRange(min=1, max=10**6), help="A fixed cluster of N devices: find the highest rate "
              "each plan serves within the SLO on at most N devices (instead of pools sized for --rate).")
@click.option("--weights", default="bf16", show_default=True, help="Weight precision: fp32 bf16 fp16 fp8 fp4.")
@click.option("--kv", default="bf16", show_default=True, help="KV-cache precision: fp32 bf16 fp16 fp8 fp4.")
@click.option("--compute-efficiency", type=Finite(0.01, 1.0), default=0.8, show_default=True,
              help="Assumed fraction of the datasheet matmul peak a large GEMM reaches (where nothing was measured; "
                   "the shaped step model lowers it for small GEMMs).")
@click.option("--bandwidth-efficiency", type=Finite(0.01, 1.0), default=0.8, show_default=True,
              help="Assumed fraction of the datasheet memory bandwidth (where nothing was measured).")
@click.option("--link-efficiency", type=Finite(0.01, 1.0), default=0.8, show_default=True,
              help="Assumed fraction of an interconnect's bandwidth a KV transfer or an all-reduce reaches.")
@click.option("--usable", type=Finite(0.05, 1.0), default=0.9, show_default=True,
              help="Fraction of device memory for weights and KV cache.")
@click.option("--tp", "tp", metavar="N[,N]", help="Tensor-parallel degrees to try per instance (default 1,2,4,8; "
              "1 on CPUs).")
@click.option("--pp", "pp", metavar="N[,N]", help="Pipeline-parallel degrees to try (default 1), e.g. 1,2.")
@click.option("--chunk", type=click.IntRange(min=16, max=10**8), default=8192, show_default=True,
              help="Tokens per iteration (decode tokens plus prompt chunks): the scheduler's token budget.")
@click.option("--max-batch", type=click.IntRange(min=1, max=10**6), default=512, show_default=True,
              help="Most requests an instance's scheduler runs at once.")
@click.option("--simulate", "n_sim", type=click.IntRange(min=0, max=10**4), default=4, show_default=True,
              help="Simulate the screen's best N choices (0: the mean-value screen alone).")
@click.option("--requests", type=click.IntRange(min=100, max=200_000), default=4000, show_default=True,
              help="Requests per whole-plan simulation at least (more where 10 request lifetimes need more; the "
                   "search for one instance's rate uses up to 1,500).")
@click.option("--seed", type=click.IntRange(min=0, max=2**63 - 1), default=0, show_default=True, help="Seed of the simulated arrivals and lengths.")
@click.option("--top", type=click.IntRange(min=0, max=10**6), default=12, show_default=True,
              help="Plans to print (0: all).")
@click.option("--plots", "plot_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Write plan-pareto.png (cost vs TTFT and TPOT, Pareto front) and plan-latency.png (simulated "
                   "TTFT and TPOT distributions) into this directory.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True)
@click.option("--step-model", type=click.Choice(("shaped", "roofline")), default="shaped", show_default=True,
              help="shaped: GPU kernel times by shape (a floor per kernel, GEMM and attention efficiency by size, "
                   "all-reduce by message size, MoE by tokens per expert); roofline: the datasheet roofs at the "
                   "assumed efficiencies alone.")
@click.option("--like", type=click.Choice(("aiconfigurator",)), help="Also print the mean-value figure under "
              "aiconfigurator's definitions (fixed concurrency, no queueing) beside kbench's own.")
@click.pass_obj
def plan_command(pm, **o):
    """Serving plans for MODEL under WORKLOAD: every hardware type aggregated (both phases on one pool) and
    every disaggregated pair (prefill pool on X, decode pool on Y, KV cache moved over an interconnect). A
    mean-value screen sizes every choice; the best are simulated iteration by iteration (continuous batching,
    chunked prefill, queueing, KV transfer) and ranked on the simulated P50/P90/P99 TTFT and TPOT and SLO
    attainment, with goodput per device, per dollar and per joule, output tokens per device, cost and energy
    per million tokens. Exit 2 with the closest plans when no plan meets the SLO.
    """
    from kbench.errors import BadInput
    from kbench.plan.model import best_per_choice

    model = _model(o)
    workload = _workload(o)
    planner, planner_for, assume = _planner(pm, o, model, workload)
    plans = planner.all_plans()
    if not any(p.devices for p in plans):
        reasons = sorted({p.reason for p in plans if p.reason})
        raise BadInput(f"workload {workload.name!r} does not fit any plan of {model.name}: " + "; ".join(reasons[:4]),
                       where="--workload",
                       fix="add hardware with more memory, a larger --tp or --pp, --kv fp8, or a workload with "
                           "shorter requests")
    screened = best_per_choice(plans, o["rank_by"])
    ranked, search, sim_note, n_sim = _simulated(o, planner, plans, screened)
    meeting = [p for p in ranked if p.meets]
    shown = (meeting or ranked)[: o["top"] or None]
    like = None
    if o["like"]:
        from kbench.plan.likeaic import like_aiconfigurator

        like = like_aiconfigurator(planner, o["devices"])
    if o["fmt"] == "json":
        _emit_json(o, model, workload, assume, planner, screened, shown, meeting, search, sim_note, like)
    else:
        _emit_text(o, model, workload, assume, planner, planner_for, plans, screened, ranked, shown, meeting,
                   search, sim_note, n_sim, like)
    _plots(o, model, workload, planner, plans, ranked, n_sim)
    if not meeting:
        raise BadInput(f"no plan meets the SLO (TTFT <= {workload.slo.ttft:g} s, TPOT <= {workload.slo.tpot * 1e3:g} "
                       f"ms for {workload.attainment:.0%} of requests); the closest plans are listed above",
                       where="--slo", fix="relax --slo or --attainment, add faster hardware, or lower --rate")


def _model(o):
    from kbench.roofline import builtin_models, load_models, pick

    known_models = {m.name: m for m in builtin_models()}
    for path in o["model_files"]:
        known_models.update({m.name: m for m in load_models(path)})
    return pick([o["model_name"]], known_models, "model", "--model")[0]


def _workload(o):
    """The workload: --isl/--osl (one class), -w NAME, or a trace; then the command line's overrides."""
    from kbench.errors import BadInput
    from kbench.plan.inputs import (SLO, RequestClass, Workload, builtin_workloads, load_workloads, mix_of_trace,
                                    parse_arrivals, parse_duration, parse_slo)
    from kbench.roofline import pick

    arrival = parse_arrivals(o["arrivals"])
    isl, osl, rate = o["isl"], o["osl"], o["rate"]
    if (isl is None) != (osl is None):
        raise BadInput("--isl and --osl go together", where="--isl/--osl", fix="give both, e.g. --isl 8000 --osl 1000")
    if isl is not None:
        if o["workload_name"]:
            raise BadInput("--workload and --isl/--osl both name a workload", where="--workload",
                           fix="give one of them")
        workload = Workload(f"isl{isl}-osl{osl}", f"{isl:,} in / {osl:,} out", rate or 1.0,
                            (RequestClass(1.0, isl, osl),), SLO(2.0, 0.05), 0.9)
    elif o["workload_name"]:
        known_wl = {w.name: w for w in builtin_workloads()}
        for path in o["workload_files"]:
            known_wl.update({w.name: w for w in load_workloads(path)})
        workload = pick([o["workload_name"]], known_wl, "workload", "--workload")[0]
    elif arrival is not None and arrival.trace is not None:
        workload = Workload("trace", f"trace {arrival.trace.path}", arrival.trace.rate, mix_of_trace(arrival.trace),
                            SLO(2.0, 0.05), 0.9, arrivals=arrival)
    else:
        raise BadInput("no workload", where="--workload",
                       fix="give --workload NAME, --isl N --osl N, or --arrivals trace:PATH")
    if arrival is not None:
        workload = replace(workload, arrivals=arrival)
    trace = workload.arrivals.trace
    if trace is not None:
        workload = replace(workload, mix=mix_of_trace(trace), rate=rate or trace.rate)
    think = o["think_time"]
    return replace(workload, slo=parse_slo(o["slo"], workload.slo), attainment=o["attainment"] or workload.attainment,
                   rate=rate or workload.rate,
                   prefix_cache=workload.prefix_cache if o["prefix_cache"] is None else o["prefix_cache"],
                   turns=o["turns"] or workload.turns,
                   think_time=parse_duration(think, "--think-time") if think else workload.think_time)


def _hardware(pm, o, measured):
    """The hardware types to plan over: the registry's and --hardware-file's profiles, a result file's
    calibrated machine where no datasheet has rates, the price overrides."""
    from kbench.hardware import load_profiles
    from kbench.plan.inputs import parse_prices, with_price
    from kbench.roofline import pick, split_names

    known_hw = dict(pm.registry.hardware)
    for path in o["hardware_files"]:
        known_hw.update({p.name: p for p in load_profiles(path)})
    for name, recorded in measured.profiles.items():
        # a machine without datasheet rates (a CPU) plans with the roofs calibrated on the machine that ran
        base = known_hw.get(name)
        if base is None or not base.peak_flops:
            known_hw[name] = recorded if base is None else replace(
                recorded, price_per_hour=base.price_per_hour, price_source=base.price_source,
                power_watts=base.power_watts, interconnects=base.interconnects)
    for name, price in parse_prices(o["prices"], known_hw).items():
        known_hw[name] = with_price(known_hw[name], price)
    hw_names = split_names(o["hardware"]) or [n for n, p in known_hw.items() if p.kind == "gpu" and p.capacity]
    return pick(hw_names, known_hw, "hardware profile", "--hardware")


def _planner(pm, o, model, workload):
    """The planner for the chosen hardware, links and assumptions (and a factory for the sensitivity check)."""
    from kbench.errors import BadInput
    from kbench.plan.inputs import builtin_interconnects, load_interconnects
    from kbench.plan.measured import MeasuredRates, load_rates
    from kbench.plan.model import Assumptions, DeviceModel, Planner
    from kbench.roofline import check_dtype, pick, split_names

    known_links = {i.name: i for i in builtin_interconnects()}
    for path in o["link_files"]:
        known_links.update({i.name: i for i in load_interconnects(path)})
    chosen_links = [i.name for i in pick(split_names(o["links"]), known_links, "interconnect", "--interconnect")]
    check_dtype(o["weights"], "--weights")
    check_dtype(o["kv"], "--kv")
    degrees, pp_degrees = _degrees(o["tp"], "--tp", BadInput), _degrees(o["pp"], "--pp", BadInput)
    if o["devices"] and not o["n_sim"]:
        raise BadInput("--devices needs the simulation", where="--simulate", fix="leave --simulate at 1 or more")
    measured = load_rates(o["results"]) if o["results"] else MeasuredRates({}, {})
    chosen_hw = _hardware(pm, o, measured)
    assume = Assumptions(compute_efficiency=o["compute_efficiency"], bandwidth_efficiency=o["bandwidth_efficiency"],
                         link_efficiency=o["link_efficiency"], usable_memory=o["usable"], weights=o["weights"],
                         kv=o["kv"], chunk=o["chunk"], max_batch=o["max_batch"], step_model=o["step_model"])
    if not split_names(o["hardware"]):   # by default, every GPU profile that has the figures for this precision
        chosen_hw = [hw for hw in chosen_hw if DeviceModel(hw, model, assume).usable]

    def planner_for(a: Assumptions) -> Planner:
        return Planner(model, workload, chosen_hw, known_links, a, measured, links=chosen_links or None,
                       tp_degrees=degrees, pp_degrees=pp_degrees)

    planner = planner_for(assume)
    for name, dm in planner.devices.items():
        if not dm.usable:
            raise BadInput(f"hardware {name!r} has no {o['weights']} compute rate, bandwidth or capacity to plan "
                           "with", where="--hardware",
                           fix="pick a datasheet profile (`kbench list`), or for this machine give --results of a "
                               "`kbench run` after `kbench calibrate`")
    return planner, planner_for, assume


def _simulated(o, planner, plans, screened):
    """The simulated plans, ranked (or the screen's when nothing is simulated), the search, a note, and how
    many choices were simulated."""
    n_sim, rank_by = o["n_sim"], o["rank_by"]
    if n_sim and not any(p.meets for p in screened):
        return screened, None, "not simulated: no plan meets the SLO in the screen (its closest plans are shown)", 0
    if not n_sim:
        return screened, None, "", 0
    from kbench.plan.search import simulate_plans

    simulated, search = simulate_plans(planner, plans, rank_by, top=n_sim, requests=o["requests"],
                                       search_requests=min(o["requests"], 1500), seed=o["seed"],
                                       devices=o["devices"])
    if any(p.meets for p in simulated):
        return sorted(simulated, key=lambda p: _sim_key(p, rank_by)), search, "", n_sim
    return (screened, search, f"the simulation found no plan meeting the SLO among the screen's best {n_sim} "
            "choices (the screen's closest plans are shown)", 0)


def _emit_json(o, model, workload, assume, planner, screened, shown, meeting, search, sim_note, like):
    from kbench.plan.report import PHASE_HEADERS, input_rows, phase_rows, plan_json

    shares, top = planner.shares, o["top"]
    click.echo(json.dumps({"model": model.name, "workload": workload.name, "rate": workload.rate,
                           "slo": {"ttft_s": workload.slo.ttft, "tpot_s": workload.slo.tpot,
                                   "attainment": workload.attainment}, "rank_by": o["rank_by"],
                           "arrivals": workload.arrivals.label, "prefix_cache": workload.prefix_cache,
                           "turns": workload.turns, "devices": o["devices"],
                           "sizing": "devices" if o["devices"] else "rate",
                           "simulations": search.simulations if search else 0, "note": sim_note or None,
                           "warnings": search.warnings if search else [],
                           "device_notes": search.budget_notes if search else [],
                           "assumptions": assume.__dict__, "meets_slo": bool(meeting),
                           "plans": [plan_json(p, shares) for p in shown],
                           "screen": [plan_json(p, shares) for p in screened[: top or None]],
                           "like_aiconfigurator": like,
                           "phases": [dict(zip(PHASE_HEADERS, r)) for r in phase_rows(planner)],
                           "inputs": [dict(zip(("hardware", "rate", "origin", "detail"), r))
                                      for r in input_rows(planner)]}, indent=1))


def _emit_text(o, model, workload, assume, planner, planner_for, plans, screened, ranked, shown, meeting, search,
               sim_note, n_sim, like):
    from kbench.plan.report import table_headers, table_rows

    fmt, shares = o["fmt"], planner.shares
    click.echo(_title(o, model, workload, plans) + "\n")
    if sim_note:
        click.echo(sim_note + "\n")
    if not meeting:
        click.echo("no plan meets the SLO; the closest plans:\n")
    click.echo(render(table_headers(workload.attainment, simulated=bool(n_sim)), table_rows(shown, shares), fmt))
    if fmt not in ("table", "markdown"):
        return
    if not meeting:
        for i, p in enumerate(shown, 1):
            click.echo(f"{i}: {p.reason}")
    else:
        missing = [p for p in ranked if not p.meets]
        if missing:
            click.echo(f"\n{len(missing)} other choices do not meet the SLO, e.g.:")
            for p in missing[:3]:
                click.echo(f"  {p.label}: {p.reason}")
    if n_sim:
        _emit_simulated_notes(o, workload, screened, search, shares)
    else:
        click.echo("\ngoodput: requests/s meeting the SLO. req/$: per dollar of device-hours; req/MJ: per "
                   "megajoule at every device's TDP. $/Mtok, kWh/Mtok: per million tokens (input + output) "
                   "of requests meeting the SLO. TTFT pNN: mean wait + prefill (+ KV transfer) of the class "
                   "within which NN% of requests fall (the attainment). batch: decode batch per lane / the "
                   "most the KV room allows. wall: the roof binding each phase (capacity: the decode batch "
                   "is limited by memory).")
    if like is not None:
        from kbench.plan.likeaic import like_rows

        click.echo("\nunder aiconfigurator's definitions (mean values at a fixed concurrency, no arrival process: TPOT "
                   "the decode step with the batch's prefills spread over it, TTFT the prefill times its queueing "
                   "correction 1.8; docs/plan.md, \"Like for like\"):")
        click.echo(render(("mode", "parallel", "tok/s/gpu", "batch", "TTFT", "TPOT", "devices"), like_rows(like),
                          fmt))
    _emit_inputs(o, assume, planner, planner_for, screened)


def _title(o, model, workload, plans=()) -> str:
    mix = ", ".join(f"{c.share:.0%} {c.input:,} in / {c.output:,} out" for c in workload.mix[:6])
    if len(workload.mix) > 6:
        mix += f", ... ({len(workload.mix)} classes)"
    extra = []
    if workload.prefix_cache:
        extra.append(f"{workload.prefix_cache:.0%} of prompts in the prefix cache")
    if workload.turns > 1:
        extra.append(f"conversations of {workload.turns} turns, {workload.think_time:g} s think time")
    sizing = (f"the most {o['devices']} devices serve" if o["devices"] else f"{workload.rate:g} req/s")
    return (f"{model.title} on {workload.title}: {sizing} ({mix}); {workload.arrivals.label}"
            f"{'; ' + '; '.join(extra) if extra else ''}; SLO TTFT <= {workload.slo.ttft:g} s, TPOT <= "
            f"{workload.slo.tpot * 1e3:g} ms for {workload.attainment:.0%} of requests; weights {o['weights']}, "
            f"KV {o['kv']}; step model {o['step_model']}; ranked by {_rank_text(o['rank_by'], plans)}")


def _emit_simulated_notes(o, workload, screened, search, shares):
    from kbench.plan.report import table_headers, table_rows

    click.echo(f"\nsimulated: {search.simulations} simulations (whole plans: at least {o['requests']:,} requests and "
               f"10 request lifetimes, {workload.arrivals.label}, seed {o['seed']}; the first and last 10% of "
               "requests left out). TTFT/TPOT: percentiles of requests (TPOT: each request's mean time per output "
               "token after the first; TTFT includes the KV transfer of disaggregated plans); ITL: percentiles of "
               "every generated token's step time. out tok/s/dev: output tokens per second per device at the rate "
               "served. batch: mean decode batch per lane / the most its KV room holds. kWh/Mtok: per million "
               "tokens of requests meeting the SLO, at TDP (marked) or measured power. SLO met: simulated "
               "attainment.")
    for line in search.warnings:
        click.echo(f"warning: {line}")
    for line in search.budget_notes:
        click.echo(f"devices: {line}")
    click.echo("\nthe mean-value screen's best choices (what the simulation started from):")
    click.echo(render(table_headers(workload.attainment), table_rows(screened[:6], shares), o["fmt"]))


def _emit_inputs(o, assume, planner, planner_for, screened):
    from kbench.plan.report import PHASE_HEADERS, input_rows, phase_rows, sensitivity

    fmt = o["fmt"]
    click.echo("\nper hardware type and phase (at the smallest parallel configuration holding the weights "
               "and the largest request; full: the batch the KV room allows; J at TDP):")
    click.echo(render(PHASE_HEADERS, phase_rows(planner), fmt))
    click.echo("\nrates used (measured: a result file; calibrated: `kbench calibrate` roofs; roofline: the "
               "datasheet times an assumed efficiency):")
    click.echo(render(("hardware", "rate", "from", "value"), input_rows(planner), fmt))
    click.echo(f"\nscheduler: token budget {assume.chunk:,} per iteration, at most {assume.max_batch} "
               "requests per instance, KV room reserved for the whole request at admission")
    if any(p.meets for p in screened) and not o["devices"]:
        click.echo("\nhow much the assumed efficiencies move the screen's answer:")
        for line in sensitivity(planner_for, assume, o["rank_by"]):
            click.echo(f"  {line}")


def _plots(o, model, workload, planner, plans, ranked, n_sim):
    from kbench.plan.report import plot_latency, plot_pareto

    plot_dir = o["plot_dir"]
    if plot_dir is None:
        return
    from kbench.outputs import check_output_dir

    check_output_dir(plot_dir, option="--plots")
    title = f"{model.title}, {workload.title}"
    path = plot_pareto(ranked if n_sim else plans, planner.shares, str(plot_dir / "plan-pareto.png"),
                       title=f"{title}: plans meeting the SLO")
    click.echo(f"\nplot: {path}", err=True)
    if n_sim:
        path = plot_latency(ranked, str(plot_dir / "plan-latency.png"), title=f"{title}: simulated latencies")
        click.echo(f"plot: {path}", err=True)


def _degrees(text: str | None, option: str, error) -> list[int] | None:
    from kbench.roofline import split_names

    if not text:
        return None
    try:
        found = sorted({int(x) for x in split_names([text])})
    except ValueError:
        found = [0]
    if not found or min(found) < 1:
        raise error(f"bad {option} {text!r}", where=option, fix=f"give positive integers, e.g. {option} 1,2,4,8")
    return found


def _rank_name(by: str) -> str:
    return "output tokens per second per device" if by == "output" else f"goodput per {by}"


def _rank_text(by: str, plans) -> str:
    """What the plans are ranked by, said truly: goodput per dollar (or joule) with no price (or power figure) on
    any plan ranks by the tie-break, the fewest devices meeting the SLO."""
    if by in ("dollar", "joule") and plans and all(p.metric(by) is None for p in plans):
        what, fix = (("price", "--price NAME=USD per device-hour") if by == "dollar"
                     else ("power figure", "a power_w in a --hardware-file profile"))
        return (f"the fewest devices meeting the SLO: {_rank_name(by)} was asked, but no hardware here has a {what} "
                f"(every {'$' if by == 'dollar' else 'energy'} column is \"-\"; give {fix})")
    return _rank_name(by)


def _sim_key(p, by: str) -> tuple:
    value = p.metric(by)
    if p.meets:
        return (0, -(value if value is not None else -1.0), p.devices)
    return (1, -p.attainment, p.devices)
