"""kbench plan from the screen to simulated plans: the published reasons disaggregation wins (DistServe's
prefill-decode interference under a tight SLO, Splitwise's cheaper decode hardware above a price ratio),
stability, measured power, and the command's simulated output."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

from kbench.cli import cli
from kbench.hardware import builtin_profiles
from kbench.plan.inputs import builtin_interconnects, builtin_workloads, with_price
from kbench.plan.measured import rates_from_results
from kbench.plan.model import Parallel, Planner
from kbench.plan.search import Choice, Search
from kbench.roofline import builtin_models

HW = {p.name: p for p in builtin_profiles()}
MODELS = {m.name: m for m in builtin_models()}
LINKS = {i.name: i for i in builtin_interconnects()}
WORKLOADS = {w.name: w for w in builtin_workloads()}


def invoke(*args):
    return CliRunner().invoke(cli, ["plan", *map(str, args)], catch_exceptions=False)


def test_disaggregation_wins_under_a_tight_slo_at_a_prefill_heavy_mix():
    """DistServe's result: 4,000-token prompts with 200-token answers under TTFT 1 s and TPOT 25 ms. In an
    aggregated instance every prompt stalls the decode steps it shares an iteration with, so the TPOT caps its
    rate; separate pools serve more per device (docs/plan.md, "DistServe")."""
    wl = WORKLOADS["prefill-heavy"]
    planner = Planner(MODELS["llama-3.1-70b"], wl, [HW["h100-sxm"]], LINKS, links=["ib-ndr"], tp_degrees=(4, 8))
    screened = planner.all_plans()
    search = Search(planner, requests=1500, search_requests=800, devices=16)
    [agg] = search.evaluate(("aggregated", "h100-sxm", "h100-sxm", None), screened, "device", keep=1)
    [dis] = search.evaluate(("disaggregated", "h100-sxm", "h100-sxm", "ib-ndr"), screened, "device", keep=1)
    assert agg.meets and dis.meets
    assert dis.output_per_device > 1.2 * agg.output_per_device
    # what limits the aggregated plan is the TPOT (the stalls), not the TTFT
    assert agg.sim.tpot_met < agg.sim.ttft_met
    assert agg.sim.percentile("tpot", 90) > 0.8 * wl.slo.tpot and dis.sim.percentile("tpot", 90) <= wl.slo.tpot


@pytest.mark.parametrize("h100_price,heterogeneous_wins", [(2.99, False), (6.0, True)])
def test_decode_on_cheaper_hardware_wins_on_cost_above_a_price_ratio(h100_price, heterogeneous_wins):
    """Splitwise's heterogeneous design (prompts on H100, tokens on A100), simulated: at the list price ratio
    (1.67) decoding on A100 costs more per request than on H100; at a ratio of 3.35 less (docs/plan.md)."""
    wl = replace(WORKLOADS["splitwise-conversation"], rate=100.0)
    h100 = with_price(HW["h100-sxm"], h100_price)
    planner = Planner(MODELS["llama-3.1-70b"], wl, [h100, HW["a100-80gb-sxm"]], LINKS, links=["ib-ndr"],
                      tp_degrees=(2, 4))
    screened = planner.all_plans()
    search = Search(planner, requests=1500, search_requests=800)
    plans = []
    for key in (("disaggregated", "h100-sxm", "h100-sxm", "ib-ndr"),
                ("disaggregated", "h100-sxm", "a100-80gb-sxm", "ib-ndr")):
        plans += search.evaluate(key, screened, "dollar", keep=1)
    assert all(p.meets for p in plans) and len(plans) == 2
    hetero = next(p for p in plans if p.decode_hw == "a100-80gb-sxm")
    same = next(p for p in plans if p.mode == "disaggregated" and p.decode_hw == "h100-sxm")
    assert (hetero.per_dollar > same.per_dollar) == heterogeneous_wins
    # the A100 decode pool needs more devices for the same tokens: its matmuls are 3.2x slower at a full batch
    assert hetero.decode_devices > same.decode_devices


def test_an_overloaded_pool_is_refused_however_short_the_simulation():
    """A decode instance offered more tokens than its full batch makes per second is unstable; a short run
    would hide the growing queue, so the search refuses such rates before simulating."""
    wl = replace(WORKLOADS["splitwise-conversation"], rate=100.0)
    planner = Planner(MODELS["llama-3.1-70b"], wl, [HW["h100-sxm"]], LINKS, links=["ib-ndr"], tp_degrees=(4,))
    search = Search(planner, requests=500, search_requests=500)
    c = Choice("disaggregated", HW["h100-sxm"], Parallel(4), HW["h100-sxm"], Parallel(4), LINKS["ib-ndr"])
    bound, _ = search.fluid(c, "decode")
    dm = planner.devices["h100-sxm"]
    b_max = min(512, int(dm.lane_tokens(Parallel(4)) // planner.slot_tokens))
    assert bound == pytest.approx(b_max / dm.decode_step(b_max, planner.decode_context, 4).seconds / 129, rel=0.01)
    assert not search.stable(c, [8, 1], 1.05 * bound) and search.stable(c, [8, 2], 1.05 * bound)
    assert search.instance_capacity(c, "decode", 2 * bound) < bound


def sustained(op: str, watts: float, idle: float, method: str = "sustained loop") -> dict:
    case = {"batch": 1, "seqlen_q": 1 if op == "decode_attention" else 8192, "seqlen_kv": 8192, "heads_q": 64,
            "heads_kv": 8, "head_dim": 128, "causal": True, "dtype": "bf16"}
    return {"backend": "b", "op": op, "case_id": f"{op}[x]", "case": case, "status": "passed",
            "metrics": {"tflops": 400.0} if op == "attention" else {"gbps": 3000.0},
            "telemetry": {"energy": {"method": method, "average_w": watts, "joules_per_call": 0.1, "idle_w": idle,
                                     "calls": 100, "seconds": 5.0}}}


def test_sustained_loop_power_replaces_the_tdp():
    records = [sustained("attention", 600.0, 90.0), sustained("decode_attention", 400.0, 110.0),
               sustained("decode_attention", 999.0, 99.0, method="window average")]   # not a sustained loop
    rates = rates_from_results([("h200.json", {"hardware": {"name": "h200"}, "records": records})])
    power = rates.power["h200"]
    assert (power.prefill_w, power.decode_w, power.idle_w, power.records) == (600.0, 400.0, 100.0, 2)
    wl = replace(WORKLOADS["chat"], rate=4.0)
    planner = Planner(MODELS["llama-3.1-8b"], wl, [HW["h200"]], LINKS, measured=rates, links=["ib-ndr"],
                      tp_degrees=(1,))
    plan = planner.disaggregated(HW["h200"], 1, HW["h200"], 1, LINKS["ib-ndr"])
    assert plan.power_source == "TDP" and plan.power == plan.devices * 700      # the screen has no utilization
    planner.price_and_power(plan, (0.5, 0.25))
    expected = (plan.prefill_devices * (0.5 * 600 + 0.5 * 100) + plan.decode_devices * (0.25 * 400 + 0.75 * 100))
    assert plan.power_source == "measured" and plan.power == pytest.approx(expected)
    # the command says where each device's power comes from
    from kbench.plan.report import input_rows

    rows = {r[1]: r for r in input_rows(planner)}
    assert rows["power per device"][2] == "measured" and "sustained loop" in rows["power per device"][3]


def test_simulated_plans_in_json_and_both_plots(tmp_path):
    res = invoke("-m", "llama-3.1-8b", "--hardware", "h100-sxm", "--isl", "2000", "--osl", "200", "--rate", "20",
                 "--slo", "ttft=1s,tpot=30ms", "--interconnect", "ib-ndr", "--tp", "1,2", "--simulate", "2",
                 "--requests", "1000", "--format", "json", "--plots", tmp_path)
    assert res.exit_code == 0, res.output
    data = json.loads(res.output[: res.output.rindex("}") + 1])
    assert data["sizing"] == "rate" and data["simulations"] > 4 and data["meets_slo"]
    for p in data["plans"]:
        sim = p["simulation"]
        assert p["simulated"] and sim["requests"] == 1000 and sim["measured"] == 800
        assert sim["ttft_p50_s"] <= sim["ttft_p90_s"] <= sim["ttft_p99_s"]
        assert sim["tpot_p90_s"] <= 0.03 or not p["meets_slo"]
        assert p["rate_req_s"] == 20 and p["output_tokens_per_s_per_device"] == pytest.approx(20 * 200 / p["devices"])
    assert {p["mode"] for p in data["plans"]} == {"aggregated", "disaggregated"}
    assert data["screen"] and not data["screen"][0]["simulated"]
    assert (tmp_path / "plan-pareto.png").stat().st_size > 10_000
    assert (tmp_path / "plan-latency.png").stat().st_size > 10_000


def test_a_fixed_cluster_reports_the_most_it_serves():
    res = invoke("-m", "llama-3.1-8b", "--hardware", "h100-sxm", "--isl", "2000", "--osl", "200", "--devices", "4",
                 "--slo", "ttft=1s,tpot=30ms", "--interconnect", "ib-ndr", "--tp", "1,2", "--simulate", "2",
                 "--requests", "1000", "--rank-by", "output")
    assert res.exit_code == 0, res.output
    assert "the most 4 devices serve" in res.output and "TTFT p50/p90/p99" in res.output
    rows = [line for line in res.output.splitlines() if line[:2].strip().isdigit()]
    devices = [int(r.split()[r.split().index("devices)") + 1]) if "devices)" in r else None for r in rows]
    assert rows and all(d is None or d <= 4 for d in devices)


@pytest.mark.parametrize("args,needle", [
    (("--isl", "100"), "--isl and --osl go together"),
    (("--isl", "100", "--osl", "10", "-w", "chat"), "both name a workload"),
    (("-w", "chat", "--arrivals", "weibull"), "bad --arrivals"),
    (("-w", "chat", "--arrivals", "gamma:-1"), "bad --arrivals"),
    (("-w", "chat", "--arrivals", "trace:/nonexistent.csv"), "not found"),
    (("-w", "chat", "--devices", "8", "--simulate", "0"), "--devices needs the simulation"),
    (("-w", "chat", "--pp", "0"), "bad --pp"),
    ((), "no workload"),
])
def test_bad_simulation_input_exits_2(args, needle):
    res = invoke("-m", "llama-3.1-8b", "--hardware", "h100-sxm", *args)
    assert res.exit_code == 2, res.output
    assert needle in res.output and "Traceback" not in res.output
