"""kbench plan's iteration-level simulation: exact times of isolated requests, a prefill iteration stalling the
decode batch it shares (and not a disaggregated one), the prefill queue against Pollaczek-Khinchine, Little's
law, arrival processes, trace replay, multi-turn conversations with cached context, early stopping."""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from kbench.errors import BadInput
from kbench.plan.inputs import SLO, Arrivals, Interconnect, RequestClass, Workload, load_trace, mix_of_trace
from kbench.plan.model import Assumptions, DeviceModel, Parallel
from kbench.plan.simulate import Pool, SimPlan, Stream, make_stream, simulate
from tests.test_plan import EXACT, TOY, TOY_HW, TOY_LINKS

LOOSE = SLO(1e9, 1e9)


def toy_dm(assume: Assumptions = EXACT) -> DeviceModel:
    return DeviceModel(TOY_HW, TOY, assume, None, TOY_LINKS)


def stream_of(requests: list[tuple[float, int, int]]) -> Stream:
    """A hand-made stream: (arrival second, input, output) per request, single turns, nothing cached."""
    times = [t for t, _, _ in requests]
    gaps = [times[0]] + [b - a for a, b in zip(times, times[1:])]
    n = len(requests)
    return Stream(gaps, [i for _, i, _ in requests], [0] * n, [o for _, _, o in requests], [0.0] * n,
                  list(range(n)), [-1] * n)


def test_a_request_alone_takes_the_model_times_exactly():
    dm = toy_dm()
    # requests 1000 s apart never meet: each TTFT is one prefill, each TPOT the mean of its decode steps
    stream = stream_of([(1000.0 * k, 1000, 101) for k in range(1, 11)])
    res = simulate(SimPlan(Pool(dm, Parallel(1), 1)), stream, 1.0, LOOSE)
    assert res.measured == 8          # the first and the last request are the warm-up and the drain
    assert res.ttft == pytest.approx([dm.prefill(1000, 1).seconds] * 8, rel=1e-12)
    # decode step i reads 1001 + i cached tokens (i = 0..99): the mean step is at 1001 + 49.5 tokens
    assert res.tpot == pytest.approx([dm.decode_step(1, 1050.5, 1).seconds] * 8, rel=1e-12)
    assert res.e2e == pytest.approx(res.ttft + 100 * res.tpot, rel=1e-12)
    assert res.attainment == 1.0 and res.output_tokens == 8 * 101


def test_a_prompt_stalls_the_decode_steps_it_shares_an_iteration_with():
    """Aggregated: a 8000-token prompt arriving while request A decodes lengthens A's decode by exactly the
    prefill's share of the mixed iteration; disaggregated, A does not see it."""
    dm = toy_dm()
    # A (request 0) decodes 200 tokens from t = 0 for about 16 ms; B arrives 5 ms in with 8000 tokens and a
    # single output token (it never joins the decode batch); the later requests only fill the measured window
    alone = stream_of([(0.0, 1000, 201), (10.0, 1000, 2), (20.0, 1000, 2)])
    joined = stream_of([(0.0, 1000, 201), (0.005, 8000, 1), (10.0, 1000, 2), (20.0, 1000, 2)])
    agg = SimPlan(Pool(dm, Parallel(1), 1))

    def decode_of_a(res) -> float:
        i = res.index.index(0)
        return res.e2e[i] - res.ttft[i]
    base = simulate(agg, alone, 1.0, LOOSE)
    hit = simulate(agg, joined, 1.0, LOOSE)
    a_base, a_hit = decode_of_a(base), decode_of_a(hit)
    lane_gemm = max(2 * dm.params.matmul * 8001 / 100e12, (dm.weight_bytes + 8000 * dm.kv_per_token) / 1e12)
    step_gemm = max(2 * dm.params.matmul / 100e12, dm.weight_bytes / 1e12)
    attn = dm.prefill_attention(8000 * 8001 / 2, 8000, 1)
    assert a_hit - a_base == pytest.approx(lane_gemm + attn - step_gemm, rel=1e-9)
    assert a_hit - a_base > 0.5 * dm.prefill(8000, 1).seconds
    # disaggregated (one prefill and one decode lane): A's decode does not change
    link = TOY_LINKS["toy-link"]
    dis = SimPlan(Pool(dm, Parallel(1), 1), Pool(dm, Parallel(1), 1), link.bandwidth, link.latency)
    d_base, d_hit = simulate(dis, alone, 1.0, LOOSE), simulate(dis, joined, 1.0, LOOSE)
    assert decode_of_a(d_hit) == pytest.approx(decode_of_a(d_base), rel=1e-12)
    # and its TTFT includes the KV transfer of 1000 tokens over the link
    assert d_base.ttft[0] == pytest.approx(dm.prefill(1000, 1).seconds + 1000 * dm.kv_per_token / link.bandwidth
                                           + link.latency, rel=1e-9)


def test_prefill_queue_matches_pollaczek_khinchine():
    """Prompts of exactly one iteration's budget, Poisson arrivals at 60% load: the mean TTFT of an M/D/1 queue,
    S + rho S / (2 (1 - rho))."""
    dm = toy_dm()
    wl = Workload("q", "q", 1.0, (RequestClass(1.0, 8192, 2),), LOOSE, 0.9)
    stream = make_stream(wl, 20_000, seed=3)
    fast = Interconnect("instant", "instant", "network", 1e18, 0.0)
    plan = SimPlan(Pool(dm, Parallel(1), 1), Pool(dm, Parallel(1), 1), fast.bandwidth, fast.latency, chunk=8192,
                   only="prefill")
    s = dm.prefill(8192, 1).seconds
    rho = 0.6
    res = simulate(plan, stream, rho / s, LOOSE)
    assert float(np.mean(res.ttft)) == pytest.approx(s + rho * s / (2 * (1 - rho)), rel=0.04)
    assert res.utilization["prefill"] == pytest.approx(rho, rel=0.03)


def test_decode_batch_follows_littles_law_and_tpot_the_step_at_that_batch():
    dm = toy_dm()
    wl = Workload("d", "d", 1.0, (RequestClass(1.0, 1000, 100),), LOOSE, 0.9)
    stream = make_stream(wl, 4000, seed=1)
    plan = SimPlan(Pool(dm, Parallel(1), 1), only="decode")
    rate = 1000.0            # about 47 requests decoding at once, well under the scheduler's 512
    res = simulate(plan, stream, rate, LOOSE)
    assert 20 < res.mean_batch < 100
    # every request decodes 99 steps; the time-averaged batch is rate x time in decode (Little's law)
    tpot = float(np.mean(res.tpot))
    assert res.mean_batch == pytest.approx(rate * 99 * tpot, rel=0.03)
    # and a step at that batch (mean context 1001 + 49) takes about the mean TPOT (the batch varies around it)
    assert dm.decode_step(round(res.mean_batch), 1050, 1).seconds == pytest.approx(tpot, rel=0.05)


def test_overload_stops_early_below_the_target():
    dm = toy_dm()
    wl = Workload("o", "o", 1.0, (RequestClass(1.0, 8000, 50),), SLO(0.05, 1.0), 0.9)
    stream = make_stream(wl, 3000, seed=0)
    plan = SimPlan(Pool(dm, Parallel(1), 1))
    capacity = 1 / dm.prefill(8000, 1).seconds
    res = simulate(plan, stream, 2 * capacity, wl.slo, target=0.9)
    assert res.stopped and res.attainment < 0.9
    ok = simulate(plan, stream, 0.2 * capacity, wl.slo, target=0.9)
    assert not ok.stopped and ok.attainment >= 0.9


def test_gamma_arrivals_have_the_coefficient_of_variation_asked_for():
    wl = Workload("g", "g", 1.0, (RequestClass(0.5, 100, 10), RequestClass(0.5, 200, 20)), LOOSE, 0.9,
                  arrivals=Arrivals("gamma", cv=2.0))
    s = make_stream(wl, 40_000, seed=5)
    gaps = np.array(s.gaps)
    assert gaps.mean() == pytest.approx(1.0, rel=0.05) and gaps.std() / gaps.mean() == pytest.approx(2.0, rel=0.05)
    assert np.mean(np.array(s.input) == 100) == pytest.approx(0.5, abs=0.01)
    poisson = np.array(make_stream(Workload("p", "p", 1.0, wl.mix, LOOSE, 0.9), 40_000, seed=5).gaps)
    assert poisson.std() / poisson.mean() == pytest.approx(1.0, rel=0.05)
    # the same mean rate, so the same offered load; the bursts cost tail latency
    dm = toy_dm()
    plan = SimPlan(Pool(dm, Parallel(1), 1))
    rate = 0.5 / dm.prefill(200, 1).seconds
    burst = simulate(plan, make_stream(wl, 4000, 1), rate, LOOSE)
    calm = simulate(plan, make_stream(Workload("p", "p", 1.0, wl.mix, LOOSE, 0.9), 4000, 1), rate, LOOSE)
    assert burst.percentile("ttft", 99) > 1.5 * calm.percentile("ttft", 99)


def test_trace_replay_reads_the_azure_columns(tmp_path):
    path = tmp_path / "azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2023-11-16 18:15:46.6805900,374,44\n"
                    "2023-11-16 18:15:50.9951690,396,109\n"
                    "2023-11-16 18:15:47.1005900,879,1\n"
                    "2023-11-16 18:15:48.1005900,91,20\n")
    tr = load_trace(str(path))
    assert tr.input == (374, 879, 91, 396) and tr.output == (44, 1, 20, 109)   # sorted by arrival
    assert tr.arrival == pytest.approx((0.0, 0.42, 1.42, 4.314579), abs=1e-6)
    assert tr.rate == pytest.approx(3 / 4.314579)
    wl = Workload("t", "t", tr.rate, mix_of_trace(tr, 2), LOOSE, 0.9, arrivals=Arrivals("trace", trace=tr))
    assert [(c.share, c.input, c.output) for c in wl.mix] == [(0.5, 232, 32), (0.5, 638, 55)]
    s = make_stream(wl, 10)
    assert s.input == [374, 879, 91, 396] and s.output == [44, 1, 20, 109]
    # replayed at the trace's own rate, requests arrive at the recorded times; at twice the rate, twice as fast
    assert np.cumsum(s.gaps) * s.unit_rate / tr.rate == pytest.approx(tr.arrival)
    jl = tmp_path / "t.jsonl"
    jl.write_text('{"arrival": 0.5, "input": 10, "output": 2}\n{"arrival": 0.0, "input": 20, "output": 3}\n')
    assert load_trace(str(jl)).input == (20, 10)


@pytest.mark.parametrize("text,needle", [
    ("time,input\n1,2\n", "no column for output"),
    ("arrival,input,output\n0,10,5\n1,ten,5\n", "line 3"),
    ("arrival,input,output\n0,10,5\n1,0,5\n", "token counts must be positive"),
    ("arrival,input,output\n0,10,5\n", "holds 1 requests"),
])
def test_bad_trace_names_file_and_line(tmp_path, text, needle):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(BadInput) as err:
        load_trace(str(path))
    assert needle in str(err.value) or needle in (err.value.where or "")
    assert str(path) in str(err.value) or err.value.file == str(path)


def test_multi_turn_conversations_reuse_the_cached_context():
    wl = Workload("m", "m", 1.0, (RequestClass(1.0, 1000, 100),), LOOSE, 0.9, prefix_cache=0.5, turns=3,
                  turn_input=200, think_time=0.0)
    # turn 0: 1000 tokens, 500 of them cached (shared); turn 1: 1100 earlier + 200 new; turn 2: 1400 + 200
    assert [(c.input, c.cached) for c in wl.served()] == [(1000, 500), (1300, 1100), (1600, 1400)]
    s = make_stream(wl, 30, seed=0)
    assert s.input[:3] == [1000, 1300, 1600] and s.cached[:3] == [500, 1100, 1400]
    assert s.next_turn[:3] == [1, 2, -1] and s.first_of[:3] == [0, 0, 0]
    # conversations start at a third of the request rate: 10 of them for 30 requests
    assert len(s.gaps) == 10
    dm = toy_dm()
    # conversations far apart: a later turn's TTFT is the prefill of its 200 new tokens after 1100 cached
    sparse = simulate(SimPlan(Pool(dm, Parallel(1), 1)), s, 1e-4, LOOSE)
    by_turn = {r % 3: t for r, t in zip(sparse.index, sparse.ttft)}
    # (rel 1e-6: the clock is at 10^5 s, where a double resolves 1e-11 s)
    assert by_turn[0] == pytest.approx(dm.prefill(1000, 1, cached=500).seconds, rel=1e-6)
    assert by_turn[1] == pytest.approx(dm.prefill(1300, 1, cached=1100).seconds, rel=1e-6)
    assert by_turn[1] < 0.5 * dm.prefill(1300, 1).seconds


def test_pipeline_lanes_share_the_instance_and_tensor_parallel_steps_pay_the_all_reduces():
    dm = toy_dm()
    wl = Workload("p", "p", 1.0, (RequestClass(1.0, 1000, 11),), LOOSE, 0.9)
    stream = stream_of([(1000.0 * k, 1000, 11) for k in range(1, 6)])
    res = simulate(SimPlan(Pool(dm, Parallel(4, 2), 1)), stream, 1.0, LOOSE)
    assert res.measured == 4
    assert res.ttft == pytest.approx([dm.prefill(1000, 4, pp=2).seconds] * 4, rel=1e-9)
    assert res.tpot == pytest.approx([dm.decode_step(1, 1005.5, 4, pp=2).seconds] * 4, rel=1e-9)
    # an instance of 4 x 2 devices is two lanes sharing the KV room of the eight devices (a request's KV is split
    # over the stages by layer): a lane's batch is sized from half of it, but one request may take more
    assert dm.kv_tokens(Parallel(4, 2)) == math.floor((8 * 100e9 - dm.weight_bytes) / dm.kv_per_token)
    assert dm.lane_tokens(Parallel(4, 2)) == dm.kv_tokens(Parallel(4, 2)) / 2
    small = DeviceModel(replace(TOY_HW, capacity=1e9), TOY, EXACT, None, TOY_LINKS)
    room = small.kv_tokens(Parallel(1, 2))
    assert room == (2 * 10**9 - 2 * 35_607_552) // 8192 == 235_447
    big = stream_of([(1000.0 * k, 150_000, 3) for k in range(1, 5)])        # more than half the room each
    served = simulate(SimPlan(Pool(small, Parallel(1, 2), 1)), big, 1.0, LOOSE)
    assert served.measured == 3 and np.isfinite(served.e2e).all()
    assert len(make_stream(wl, 5).input) == 5
