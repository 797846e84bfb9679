"""Result files: round trip, validation, migration, atomic incremental writes."""
from __future__ import annotations

import json

import pytest

from kbench.errors import BadInput
from kbench.results import RESULT_VERSION, ResultWriter, load_result


def header():
    return {"id": "t", "machine": {"id": "m1"}, "environment": {"kbench": "0"}, "hardware": None,
            "suite": {"name": "s", "path": None, "data": {"name": "s"}}, "device": "cpu"}


def record(backend="numpy", status="passed", samples=(1e-3, 2e-3)):
    rec = {"backend": backend, "op": "attention", "case_id": "attention[x]", "case": {"seqlen_q": 1},
           "device": "cpu", "status": status, "reason": None}
    if samples:
        rec["timing"] = {"samples": list(samples), "stop_reason": "noise_target"}
    return rec


def test_round_trip_and_incremental_writes(tmp_path):
    path = tmp_path / "r.json"
    w = ResultWriter(path, header())
    w.append(record())
    # readable, and marked incomplete, after every record: an interrupted run loses nothing
    mid = load_result(path)
    assert mid["complete"] is False and len(mid["records"]) == 1
    w.append(record(backend="numpy-flash", status="skipped", samples=None))
    w.finish()
    data = load_result(path)
    assert data["complete"] is True and data["version"] == RESULT_VERSION
    assert [r["backend"] for r in data["records"]] == ["numpy", "numpy-flash"]
    assert data["records"][0]["timing"]["samples"] == [1e-3, 2e-3]
    assert not list(tmp_path.glob(".*tmp"))  # no temporary files left behind


def test_interrupted_run_is_marked(tmp_path):
    w = ResultWriter(tmp_path / "r.json", header())
    w.append(record())
    w.finish(interrupted="killed")
    data = load_result(tmp_path / "r.json")
    assert data["complete"] is False and data["interrupted"] == "killed"


def test_non_finite_numbers_are_stored_as_null(tmp_path):
    w = ResultWriter(tmp_path / "r.json", header())
    rec = record()
    rec["correctness"] = {"rel_l2": float("nan"), "bound": 1e-5, "seeds": 1, "rows_checked": None}
    w.append(rec)
    assert load_result(tmp_path / "r.json")["records"][0]["correctness"]["rel_l2"] is None  # journal included


def test_invalid_record_is_refused_before_it_is_written(tmp_path):
    w = ResultWriter(tmp_path / "r.json", header())
    with pytest.raises(BadInput, match="status"):
        w.append(record(status="great"))
    assert load_result(tmp_path / "r.json")["records"] == []


def test_version_1_is_migrated(tmp_path):
    old = {"format": "kbench-result", "version": 1, **header(), "created": "2026-01-01", "complete": True,
           "records": [{**record(samples=None), "timing": {"samples_ns": [1500, 2500], "stop_reason": "time_limit"}}]}
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    data = load_result(path)
    assert data["version"] == RESULT_VERSION
    assert data["records"][0]["timing"]["samples"] == pytest.approx([1.5e-6, 2.5e-6])


@pytest.mark.parametrize("content, message", [
    ('{"format": "kbench-result", "version": 99}', "newer than this kbench reads"),
    ('{"format": "something-else"}', "not a kbench result file"),
    ('{"format": "kbench-result", "version": 2, "records": []', "not valid JSON"),
    ('{"format": "kbench-result", "version": 2, "id": "x"}', "invalid result file"),
])
def test_bad_result_files(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(BadInput, match=message) as err:
        load_result(path)
    assert str(path) in err.value.format() and err.value.exit_code == 2


def test_missing_file(tmp_path):
    with pytest.raises(BadInput, match="not found"):
        load_result(tmp_path / "nope.json")


def test_per_output_correctness_is_validated_to_the_leaves(tmp_path):
    """A backward's record judges every output with its own bound (correctness.outputs, worst_output)."""
    w = ResultWriter(tmp_path / "r.json", header())
    good = record()
    good["correctness"] = {"rel_l2": 3e-3, "bound": 2e-2, "seeds": 2, "rows_checked": 32, "per_seed": [1e-3, 3e-3],
                           "outputs": {"out": {"rel_l2": 1e-3, "bound": 1e-2}, "dk": {"rel_l2": 3e-3, "bound": 2e-2}},
                           "worst_output": "dk", "call_seconds": [1e-3, 1e-3]}
    w.append(good)
    for bad, where in (({"dk": {"rel_l2": "small", "bound": 2e-2}}, "rel_l2"), ({"dk": {"rel_l2": 1e-3}}, "bound"),
                       ({"dk": {"rel_l2": 1e-3, "bound": -1}}, "bound")):
        rec = record(backend="numpy-flash")
        rec["correctness"] = {**good["correctness"], "outputs": bad}
        with pytest.raises(BadInput, match=where):
            w.append(rec)
    rec = record(backend="numpy-flash")
    rec["correctness"] = {**good["correctness"], "worst_output": 3}
    with pytest.raises(BadInput, match="worst_output"):
        w.append(rec)
    w.finish()
    assert load_result(tmp_path / "r.json")["records"][0]["correctness"]["outputs"]["dk"]["bound"] == 2e-2
