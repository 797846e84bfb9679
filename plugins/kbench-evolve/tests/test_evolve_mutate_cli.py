"""mutate on the CPU improves a deliberately bad tunable setting; CLI, backends, transfer, operator hook."""
from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner

from kbench.testing import cli
from kbench.api import PluginError
from kbench_evolve import source as src


def test_mutate_commits_a_faster_setting_of_a_badly_tuned_seed(lineage, workspace):
    res = CliRunner().invoke(cli, ["evolve", "run", "t", "--operator", "mutate", "--iterations", "1",
                                   "--max-steps", "4", "--rounds", "1", "--device", "cpu"])
    assert res.exit_code == 0, res.output
    versions = lineage.versions()
    assert len(versions) == 2, res.output
    v1, v2 = versions
    assert v2.meta["operator"] == "mutate" and v2.meta["parent"] == 1
    # the stored geomeans were measured minutes apart under whatever load there was: the commit rests on the
    # interleaved re-measurement, whose bootstrap interval must lie above 1
    assert v2.geomean > 0
    d = v2.meta["decision"]
    assert d["commit"] and d["ci"][0] > 1.0  # beat the re-measured champion beyond noise
    before = {k: s["default"] for k, s in src.tunables(v1.source).items()}
    after = {k: s["default"] for k, s in src.tunables(v2.source).items()}
    assert after != before and all(after[k] >= before[k] for k in before)  # bigger tiles than 8 are faster
    assert any(a.get("outcome") == "committed" and a.get("version") == "v2" for a in lineage.attempts())
    assert json.loads((lineage.root / "state.json").read_text())["status"] == "finished"

    log = CliRunner().invoke(cli, ["evolve", "log", "t", "--attempts"])
    assert log.exit_code == 0 and log.output.index("version v2") < log.output.index("version v1")
    assert f"{v2.geomean:.4g} TFLOP/s" in log.output
    diff = CliRunner().invoke(cli, ["evolve", "diff", "t", "v2"])
    moved = [line for line in diff.output.splitlines() if line and line[0] in "+-" and not line.startswith(("+++", "---"))]
    assert len(moved) in (2, 4) and all('"block_' in line and '"default"' in line for line in moved)
    show = CliRunner().invoke(cli, ["evolve", "show", "t", "v1", "--no-source"])
    assert "seed" in show.output and "causal" in show.output


def test_evolved_backends_are_registered_untrusted_and_run(lineage, workspace, tiny_suite):
    from kbench.api import RunRequest, get_plugin_manager, load_suite, plan_run, run_suite

    pm = get_plugin_manager(fresh=True)
    names = {b for b in pm.registry.backends if b.startswith("evolved:")}
    assert names == {"evolved:t", "evolved:t@v1"}
    backend = pm.registry.backends["evolved:t"]
    assert backend.trusted is False and backend.source_path.endswith("v0001/kernel.py")
    assert backend.tunables["block_q"].default == 8
    planned = plan_run(pm, RunRequest(suite=load_suite(tiny_suite), device="cpu", backend_patterns=["evolved:t"],
                                      output=workspace.parent / "r.json"))
    records = run_suite(pm, planned).records
    assert [r["status"] for r in records] == ["passed", "passed"]


def test_init_refuses_an_incorrect_seed_and_leaves_nothing(workspace, tiny_suite, tmp_path):
    wrong = tmp_path / "wrong.py"
    wrong.write_text("def attention(q, k, v, out, *, causal, scale):\n    out[...] = 0\n")
    res = CliRunner().invoke(cli, ["evolve", "init", "w", "--seed", str(wrong), "--suite", str(tiny_suite),
                                   "--device", "cpu"])
    assert res.exit_code == 2 and "not correct" in res.output
    assert not (workspace / "w").exists()


def test_transfer_moves_the_lineage_to_a_gqa_suite(lineage, workspace, gqa_suite):
    res = CliRunner().invoke(cli, ["evolve", "transfer", "t", "--suite", str(gqa_suite), "--device", "cpu"])
    assert res.exit_code == 0, res.output
    v2 = lineage.champion()
    assert v2.meta["operator"] == "transfer" and v2.meta["suite_origin"] == str(gqa_suite.resolve())
    assert all("hq=4,hkv=2" in c for c in v2.scores) and v2.geomean > 0
    # the lineage keeps its own copy of the suite, by content
    copy = lineage.current_suite()
    assert copy.startswith(str(lineage.root / "suites")) and open(copy).read() == gqa_suite.read_text()


def test_run_refuses_to_clobber_an_unfinished_run(lineage):
    lineage.save_state({"operator": "mutate", "status": "running", "spent": {}, "budget": {}})
    res = CliRunner().invoke(cli, ["evolve", "run", "t", "--operator", "mutate"])
    assert res.exit_code == 2 and "resume" in res.output


def test_llm_operators_need_a_model(lineage, monkeypatch):
    monkeypatch.delenv("KBENCH_EVOLVE_MODEL", raising=False)
    res = CliRunner().invoke(cli, ["evolve", "run", "t", "--operator", "agent"])
    assert res.exit_code == 2 and "KBENCH_EVOLVE_MODEL" in res.output


class FakeOperator:
    name = "mutate"
    description = "a third party's operator with a clashing name"
    uses_llm = False


def test_operators_come_from_the_hook_and_duplicates_name_both_plugins(pm):
    import kbench
    from kbench_evolve.operators import operator_registry

    reg = operator_registry(pm)
    assert {"mutate", "llm", "agent"} <= set(reg.operators) and reg.owners["agent"] == "evolve"

    class ThirdParty:
        @kbench.hookimpl
        def kbench_evolve_register_operators(self, registry):
            registry.add(FakeOperator)

    pm.pm.register(ThirdParty(), name="thirdparty")
    pm._kbench_evolve_operators = None
    with pytest.raises(PluginError, match="'evolve'.*'thirdparty'"):
        operator_registry(pm)


def test_bench_call_and_wall_time_budgets_stop_mutate_cleanly(pm, lineage):
    from kbench_evolve.engine import Budget, make_state, run_evolution

    state = make_state("mutate", Budget(iterations=5, max_steps=5, max_bench_calls=1), {"rounds": 2})
    assert run_evolution(pm, lineage, state, device="cpu", echo=lambda s: None) == "budget"
    assert state["spent"]["bench_calls"] == 1 and [v.label for v in lineage.versions()] == ["v1"]
    seed, candidate = lineage.attempts()  # the seed, and the one candidate the budget allowed
    assert candidate["outcome"] in ("rejected", "abandoned") and candidate["operator"] == "mutate"

    state = make_state("mutate", Budget(iterations=5, max_time=0.001), {"rounds": 1})
    time.sleep(0.01)
    assert run_evolution(pm, lineage, state, device="cpu", echo=lambda s: None) == "budget"
    assert state["spent"]["bench_calls"] == 0
