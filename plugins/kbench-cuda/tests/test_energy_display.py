"""Energy in `kbench show` and `kbench report`: a real result file whose passed records carry the
``telemetry.energy`` the sustained loop writes (kbench_cuda.nvml.sustained_summary)."""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kbench.testing import cli as kbench_main
from kbench_cuda.nvml import sustained_summary

ROOT = Path(__file__).resolve().parents[3]
REFERENCE_RUN = ROOT / "results" / "cpu-amd-epyc-2c" / "attention-20261129-183310.json"


@pytest.fixture
def result_with_energy(tmp_path) -> tuple[Path, dict]:
    if not REFERENCE_RUN.exists():
        pytest.skip("the committed reference run is not here")
    data = json.loads(REFERENCE_RUN.read_text())
    passed = [r for r in data["records"] if r["status"] == "passed"]
    # a 2 s loop of 200 calls, 300 J: 150 W average, 1.5 J per call
    energy = {**sustained_summary(10_000, 310_000, 2.0, 200, [], idle_w=60.0, limit_w=700.0),
              "method": "sustained loop"}
    passed[0]["telemetry"] = {**(passed[0].get("telemetry") or {}), "energy": energy,
                              "after": {"power_limit_w": 700.0}, "throttled_samples": [1, 2]}
    path = tmp_path / "with-energy.json"
    path.write_text(json.dumps(data))
    return path, passed[0]


def test_show_has_energy_columns_only_when_measured(result_with_energy):
    path, rec = result_with_energy
    out = CliRunner().invoke(kbench_main, ["show", str(path), "--format", "csv"])
    assert out.exit_code == 0, out.output
    rows = list(csv.reader(io.StringIO(out.output)))
    assert rows[0][-3:] == ["joules_per_call", "average_w", "tflop_per_s_per_w"]
    row = next(r for r in rows if r[0] == rec["case_id"] and r[1] == rec["backend"])
    assert [float(v) for v in row[-3:]] == pytest.approx([1.5, 150, rec["metrics"]["tflops"] / 150])
    assert all(r[-3:] == ["", "", ""] for r in rows[1:] if r and r is not row)
    plain = CliRunner().invoke(kbench_main, ["show", str(REFERENCE_RUN), "--format", "csv"])
    assert plain.exit_code == 0 and "joules_per_call" not in plain.output.splitlines()[0]
    table = CliRunner().invoke(kbench_main, ["show", str(path)]).output
    assert "J/call" in table and "TFLOP/s/W" in table


def test_report_has_an_energy_table(result_with_energy, tmp_path):
    path, rec = result_with_energy
    html_path = tmp_path / "report.html"
    out = CliRunner().invoke(kbench_main, ["report", str(path), "-o", str(html_path)])
    assert out.exit_code == 0, out.output
    html = html_path.read_text()
    section = html[html.index('<section id="energy-'):]
    section = section[:section.index("</section>")].replace("<wbr>", "")  # break opportunities in long ids
    assert rec["case_id"] in section and ">1.5<" in section and ">150<" in section and ">700<" in section
    assert ">60<" in section and "sustained loop" in section  # the idle power, and how the figures were taken
