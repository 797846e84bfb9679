"""kbench.record.Record: exact JSON round trip (committed and synthetic records), accessors, the readers on it,
the roofline split's old import paths, and the one dtype vocabulary of the capacity analysis."""
from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings, strategies as st
from synthetic_results import lognormal, record, result, write

from kbench.cli import cli
from kbench.compare import Change, compare_runs, pool_runs
from kbench.enums import DType, Status
from kbench.errors import BadInput
from kbench.record import Record, as_records, records_of
from kbench.results import load_result, validate_record

ROOT = Path(__file__).resolve().parents[1]

ATTENTION = ROOT / "results/cpu-amd-epyc-2c/attention-20261129-183310.json"
DECODE = ROOT / "results/cpu-amd-epyc-2c/decode-cpu.json"
SMALL = {"seqlen": 64, "heads": 4, "head_dim": 32}


def _result_files() -> list[Path]:
    """The kbench result files under results/ (calibrations and gpu-check outputs lie beside them)."""
    from kbench.results import FORMAT

    out = []
    for p in sorted((ROOT / "results").rglob("*.json")):
        try:
            data = json.loads(p.read_text())
        except ValueError:
            continue
        if isinstance(data, dict) and data.get("format") == FORMAT and data.get("records"):
            out.append(p)
    return out


COMMITTED = _result_files()


# -- round trip ------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.name)
def test_every_committed_record_round_trips_to_the_same_json_text(path):
    raw = json.loads(path.read_text())
    for i, rec in enumerate(raw["records"]):
        back = Record.from_json(rec).to_json()
        assert json.dumps(back) == json.dumps(rec), (path.name, i)   # same keys, values and key order
    loaded = load_result(path)   # migrated and validated: what readers get
    assert [r.to_json() for r in records_of(loaded)] == loaded["records"]


def test_synthetic_records_of_every_status_round_trip_and_validate():
    recs = [record("numpy", SMALL, lognormal(1e-4, 0.02, 20, seed=1)),
            *(record("numpy", SMALL, None, status=s.value, reason=f"why {s.value}")
              for s in Status if s is not Status.PASSED)]
    for rec in recs:
        r = Record.from_json(rec)
        assert r.status is Status(rec["status"])
        assert json.dumps(r.to_json()) == json.dumps(rec)
        validate_record(r.to_json())


_KEYS = ("backend", "op", "case_id", "case", "device", "status", "reason", "started", "integrity", "backend_info",
         "correctness", "timing", "stats", "metrics", "telemetry", "duration", "worker", "plugin_extra", "cause")
_SECTION = st.one_of(st.none(), st.dictionaries(st.sampled_from(["median", "samples", "x", "energy"]),
                                                st.one_of(st.floats(0, 1), st.lists(st.floats(0, 1), max_size=3)),
                                                max_size=3))


@settings(max_examples=150, deadline=None)
@given(st.permutations(_KEYS).flatmap(lambda order: st.integers(6, len(order)).map(lambda n: order[:n])),
       st.sampled_from(list(Status)), st.data())
def test_any_subset_and_order_of_keys_round_trips(keys, status, data):
    """Absent stays absent, null stays null, unknown keys stay where they were: whatever a writer put."""
    rec = {}
    for key in ("backend", "case_id", "status") + tuple(keys):
        if key in rec:
            continue
        if key in ("backend", "case_id", "op", "device", "reason", "started", "cause"):
            rec[key] = data.draw(st.text(max_size=5)) if key in ("backend", "case_id") else \
                data.draw(st.one_of(st.none(), st.text(max_size=5)))
        elif key == "status":
            rec[key] = status.value
        elif key == "duration":
            rec[key] = data.draw(st.one_of(st.none(), st.floats(0, 10)))
        else:
            rec[key] = data.draw(_SECTION)
    r = Record.from_json(rec)
    assert json.dumps(r.to_json()) == json.dumps(rec)
    assert r.status is status
    assert r.extra == {k: rec[k] for k in ("worker", "plugin_extra", "cause") if k in rec}


def test_a_record_built_in_code_writes_the_required_fields_and_no_absent_sections():
    r = Record("numpy", "attention", "attention[x]", {"dtype": "fp32"}, "cpu", Status.SKIPPED, reason="no GPU")
    assert r.to_json() == {"backend": "numpy", "op": "attention", "case_id": "attention[x]", "case": {"dtype": "fp32"},
                           "device": "cpu", "status": "skipped", "reason": "no GPU"}
    validate_record(r.to_json())
    later = r.replace(duration=0.5, extra={"plugin": 1})
    assert later.to_json()["duration"] == 0.5 and later.to_json()["plugin"] == 1 and "duration" not in r.to_json()


@pytest.mark.parametrize("bad, where, says", [
    ({"backend": "b", "case_id": "c", "status": "ok"}, "records[3].status", "'ok' is not one of"),
    ({"backend": "b", "case_id": "c"}, "records[3].status", "None is not one of"),
    ({"backend": 7, "case_id": "c", "status": "passed"}, "records[3].backend", "no string `backend`"),
    (["not", "a", "dict"], "records[3]", "a record is a JSON object"),
])
def test_a_malformed_record_is_bad_input_naming_file_and_place(bad, where, says):
    with pytest.raises(BadInput) as info:
        Record.from_json(bad, file="r.json", where="records[3]")
    assert says in info.value.message and info.value.where == where and info.value.file == "r.json"


# -- accessors on real records ---------------------------------------------------------------------

def test_accessors_read_the_committed_records():
    assert {ATTENTION, DECODE} <= set(COMMITTED)
    recs = records_of(load_result(ATTENTION))
    raw = json.loads(ATTENTION.read_text())["records"]
    passed = [(r, d) for r, d in zip(recs, raw) if d["status"] == "passed"]
    assert len(passed) == 84 and all(r.passed for r, _ in passed)
    for r, d in passed:
        assert r.samples == d["timing"]["samples"] and len(r.samples) >= 2
        assert r.median == d["stats"]["median"] == pytest.approx(float(np.median(r.samples)))
        assert r.tflops == d["metrics"]["tflops"] > 0 and r.bandwidth == d["metrics"]["gbps"] > 0
        assert r.rel_l2 == d["correctness"]["rel_l2"] < d["correctness"]["bound"]
        assert r.spread == d["stats"]["rel_spread"] and r.dtype is DType(d["case"]["dtype"])
    skipped = [r for r in recs if r.status is Status.SKIPPED]
    assert len(skipped) == 280
    assert all(r.samples == [] and r.median is None and r.tflops is None and r.rel_l2 is None for r in skipped)
    assert skipped[0].status_text == f"skipped: {skipped[0].reason}"
    flash = next(r for r in recs if r.backend == "numpy-flash" and r.passed)
    assert flash.tunables == flash.backend_info["tunables"] and set(flash.tunables) == {"block_q", "block_k"}
    decode = records_of(load_result(DECODE))
    assert {r.backend for r in decode} == {"numpy-decode"} and all(r.tunables == {"block_kv": 8192} for r in decode)


def test_energy_and_telemetry_accessors():
    rec = record("numpy", SMALL, lognormal(1e-4, 0.02, 10, seed=2))
    assert Record.from_json(rec).energy == {}
    rec["telemetry"] = {"energy": {"average_w": 0.0, "joules_per_call": 1.0}}
    assert Record.from_json(rec).energy == {}           # a counter that read nothing is no measurement
    rec["telemetry"] = {"energy": {"average_w": 150.0, "joules_per_call": 1.5}, "throttled_samples": [1]}
    r = Record.from_json(rec)
    assert r.energy["joules_per_call"] == 1.5 and r.telemetry_item("throttled_samples") == [1]
    assert r.telemetry_item("after") is None and r.telemetry_item("after", "power_limit_w") is None
    r.telemetry["after"] = {"power_limit_w": 700.0}
    assert r.telemetry_item("after", "power_limit_w") == 700.0
    assert r.telemetry_item("throttled_samples", "x") is None   # a list on the way: no such entry


def test_with_samples_copies_and_leaves_the_original_alone():
    rec = record("numpy", SMALL, [1.0, 2.0, 3.0])
    r = Record.from_json(rec)
    more = r.with_samples(r.samples + [4.0])
    assert more.samples == [1.0, 2.0, 3.0, 4.0] and r.samples == [1.0, 2.0, 3.0] == rec["timing"]["samples"]
    assert more.timing["stop_reason"] == "time_limit" and more.to_json()["timing"]["samples"][-1] == 4.0


# -- readers ---------------------------------------------------------------------------------------

def test_pooling_runs_does_not_change_the_loaded_records():
    a = result([record("numpy", SMALL, lognormal(1e-4, 0.02, 20, seed=3))], name="s")
    b = result([record("numpy", SMALL, lognormal(1e-4, 0.02, 30, seed=4))], name="s")
    before = json.dumps([a, b])
    pooled = pool_runs([a, b])
    assert [len(r.samples) for r in pooled["records"]] == [50]
    assert json.dumps([a, b]) == before
    assert all(isinstance(r, Record) for r in pooled["records"])


def test_compare_takes_records_or_json_objects_alike():
    base = result([record("numpy", SMALL, lognormal(1e-4, 0.01, 100, seed=5)),
                   record("torch", SMALL, None, status="error", reason="boom")], name="s")
    new = result([record("numpy", SMALL, lognormal(1.3e-4, 0.01, 100, seed=6)),
                  record("torch", SMALL, lognormal(1e-4, 0.01, 100, seed=7))], name="s")
    as_dicts = compare_runs(base, new)
    as_objs = compare_runs({**base, "records": as_records(base["records"])}, {**new, "records": records_of(new)})
    assert [(p.change, p.note) for p in as_dicts] == [(p.change, p.note) for p in as_objs]
    assert [p.change for p in as_dicts] == [Change.SLOWER, Change.FIXED]
    assert as_dicts[1].note == "was error: boom" and as_dicts[1].to_json()["base_status"] == "error"


def test_a_pair_whose_settings_differ_says_so():
    def with_tunables(rec, **tunables):
        return {**rec, "backend_info": {"tunables": tunables}}
    samples = lognormal(1e-4, 0.01, 50, seed=8)
    base = result([with_tunables(record("numpy-flash", SMALL, samples), block_q=128, block_k=128)], name="s")
    new = result([with_tunables(record("numpy-flash", SMALL, samples), block_q=64, block_k=128)], name="s")
    same = result([with_tunables(record("numpy-flash", SMALL, samples), block_q=128, block_k=128)], name="s")
    [pair] = compare_runs(base, new)
    assert pair.change is Change.SAME and pair.note == "settings differ: block_q 128 -> 64"
    assert compare_runs(base, same)[0].note == ""


def _placed(rec, profile):
    return {**rec, "placement": {"host": "node", "executor": "ray", "device": "cuda", "profile": profile}}


def test_records_of_different_gpu_models_in_one_file_are_paired_per_profile():
    def run(name, h200_scale, seeds):
        return result([_placed(record("numpy", SMALL, lognormal(1e-4, 0.01, 60, seed=seeds[0])), "h100-sxm"),
                       _placed(record("numpy", SMALL, lognormal(1e-4 * h200_scale, 0.01, 60, seed=seeds[1])), "h200")],
                      name=name)
    base, new = run("s", 0.5, (10, 11)), run("s", 0.5, (12, 13))
    pairs = compare_runs(base, new)
    assert [p.case_id.rsplit(" @ ", 1)[1] for p in pairs] == ["h100-sxm", "h200"]
    assert [p.change for p in pairs] == [Change.SAME, Change.SAME]   # no h100 time set against an h200 time
    only_h100 = result(new["records"][:1], name="s")
    assert [p.note for p in compare_runs(base, only_h100)] == ["", "only in the base run"]
    assert pool_runs([base, new])["records"][0].samples == base["records"][0]["timing"]["samples"] + \
        new["records"][0]["timing"]["samples"]
    assert len(pool_runs([base, new])["records"]) == 2


def test_speedups_are_taken_within_one_gpu_model():
    from kbench.compare import speedup_vs_baseline

    recs = []
    for profile, scale, seed in (("h100-sxm", 1.0, 20), ("h200", 0.5, 30)):
        recs += [_placed(record("numpy", SMALL, lognormal(1e-4 * scale, 0.01, 60, seed=seed)), profile),
                 _placed(record("torch", SMALL, lognormal(0.5e-4 * scale, 0.01, 60, seed=seed + 1)), profile)]
    table = speedup_vs_baseline(result(recs, name="s"), "numpy", lambda r: r.op)
    assert sorted(table.groups) == ["attention @ h100-sxm", "attention @ h200"]
    assert [round(s.speedup, 1) for s in table.cells.values()] == [2.0, 2.0]


def test_show_json_gives_back_the_records_of_the_file():
    out = CliRunner().invoke(cli, ["show", str(DECODE), "--format", "json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output) == load_result(DECODE)["records"]


def test_show_csv_columns_are_the_accessors():
    out = CliRunner().invoke(cli, ["show", str(DECODE), "--format", "csv"])
    assert out.exit_code == 0, out.output
    rows = list(csv.DictReader(io.StringIO(out.output)))
    for row, r in zip(rows, records_of(load_result(DECODE)), strict=True):
        assert (row["case_id"], row["backend"], row["status"]) == (r.case_id, r.backend, "passed")
        assert float(row["median_s"]) == r.median and float(row["spread_iqr_over_median"]) == r.spread
        assert float(row["tflop_per_s"]) == r.tflops and float(row["gb_per_s"]) == r.bandwidth
        assert float(row["rel_l2"]) == r.rel_l2 and int(row["n"]) == len(r.samples)


def test_compare_of_a_committed_run_with_itself_is_the_same_everywhere():
    out = CliRunner().invoke(cli, ["compare", str(DECODE), str(DECODE), "--format", "json"])
    assert out.exit_code == 0, out.output
    pairs = json.loads(out.output)
    assert len(pairs) == 9 and all(p["change"] == "same" and p["ratio"] == 1.0 for p in pairs)
    assert all(p["base_status"] == p["new_status"] == "passed" for p in pairs)


def test_history_and_plan_read_through_records(tmp_path):
    from kbench.history.runs import reduce_result
    from kbench.plan.measured import rates_from_results

    data = load_result(DECODE)
    run = reduce_result(DECODE, data)
    assert run.statuses == {"passed": 9} and len(run.points) == 9
    assert sorted(p.median for p in run.points) == sorted(r.median for r in records_of(data))
    rates = rates_from_results([(str(DECODE), data)])
    assert rates.curves and all(c.file == str(DECODE) for cs in rates.curves.values() for c in cs)


# -- the roofline split and the dtype vocabulary ---------------------------------------------------

def test_old_roofline_import_paths_still_work():
    from kbench.commands import roofline as cmd
    from kbench.report import capacity
    from kbench.roofline import check_dtype, parse_context, pick, plot_footprint, plot_quadrants, split_names

    assert plot_quadrants is capacity.plot_quadrants and plot_footprint is capacity.plot_footprint
    assert (parse_context, split_names, pick, check_dtype) == (cmd.parse_context, cmd.split_names, cmd.pick,
                                                               cmd.check_dtype)
    assert parse_context("128Ki") == 131072
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        import kbench.roofline as r

        r.nothing  # noqa: B018


def test_the_analysis_imports_neither_pyplot_nor_click():
    code = ("import sys, kbench.roofline as r; r.analyze_all(r.builtin_models()[:1], [8192], []); "
            "print(sorted(m for m in ('matplotlib', 'click') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_one_dtype_vocabulary_for_bytes_and_peaks():
    from kbench.hardware import HardwareProfile
    from kbench.roofline import DTYPE_BYTES, STORAGE_ONLY_BYTES
    from kbench.roofline.analysis import _compute_peak, peak_names

    for d in DType:
        assert DTYPE_BYTES[d.value] == d.itemsize == d.numpy.itemsize
    assert set(DTYPE_BYTES) == {d.value for d in DType} | set(STORAGE_ONLY_BYTES)
    assert peak_names("fp32") == ("tf32", "fp32") and peak_names("bf16") == ("bf16",)
    assert peak_names("fp8_e4m3") == ("fp8_e4m3", "fp8")
    hw = HardwareProfile.from_json({"name": "toy", "title": "toy", "kind": "gpu", "source": "test",
                                    "peak_flops": {"fp8": 2e15, "tf32": 4e14, "fp32": 6e13},
                                    "bandwidth": 4e12, "capacity": 1e11})
    assert _compute_peak(hw, "fp8_e4m3") == 2e15 and _compute_peak(hw, "fp32") == 4e14
    out = CliRunner().invoke(cli, ["roofline", "-m", "llama-3.1-8b", "-c", "8k", "--hardware", "h200",
                                   "--weights", "fp64"])
    assert out.exit_code == 2 and "unknown precision 'fp64'" in out.output and "bf16" in out.output


def test_the_runner_and_the_writer_take_typed_records(tmp_path):
    from kbench.enums import Status
    from kbench.record import Record
    from kbench.results import ResultWriter, load_result
    from kbench.run.runner import exit_code

    base = {"backend": "numpy", "op": "attention", "case_id": "attention[x]", "case": {}, "device": "cpu",
            "reason": None}
    passed = Record.from_json({**base, "status": "passed"})
    crashed = passed.replace(status=Status.CRASHED, reason="signal 11")
    assert exit_code([passed, {**base, "status": "skipped"}]) == 0
    assert exit_code([passed, crashed]) == 1 and exit_code([{**base, "status": "timeout"}]) == 1
    w = ResultWriter(tmp_path / "r.json", {"id": "t", "machine": {"id": "m"}, "environment": {}, "hardware": None,
                                           "suite": {"name": "s", "path": None, "data": {"name": "s"}}, "device": "cpu"})
    w.append(crashed)
    w.finish()
    [got] = load_result(tmp_path / "r.json")["records"]
    assert got["status"] == "crashed" and got["reason"] == "signal 11" and Record.from_json(got) == crashed
