"""Rounds (kbench.run.rounds): a record's samples taken in passes spread over the run, pooled into one record."""
from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from kbench.cli import cli
from kbench.compare import Change, Settings, compare_runs
from kbench.errors import BadInput
from kbench.plugins import get_plugin_manager
from kbench.results import load_result
from kbench.run.rounds import merge_rounds, round_order
from kbench.run.runner import RunInterrupted, RunRequest, plan_run, resume_request, run_suite
from kbench.suite import load_suite, suite_from_data
from kbench.timing import TimingSettings

ROOT = Path(__file__).resolve().parents[1]
SMOKE = str(ROOT / "suites/smoke.yaml")


def test_round_order_puts_every_round_of_a_block_one_pass_after_another():
    order = round_order(5, 3, block=2)
    assert sorted(order) == [(u, k) for u in range(5) for k in (1, 2, 3)]  # every job once
    assert order[:6] == [(0, 1), (1, 1), (0, 2), (1, 2), (0, 3), (1, 3)]
    for u in range(5):  # a record's rounds in order, and a block's records between two of them
        at = [order.index((u, k)) for k in (1, 2, 3)]
        assert at == sorted(at)
        block_len = 2 if u < 4 else 1
        assert all(b - a == block_len for a, b in zip(at, at[1:]))
    assert round_order(4, 1) == [(0, 1), (1, 1), (2, 1), (3, 1)]


def test_one_round_shares_out_the_budget_and_the_pool_meets_the_noise_target():
    whole = TimingSettings(warmup_time=0.3, min_samples=10, max_samples=1000, min_time=0.3, max_time=3.0,
                           target_rel_se=0.01, rounds=3)
    one = whole.per_round()
    assert one.rounds == 1 and one.min_samples == 4 and one.max_samples == 334
    assert math.isclose(one.min_time * 3, 0.3) and math.isclose(one.max_time * 3, 3.0)
    assert math.isclose(one.warmup_time * 3, 0.3)
    # three rounds each at the looser target pool to the asked one: SE shrinks by sqrt(rounds)
    assert math.isclose(one.target_rel_se / math.sqrt(3), 0.01)
    assert TimingSettings(rounds=1).per_round() == TimingSettings()


def _passed(samples, **timing):
    return {"backend": "b", "case_id": "c", "status": "passed", "reason": None, "started": "t",
            "stats": {"median": sorted(samples)[len(samples) // 2]},
            "correctness": {"rel_l2": 1e-7 * len(samples)},
            "timing": {"samples": list(samples), "stop_reason": "noise_target", "warmup_calls": 2, "warmup_time": 0.1,
                       "sampling_time": sum(samples), **timing}}


def test_merged_rounds_pool_the_samples_and_sum_the_accounting():
    acc = lambda walls: {"parent_seconds": walls, "sample_seconds": walls * 0.9, "batches": 2, "calls_per_batch": 4,
                         "phases": {"timed batches": walls}}
    parts = [_passed([1.0, 1.1, 1.2], accounting=acc(4.0)), _passed([2.0, 2.1], accounting=acc(6.0)),
             _passed([1.05, 1.15, 1.0], accounting=acc(5.0))]
    rec = merge_rounds(parts, 3)
    # every round weighs the same: two samples of each (the smallest round's count), each round's first and last
    assert rec["timing"]["samples"] == [1.0, 1.2, 2.0, 2.1, 1.05, 1.0]
    assert rec["stats"]["n"] == 6 and rec["stats"]["median"] == pytest.approx(1.125)
    assert [r["samples"] for r in rec["timing"]["rounds"]] == [3, 2, 3] and rec["timing"]["rounds_planned"] == 3
    assert [r["pooled"] for r in rec["timing"]["rounds"]] == [2, 2, 2]
    assert rec["timing"]["warmup_calls"] == 6
    a = rec["timing"]["accounting"]
    assert a["parent_seconds"] == 15.0 and a["batches"] == 6 and a["explained"] == pytest.approx(0.9)
    assert a["phases"]["timed batches"] == 15.0
    assert rec["correctness"]["rel_l2"] == pytest.approx(3e-7)  # the worst round's trials
    assert rec["correctness"]["rounds_rel_l2"] == pytest.approx([3e-7, 2e-7, 3e-7])


def test_a_slow_noisy_round_that_sampled_longer_does_not_outweigh_the_quiet_ones():
    """A round in a slow moment is noisy, misses the noise target and samples until its time is up: ten times the
    samples of a quiet round (seen in a CI run). Pooled whole it carried the record's median 1.58x; pooled in equal
    shares the median stays within the quiet rounds' and their spread."""
    rng = np.random.default_rng(7)
    slow = list(1.6e-4 * np.exp(rng.normal(0, 0.15, 300)))
    quiet = [list(1.0e-4 * np.exp(rng.normal(0, 0.01, 30))) for _ in range(2)]
    rec = merge_rounds([_passed(slow), _passed(quiet[0]), _passed(quiet[1])], 3)
    whole = float(np.median(slow + quiet[0] + quiet[1]))
    assert whole > 1.4e-4  # what pooling every sample gave
    assert rec["stats"]["median"] < 1.05e-4 and rec["stats"]["n"] == 90
    assert [r["pooled"] for r in rec["timing"]["rounds"]] == [30, 30, 30]
    kept = rec["timing"]["samples"][:30]  # the slow round's share spans the round: its first and last sample kept
    assert kept[0] == slow[0] and kept[-1] == slow[-1] and set(kept) <= set(slow)


def test_a_round_that_did_not_pass_is_the_record():
    ok = _passed([1.0, 1.1])
    bad = {**_passed([3.0]), "status": "failed", "reason": "samples do not add up"}
    assert merge_rounds([bad], 3) is bad  # the first round: as it came
    rec = merge_rounds([ok, bad], 3)
    assert rec["status"] == "failed" and rec["reason"] == "round 2 of 3: samples do not add up"
    assert merge_rounds([ok], 1) is ok


def _planned(tmp_path, rounds, name="r.json", **kw):
    pm = get_plugin_manager()
    req = RunRequest(suite=load_suite(SMOKE), device="cpu", backend_patterns=kw.pop("backends", ["numpy", "numpy-flash"]),
                     keyword=kw.pop("keyword", "d=32 and noncausal"), output=tmp_path / name, isolate=False,
                     rounds=rounds, **kw)
    return pm, plan_run(pm, req)


def test_a_run_in_rounds_measures_each_record_in_passes_and_writes_one_record_each(tmp_path):
    from kbench.run.pool import execute_in_process

    pm, planned = _planned(tmp_path, 3)
    calls = []

    def run(backend, case):
        calls.append((case.id, backend.name))
        return execute_in_process(planned.ctx, backend, case)

    seen = []
    writer = run_suite(pm, planned, executor=run, on_record=lambda rec, i, n: seen.append(i))
    work = [(c.id, b.name) for c, b in planned.work()]
    assert len(work) == 8 and calls == work * 3  # one pass over the block, then the next
    recs = load_result(planned.output)["records"]
    assert [(r["case_id"], r["backend"]) for r in recs] == work and seen == list(range(1, 9))
    suite_timing = planned.plan.timing
    for r in recs:
        assert r["status"] == "passed"
        rounds = r["timing"]["rounds"]
        assert len(rounds) == 3 and sum(x["pooled"] for x in rounds) == len(r["timing"]["samples"]) == r["stats"]["n"]
        assert len({x["pooled"] for x in rounds}) == 1 and all(x["pooled"] <= x["samples"] for x in rounds)
        assert all(x["samples"] >= planned.ctx.timing.min_samples for x in rounds)
        assert r["stats"]["n"] >= suite_timing.min_samples
        assert r["metrics"]["tflops"] == pytest.approx(r["metrics"]["flops"] / r["stats"]["median"] / 1e12)
    assert load_result(planned.output)["selection"]["rounds"] == 3
    assert writer.records and planned.ctx.timing.max_time == pytest.approx(suite_timing.max_time / 3)


def _measured_then_replayed(planned, jobs):
    """Real records of ``planned``'s jobs, kept in ``jobs`` in the order the runner asked for them."""
    from kbench.run.pool import execute_in_process

    def run(backend, case):
        rec = execute_in_process(planned.ctx, backend, case)
        jobs.append(copy.deepcopy(rec))
        return rec

    return run


def _replayed_with_a_slow_moment(jobs, hit, factor):
    """The same real records again, job for job (the same code on the same machine, its noise taken out of the
    comparison), with a slow moment of the machine (every sample ``factor`` longer) over the jobs numbered ``hit``."""
    count = [0]

    def run(backend, case):
        rec = copy.deepcopy(jobs[count[0]])
        count[0] += 1
        assert (rec["case_id"], rec["backend"]) == (case.id, backend.name)
        if count[0] in hit:
            rec["timing"]["samples"] = [s * factor for s in rec["timing"]["samples"]]
            rec["stats"] = {**rec["stats"], "median": rec["stats"]["median"] * factor,
                            "min": rec["stats"]["min"] * factor}
        return rec

    return run


@pytest.mark.parametrize("rounds,flagged", [(1, True), (3, False)])
def test_a_slow_moment_over_one_record_is_a_false_alarm_in_one_round_and_not_in_three(tmp_path, rounds, flagged):
    """The machine slow for the length of one job (60% longer, as seen on the 2-core VM): with the samples all
    taken at once the record moves with it and `kbench compare` calls it slower (a false alarm: same code); in three
    rounds the slow moment meets one round of it and the comparison is quiet. The second run replays the first's
    real records job for job, so the machine's own noise (a CI run under load once made the first run 1.7x slower
    than the second) cannot stand in for the slow moment or hide it."""
    keyword = "d=32 and noncausal and sq=64 and hkv=4"
    jobs: list[dict] = []
    pm, base_plan = _planned(tmp_path, rounds, "base.json", backends=["numpy"], keyword=keyword)
    run_suite(pm, base_plan, executor=_measured_then_replayed(base_plan, jobs))
    assert len(jobs) == rounds
    pm, new_plan = _planned(tmp_path, rounds, "new.json", backends=["numpy"], keyword=keyword)
    run_suite(pm, new_plan, executor=_replayed_with_a_slow_moment(jobs, {1}, 1.6))  # the first job of the run
    pairs = [p for p in compare_runs(load_result(base_plan.output), load_result(new_plan.output), Settings()) if p.test]
    assert len(pairs) == 1
    assert (pairs[0].change is Change.SLOWER) is flagged, (pairs[0].change, pairs[0].test.ratio)
    (rec,) = load_result(new_plan.output)["records"]
    (base,) = load_result(base_plan.output)["records"]
    if flagged:  # the record moved with the slow moment whole
        assert rec["stats"]["median"] == pytest.approx(1.6 * base["stats"]["median"])
    else:  # the slow round is a third of the pool whatever its size: the median stays among the clean rounds'
        clean = rec["timing"]["samples"][rec["timing"]["rounds"][0]["pooled"]:]  # rounds 2 and 3, as measured
        assert [r["pooled"] for r in rec["timing"]["rounds"]] == [len(clean) // 2] * 3
        assert rec["stats"]["median"] <= np.quantile(clean, 0.8), (rec["stats"]["median"], np.quantile(clean, 0.8))


def test_ctrl_c_keeps_the_rounds_measured_and_a_resume_keeps_the_rounds(tmp_path):
    from kbench.run.pool import execute_in_process

    pm, planned = _planned(tmp_path, 2, keyword="d=32 and noncausal and hkv=4")
    count = [0]

    def run(backend, case):
        count[0] += 1
        if count[0] == 6:  # rounds 1 of all four and round 2 of the first done
            raise KeyboardInterrupt
        return execute_in_process(planned.ctx, backend, case)

    with pytest.raises(RunInterrupted):
        run_suite(pm, planned, executor=run)
    data = load_result(planned.output)
    assert data["interrupted"] and len(data["records"]) == 4  # nothing measured was dropped
    done = {r["backend"] + r["case_id"]: len(r["timing"]["rounds"]) for r in data["records"]}
    assert sorted(done.values()) == [1, 1, 1, 2]
    req, existing = resume_request(pm, planned.output)
    assert req.rounds == 2


def test_rounds_are_refused_beside_an_energy_loop_with_the_place_and_the_fix(tmp_path):
    data = {"version": 1, "name": "e", "op": "attention", "backends": ["numpy"],
            "timing": {"energy_seconds": 1.0, "rounds": 2},
            "grid": [{"batch": 1, "seqlen": 16, "heads": 1, "head_dim": 16, "dtype": "fp32"}]}
    pm = get_plugin_manager()
    with pytest.raises(BadInput) as err:
        plan_run(pm, RunRequest(suite=suite_from_data(data, path="e.yaml"), device="cpu", output=tmp_path / "e.json"))
    assert "energy" in err.value.message and "rounds" in (err.value.fix or "")


@pytest.mark.parametrize("value", [0, 17, 1.5])
def test_the_suite_schema_refuses_rounds_out_of_range(tmp_path, value):
    path = tmp_path / "s.yaml"
    path.write_text(Path(SMOKE).read_text().replace("  rotate: 2\n", f"  rotate: 2\n  rounds: {value}\n"))
    result = CliRunner().invoke(cli, ["run", str(path), "-o", str(tmp_path / "o.json")])
    assert result.exit_code == 2 and "rounds" in result.output


def test_the_cli_takes_rounds_and_says_so(tmp_path):
    out = tmp_path / "o.json"
    result = CliRunner().invoke(cli, ["run", SMOKE, "-b", "numpy", "-k", "sq=64 and hkv=4 and noncausal", "--rounds",
                                      "2", "--no-isolate", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "in 2 rounds" in result.output
    (rec,) = load_result(out)["records"]
    assert len(rec["timing"]["rounds"]) == 2
    shown = CliRunner().invoke(cli, ["show", str(out)])
    assert shown.exit_code == 0 and "complete, each record in 2 rounds" in shown.output
    again = CliRunner().invoke(cli, ["run", "--resume", str(out), "--rounds", "3"])
    assert again.exit_code == 2 and "--resume takes" in again.output


@pytest.mark.parametrize("rounds,noted", [(1, True), (3, False)])
def test_compare_says_when_a_flag_rests_on_one_run_of_one_round(tmp_path, rounds, noted):
    """And (rounds 1) warns when the runs were timed by different measuring methods (kbench.timing)."""
    from synthetic_results import lognormal, record, result, write

    params = [{"seqlen": s, "heads": 2, "head_dim": 32} for s in (64, 128, 256, 512)]
    files = []
    for side, slow in (("base", 1.0), ("new", 2.0)):  # numpy really 2x slower on every case in NEW
        recs = [record(b, p, lognormal(1e-3 * (1 + i), 0.01, 200, seed=7 * i + len(b)))
                for i, p in enumerate(params) for b in ("numpy-flash",)]
        recs += [record("numpy", p, [s * slow for s in lognormal(2e-3 * (1 + i), 0.01, 200, seed=i)])
                 for i, p in enumerate(params)]
        data = result(recs)
        data["selection"] = {"rounds": rounds}
        data["environment"]["measuring_method"] = 1 if side == "base" and rounds == 1 else 2
        files.append(write(tmp_path / f"{side}.json", data))
    out = CliRunner().invoke(cli, ["compare", *files])
    assert out.exit_code == 0, out.output
    assert "4 slower" in out.output
    assert ("kbench run --rounds 3" in out.output) is noted
    assert (f"{rounds} rounds" in out.output) is (rounds > 1)
    assert ("different measuring methods (1 before, 2 after" in out.output) is (rounds == 1)


@pytest.mark.parametrize("edit,place", [
    (("  rotate: 2\n", "  rotate: 2\n  rounds: 2.0\n"), "timing.rounds"),
    (("  rotate: 2\n", "  rotate: 2\n  max_samples: 100.0\n"), "timing.max_samples"),
    (("  seeds: 2\n", "  seeds: 2.0\n"), "check.seeds"),
])
def test_counts_written_as_floats_are_refused_before_the_run(tmp_path, edit, place):
    """JSON Schema's integers include 2.0: ``rounds: 2.0`` and ``check.seeds: 2.0`` reached range() as floats and
    ended the run with a TypeError (the seeds one as an 'environment' error on every record). A count is now
    refused as the grid refuses ``batch: 1.0``, naming the key and its line."""
    path = tmp_path / "s.yaml"
    path.write_text(Path(SMOKE).read_text().replace(*edit))
    result = CliRunner().invoke(cli, ["run", str(path), "-o", str(tmp_path / "o.json")])
    assert result.exit_code == 2 and f"{place} (line" in result.output and "is not of type 'integer'" in result.output
    assert not (tmp_path / "o.json").exists()


def test_timing_settings_from_python_take_integral_floats_as_counts():
    timing = TimingSettings.from_mapping({"rounds": 2.0, "max_samples": 100.0, "min_samples": 4.0, "min_time": 1})
    assert (type(timing.rounds), type(timing.max_samples), type(timing.min_samples)) == (int, int, int)
    assert timing.min_time == 1  # a float field keeps what it was given


def test_a_round_that_timed_out_gets_no_further_rounds(tmp_path):
    """An untrusted backend timing out in round 1: no later round of that record runs (a hang costs the case
    timeout once, rounds or not); its cases not yet handed out are not started (the pool's own rule stops the
    ones already queued); the other backend gets all its rounds."""
    from kbench.judge.context import new_record
    from kbench.run.pool import execute_in_process

    pm, planned = _planned(tmp_path, 3, keyword="d=32 and noncausal and hkv=4")
    hang = planned.backends[1]
    calls = []

    def run(backend, case):
        calls.append((backend.name, case.id))
        if backend is hang:
            rec = new_record(backend.name, case, planned.ctx.device.name)
            rec.update(status="timeout", reason="exceeded the case timeout")
            return rec
        return execute_in_process(planned.ctx, backend, case)

    hang.stop_after_timeout = True  # as an untrusted kernel's
    try:
        run_suite(pm, planned, executor=run)
    finally:
        del hang.stop_after_timeout
    cases = [c.id for c in planned.plan.cases if planned.keyword.matches(hang.name, c.id)]
    assert len(cases) == 2
    assert [c for b, c in calls if b == hang.name] == cases  # round 1 only (both were handed out together)
    assert sum(b != hang.name for b, _ in calls) == 3 * len(cases)
    recs = {(r["backend"], r["case_id"]): r for r in load_result(planned.output)["records"]}
    assert all(recs[(hang.name, c)]["status"] == "timeout" for c in cases)
    assert all(len(recs[(b.name, c)]["timing"]["rounds"]) == 3 for b in planned.backends if b is not hang
               for c in cases)


def test_the_python_api_takes_rounds_through_timing():
    import kbench.api as kb

    m = kb.measure("numpy", cases=[{"seqlen": 48, "heads": 2, "head_dim": 16}], device="cpu", timing={"rounds": 2},
                   isolate=False)
    (rec,) = m.records
    assert rec.status.value == "passed" and len(rec.timing["rounds"]) == 2
    assert sum(r["pooled"] for r in rec.timing["rounds"]) == len(rec.samples)


def test_a_kernel_that_memoises_by_content_never_sees_an_input_twice_in_a_run(kbench_pm, kbench_case):
    """Rounds judge a (case, backend) several times in one run with one secret. An untrusted kernel keeping
    outputs by input content across its jobs would be handed round 1's inputs again in round 2 and answer from
    memory, correctly and in no time. Every key of an untrusted kernel's job is its own (kbench.judge.inputs:
    a nonce per job), so no call of any round repeats an input of another."""
    import dataclasses
    import hashlib

    from kbench.builtin.numpy_backends import attention_numpy
    from kbench.judge.context import RunContext
    from kbench.judge.judge import judge
    from kbench.ops.attention import softmax_scale
    from kbench.run.pool import LocalChannel
    from kbench.testing import TEST_CHECK, TEST_TIMING, FunctionBackend
    from kbench.worker.calls import CallRunner

    seen: dict[str, int] = {}

    def memo(q, k, v, out, case):
        digest = hashlib.sha256(q.tobytes() + k.tobytes() + v.tobytes()).hexdigest()
        seen[digest] = seen.get(digest, 0) + 1
        attention_numpy(q, k, v, out, causal=case["causal"], scale=softmax_scale(case))

    ctx = RunContext(op=kbench_pm.registry.op("attention"), device=kbench_pm.registry.device("cpu"), check=TEST_CHECK,
                     timing=dataclasses.replace(TEST_TIMING, rounds=1))
    case = kbench_case(seqlen=16)
    nonces = set()
    for _ in range(2):  # two rounds of one record: one run context, one secret
        rec = judge(ctx, LocalChannel(CallRunner(ctx.device, ctx.op), FunctionBackend(memo)), "memo", case,
                    trusted=False)
        assert rec["status"] == "passed", rec["reason"]
        nonces.add(rec["integrity"]["input_nonce"])
    assert seen and max(seen.values()) == 1, sorted(seen.values())[-5:]
    assert len(nonces) == 2  # each job's, in its record: with the run's secret it regenerates the inputs
