"""Tables of records: n and the stop reason shown, records below the suite's min_samples marked and counted,
numbers (units in the column names) in CSV and JSON."""
from __future__ import annotations

import csv
import io
import json
import re

import pytest
from click.testing import CliRunner
from synthetic_results import lognormal, record, result, write

from kbench.cli import cli
from kbench.tables import min_samples_of, records_table, status_summary

SMALL = {"seqlen": 64, "heads": 4, "head_dim": 32}


def _result(min_samples_top=None, min_samples_cpu=None):
    recs = [record("numpy", SMALL, [1e-3, 1.1e-3]),                          # stopped at 2 samples
            record("numpy-flash", SMALL, lognormal(5e-4, 0.01, 40, 1)),
            record("numpy", {**SMALL, "causal": True}, None, status="failed", reason="relative L2 error 0.3")]
    recs[1]["timing"]["stop_reason"] = "noise_target"
    data = result(recs)
    suite = {"name": "t", "op": "attention"}
    if min_samples_top is not None:
        suite["timing"] = {"min_samples": min_samples_top}
    if min_samples_cpu is not None:
        suite["devices"] = {"cpu": {"timing": {"min_samples": min_samples_cpu}},
                            "cuda": {"timing": {"min_samples": 99}}}
    data["suite"]["data"] = suite
    return data


def test_min_samples_is_the_devices_then_the_suites_then_the_default():
    from kbench.timing import TimingSettings

    assert min_samples_of(_result()) == TimingSettings().min_samples
    assert min_samples_of(_result(min_samples_top=7)) == 7
    assert min_samples_of(_result(min_samples_top=7, min_samples_cpu=3)) == 3


def test_show_has_n_and_stop_reason_and_marks_records_below_min_samples(tmp_path):
    path = write(tmp_path / "r.json", _result(min_samples_top=5))
    out = CliRunner().invoke(cli, ["show", path])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    header = next(ln for ln in lines if ln.startswith("case"))
    assert header.split()[3:6] == ["n", "stop", "median"]
    few = next(ln for ln in lines if " numpy " in ln and "noncausal" in ln)
    many = next(ln for ln in lines if "numpy-flash" in ln)
    assert " 2 <5 " in few and "time_limit" in few
    assert " 40 " in many and "noise_target" in many and "<" not in many.split("noise_target")[0].split("passed")[1]
    assert "n <5: 1 passed records stopped sampling before the suite's min_samples (time_limit 1)" in out.output
    assert lines[-1] == "2 passed (1 below min_samples 5), 1 failed"
    # no record below: no mark, no note, the plain count
    path = write(tmp_path / "r2.json", _result(min_samples_top=2))
    out = CliRunner().invoke(cli, ["show", path]).output
    assert "<2" not in out and "below min_samples" not in out and out.splitlines()[-1] == "2 passed, 1 failed"


def test_show_csv_and_json_hold_numbers_with_units_in_the_names(tmp_path):
    data = _result(min_samples_top=5)
    path = write(tmp_path / "r.json", data)
    out = CliRunner().invoke(cli, ["show", path, "--format", "csv"])
    rows = {(r["backend"], r["case_id"]): r for r in csv.DictReader(io.StringIO(out.output))}
    few = rows[("numpy", data["records"][0]["case_id"])]
    assert float(few["median_s"]) == pytest.approx(data["records"][0]["stats"]["median"])
    assert float(few["spread_iqr_over_median"]) == pytest.approx(data["records"][0]["stats"]["rel_spread"])
    assert float(few["tflop_per_s"]) == pytest.approx(data["records"][0]["metrics"]["tflops"])
    assert (few["n"], few["min_samples"], few["below_min_samples"], few["stop_reason"]) == ("2", "5", "True",
                                                                                             "time_limit")
    failed = rows[("numpy", data["records"][2]["case_id"])]
    assert (failed["status"], failed["reason"], failed["n"], failed["median_s"]) == ("failed",
                                                                                     "relative L2 error 0.3", "", "")
    for row in rows.values():  # nothing formatted: no units or percent signs inside the cells
        assert not any(v.endswith(("%", " us", " ms", " s")) for v in row.values())
    # JSON: the records themselves (every field, tracebacks included)
    assert json.loads(CliRunner().invoke(cli, ["show", path, "--format", "json"]).output) == data["records"]


def test_the_roof_column_says_how_to_fill_it():
    text = records_table(_result()["records"], "table")
    assert "`kbench calibrate` measures them" in text


def test_status_summary_counts_records_below_min_samples():
    recs = _result()["records"]
    assert status_summary(recs) == "2 passed, 1 failed"
    assert status_summary(recs, 50) == "2 passed (2 below min_samples 50), 1 failed"


def test_kbench_run_summary_counts_records_below_min_samples(tmp_path):
    suite = tmp_path / "few.yaml"
    suite.write_text("version: 1\nname: few\nop: attention\nbackends: [numpy]\n"
                     "timing: {warmup_time: 0, min_samples: 1000, min_time: 0, max_time: 0.002}\n"
                     "grid: [{batch: 1, seqlen: 32, heads: 2, head_dim: 16, causal: false, dtype: fp32}]\n")
    res = CliRunner().invoke(cli, ["run", str(suite), "--no-isolate", "--progress", "-o", str(tmp_path / "r.json")])
    assert res.exit_code == 0, res.output
    assert "1 passed (1 below min_samples 1000)" in res.stderr
    # the progress bar says how long is left (0:00:00 once done)
    assert re.search(r"1/1 .*eta 0:00:00 numpy passed", res.stderr), res.stderr
    assert "n <1000: 1 passed records stopped sampling" in res.stdout


def test_kbench_list_rows_fit_140_characters_and_keep_every_word():
    from kbench.commands.list import WIDTH
    from kbench.plugins import PluginManager

    out = CliRunner().invoke(cli, ["list"])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert max(len(line) for line in lines) <= WIDTH == 140
    # a backend's reason that wrapped reads whole down its column
    start = lines.index("backends:")
    header = lines[start + 1]
    col = header.index("status")
    statuses, name = {}, None
    for line in lines[start + 3:]:
        if not line.strip():
            break
        if not line.startswith(" "):
            name = line.split()[0]
            statuses[name] = line[col:].strip()
        else:
            statuses[name] += " " + line[col:].strip()
    for b in PluginManager().registry.backends.values():
        reason = b.available()
        assert statuses[b.name] == ("available" if not reason else " ".join(f"unavailable: {reason}".split()))


def test_wide_columns_share_the_narrowing():
    from kbench.tables import MIN_WRAPPED, fit_widths, render

    rows = [["a", "x" * 10 + " word" * 40, "short", "y" * 5 + " word" * 30]]
    widths = fit_widths(["k", "reason", "s", "note"], rows, 100)
    assert widths[0] is None and widths[2] is None and widths[1] == widths[3] >= MIN_WRAPPED
    text = render(["k", "reason", "s", "note"], rows, "table", max_width=100)
    assert max(len(line) for line in text.splitlines()) <= 100
    assert " ".join(text.split()).count("word") == 70
    assert fit_widths(["k"], [["tiny"]], 100) is None
