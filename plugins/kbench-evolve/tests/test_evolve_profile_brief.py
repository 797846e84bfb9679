"""The brief quotes Nsight Compute's figures of the champion and of the latest measured candidate, per case."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from kbench.api import profile_from_output
from kbench_evolve.prompt import profiles_text

DATA = Path(__file__).resolve().parents[3] / "tests" / "data"


def test_champion_and_latest_candidate_profiles_are_quoted_per_case():
    hopper = {"tool": "ncu", **profile_from_output((DATA / "ncu-details-triton-hopper.csv").read_text())}
    training = {"tool": "ncu", **profile_from_output((DATA / "ncu-raw-triton-fwd-bwd.csv").read_text())}
    champion = SimpleNamespace(label="v3", meta={"profile": {
        "attention[d=128,causal]": {"median_s": 1.6e-3, "ncu": hopper},
        "attention[d=64]": {"median_s": 1e-3}}})  # measured without the profiler: left out
    attempts = [{"label": "a1", "outcome": "rejected",
                 "profile": {"attention[d=128,causal]": {"median_s": 3e-3, "ncu": training}}},
                {"label": "a2", "outcome": "failed", "profile": {"attention[d=128,causal]": {"median_s": 2e-3}}}]
    # the latest attempt without Nsight Compute's figures (a2) is not the one quoted
    text = profiles_text(champion, attempts)
    lines = text.splitlines()
    assert lines[0] == "Champion v3:"
    assert lines[1].startswith("- attention[d=128,causal]: ncu: 1.62 ms in 1 kernel(s)") and "tensor pipe 66.8%" in lines[1]
    assert "attention[d=64]" not in text
    assert lines[2] == "Latest measured candidate (a1, rejected):"
    assert "2.945 ms in 4 kernel(s)" in lines[3] and "250 registers/thread" in lines[3]


def test_no_profiles_no_text():
    assert profiles_text(SimpleNamespace(label="v0", meta={}), [{"label": "a"}]) == ""


def test_a_measurement_keeps_the_records_ncu_profile_for_the_brief():
    from kbench_evolve.fitness import measurement_from_records

    ok = {"tool": "ncu", **profile_from_output((DATA / "ncu-details-triton-hopper.csv").read_text())}
    assert ok["status"] == "ok"
    base = {"status": "passed", "metrics": {"tflops": 500.0, "flops": 1e12}, "stats": {"median": 2e-3},
            "timing": {"samples": [2e-3] * 3}, "correctness": {"rel_l2": 1e-3}}
    records = [{**base, "case_id": "attention[profiled]", "profile": ok},
               {**base, "case_id": "attention[no-ncu]", "profile": {"tool": "ncu", "status": "skipped",
                                                                    "reason": "ncu is not on PATH"}}]
    m = measurement_from_records("k.py", None, records)
    assert m.profile["attention[profiled]"]["ncu"] is ok and "ncu" not in m.profile["attention[no-ncu]"]
    text = profiles_text(SimpleNamespace(label="v1", meta={"profile": m.profile}), [])
    assert "attention[profiled]" in text and "tensor pipe" in text and "no-ncu" not in text


def test_evolve_run_profile_asks_for_profiles_on_screenings_only(lineage):
    """--profile ncu: each screening run profiles its passed records (on the CPU ncu says why not, in the record);
    checks and duels are never profiled; the option is kept for a resume."""
    import json

    from click.testing import CliRunner

    from kbench.api import load_result
    from kbench.testing import cli

    res = CliRunner().invoke(cli, ["evolve", "run", "t", "--operator", "mutate", "--iterations", "1", "--max-steps",
                                   "1", "--rounds", "1", "--device", "cpu", "--profile", "ncu"])
    assert res.exit_code == 0, res.output
    assert json.loads((lineage.root / "state.json").read_text())["options"]["profile"] == "ncu"
    kinds = {}
    for path in sorted((lineage.root / "runs").glob("*.json")):
        kind = next((k for k in ("screen", "check", "duel", "bench") if f"-{k}" in path.name), "other")
        for rec in load_result(path)["records"]:
            kinds.setdefault(kind, []).append(rec.get("profile"))
    assert kinds.get("screen"), kinds.keys()
    assert all(p and p["status"] == "skipped" and "'cpu'" in p["reason"] for p in kinds["screen"] if p), kinds
    assert any(kinds["screen"])
    assert not any(p for k in ("check", "duel") for p in kinds.get(k, []))
