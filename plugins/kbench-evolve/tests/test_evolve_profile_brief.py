"""The brief quotes Nsight Compute's figures of the champion and of the latest measured candidate, per case."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from kbench.profiling import profile_from_output
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
