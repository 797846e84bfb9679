"""kbench plan, the mean-value screen and the command: the serving arithmetic by hand (parallelism costs
included), measured-vs-roofline marking, bad inputs and exit codes. The simulation: tests/test_plan_sim.py."""
from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from kbench.cli import cli
from kbench.hardware import HardwareProfile, builtin_profiles
from dataclasses import replace

from kbench.plan.inputs import (SLO, Interconnect, RequestClass, Workload, builtin_interconnects, builtin_workloads,
                                parse_duration, parse_slo)
from kbench.plan.measured import rates_from_results
from kbench.plan.model import Assumptions, Planner, best_per_choice
from kbench.plan.report import pareto
from kbench.roofline import ModelConfig, builtin_models, param_count

ROOT = Path(__file__).resolve().parents[1]
CPU_RESULTS = [ROOT / "results/cpu-amd-epyc-2c/attention-20261129-183310.json",
               ROOT / "results/cpu-amd-epyc-2c/decode-cpu.json"]

# A toy model small enough to count by hand: 2 layers, hidden 1024, 8 heads of 128 (MHA), SwiGLU 4096, vocab 1000.
TOY = ModelConfig(name="toy", title="toy", layers=2, hidden=1024, heads_q=8, heads_kv=8, head_dim=128, ffn=4096,
                  vocab=1000)
# per layer: q,o 2*1024*1024 + k,v 2*1024*1024 = 4,194,304; norms 2,048; FFN 3*1024*4096 = 12,582,912
# total = 2*(4,194,304 + 2,048 + 12,582,912) + final norm 1,024 + embed 1,024,000 + head 1,024,000
TOY_TOTAL = 35_607_552
TOY_MATMUL = TOY_TOTAL - 1_024_000          # the embedding lookup multiplies nothing
TOY_KV_PER_TOKEN = 2 * 2 * 8 * 128 * 2      # K and V, 2 layers, 8 heads, d=128, bf16 = 8,192 B
TOY_PAIR_FLOPS = 2 * 2 * 8 * (128 + 128)    # QK^T and PV per (query, key) pair, 2 layers x 8 heads = 8,192

TOY_HW = HardwareProfile(name="toy-gpu", title="toy GPU", kind="gpu", peak_flops={"bf16": 100e12}, bandwidth=1e12,
                         capacity=100e9, price_per_hour=2.0, power_watts=500.0,
                         interconnects=("toy-nvlink", "toy-link"))
TOY_LINK = Interconnect(name="toy-link", title="toy link", scope="network", bandwidth=10e9, latency=10e-6)
TOY_NVLINK = Interconnect(name="toy-nvlink", title="toy server link", scope="node", bandwidth=100e9, latency=2e-6)
TOY_LINKS = {"toy-link": TOY_LINK, "toy-nvlink": TOY_NVLINK}
EXACT = Assumptions(compute_efficiency=1.0, bandwidth_efficiency=1.0, link_efficiency=1.0, usable_memory=1.0,
                    step_model="roofline")


def toy_planner(rate=1000.0, ttft=0.01, tpot=0.5e-3, assume=EXACT, **kwargs) -> Planner:
    wl = Workload("toy", "toy", rate, (RequestClass(1.0, 1000, 100),), SLO(ttft, tpot), 0.9)
    kwargs.setdefault("tp_degrees", (1,))
    return Planner(TOY, wl, [TOY_HW], TOY_LINKS, assume, **kwargs)


def invoke(*args):
    return CliRunner().invoke(cli, ["plan", *map(str, args)], catch_exceptions=False)


# ---------------------------------------------------------------------------------------------
# Arithmetic by hand
# ---------------------------------------------------------------------------------------------

def test_toy_counts_by_hand():
    pc = param_count(TOY)
    assert pc.total == TOY_TOTAL and pc.matmul == TOY_MATMUL
    dm = toy_planner().devices["toy-gpu"]
    assert dm.kv_per_token == TOY_KV_PER_TOKEN
    assert dm.weight_bytes == 2 * TOY_TOTAL


def test_prefill_time_by_hand():
    dm = toy_planner().devices["toy-gpu"]
    # matmuls: 2 * 34,583,552 * 1000 FLOPs at 100 TFLOP/s = 691.67 us (the weight read, 79 us, is shorter)
    gemm = 2 * TOY_MATMUL * 1000 / 100e12
    # causal attention: 1000 * 1001 / 2 pairs * 8,192 FLOPs at 100 TFLOP/s = 41.0 us
    attn = 1000 * 1001 / 2 * TOY_PAIR_FLOPS / 100e12
    t = dm.prefill(1000, 1)
    assert t.seconds == pytest.approx(gemm + attn, rel=1e-12)
    assert t.seconds == pytest.approx(732.672e-6, rel=1e-6)
    assert t.wall == "compute"
    # four devices split the work and add two all-reduces per layer of 1000 tokens x 1024 x 2 B = 2.048 MB over the
    # server link (100 GB/s, 2 us): two-shot, 3 x 2 us + 2 x 3/4 x 2.048 MB / 100 GB/s = 36.72 us, beats one-shot
    # (2 us + 3 x 20.48 us = 63.44 us); 2 layers x 2 = 4 all-reduces
    assert dm.allreduce(2.048e6, 4) == pytest.approx(36.72e-6, rel=1e-9)
    assert dm.prefill(1000, 4).seconds == pytest.approx(t.seconds / 4 + 4 * 36.72e-6, rel=1e-9)
    # one token (2 KB): one-shot, 2 us + 3 x 2048 B / 100 GB/s = 2.0614 us, beats two-shot's 3 latencies
    assert dm.allreduce(2048, 4) == pytest.approx(2e-6 + 3 * 2048 / 100e9, rel=1e-9)
    # two pipeline stages add one transfer of the activations over the server link (the stages share a server)
    assert dm.prefill(1000, 4, pp=2).seconds == pytest.approx(
        dm.prefill(1000, 4).seconds + 2e-6 + 2.048e6 / 100e9, rel=1e-9)
    # a prompt with 400 of its 1000 tokens in the prefix cache computes 600 tokens, attending to all before them
    cached = dm.prefill(1000, 1, cached=400)
    pairs = 600 * 400 + 600 * 601 / 2
    assert cached.seconds == pytest.approx(2 * TOY_MATMUL * 600 / 100e12 + pairs * TOY_PAIR_FLOPS / 100e12, rel=1e-12)


def test_decode_step_by_hand():
    dm = toy_planner().devices["toy-gpu"]
    # batch 7 at 1,050 cached tokens: weights 71.2 MB read once (71.2 us) + 7 KV caches of 1050 * 8192 B (60.2 us)
    t = dm.decode_step(7, 1050, 1)
    assert t.seconds == pytest.approx(2 * TOY_TOTAL / 1e12 + 7 * 1050 * TOY_KV_PER_TOKEN / 1e12, rel=1e-12)
    assert t.wall == "bandwidth"
    # a batch of 200 makes the matmuls (2 * 34.6M * 200 FLOPs = 138 us) longer than the weight read
    big = dm.decode_step(200, 1050, 1)
    assert big.seconds == pytest.approx(2 * TOY_MATMUL * 200 / 100e12 + 200 * 1050 * TOY_KV_PER_TOKEN / 1e12)


def step(b: int) -> float:
    return max(2 * TOY_MATMUL * b / 100e12, 2 * TOY_TOTAL / 1e12) + b * 1050 * TOY_KV_PER_TOKEN / 1e12


def test_disaggregated_plan_by_hand():
    planner = toy_planner()
    plan = planner.disaggregated(TOY_HW, 1, TOY_HW, 1, TOY_LINK)
    # decode: the largest batch with a step <= 0.5 ms is 49 (49 * 8.6 us + 71.2 us = 492.7 us)
    assert step(49) <= 0.5e-3 < step(50)
    # 1000 req/s x 100 tokens = 100,000 tokens/s; one instance at batch 49 makes 49 / 492.7 us = 99,451/s: 2 instances
    assert plan.decode_instances == math.ceil(1000 * 100 / (49 / step(49))) == 2
    # each makes 50,000 tokens/s: the smallest batch doing so is 7 (b / step(b) >= 50,000 <=> b >= 6.25)
    assert plan.batch == 7 and 6 / step(6) < 50_000 <= 7 / step(7)
    assert plan.tpot == pytest.approx(step(7), rel=1e-12)
    # prefill: one instance is 73% busy (1000/s x 732.672 us); M/G/1 wait = lambda E[S^2] / (2 (1 - rho))
    s = 732.672e-6
    rho = 1000 * s
    wait = 1000 * s * s / (2 * (1 - rho))
    transfer = 1000 * TOY_KV_PER_TOKEN / 10e9 + 10e-6          # 8.192 MB over 10 GB/s + 10 us
    assert plan.prefill_instances == 1
    assert plan.transfer[0] == pytest.approx(transfer, rel=1e-12)
    assert plan.ttft[0] == pytest.approx(wait + s + transfer, rel=1e-6)
    assert plan.ttft[0] == pytest.approx(2.5659e-3, rel=1e-4)
    # 3 devices, $6/h, 1500 W, 1000 good requests/s of 1,100 tokens each
    assert plan.meets and plan.devices == 3 and plan.attainment == 1.0
    assert plan.per_device == pytest.approx(1000 / 3)
    assert plan.per_dollar == pytest.approx(1000 * 3600 / 6.0)
    assert plan.per_megajoule == pytest.approx(1000 / 1500 * 1e6)
    assert plan.dollars_per_mtok == pytest.approx(6.0 / 3600 / 1.1e6 * 1e6)
    assert plan.kwh_per_mtok == pytest.approx(1500 / 1.1e6 * 1e6 / 3.6e6)


def test_aggregated_plan_by_hand():
    planner = toy_planner()
    plan = planner.aggregated(TOY_HW, 1)
    s = 732.672e-6

    def fits(n: int) -> tuple[bool, int, float]:
        busy = 1000 / n * s
        if busy > 0.8:
            return False, 0, 0.0
        best = max(b for b in range(1, 2000) if step(b) / (1 - busy) <= 0.5e-3)
        need = min(b for b in range(1, best + 1) if b * (1 - busy) / step(b) >= 1000 * 100 / n) \
            if best * (1 - busy) / step(best) >= 1000 * 100 / n else 0
        ttft = 1000 / n * s * s / (2 * (1 - busy)) + s
        return bool(need) and ttft <= 0.01, need, step(need) / (1 - busy) if need else 0.0
    n = next(k for k in range(1, 100) if fits(k)[0])
    assert plan.mode == "aggregated" and plan.prefill_instances == n == plan.devices
    assert plan.batch == fits(n)[1]
    assert plan.tpot == pytest.approx(fits(n)[2], rel=1e-12)
    # n = 1: prefills keep the instance 73% busy, so a step may take 0.27 x 0.5 ms: batch <= 7, 14,200 tokens/s
    # < 100,000. n = 2: 37% busy, batch <= 28, 28 x 0.63 / 312 us = 56,900 tokens/s >= 50,000 per instance.
    assert n == 2


def test_capacity_limits_the_batch_and_is_the_decode_wall():
    # 1 GB device: 71.2 MB of weights leave 928.8 MB = 103 slots of 1,100 tokens x 8,192 B
    small = HardwareProfile(name="toy-gpu", title="toy", kind="gpu", peak_flops={"bf16": 100e12}, bandwidth=1e12,
                            capacity=1e9, price_per_hour=2.0, power_watts=500.0, interconnects=("toy-link",))
    wl = Workload("toy", "toy", 5000.0, (RequestClass(1.0, 1000, 100),), SLO(1.0, 5e-3), 0.9)
    planner = Planner(TOY, wl, [small], TOY_LINKS, EXACT, tp_degrees=(1,))
    plan = planner.disaggregated(small, 1, small, 1, TOY_LINK)
    assert plan.max_batch == (10**9 - 2 * TOY_TOTAL) // (1100 * TOY_KV_PER_TOKEN) == 103
    # the 5 ms TPOT would allow a batch of 500 (step(500) = 4.6 ms): memory binds first
    assert step(500) < 5e-3 and plan.decode_wall == "capacity"
    # on 100 GB (11,089 slots) a 2 ms TPOT binds the batch below the scheduler's 512, at the bandwidth roof; with a
    # scheduler cap of 100 requests, the cap binds
    assert 100 < max(b for b in range(1, 600) if step(b) <= 2e-3) < 512
    assert toy_planner(tpot=2e-3).disaggregated(TOY_HW, 1, TOY_HW, 1, TOY_LINK).decode_wall == "bandwidth"
    tight = replace(wl, rate=1000.0, slo=SLO(1.0, 2e-3))
    capped = Planner(TOY, tight, [TOY_HW], TOY_LINKS, replace(EXACT, max_batch=100), tp_degrees=(1,))
    assert capped.disaggregated(TOY_HW, 1, TOY_HW, 1, TOY_LINK).decode_wall == "max batch"


def test_slow_link_moves_ttft_by_the_transfer_time():
    planner = toy_planner(ttft=1.0)    # loose, so that both plans keep one prefill instance
    slow = Interconnect("slow", "slow", "network", 1e9, 1e-3)
    fast = planner.disaggregated(TOY_HW, 1, TOY_HW, 1, TOY_LINK)
    slow_plan = planner.disaggregated(TOY_HW, 1, TOY_HW, 1, slow)
    delta = (1000 * TOY_KV_PER_TOKEN / 1e9 + 1e-3) - (1000 * TOY_KV_PER_TOKEN / 10e9 + 10e-6)
    assert slow_plan.ttft[0] - fast.ttft[0] == pytest.approx(delta, rel=1e-9)


def test_attainment_counts_classes_meeting_the_slo():
    wl = Workload("two", "two", 10.0, (RequestClass(0.7, 1000, 100), RequestClass(0.3, 200_000, 100)),
                  SLO(0.05, 1.0), 0.9)
    planner = Planner(TOY, wl, [TOY_HW], TOY_LINKS, EXACT, tp_degrees=(1,))
    plan = planner.aggregated(TOY_HW, 1)
    # a 200k-token prompt takes > 0.05 s (attention alone: 2e10 pairs x 8,192 FLOPs / 100 TFLOP/s = 1.6 s)
    assert plan.attainment == pytest.approx(0.7) and not plan.meets
    assert "200,000-token prompts" in plan.reason
    assert plan.goodput == 0.0 or plan.goodput == pytest.approx(7.0)


def test_pareto_front_by_hand():
    # (cost, latency): (1, 5) and (2, 2) and (4, 1) trade off; (3, 3) is beaten by (2, 2); (2, 2) twice: both stay
    pts = [(1, 5), (2, 2), (3, 3), (4, 1), (2, 2)]
    assert pareto(pts) == [0, 1, 4, 3]


# ---------------------------------------------------------------------------------------------
# Measured inputs
# ---------------------------------------------------------------------------------------------

def fake_results(records, name="toy-gpu"):
    return [("fake.json", {"hardware": {"name": name, "title": "toy", "kind": "gpu", "peak_flops": {},
                                        "bandwidth": None, "capacity": None}, "records": records})]


def attention_record(seqlen, tflops, backend="b1", status="passed", op="attention", **case):
    base = {"batch": 1, "seqlen_q": seqlen, "seqlen_kv": seqlen, "heads_q": 8, "heads_kv": 8, "head_dim": 128,
            "causal": True, "dtype": "bf16", **case}
    metric = {"tflops": tflops} if op == "attention" else {"gbps": tflops}
    return {"backend": backend, "op": op, "case_id": f"{op}[sk={seqlen}]", "case": base, "status": status,
            "metrics": metric}


def test_measured_rates_interpolate_in_log_seqlen_and_take_the_best_backend():
    rates = rates_from_results(fake_results([
        attention_record(1024, 10.0), attention_record(4096, 30.0),
        attention_record(4096, 40.0, backend="b2"),                     # faster backend at 4096: used
        attention_record(2048, 99.0, status="failed"),                 # a failed record never counts
        attention_record(1024, 5.0, head_dim=64),                       # another shape
    ]))
    planner = toy_planner(measured=rates)
    dm = planner.devices["toy-gpu"]
    r = dm.attention_rate(2048)          # halfway between 1024 and 4096 in log2: (10 + 40) / 2 TFLOP/s
    assert r.origin == "measured" and r.value == pytest.approx(25e12)
    assert "interpolated between seqlen 1,024 (b1) and 4,096 (b2)" in r.detail
    held = dm.attention_rate(100_000)
    assert held.value == pytest.approx(40e12) and "extrapolated" in held.detail
    # decode KV reads were not measured: the roofline figure, marked so
    assert dm.kv_read_rate(1050).origin == "roofline" and "assumed efficiency" in dm.kv_read_rate(1050).detail
    # the measured rate is what the prefill time uses: attention at 25 TFLOP/s instead of 100
    t = dm.prefill(2048, 1)
    assert t.seconds == pytest.approx(2 * TOY_MATMUL * 2048 / 100e12 + 2048 * 2049 / 2 * TOY_PAIR_FLOPS / 25e12)
    plan = planner.aggregated(TOY_HW, 1)
    assert plan.origins == ("measured", "roofline")


def test_measured_decode_rate_replaces_the_kv_read_roof_only_at_the_batch_it_was_measured_at():
    rates = rates_from_results(fake_results([attention_record(1050, 250.0, op="decode_attention", seqlen_q=1),
                                             attention_record(1050, 999.0, op="decode_attention", seqlen_q=4)]))
    dm = toy_planner(measured=rates).devices["toy-gpu"]
    # batch 1 x 8 KV heads on one device: the measured work; the seqlen_q=4 record is not decode
    r = dm.kv_read_rate(1050, dm.work(1, 1))
    assert r.origin == "measured" and r.value == pytest.approx(250e9)
    assert dm.decode_step(1, 1050, 1).seconds == pytest.approx(2 * TOY_TOTAL / 1e12 + 1050 * TOY_KV_PER_TOKEN / 250e9)
    # batch 7 (56 heads x requests) was not measured: the bandwidth roof, and the rates table says why
    r7 = dm.kv_read_rate(1050, dm.work(7, 1))
    assert r7.origin == "roofline" and "measured only up to 8 heads x requests per device, 56 here" in r7.detail
    assert dm.decode_step(7, 1050, 1).seconds == pytest.approx(2 * TOY_TOTAL / 1e12 + 7 * 1050 * TOY_KV_PER_TOKEN / 1e12)
    # measured at batch 1 and 8 (8 and 64 heads x requests): batch 4 (32) interpolates in log(work), halfway in
    # log2 from 8 to 64 is 32 = 2/3 of the way: 250 + 2/3 (400 - 250) = 350 GB/s
    both = rates_from_results(fake_results([attention_record(1050, 250.0, op="decode_attention", seqlen_q=1),
                                            attention_record(1050, 400.0, op="decode_attention", seqlen_q=1, batch=8)]))
    dm2 = toy_planner(measured=both).devices["toy-gpu"]
    r4 = dm2.kv_read_rate(1050, dm2.work(4, 1))
    assert r4.origin == "measured" and r4.value == pytest.approx(350e9)
    assert "interpolated between 8 and 64 heads x requests" in r4.detail
    # two-way tensor parallelism halves the heads per device: batch 8 on TP2 is 32 per device, the same rate
    assert dm2.kv_read_rate(1050, dm2.work(8, 2)).value == pytest.approx(350e9)


def test_rates_of_other_hardware_do_not_apply():
    rates = rates_from_results(fake_results([attention_record(1024, 10.0)], name="other-gpu"))
    assert toy_planner(measured=rates).devices["toy-gpu"].attention_rate(1024).origin == "roofline"


# ---------------------------------------------------------------------------------------------
# Data files
# ---------------------------------------------------------------------------------------------

def test_profiles_name_known_interconnects_and_cite_prices():
    links = {i.name for i in builtin_interconnects()}
    for p in builtin_profiles():
        assert set(p.interconnects) <= links, p.name
        if p.price_per_hour is not None:
            assert "lambda.ai" in p.price_source and "2025" in p.price_source
    names = {i.name for i in builtin_interconnects()}
    assert {"nvlink4", "ib-ndr", "pcie5", "eth-400g"} <= names


def test_workloads_shipped():
    wls = {w.name: w for w in builtin_workloads()}
    assert {"chat", "rag", "coding-agent"} <= set(wls)
    agent = wls["coding-agent"]
    assert min(c.input for c in agent.mix) == 300_000 and max(c.input for c in agent.mix) == 1_000_000
    for w in wls.values():
        assert sum(c.share for c in w.mix) == pytest.approx(1.0)


@pytest.mark.parametrize("text,seconds", [("2s", 2.0), ("50ms", 0.05), ("0.05", 0.05), ("3min", 180.0)])
def test_parse_duration(text, seconds):
    assert parse_duration(text, "--slo") == pytest.approx(seconds)


def test_parse_slo_keeps_unset_keys():
    assert parse_slo("tpot=20ms", SLO(2.0, 0.05)) == SLO(2.0, 0.02)


# ---------------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------------

def test_must_show_command_and_the_worked_example_in_docs():
    res = invoke("--model", "llama-3.1-70b", "--hardware", "h100-sxm,a100-80gb-sxm", "--workload", "coding-agent",
                 "--simulate", "0", "--step-model", "roofline", "--compute-efficiency", "0.6")
    assert res.exit_code == 0, res.output
    rows = [line for line in res.output.splitlines() if re.match(r"^\d+\s", line)]
    assert any("aggregated h100-sxm TP8" in r for r in rows)
    assert any("P h100-sxm TP8 -> D a100-80gb-sxm TP8 via ib-ndr" in r for r in rows)
    assert "compute | capacity" in res.output and "assumed efficiency 0.6" in res.output
    # docs/plan.md works the first row out by hand; its figures must be the printed ones
    first = rows[0].split()
    doc = (ROOT / "docs/plan.md").read_text()
    assert first[1:4] == ["aggregated", "h100-sxm", "TP8"]
    for figure in ("0.000469", "0.564", "0.67", "4.41", "1.03", "177 s", "26.1 ms"):
        assert figure in rows[0] and figure in doc, figure
    # and the hand calculation's figures are the planner's
    wl = {w.name: w for w in builtin_workloads()}["coding-agent"]
    hw = {p.name: p for p in builtin_profiles()}
    m = {x.name: x for x in builtin_models()}["llama-3.1-70b"]
    planner = Planner(m, wl, [hw["h100-sxm"]], {i.name: i for i in builtin_interconnects()},
                      Assumptions(compute_efficiency=0.6, step_model="roofline"))
    plan = planner.aggregated(hw["h100-sxm"], 8)
    dm = planner.devices["h100-sxm"]
    s = [dm.prefill(c.input, 8).seconds for c in wl.mix]
    # matmuls + attention of the worked example, plus 160 all-reduces of L x 8192 x 2 B over NVLink 4 (two-shot:
    # 7 x 3 us + 2 x 7/8 x S / (450 GB/s x 0.8))
    comm = [160 * (7 * 3e-6 + 1.75 * c.input * 8192 * 2 / 360e9) for c in wl.mix]
    assert comm[0] == pytest.approx(3.8263, abs=1e-4)
    assert s[0] == pytest.approx(33.634 + comm[0], abs=1e-3) and s[1] == pytest.approx(116.967 + comm[1], abs=1e-3)
    mean_s = 0.6 * s[0] + 0.3 * s[1] + 0.1 * s[2]
    busy = 0.05 / 12 * mean_s
    wait = 0.05 / 12 * (0.6 * s[0] ** 2 + 0.3 * s[1] ** 2 + 0.1 * s[2] ** 2) / (2 * (1 - busy))
    assert plan.prefill_instances == 12 and plan.ttft[1] == pytest.approx(wait + s[1], rel=1e-9)
    # the p90 TTFT printed is the 600k class's: 60% + 30% of requests wait at most that long
    assert plan.ttft_quantile([0.6, 0.3, 0.1], 0.9) == plan.ttft[1] == pytest.approx(177.275, abs=1e-3)
    for text in ("37.46", "124.62", "318.13", "52.66", "3.826"):
        assert text in doc, text


def test_cpu_results_mark_measured_numbers():
    res = invoke("--model", "llama-3.1-8b", "--hardware", "cpu", "--workload", "chat", "--kv", "fp32",
                 "--slo", "ttft=20min,tpot=2s", "--rate", "0.001", "--price", "cpu=0.05",
                 *[a for p in CPU_RESULTS for a in ("--results", p)])
    assert res.exit_code == 0, res.output
    assert "measured+calibrated" in res.output
    assert re.search(r"prefill attention at 512 tokens\s+measured", res.output)
    assert re.search(r"decode KV reads at [\d,]+ tokens, batch 1 \(TP1\)\s+measured", res.output)
    assert re.search(r"matmul FLOP/s\s+calibrated", res.output)
    assert "uses no assumed efficiency" in res.output


def test_json_output_and_plot(tmp_path):
    import json

    res = invoke("-m", "llama-3.1-8b", "--hardware", "h100-sxm,a100-80gb-sxm", "-w", "chat", "--format", "json",
                 "--plots", tmp_path, "--top", "0", "--simulate", "0")
    assert res.exit_code == 0, res.output
    data = json.loads(res.output[: res.output.rindex("}") + 1])
    assert data["meets_slo"] and all(p["meets_slo"] for p in data["plans"])
    values = [p["requests_per_dollar"] for p in data["plans"]]
    assert values == sorted(values, reverse=True)
    assert {p["mode"] for p in data["plans"]} == {"aggregated", "disaggregated"}
    assert (tmp_path / "plan-pareto.png").stat().st_size > 10_000


def test_price_override_changes_the_ranking_figure():
    base = invoke("-m", "llama-3.1-8b", "--hardware", "h100-sxm", "-w", "chat", "--format", "json",
                  "--interconnect", "ib-ndr", "--simulate", "0")
    cheap = invoke("-m", "llama-3.1-8b", "--hardware", "h100-sxm", "-w", "chat", "--format", "json",
                   "--interconnect", "ib-ndr", "--price", "h100-sxm=1.495", "--simulate", "0")
    import json

    a, b = json.loads(base.output)["plans"][0], json.loads(cheap.output)["plans"][0]
    assert b["requests_per_dollar"] == pytest.approx(2 * a["requests_per_dollar"])


@pytest.mark.parametrize("args,needle", [
    (("-m", "llama-9", "-w", "chat"), "unknown model 'llama-9'"),
    (("-m", "llama-3.1-8b", "-w", "chit"), "unknown workload 'chit'"),
    (("-m", "llama-3.1-8b", "-w", "chat", "--hardware", "h900"), "unknown hardware profile 'h900'"),
    (("-m", "llama-3.1-8b", "-w", "chat", "--slo", "ttft=-1s"), "bad duration '-1s'"),
    (("-m", "llama-3.1-8b", "-w", "chat", "--slo", "latency=1s"), "bad SLO item"),
    (("-m", "llama-3.1-8b", "-w", "chat", "--price", "h100-sxm=free"), "bad price"),
    (("-m", "llama-3.1-8b", "-w", "chat", "--interconnect", "carrier-pigeon"), "unknown interconnect"),
    (("-m", "llama-3.1-70b", "-w", "coding-agent", "--hardware", "l40s", "--pp", "1"), "does not fit any plan"),
    (("-m", "llama-3.1-8b", "-w", "chat", "--hardware", "h100-sxm", "--slo", "tpot=0.1ms"), "no plan meets the SLO"),
])
def test_bad_input_exits_2_with_a_message(args, needle):
    res = invoke(*args)
    assert res.exit_code == 2, res.output
    assert needle in res.output
    assert "Traceback" not in res.output


def test_no_plan_meets_lists_the_closest():
    res = invoke("-m", "llama-3.1-70b", "--hardware", "a100-80gb-sxm", "-w", "coding-agent")
    assert res.exit_code == 2
    assert "no plan meets the SLO; the closest plans" in res.output
    assert "TTFT" in res.output and "600,000-token prompts" in res.output


def test_bad_workload_file_names_file_and_place(tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text("version: 1\nworkloads:\n  - name: mine\n    rate: 1\n    slo: {ttft: 1, tpot: 0.1}\n"
                    "    mix:\n      - {share: 0.5, input: 10, output: 10}\n")
    res = invoke("-m", "llama-3.1-8b", "-w", "mine", "--workload-file", path)
    assert res.exit_code == 2
    assert str(path) in res.output and "sum to 0.5" in res.output and "line" in res.output


def test_phase_table_by_hand():
    from kbench.plan.report import phase_rows

    planner = toy_planner(assume=replace(EXACT, max_batch=20_000))
    [row] = phase_rows(planner)
    # the toy request fits one device; prefill 733 us; 11,089 requests fit the KV room of 100 GB (the scheduler's
    # cap raised above it)
    assert row[:3] == ["toy-gpu", "TP1", "0.733 ms"]
    assert row[4] == str((100 * 10**9 - 2 * TOY_TOTAL) // (1100 * TOY_KV_PER_TOKEN)) == "11089"
    # prefill energy per token: 500 W x 732.672 us / 1000 tokens; decode: 500 W x step(11,089) / 11,089
    assert float(row[3]) == pytest.approx(500 * 732.672e-6 / 1000, rel=1e-3)
    full = max(2 * TOY_MATMUL * 11089 / 100e12, 2 * TOY_TOTAL / 1e12) + 11089 * 1050 * TOY_KV_PER_TOKEN / 1e12
    assert float(row[8]) == pytest.approx(500 * full / 11089, rel=1e-3)


def test_default_hardware_skips_profiles_without_the_precision():
    # rubin-cpx has only an fp4 rate: named, it is bad input; by default it is left out
    res = invoke("-m", "llama-3.1-8b", "-w", "chat", "--format", "json", "--simulate", "0")
    assert res.exit_code == 0, res.output
    assert "rubin-cpx" not in res.output
    named = invoke("-m", "llama-3.1-8b", "-w", "chat", "--hardware", "rubin-cpx")
    assert named.exit_code == 2 and "no bf16 compute rate" in named.output


def test_splitwise_direction_decode_on_a100_pays_once_h100_costs_more_than_its_bandwidth_ratio():
    """docs/plan.md, comparison with Splitwise (the screen): decode on A100 beats decode on H100 per dollar only
    when the H100/A100 price ratio exceeds about their bandwidth ratio (3.35 / 2.039 = 1.64); prefill belongs on
    the H100."""
    from kbench.plan.inputs import with_price

    hw = {p.name: p for p in builtin_profiles()}
    m = {x.name: x for x in builtin_models()}["llama-3.1-70b"]
    wl = replace({w.name: w for w in builtin_workloads()}["splitwise-conversation"], rate=100.0)
    links = {i.name: i for i in builtin_interconnects()}

    def per_dollar(h100_price: float) -> dict[tuple, float]:
        h100 = with_price(hw["h100-sxm"], h100_price)
        planner = Planner(m, wl, [h100, hw["a100-80gb-sxm"]], links, links=["ib-ndr"])
        return {p.key[:3]: p.per_dollar for p in best_per_choice(planner.all_plans(), "dollar") if p.meets}

    on_h100 = ("disaggregated", "h100-sxm", "h100-sxm")
    on_a100 = ("disaggregated", "h100-sxm", "a100-80gb-sxm")
    list_price = per_dollar(2.99)                          # ratio 1.67: about even, H100 decode ahead
    assert list_price[on_h100] > list_price[on_a100]
    dear = per_dollar(4.5)                                 # ratio 2.5: A100 decode ahead
    assert dear[on_a100] > dear[on_h100]
    # prefill on A100 ranks below prefill on H100 at every price
    for figures in (list_price, dear):
        best_a100_prefill = max(v for k, v in figures.items() if k[:2] == ("disaggregated", "a100-80gb-sxm"))
        assert best_a100_prefill < figures[on_a100]
