"""Failures of the environment are never the candidate's; screening compares with the champion measured
alongside; --unattended waits through outages with capped backoff up to its limit."""
from __future__ import annotations

import numpy as np
import pytest

from kbench.testing import sandbox_unavailable
from kbench_evolve import source as src
from kbench_evolve.engine import Budget, Spent, VariationContext, make_state, run_evolution
from kbench_evolve.fitness import Evaluator, infrastructure_reason, screen_verdict


def candidate_of(lineage) -> str:
    return src.with_tunables(lineage.champion().source, {"block_q": 16, "block_k": 16})


def test_an_environment_failure_never_marks_or_blacklists_the_candidate(pm, lineage, monkeypatch):
    sandbox_unavailable(monkeypatch)
    waits: list[float] = []
    state = make_state("mutate", Budget(iterations=1, max_steps=1), {"rounds": 1, "infra_retries": 1})
    assert run_evolution(pm, lineage, state, device="cpu", echo=lambda s: None, sleep=waits.append) == "environment"
    assert waits == [5.0]  # retried once, after the backoff, before giving up
    tried = [a for a in lineage.attempts() if a["operator"] == "mutate"]
    assert [a["outcome"] for a in tried] == ["environment"] and "simulated" in tried[0]["reason"]
    assert lineage.load_state()["status"] == "environment"

    monkeypatch.undo()  # the sandbox is back: the same candidate is measured, not refused as tried before
    ev = Evaluator(pm, lineage.current_suite(), lineage.scratch("runs"), device="cpu", rounds=1)
    ctx = VariationContext(pm, lineage, ev, Budget(), Spent(), {}, "mutate", echo=lambda s: None)
    source = src.with_tunables(lineage.champion().source, tried[0]["tunables"])
    assert ctx.attempted(src.sha(source)) is None
    result = ctx.submit(source, rationale="again")
    assert "tried" not in result.reason and "environment" not in result.reason
    assert lineage.attempts()[-1]["outcome"] in ("committed", "rejected") and "speedup" in result.reason  # measured


def test_a_candidate_that_does_not_load_is_its_own_failure_not_the_runs(pm, lineage):
    ev = Evaluator(pm, lineage.current_suite(), lineage.scratch("runs"), device="cpu", rounds=1)
    ctx = VariationContext(pm, lineage, ev, Budget(), Spent(), {}, "mutate", echo=lambda s: None)
    bad = lineage.champion().source.replace('SUBSTRATE = "numpy"', 'SUBSTRATE = "nope"')
    result = ctx.submit(bad, rationale="unknown substrate")
    assert not result.committed and result.reason.startswith("incorrect") and "SUBSTRATE" in result.reason
    assert lineage.attempts()[-1]["outcome"] == "rejected"


def test_infrastructure_records_are_told_apart_from_the_kernels_failures():
    assert infrastructure_reason({"status": "error", "reason": "sandbox unavailable", "cause": "infrastructure"})
    assert infrastructure_reason({"status": "error", "reason": "worker failed to start: worker died (exit 1)"})
    assert infrastructure_reason({"status": "crashed", "reason": "worker exited with status 1"}) is None
    assert infrastructure_reason({"status": "incorrect", "reason": "rel_l2 0.3 above 1e-05"}) is None


@pytest.mark.parametrize("max_outage, expected", [(100.0, "finished"), (4.0, "environment")])
def test_unattended_waits_through_an_outage_with_capped_backoff(pm, lineage, monkeypatch, max_outage, expected):
    # every refused record asks the probe once: 6 per screening run (champion, candidate, champion again
    # x 2 cases); 4 outages in a row
    sandbox_unavailable(monkeypatch, calls=24)
    waits: list[float] = []
    opts = {"rounds": 1, "infra_retries": 0, "unattended": True, "max_outage": max_outage,
            "outage_first_wait": 1.0, "outage_wait_cap": 3.0}
    state = make_state("mutate", Budget(iterations=1, max_steps=1), opts)
    status = run_evolution(pm, lineage, state, device="cpu", echo=lambda s: None, sleep=waits.append)
    assert status == expected
    if expected == "finished":
        assert waits == [1.0, 2.0, 3.0, 3.0]  # doubled, capped at 3
        assert [o["kind"] for o in state["outages"]] == ["environment"] * 4
        outcomes = [a["outcome"] for a in lineage.attempts() if a["operator"] == "mutate"]
        assert outcomes[:4] == ["environment"] * 4 and outcomes[4] in ("committed", "rejected")
    else:
        assert waits == [1.0, 2.0]  # the next wait (3 s) would pass the 4 s limit: paused
    assert not any(a["outcome"] == "rejected" and "sandbox" in a.get("reason", "") for a in lineage.attempts())


def test_screening_keeps_a_copy_of_the_champion_under_noise_and_drops_a_clearly_slower_one():
    rng = np.random.default_rng(7)
    cases = [f"c{i}" for i in range(4)]
    for trial in range(40):
        base = {c: rng.uniform(1e-3, 5e-2) for c in cases}
        drift = rng.uniform(0.92, 1.08)  # the load moved between the two kernels' turns
        champ = {c: list(base[c] * rng.lognormal(0, 0.2, 7)) for c in cases}
        copy = {c: list(base[c] * drift * rng.lognormal(0, 0.2, 7)) for c in cases}
        slower = {c: list(base[c] / 0.6 * rng.lognormal(0, 0.2, 7)) for c in cases}
        keep, why = screen_verdict(champ, copy, seed=trial)
        assert keep, f"trial {trial}: a copy of the champion was dropped: {why}"
        keep, why = screen_verdict(champ, slower, seed=trial)
        assert not keep and "clearly slower" in why
