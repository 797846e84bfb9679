"""kbench plan beside NVIDIA's aiconfigurator (docs/plan.md, "Validation"): its output parsed, the anchor scenario
against its recorded answer (default tier), the whole grid and a live aiconfigurator run (slow; the live run
skips where aiconfigurator is not installed)."""
from __future__ import annotations

import pytest

from kbench.plan.validation import (GRID, HELD_OUT, RECORDED, Row, aiconfigurator_missing, parse_aiconfigurator,
                                    recorded, run_aiconfigurator, run_kbench)

#: the result tables of `aiconfigurator cli default --model-path meta-llama/Meta-Llama-3.1-70B --total-gpus 16
#: --system h200_sxm --isl 8000 --osl 1000 --ttft 2000 --tpot 50 --backend trtllm` (aiconfigurator 0.12.0), as
#: printed, the rows below the second cut
AIC_OUTPUT = """\
agg Top Configurations: (Ranked by tokens/s/gpu)
+------+---------+--------------+---------------+-------+---------+-----------------+-------------+-------------------+----------+--------------+-------------+----------+----+
| Rank | backend | tokens/s/gpu | tokens/s/user | req/s |   TTFT  | request_latency | concurrency | total_gpus (used) | replicas | gpus/replica | gpus/worker | parallel | bs |
+------+---------+--------------+---------------+-------+---------+-----------------+-------------+-------------------+----------+--------------+-------------+----------+----+
|  1   |  trtllm |    222.88    |     29.11     |  3.57 | 1851.02 |     36167.46    | 128 (=32x4) |    16 (16=4x4)    |    4     |      4       |   4 (=4x1)  |  tp4pp1  | 32 |
|  2   |  trtllm |    220.28    |     22.49     |  3.53 | 1368.04 |     45782.67    | 160 (=80x2) |    16 (16=2x8)    |    2     |      8       |   8 (=8x1)  |  tp8pp1  | 80 |
+------+---------+--------------+---------------+-------+---------+-----------------+-------------+-------------------+----------+--------------+-------------+----------+----+

disagg Top Configurations: (Ranked by tokens/s/gpu)
+------+---------+--------------+---------------+-------+---------+-----------------+--------------+-------------------+----------+----------------+------------+----------------+-------------+-------+------------+----------------+-------------+-------+
| Rank | backend | tokens/s/gpu | tokens/s/user | req/s |   TTFT  | request_latency | concurrency  | total_gpus (used) | replicas |  gpus/replica  | (p)workers | (p)gpus/worker | (p)parallel | (p)bs | (d)workers | (d)gpus/worker | (d)parallel | (d)bs |
+------+---------+--------------+---------------+-------+---------+-----------------+--------------+-------------------+----------+----------------+------------+----------------+-------------+-------+------------+----------------+-------------+-------+
|  1   |  trtllm |    222.75    |     40.40     |  3.56 | 1818.23 |     26544.48    | 104 (=52x2)  |    16 (16=2x8)    |    2     |  8 (=2x2+1x4)  |     2      |    2 (=2x1)    |    tp2pp1   |   1   |     1      |    4 (=4x1)    |    tp4pp1   |   52  |
|  2   |  trtllm |    222.75    |     25.14     |  3.56 | 1818.23 |     41562.44    | 176 (=44x4)  |    16 (16=4x4)    |    4     |  4 (=1x2+1x2)  |     1      |    2 (=2x1)    |    tp2pp1   |   1   |     1      |    2 (=2x1)    |    tp2pp1   |   44  |
+------+---------+--------------+---------------+-------+---------+-----------------+--------------+-------------------+----------+----------------+------------+----------------+-------------+-------+------------+----------------+-------------+-------+"""


def test_aiconfigurator_tables_are_parsed():
    found = parse_aiconfigurator("log lines before\n" + AIC_OUTPUT)
    assert found["agg"] == {"tokens_s_gpu": 222.88, "ttft_s": pytest.approx(1.85102), "tpot_s": pytest.approx(1 / 29.11),
                            "req_s": 3.57, "parallel": "tp4pp1", "batch": 32}
    assert found["disagg"]["tokens_s_gpu"] == 222.75 and found["disagg"]["parallel"] == "P 2xtp2pp1 + D 1xtp4pp1"
    assert found["disagg"]["batch"] == 52
    assert parse_aiconfigurator("no tables") == {"agg": None, "disagg": None}
    # the recorded answer of the anchor is this output
    assert recorded("70b-h200-8k")["agg"]["tokens_s_gpu"] == found["agg"]["tokens_s_gpu"]
    assert set(RECORDED) == {s.name for s in GRID + HELD_OUT} and len(GRID) >= 16
    # the grid holds MoE models and B200s; the held-out scenarios are none of the grid's
    assert {"qwen3-30b-a3b", "qwen3-235b-a22b"} <= {s.model for s in GRID} and "b200" in {s.hardware for s in GRID}
    assert not {(s.model, s.hardware, s.isl, s.osl) for s in HELD_OUT} & {(s.model, s.hardware, s.isl, s.osl)
                                                                         for s in GRID}
    # aiconfigurator's MoE spelling (attention data parallel, expert parallel) is read as printed
    moe = recorded("moe-30b-h200-2k")
    assert moe["agg"]["parallel"] == "tp1pp1dp4etp1ep4" and moe["disagg"]["batch"] == 136


def _check(row: Row) -> None:
    assert row.kbench["agg"] and row.kbench["disagg"], row.kbench
    assert row.within, f"{row.scenario.name}: kbench / aiconfigurator = {row.ratio:.2f}"


def test_the_anchor_scenario_is_within_20_percent_of_aiconfigurator():
    """Llama-3.1-70B on 16 H200, 8000/1000 tokens, TTFT 2 s, TPOT 50 ms: aiconfigurator 223 output tokens/s per
    GPU (aggregated TP4, batch 32); kbench plan's answer within 20% of it, aggregated TP4 too."""
    sc = next(s for s in GRID if s.name == "70b-h200-8k")
    row = Row(sc, recorded(sc.name), run_kbench(sc, ["--requests", "2000"]))
    _check(row)
    assert row.kbench["agg"]["parallel"].startswith("tp4pp1")
    # both percentiles of the winning plan within the SLO
    best = row.kbench[row.best("kbench")[0]]
    assert best["ttft_p90_s"] <= 2.0 and best["tpot_p90_s"] <= 0.05


@pytest.mark.nightly
def test_the_grid_meets_the_targets_against_aiconfigurator():
    """Every scenario against aiconfigurator's recorded answer: within 20% in at least 90% of them (17 of 18 today)
    and within 15% in at least 75%; the same verdict where aiconfigurator's margin exceeds 10% but for two
    (docs/plan.md lists the figures and why the plans that differ do)."""
    rows = [Row(sc, recorded(sc.name), run_kbench(sc)) for sc in GRID]
    ratios = [(r.scenario.name, round(r.ratio, 2)) for r in rows]
    assert sum(r.within for r in rows) >= 0.9 * len(rows), ratios
    assert sum(abs(r.ratio - 1) <= 0.15 for r in rows) >= 0.75 * len(rows), ratios
    needed = [r for r in rows if r.verdict_required]
    assert sum(r.same_verdict for r in needed) >= len(needed) - 2, [r.scenario.name for r in needed
                                                                     if not r.same_verdict]


@pytest.mark.nightly
@pytest.mark.skipif(aiconfigurator_missing() is not None, reason=str(aiconfigurator_missing()))
def test_the_grid_against_a_live_aiconfigurator():
    """The grid's recorded answers are still aiconfigurator's (a live run of each scenario, 1-15 minutes each) and
    kbench stays within 20% of the live answers in at least 80% of the scenarios."""
    rows = [Row(sc, run_aiconfigurator(sc), run_kbench(sc)) for sc in GRID]
    for r in rows:
        rec = recorded(r.scenario.name)
        for mode in ("agg", "disagg"):
            if rec[mode] is not None:
                assert r.aic[mode]["tokens_s_gpu"] == pytest.approx(rec[mode]["tokens_s_gpu"], rel=0.02)
    assert sum(r.within for r in rows) >= 0.8 * len(rows), [(r.scenario.name, round(r.ratio, 2)) for r in rows]


@pytest.mark.nightly
@pytest.mark.skipif(aiconfigurator_missing() is not None, reason=str(aiconfigurator_missing()))
def test_aiconfigurator_still_gives_the_recorded_answer():
    """The recorded answers are aiconfigurator's: re-run the anchor scenario (about 40 s, offline)."""
    sc = next(s for s in GRID if s.name == "70b-h200-8k")
    live = run_aiconfigurator(sc)
    for mode in ("agg", "disagg"):
        assert live[mode]["tokens_s_gpu"] == pytest.approx(recorded(sc.name)[mode]["tokens_s_gpu"], rel=0.02)
