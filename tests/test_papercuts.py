"""Papercuts a new user hit: a CPU run's log buried under skipped lines, `kbench plan` claiming a ranking by
goodput per dollar with no prices, a Case without the dict's ``get``."""
from __future__ import annotations

import io
from pathlib import Path

from click.testing import CliRunner

from kbench.cli import cli

ROOT = Path(__file__).resolve().parents[1]


def test_progress_lines_give_one_line_per_skipped_backend_not_one_per_skipped_record():
    import kbench.commands.run as run

    out = io.StringIO()
    lines = run._progress_lines(out, 10)
    try:
        for i in range(4):
            lines({"backend": "numpy", "case_id": f"attention[{i}]", "status": "passed"}, 2 * i + 1, 10)
            lines({"backend": "cuda-flash", "case_id": f"attention[{i}]", "status": "skipped",
                   "reason": "no CUDA device here"}, 2 * i + 2, 10)
        lines({"backend": "torch-sdpa", "case_id": "attention[9]", "status": "skipped", "reason": "fp8: not taken"},
              9, 10)
        lines({"backend": "torch-sdpa", "case_id": "attention[10]", "status": "skipped", "reason": "window: no"},
              10, 10)
    finally:
        lines.stop()
        lines.stop()  # a second stop writes nothing more
    text = out.getvalue().splitlines()
    assert sum("numpy attention[" in t for t in text) == 4 and not any("cuda-flash attention[" in t for t in text)
    skipped = [t for t in text if "skipped" in t]
    assert len(skipped) == 2
    assert skipped[0].endswith("] cuda-flash: 4 records skipped: no CUDA device here")
    assert skipped[1].endswith("] torch-sdpa: 2 records skipped: fp8: not taken (1); window: no (1)")


def test_plan_says_what_it_ranks_by_when_no_hardware_has_a_price(monkeypatch):
    monkeypatch.chdir(ROOT)
    argv = ["plan", "--model", "llama-3.1-8b", "--isl", "512", "--osl", "64", "--simulate", "0"]
    unpriced = CliRunner().invoke(cli, argv + ["--hardware", "h200"])
    assert unpriced.exit_code == 0, unpriced.output
    head = unpriced.output.splitlines()[0]
    assert "ranked by the fewest devices meeting the SLO" in head and "no hardware here has a price" in head
    assert "--price" in head
    priced = CliRunner().invoke(cli, argv + ["--hardware", "h200", "--price", "h200=3.5"])
    assert priced.exit_code == 0 and priced.output.splitlines()[0].endswith("ranked by goodput per dollar")


def test_a_case_reads_like_the_dict_of_its_parameters():
    from kbench.plugins import PluginManager

    case = PluginManager(load_entry_points=False).registry.op("attention").make_case(
        {"seqlen": 64, "heads": 2, "head_dim": 32})
    assert case.get("seqlen_q") == 64 == case["seqlen_q"]
    assert case.get("no_such_parameter") is None and case.get("no_such_parameter", 7) == 7
    assert "causal" in case and "no_such_parameter" not in case
    assert dict(case.items()) == case.to_json() and set(case.keys()) == set(case.to_json())
