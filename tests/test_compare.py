"""kbench compare: classification of known shifts, statuses, machine checks, baseline speedups, the CLI."""
from __future__ import annotations

import csv
import io
import json
import math

import numpy as np
import pytest
from click.testing import CliRunner
from synthetic_results import lognormal, record, result, write

from kbench.cli import cli
from kbench.compare import Change, Settings, classify, compare_runs, group_key_for, ratio_test, \
    speedup_vs_baseline
from kbench.errors import BadInput
from kbench.plugins import PluginManager

SMALL = {"seqlen": 64, "heads": 4, "head_dim": 32}


def verdict(base, new, **settings):
    return classify(ratio_test(base, new, Settings(**settings)), Settings(**settings))[0]


# -- statistics on known shifts --------------------------------------------------------------------

def test_ten_percent_slowdown_with_low_noise_is_slower_beyond_the_variation_between_runs():
    base = lognormal(1e-4, 0.01, 200, seed=1)
    new = lognormal(1.1e-4, 0.01, 200, seed=2)
    t = ratio_test(base, new)
    assert t.ratio == pytest.approx(1.1, rel=0.01)
    assert t.ci_low > 1.08 and t.ci_high < 1.12 and t.p_value < 1e-10
    # one run a side: two runs of the same code differ by ~3% (docs/compare.md), so 10% is not beyond doubt
    change, why = classify(t)
    assert change is Change.AMBIGUOUS and "variation between runs" in why and "1.11" in why
    # a quieter machine (--run-noise 1%), or a larger change, is a verdict
    assert verdict(base, new, run_noise=0.01) is Change.SLOWER
    assert verdict(new, base, run_noise=0.01) is Change.FASTER
    assert verdict(base, lognormal(1.25e-4, 0.01, 200, seed=2)) is Change.SLOWER


def test_pooled_runs_narrow_the_variation_between_runs():
    """Three runs a side: their medians' run-to-run scatter is sqrt(3) smaller, and 10% becomes a verdict."""
    base = [result([record("numpy", SMALL, lognormal(1e-4, 0.01, 100, seed=s))], name="a") for s in range(3)]
    new = [result([record("numpy", SMALL, lognormal(1.1e-4, 0.01, 100, seed=9 + s))], name="a") for s in range(3)]
    from kbench.compare import pool_runs

    [single] = compare_runs(base[0], new[0])
    [pooled] = compare_runs(pool_runs(base), pool_runs(new))
    assert single.change is Change.AMBIGUOUS and pooled.change is Change.SLOWER
    assert pooled.test.runs == (3, 3) and pooled.to_json()["runs"] == [3, 3]


@pytest.mark.parametrize("seed", range(8))
def test_ten_percent_shift_in_heavy_noise_is_never_slower(seed):
    base = lognormal(1e-4, 0.4, 30, seed=100 + seed)
    new = lognormal(1.1e-4, 0.4, 30, seed=200 + seed)
    assert verdict(base, new) in (Change.SAME, Change.AMBIGUOUS)


@pytest.mark.parametrize("sigma", [0.01, 0.05])
def test_identical_distributions_are_same(sigma):
    for seed in range(5):
        base = lognormal(1e-4, sigma, 100, seed=seed)
        new = lognormal(1e-4, sigma, 100, seed=50 + seed)
        assert verdict(base, new) is Change.SAME, (sigma, seed)


def test_identical_distributions_in_heavy_noise_are_never_a_change():
    # the medians of 100 samples with 40% noise differ by more than 5% by chance: not a verdict either way
    for seed in range(8):
        base = lognormal(1e-4, 0.4, 100, seed=seed)
        new = lognormal(1e-4, 0.4, 100, seed=50 + seed)
        assert verdict(base, new) in (Change.SAME, Change.AMBIGUOUS), seed


def test_factor_decides_what_counts_as_a_change():
    base = lognormal(1e-4, 0.005, 200, seed=3)
    new = lognormal(1.03e-4, 0.005, 200, seed=4)
    # significant, but 3% is inside the default factor 1.05 ...
    assert ratio_test(base, new).significant(0.01)
    assert verdict(base, new) is Change.SAME
    # ... and a change when the factor is 1.02 (on a machine whose runs vary by 0.5%)
    assert verdict(base, new, factor=1.02, run_noise=0.005) is Change.SLOWER


def test_shift_smaller_than_the_spread_is_ambiguous_unless_the_fastest_samples_moved_alike():
    # many samples make a 15% shift of the median significant, but the slower the sample, the more it moved,
    # and the fastest did not (interference, 40% spread): inside the noise. (No variation between runs assumed.)
    a = np.sort(lognormal(1e-4, 0.3, 3000, seed=5))
    b = np.sort(lognormal(1e-4, 0.3, 3000, seed=6)) * (1 + 0.3 * np.arange(3000) / 3000)
    t = ratio_test(a, b)
    assert t.significant(0.01) and t.noise > 0.3 and t.ratio > 1.08 and t.min_ratio < 1.05 * t.ratio ** 0.5
    change, why = classify(t, Settings(run_noise=0.0))
    assert change is Change.AMBIGUOUS and "noise" in why
    # every sample 12% slower, the fastest too: however wide the spread, that is the code
    t = ratio_test(a, a * 1.12)
    assert t.noise > 0.3 and classify(t, Settings(run_noise=0.0))[0] is Change.SLOWER


def test_interference_that_leaves_the_fastest_samples_alone_is_ambiguous():
    # another process slows 90% of the samples by 20%: the median moves, the spread stays small,
    # the minimum does not move -- the code did not change
    base = np.asarray(lognormal(1e-4, 0.005, 200, seed=7))
    new = np.asarray(lognormal(1e-4, 0.005, 200, seed=8))
    new[20:] *= 1.2
    t = ratio_test(base, new)
    assert t.ratio > 1.15 and t.significant(0.01) and t.noise < 0.05 and t.min_ratio < 1.02
    change, why = classify(t)
    assert change is Change.AMBIGUOUS and "fastest samples" in why
    # the same shift applied to every sample is a change in the code
    assert verdict(base, np.asarray(lognormal(1e-4, 0.005, 200, seed=8)) * 1.2) is Change.SLOWER


def test_bad_settings_are_bad_input():
    with pytest.raises(BadInput, match="--factor"):
        Settings(factor=0.9)
    with pytest.raises(BadInput, match="--alpha"):
        Settings(alpha=2)


# -- statuses and matching --------------------------------------------------------------------------

def _pair_result(new_status="passed", shift=1.0, extra_new=(), extra_base=()):
    base = result([record("a", SMALL, lognormal(1e-4, 0.01, 50, 1)), *extra_base])
    new_rec = (record("a", SMALL, lognormal(shift * 1e-4, 0.01, 50, 2)) if new_status == "passed"
               else record("a", SMALL, None, status=new_status, reason="relative L2 error 0.3 exceeds 1e-5"))
    return base, result([new_rec, *extra_new])


def test_newly_failing_fixed_and_incomparable():
    base, new = _pair_result(new_status="failed")
    (p,) = compare_runs(base, new)
    assert p.change is Change.FAILING and p.change.mark == "!" and "relative L2" in p.note
    (p,) = compare_runs(new, base)
    assert p.change is Change.FIXED and p.change.mark == "*"
    only_new = record("b", SMALL, lognormal(1e-4, 0.01, 20, 3))
    skipped = record("c", SMALL, None, status="skipped", reason="needs a GPU")
    base, new = _pair_result(extra_new=(only_new, skipped), extra_base=(skipped,))
    pairs = {p.backend: p for p in compare_runs(base, new)}
    assert pairs["a"].change is Change.SAME
    assert pairs["b"].change is Change.INCOMPARABLE and "only in the new run" in pairs["b"].note
    assert pairs["c"].change is Change.INCOMPARABLE and pairs["c"].change.mark == "x"


# -- the CLI ----------------------------------------------------------------------------------------

@pytest.fixture
def runner():
    return CliRunner()


def invoke(runner, *args):
    return runner.invoke(cli, [str(a) for a in args], catch_exceptions=False)


def _files(tmp_path, shift, machine_new=None):
    recs_b, recs_n = [], []
    for i, seqlen in enumerate((64, 128)):
        params = {**SMALL, "seqlen": seqlen}
        recs_b += [record("fast", params, lognormal(1e-4, 0.01, 60, i)),
                   record("slowing", params, lognormal(2e-4, 0.01, 60, 10 + i))]
        recs_n += [record("fast", params, lognormal(1e-4, 0.01, 60, 20 + i)),
                   record("slowing", params, lognormal(2e-4 * shift, 0.01, 60, 30 + i))]
    base = write(tmp_path / "base.json", result(recs_b))
    kw = {"machine": machine_new} if machine_new else {}
    new = write(tmp_path / "new.json", result(recs_n, **kw))
    return base, new


def test_cli_reports_slower_and_fails_on_regression(runner, tmp_path):
    base, new = _files(tmp_path, shift=1.5)
    res = invoke(runner, "compare", base, new)
    assert res.exit_code == 0, res.output
    lines = [ln for ln in res.output.splitlines() if "attention[" in ln]
    assert len(lines) == 4
    assert all(ln.startswith("+") and "slower" in ln for ln in lines if "slowing" in ln)
    assert all(not ln.startswith(("+", "-")) and "same" in ln for ln in lines if " fast " in ln)
    assert "2 slower" in res.output and "2 same" in res.output
    res = invoke(runner, "compare", base, new, "--fail-on-regression")
    assert res.exit_code == 1 and "regression" in res.output
    # only the changed pairs, worst first
    res = invoke(runner, "compare", base, new, "--only-changed", "--sort", "ratio")
    rows = [ln for ln in res.output.splitlines() if "attention[" in ln]
    assert len(rows) == 2 and all("slowing" in r for r in rows)


def test_cli_identical_runs_pass_the_gate(runner, tmp_path):
    base, new = _files(tmp_path, shift=1.0)
    res = invoke(runner, "compare", base, new, "--fail-on-regression")
    assert res.exit_code == 0, res.output
    assert "4 pairs: 4 same" in res.output


def test_cli_formats(runner, tmp_path):
    base, new = _files(tmp_path, shift=1.5)
    data = json.loads(invoke(runner, "compare", base, new, "--format", "json").output)
    assert {d["change"] for d in data} == {"slower", "same"}
    slow = [d for d in data if d["backend"] == "slowing"]
    assert all(d["mark"] == "+" and d["ratio"] == pytest.approx(1.5, rel=0.03) for d in slow)
    assert all(d["ci_low"] <= d["ratio"] <= d["ci_high"] for d in data)
    rows = list(csv.DictReader(io.StringIO(invoke(runner, "compare", base, new, "--format", "csv").output)))
    by_key = {(d["backend"], d["case_id"]): d for d in data}
    for row in rows:  # numbers, units in the column names: the JSON's figures, not "200 us"
        d = by_key[(row["backend"], row["case_id"])]
        assert float(row["before_median_s"]) == pytest.approx(d["base_median"])
        assert float(row["ratio"]) == pytest.approx(d["ratio"]) and row["change"] == d["change"]
        assert (int(row["n_before"]), int(row["n_after"])) == (d["n_base"], d["n_new"]) == (60, 60)
    md = invoke(runner, "compare", base, new, "--format", "markdown").output
    assert "| before" in md.replace("|    ", "| ").replace("|  ", "| ")


def test_cli_refuses_different_machines_unless_allowed(runner, tmp_path):
    other = {"id": "gpu-nvidia-h100-sxm", "device": "cuda"}
    base, new = _files(tmp_path, shift=1.0, machine_new=other)
    res = runner.invoke(cli, ["compare", base, new])
    assert res.exit_code == 2
    assert "different machines" in res.output and "cpu-test-2c" in res.output and "gpu-nvidia-h100-sxm" in res.output
    assert "--allow-different-machines" in res.output
    res = invoke(runner, "compare", base, new, "--allow-different-machines")
    assert res.exit_code == 0 and "WARNING: different machines" in res.output


def test_cli_bad_arguments(runner, tmp_path):
    base, new = _files(tmp_path, shift=1.0)
    res = runner.invoke(cli, ["compare", base])
    assert res.exit_code == 2 and "BASE and NEW" in res.output
    res = runner.invoke(cli, ["compare", base, "--baseline", "nope"])
    assert res.exit_code == 2 and "nope" in res.output and "fast, slowing" in res.output
    res = runner.invoke(cli, ["compare", base, new, "--baseline", "fast"])
    assert res.exit_code == 2 and "one result" in res.output


# -- speedup against a baseline -----------------------------------------------------------------------

def test_speedup_vs_baseline_per_case_and_geomean_per_group(runner, tmp_path):
    recs = []
    speed = {False: 1.25, True: 1.10}        # the candidate is 25% faster non-causal, 10% faster causal
    for causal in (False, True):
        for i, seqlen in enumerate((64, 128, 256)):
            params = {**SMALL, "seqlen": seqlen, "causal": causal}
            t = 1e-4 * seqlen / 64
            recs.append(record("cudnn", params, lognormal(t, 0.005, 80, i)))
            recs.append(record("evolved", params, lognormal(t / speed[causal], 0.005, 80, 100 + i)))
            recs.append(record("broken", params, None, status="error", reason="RuntimeError: boom"))
    data = result(recs)
    table = speedup_vs_baseline(data, "cudnn", group_key_for(PluginManager(load_entry_points=False).registry))
    assert set(table.groups) == {"d=32,noncausal,hq=4,hkv=4,fp32", "d=32,causal,hq=4,hkv=4,fp32"}
    assert table.group_geomean("d=32,noncausal,hq=4,hkv=4,fp32", "evolved") == pytest.approx(1.25, rel=0.01)
    assert table.group_geomean("d=32,causal,hq=4,hkv=4,fp32", "evolved") == pytest.approx(1.10, rel=0.01)
    assert table.overall_geomean("evolved") == pytest.approx(math.sqrt(1.25 * 1.10), rel=0.01)
    assert all(c.significant for (cid, b), c in table.cells.items() if b == "evolved")
    assert all(c.speedup is None and "error" in c.note for (cid, b), c in table.cells.items() if b == "broken")

    res = invoke(runner, "compare", write(tmp_path / "one.json", data), "--baseline", "cudnn")
    assert res.exit_code == 0, res.output
    assert "geomean d=32,noncausal,hq=4,hkv=4,fp32 (3 cases)" in res.output
    assert "evolved vs cudnn: 1.17x faster" in res.output   # sqrt(1.25 * 1.10) = 1.1726
    geo_rows = [ln for ln in res.output.splitlines() if ln.startswith("geomean d=32,causal")]
    assert len(geo_rows) == 1 and "1.10x faster" in geo_rows[0]
    data = json.loads(invoke(runner, "compare", str(tmp_path / "one.json"), "--baseline", "cudnn",
                             "--format", "json").output)
    assert data["geomean"]["evolved"]["all"] == pytest.approx(1.1726, rel=0.01)


def test_pooled_repeated_runs_count_run_to_run_variation_as_noise(runner, tmp_path):
    # one process is 20% slower than another for no reason in the code (memory layout, a neighbour);
    # a single run against a new run in between calls it a change, the pooled runs do not
    def one(name, median, seed):
        return write(tmp_path / f"{name}.json", result([record("numpy", SMALL, lognormal(median, 0.01, 80, seed))]))
    b1, b2, n1 = one("b1", 1.0e-4, 1), one("b2", 1.2e-4, 2), one("n1", 1.1e-4, 3)
    single = json.loads(invoke(runner, "compare", b1, n1, "--format", "json", "--run-noise", "0.5%").output)
    assert single[0]["change"] == "slower"
    pooled = json.loads(invoke(runner, "compare", f"{b1},{b2}", n1, "--format", "json").output)
    assert pooled[0]["change"] in ("same", "ambiguous") and pooled[0]["noise"] > 0.15
    res = invoke(runner, "compare", f"{b1},{b2}", n1)
    assert "2 runs pooled" in res.output


def test_slowable_test_backend_loads_with_p_and_stays_correct(monkeypatch, kbench_check):
    import slow_backend_plugin

    pm = PluginManager(["slow_backend_plugin"], load_entry_points=False)
    backend = pm.registry.backends["numpy-slowed"]
    assert pm.registry.owner("backend", "numpy-slowed") == "slow_backend_plugin"
    monkeypatch.setenv("KBENCH_TEST_SLOWDOWN", "2")
    case = pm.registry.op("attention").make_case({"seqlen": 32, "heads": 2, "head_dim": 16, "causal": True})
    rec = kbench_check(backend, case)
    assert rec["status"] == "passed", rec.get("reason")       # slower, still the right answer
    assert rec["backend_info"]["slowdown"] == 2.0
    monkeypatch.setenv("KBENCH_TEST_SLOWDOWN", "fast")
    with pytest.raises(BadInput, match="KBENCH_TEST_SLOWDOWN"):
        slow_backend_plugin.slowdown()


# -- what a verdict rests on: the sample counts ----------------------------------------------------------

def test_a_large_gap_on_two_samples_is_too_few_to_tell_not_within_the_noise(runner, tmp_path):
    # 2 samples a side: the U test cannot go below p=0.33, so no gap is significant; a 76x gap is not "noise"
    recs = [record("cudnn", SMALL, [1.00e-3, 1.01e-3]), record("numpy", SMALL, [76e-3, 77e-3]),
            record("close", SMALL, lognormal(1.0e-3, 0.02, 40, 5)), ]
    recs.append(record("cudnn", {**SMALL, "seqlen": 128}, lognormal(2e-3, 0.02, 40, 6)))
    recs.append(record("close", {**SMALL, "seqlen": 128}, lognormal(2.01e-3, 0.02, 40, 7)))
    path = write(tmp_path / "few.json", result(recs))
    res = invoke(runner, "compare", path, "--baseline", "cudnn")
    assert res.exit_code == 0, res.output
    row = next(ln for ln in res.output.splitlines() if ln.startswith("attention[") and "sq=64" in ln)
    assert "76.1x slower (n=2/2)" in row and "%" not in row  # 76.5 / 1.005
    row128 = next(ln for ln in res.output.splitlines() if ln.startswith("attention[") and "sq=128" in ln)
    assert row128.rstrip().endswith("?")  # 0.5% apart with 2% noise: within it
    assert "numpy vs cudnn: 76.1x slower (geomean of 1 cases, from 76.1x slower to 76.1x slower; " \
           "1 with too few samples to tell)" in res.output
    cells = {c["backend"]: c for c in json.loads(invoke(runner, "compare", path, "--baseline", "cudnn",
                                                        "--format", "json").output)["cells"]}
    assert cells["numpy"]["few_samples"] and cells["numpy"]["n"] == [2, 2]
    assert cells["numpy"]["speedup"] == pytest.approx(1.005 / 76.5)
    rows = list(csv.reader(io.StringIO(invoke(runner, "compare", path, "--baseline", "cudnn",
                                              "--format", "csv").output)))
    assert rows[0] == ["case", "cudnn_median_s", "numpy_speedup_x", "close_speedup_x"]
    assert float(rows[1][1]) == pytest.approx(1.005e-3) and float(rows[1][2]) == pytest.approx(1.005 / 76.5)

    # two runs: the same gap is ambiguous for the same reason, and says so
    slow = write(tmp_path / "slow.json", result([record("cudnn", SMALL, [76e-3, 77e-3])]))
    fast = write(tmp_path / "fast.json", result([record("cudnn", SMALL, [1.00e-3, 1.01e-3])]))
    (pair,) = json.loads(invoke(runner, "compare", fast, slow, "--format", "json").output)
    assert pair["change"] == "ambiguous" and pair["note"].startswith("too few samples to tell (n=2 and 2")
    assert (pair["n_base"], pair["n_new"], pair["stop_reason_new"]) == (2, 2, "time_limit")
    shown = invoke(runner, "compare", fast, slow).output
    assert "2/2" in shown and "the U test cannot reach p<0.01 with so few, its floor is 0.33" in shown


def test_smallest_p_of_the_u_test_is_what_scipy_gives_for_separated_samples():
    from kbench.compare import smallest_p

    assert smallest_p(2, 2) == pytest.approx(1 / 3)
    assert smallest_p(3, 3) == pytest.approx(0.1)
    assert smallest_p(5, 5) < 0.01 < smallest_p(4, 4)


# -- a same-code comparison stays quiet --------------------------------------------------------

BACKENDS = ("numpy", "numpy-flash", "torch-sdpa")


def _run(factors, *, seed: int, name: str = "smoke"):
    """A run of 4 cases x 3 backends, record (case, backend) taking ``factors.get((case, backend), 1)`` times
    its usual time: 100 samples spread 1%, and a run-to-run jitter of 1% per record."""
    rng = np.random.default_rng(seed)
    recs = []
    for c in range(4):
        params = {"seqlen": 32 * (c + 1), "heads": 4, "head_dim": 32}
        for b, backend in enumerate(BACKENDS):
            level = 1e-4 * (1 + c) * (1 + b) * factors.get((c, backend), 1.0) * float(np.exp(rng.normal(0, 0.01)))
            recs.append(record(backend, params, level * np.exp(rng.normal(0, 0.01, 100))))
    return result(recs, name=name)


def test_a_slow_window_of_the_machine_is_ambiguous_but_a_backend_slower_everywhere_is_slower(runner, tmp_path):
    """The VM's slow windows slow every record measured in them, minimum included (docs/compare.md): here
    case 2's three records are 1.6x slower. Before, each was `+ slower` and failed the gate; now the records
    of the other backends beside each moved alike, so each is ambiguous. A backend 1.25x slower on every case
    beside unchanged ones is still slower; every record 11x slower is machine-wide."""
    base = _run({}, seed=1)
    window = _run({(2, b): 1.6 for b in BACKENDS}, seed=2)
    pairs = compare_runs(base, window)
    moved = [p for p in pairs if "(b=1,sq=96" in p.case_id or "sq=96" in p.case_id]
    assert len(moved) == 3 and all(p.change is Change.AMBIGUOUS and "moved alike" in p.note for p in moved)
    assert all(p.change is Change.SAME for p in pairs if p not in moved)
    a, b = write(tmp_path / "a.json", base), write(tmp_path / "b.json", window)
    assert invoke(runner, "compare", a, b, "--fail-on-regression").exit_code == 0

    slower = compare_runs(base, _run({(c, "numpy-flash"): 1.25 for c in range(4)}, seed=3))
    assert [p.change for p in slower if p.backend == "numpy-flash"] == [Change.SLOWER] * 4
    assert all(p.change is Change.SAME for p in slower if p.backend != "numpy-flash")
    # every backend of the run 11x slower: the control rule reports it as machine-wide (the machine, or what every
    # backend shares), never as one backend's regression, and never as "same"
    everything = compare_runs(base, _run({(c, b): 11.0 for c in range(4) for b in BACKENDS}, seed=4))
    assert all(p.change is Change.MACHINE and "the backends of the run moved alike" in p.note for p in everything)
    c = write(tmp_path / "c.json", _run({(c, "numpy-flash"): 1.25 for c in range(4)}, seed=3))
    res = invoke(runner, "compare", a, c, "--fail-on-regression")
    assert res.exit_code == 1 and "numpy-flash slower x4" in res.stderr


def test_same_code_runs_that_differ_by_a_few_percent_are_never_a_verdict():
    """Two runs of the same code: every record of the second 6% faster (the machine sped up: seen with other
    work on it), each record's own interval +-0.2%. The samples alone call each a significant change beyond
    the factor; against the variation between runs none is, and with --run-noise 0 the control rule (every
    backend moved alike) reports them as machine-wide."""
    base = _run({}, seed=5)
    new = _run({(c, b): 0.94 for c in range(4) for b in BACKENDS}, seed=6)
    pairs = compare_runs(base, new)
    beyond = [i for i, p in enumerate(pairs) if p.test.ratio <= 1 / 1.05]
    assert len(beyond) >= 6 and all(p.change is not Change.FASTER for p in pairs)
    assert all(pairs[i].change is Change.AMBIGUOUS and "variation between runs" in pairs[i].note for i in beyond)
    # without the run-to-run term the samples alone would call each faster; the control rule still holds every
    # record against the other backends of the run, which all moved alike: machine-wide, never "faster"
    before = compare_runs(base, new, Settings(run_noise=0.0))
    assert all(before[i].change is Change.MACHINE and "moved alike" in before[i].note for i in beyond)
