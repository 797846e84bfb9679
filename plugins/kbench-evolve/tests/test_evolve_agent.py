"""The agent operator end to end against scripted model responses (litellm CustomLLM provider):
tool errors, rate limits, timeouts, a supervisor intervention, budgets, an outage, a kill and resume."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from click.testing import CliRunner

from kbench.testing import cli
from kbench_evolve.engine import Budget, make_state, run_evolution
from kbench_evolve.knowledge import KnowledgeBase
from kbench_evolve.replay import MODEL, install_script
from kbench_evolve.store import read_jsonl

from evolve_testlib import bad_seed_source, write_script

GOOD_PATCH = ('<<<<<<< SEARCH\n    "block_q": {"default": 8,\n=======\n    "block_q": {"default": 64,\n>>>>>>> REPLACE\n'
              '<<<<<<< SEARCH\n    "block_k": {"default": 8,\n=======\n    "block_k": {"default": 64,\n>>>>>>> REPLACE')
WRONG_SOURCE = bad_seed_source().replace("* np.float32(scale)", "* np.float32(scale * 1.5)")


def call(tool, **arguments):
    return {"name": tool, "arguments": arguments}


def run_agent(pm, lineage, script_items, tmp_path, *, budget=None, **options):
    script = write_script(tmp_path / "script.json", script_items)
    provider = install_script(script, lineage.root / "replay-position.json")
    opts = {"model": MODEL, "backoff": 0.0, "retries": 3, "rounds": 1, **options}
    state = make_state("agent", budget or Budget(iterations=1, max_steps=15), opts)
    status = run_evolution(pm, lineage, state, device="cpu", knowledge=KnowledgeBase(), echo=lambda s: None)
    return status, state, provider


def trajectory(lineage):
    out = []
    for path in sorted((lineage.root / "trajectories").glob("*.jsonl")):
        out += read_jsonl(path)
    return out


def test_agent_commits_through_the_real_tools_despite_errors_and_a_supervisor_redirect(pm, lineage, tmp_path):
    champion_source = lineage.champion().source
    script = [
        {"error": "rate_limit", "message": "429 slow down"},
        {"error": "timeout", "message": "took too long"},
        {"tool_calls": [call("list_versions"), call("list_knowledge")]},
        {"tool_calls": [call("read_knowledge", name="no-such.md"),
                        call("write_candidate", patch="<<<<<<< SEARCH\nnot in the file\n=======\nx\n>>>>>>> REPLACE"),
                        call("no_such_tool"), call("read_version", version="v9")]},
        {"tool_calls": [call("write_candidate", source=WRONG_SOURCE), call("check")]},
        {"tool_calls": [call("write_candidate", source=WRONG_SOURCE), call("check")]},  # same again: supervisor
        {"content": "Let me think about tile sizes."},
        {"tool_calls": [call("write_memory", note="scaling Q twice breaks correctness"),
                        call("write_candidate", source=champion_source), call("write_candidate", patch=GOOD_PATCH)]},
        {"tool_calls": [call("check"), call("benchmark", cases="noncausal"), call("profile")]},
        {"tool_calls": [call("submit", rationale="64x64 tiles: 64x fewer Python-level iterations")]},
    ]
    status, state, provider = run_agent(pm, lineage, script, tmp_path, repeat_limit=2, failure_limit=5)
    assert status == "finished"
    v2 = lineage.champion()
    assert v2.label == "v2" and v2.meta["operator"] == "agent"
    assert '"block_q": {"default": 64' in v2.source and '"block_k": {"default": 64' in v2.source
    assert v2.geomean > lineage.version("v1").geomean and v2.meta["decision"]["ci"][0] > 1
    assert v2.meta["rationale"].startswith("64x64 tiles")

    traj = trajectory(lineage)
    tool_out = {m["name"]: m["content"] for m in traj if m.get("role") == "tool" and m["name"] != "write_candidate"}
    tool_texts = [m["content"] for m in traj if m.get("role") == "tool"]
    assert "v1:" in tool_out["list_versions"]
    assert any(t.startswith("ERROR: no knowledge document") for t in tool_texts)
    assert any("does not occur" in t for t in tool_texts)
    assert any(t.startswith("ERROR: no tool 'no_such_tool'") for t in tool_texts)
    assert any(t.startswith("ERROR: lineage 't' has no version v9") for t in tool_texts)
    assert any(t.startswith("FAILED") and "relative L2" in t for t in tool_texts)
    assert "PASSED on all 2 cases" in tool_texts
    assert "geomean" in tool_out["benchmark"] and "noncausal" in tool_out["benchmark"]
    assert "median_s" in tool_out["profile"]
    assert any(m.get("role") == "user" and m["content"].startswith("SUPERVISOR: the same candidate")
               for m in traj)
    # the redirect reached the model in the next request
    assert any("SUPERVISOR" in str(m.get("content")) for m in provider.requests[-1])

    errors = [e["error"] for e in read_jsonl(lineage.root / "llm-errors.jsonl")]
    assert errors == ["RateLimitError", "Timeout"]
    spent = state["spent"]
    assert spent["tokens"] > 0 and spent["cost"] > 0 and spent["commits"] == 1
    assert "scaling Q twice" in lineage.read_memory()


def test_token_budget_stops_the_run_and_leaves_the_lineage_alone(pm, lineage, tmp_path):
    usage = {"prompt_tokens": 100, "completion_tokens": 50}
    script = [{"tool_calls": [call("list_versions")], "usage": usage}] * 10
    status, state, _ = run_agent(pm, lineage, script, tmp_path, budget=Budget(iterations=3, max_steps=10,
                                                                             max_tokens=400))
    assert status == "budget"
    assert state["spent"]["tokens"] == 450  # three calls; the fourth is refused before it is made
    assert [v.label for v in lineage.versions()] == ["v1"]


def test_outage_pauses_then_resume_continues_and_commits(pm, lineage, tmp_path):
    script = [{"error": "connection", "message": "network down"}] * 2 + [
        {"tool_calls": [call("write_candidate", patch=GOOD_PATCH)]},
        {"tool_calls": [call("submit", rationale="bigger tiles")]},
    ]
    status, state, _ = run_agent(pm, lineage, script, tmp_path, retries=1)
    assert status == "paused"
    assert [v.label for v in lineage.versions()] == ["v1"]
    saved = lineage.load_state()
    assert saved["status"] == "paused" and saved["spent"]["steps"] == 1

    res = CliRunner().invoke(cli, ["evolve", "resume", "t"])  # picks up the saved state and script position
    assert res.exit_code == 0, res.output
    assert lineage.champion().label == "v2" and lineage.champion().meta["operator"] == "agent"
    assert lineage.load_state()["status"] == "finished"


def test_kill_mid_submit_then_resume_loses_nothing(lineage, workspace, tmp_path):
    script = write_script(tmp_path / "kill.json", [
        {"tool_calls": [call("write_candidate", patch=GOOD_PATCH), call("write_memory", note="try 64")]},
        {"tool_calls": [call("submit", rationale="bigger tiles")]},
    ])
    env = {**os.environ, "KBENCH_EVOLVE_DIR": str(workspace)}
    proc = subprocess.Popen([sys.executable, "-m", "kbench.cli", "evolve", "run", "t", "--operator", "agent",
                             "--script", str(script), "--iterations", "1", "--rounds", "1", "--device", "cpu"],
                            env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        state = lineage.load_state() or {}
        if any(t["stage"] == "screening" for t in (state.get("in_flight") or {}).values()):  # inside the submit's
            break                                                                                # screening run
        time.sleep(0.05)
    assert proc.poll() is None, proc.stdout.read().decode()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    state = lineage.load_state()
    assert state["status"] == "running"  # killed, not finished
    assert "try 64" in lineage.read_memory()

    res = CliRunner().invoke(cli, ["evolve", "resume", "t"])
    assert res.exit_code == 0, res.output
    versions = lineage.versions()
    assert [v.label for v in versions] == ["v1", "v2"]
    assert '"block_q": {"default": 64' in versions[-1].source
    traj = trajectory(lineage)
    submits = [m for m in traj if m.get("role") == "tool" and m["name"] == "submit"]
    assert submits and submits[-1]["content"].startswith("COMMITTED as v2")
    assert lineage.load_state()["status"] == "finished"
    outcomes = [a["outcome"] for a in lineage.attempts() if a.get("operator") == "agent"]
    assert outcomes == ["interrupted", "committed"]  # the killed submit is logged, then measured again


def test_llm_operator_retries_a_malformed_patch_then_commits(pm, lineage, tmp_path):
    script = [{"content": "RATIONALE: bigger tiles\nI would change the blocks."},
              {"content": "RATIONALE: 64x64 tiles cut loop overhead\n" + GOOD_PATCH}]
    write_script(tmp_path / "script.json", script)
    install_script(tmp_path / "script.json", lineage.root / "replay-position.json")
    state = make_state("llm", Budget(iterations=1, max_steps=3), {"model": MODEL, "backoff": 0.0, "rounds": 1})
    status = run_evolution(pm, lineage, state, device="cpu", knowledge=KnowledgeBase(), echo=lambda s: None)
    assert status == "finished"
    v2 = lineage.champion()
    assert v2.meta["operator"] == "llm" and v2.meta["rationale"] == "64x64 tiles cut loop overhead"
    rejected = [a for a in lineage.attempts() if a.get("outcome") == "rejected"]
    assert rejected and rejected[0]["reason"].startswith("bad patch")
    traj = trajectory(lineage)
    prompt = traj[1]["content"]  # the brief: champion source, knowledge notes for its substrate, answer format
    assert "Champion source" in prompt and "branchless" in prompt.lower() and "def attention(" in prompt
    assert "Python overhead per tile" in prompt and "RATIONALE:" in prompt  # numpy-cpu-kernels.md, whole
    assert [m["role"] for m in traj] == ["system", "user", "assistant", "assistant"]
    assert all(m["call"]["prompt_tokens"] > 0 for m in traj if m["role"] == "assistant")
