"""A real model provider's failure modes, through litellm's normal HTTP path to a scripted OpenAI-compatible
server on 127.0.0.1 (``openai/...`` models with ``--api-base``): context overflow, unknown model, missing
key, unpriced model under --max-cost, and what the trajectory records of each call."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from kbench.testing import cli
from kbench_evolve.store import read_jsonl

from openai_server import CONTEXT_OVERFLOW, ScriptedOpenAI, reply


def evolve(*args, **env):
    return CliRunner().invoke(cli, ["evolve", *args], env=env or None)


def agent_run(server, *extra):
    return evolve("run", "t", "--operator", "agent", "--api-base", server.url, "--iterations", "1",
                  "--max-steps", "8", "--llm-retries", "0", "--device", "cpu", *extra)


@pytest.fixture
def api_key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")


def trajectory(lineage):
    out = []
    for path in sorted((lineage.root / "trajectories").glob("*.jsonl")):
        out += read_jsonl(path)
    return out


def test_context_overflow_compacts_the_conversation_and_the_run_continues(lineage, api_key):
    script = [reply(tool_calls=[("list_knowledge", {})]),
              reply(tool_calls=[("read_knowledge", {"name": "flashattention-2-3-4.md"})]),
              reply(tool_calls=[("read_knowledge", {"name": "attention-online-softmax.md"})]),
              reply(tool_calls=[("read_version", {})]),
              CONTEXT_OVERFLOW,
              reply("GIVE UP: nothing worth its cost", prompt_tokens=800, completion_tokens=20)]
    with ScriptedOpenAI(script) as server:
        res = agent_run(server, "--model", "openai/scripted")
    assert res.exit_code == 0, res.output
    assert "context window exceeded: conversation compacted" in res.output
    overflowed, after = server.requests[4], server.requests[5]
    size = lambda body: len(json.dumps(body["messages"]))  # noqa: E731
    assert size(after) < size(overflowed)
    elided = [m for m in after["messages"] if m["role"] == "tool" and str(m.get("content")).startswith("[elided")]
    assert elided and not any(str(m.get("content")).startswith("[elided") for m in overflowed["messages"])
    assert lineage.load_state()["status"] == "finished"
    errors = read_jsonl(lineage.root / "llm-errors.jsonl")
    assert [e["kind"] for e in errors] == ["overflow"] and errors[0]["status_code"] == 400 and errors[0]["time"]
    calls = [m["call"] for m in trajectory(lineage) if m.get("role") == "assistant"]
    assert len(calls) == 5 and calls[-1]["prompt_tokens"] == 800 and calls[-1]["completion_tokens"] == 20
    assert all(c["time"] and c["latency_s"] >= 0 for c in calls)


def test_unknown_model_exits_2_state_saved_then_resume_with_another_model(lineage, api_key):
    with ScriptedOpenAI([reply("GIVE UP: the champion is good")], reject=("gpt-nope",)) as server:
        res = agent_run(server, "--model", "openai/gpt-nope")
        assert res.exit_code == 2, res.output
        assert "does not exist" in res.output and "Traceback" not in res.output
        assert "kbench evolve resume t" in res.output
        state = lineage.load_state()
        assert state["status"] == "provider-error" and "does not exist" in state["error"]["message"]
        assert [e["kind"] for e in read_jsonl(lineage.root / "llm-errors.jsonl")] == ["fatal"]
        assert len(server.requests) == 1  # not retried: retrying cannot fix an unknown model

        res = evolve("run", "t", "--operator", "agent", "--model", "openai/other", "--api-base", server.url)
        assert res.exit_code == 2 and "unfinished agent run (provider-error)" in res.output

        res = evolve("resume", "t", "--model", "openai/scripted")
        assert res.exit_code == 0, res.output
    assert [r["model"] for r in server.requests] == ["gpt-nope", "scripted"]
    state = lineage.load_state()
    assert state["status"] == "finished" and state["options"]["model"] == "openai/scripted"
    assert state["changes"][-1]["from"] == {"model": "openai/gpt-nope"}
    assert state["changes"][-1]["to"] == {"model": "openai/scripted"}


def test_missing_api_key_exits_2_at_once(lineage, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with ScriptedOpenAI([reply("GIVE UP")]) as server:
        res = agent_run(server, "--model", "openai/scripted")
    assert res.exit_code == 2 and "OPENAI_API_KEY is not set" in res.output and "Traceback" not in res.output
    assert server.requests == [] and lineage.load_state() is None  # refused before anything ran


def test_unpriced_model_with_max_cost_is_refused_unless_priced(lineage, api_key):
    with ScriptedOpenAI([reply("GIVE UP: done", prompt_tokens=2000, completion_tokens=500)]) as server:
        res = agent_run(server, "--model", "openai/my-local-model", "--max-cost", "1")
        assert res.exit_code == 2 and "--price-input" in res.output and server.requests == []
        res = agent_run(server, "--model", "openai/my-local-model", "--max-cost", "1",
                        "--price-input", "3", "--price-output", "15")
        assert res.exit_code == 0, res.output
    spent = lineage.load_state()["spent"]
    assert spent["cost"] == pytest.approx((2000 * 3 + 500 * 15) / 1e6) and spent["unpriced_calls"] == 0


def test_an_unpriced_call_is_shown_as_unknown_never_zero(lineage, api_key):
    with ScriptedOpenAI([reply("GIVE UP: done")]) as server:
        res = agent_run(server, "--model", "openai/my-local-model")
    assert res.exit_code == 0, res.output
    assert "cost unknown (1 unpriced model calls" in res.output and "$0.0000," not in res.output
    assert lineage.load_state()["spent"]["unpriced_calls"] == 1


def test_transient_errors_are_retried_and_logged_with_their_time(lineage, api_key):
    from openai_server import error

    script = [error(429, "Rate limit reached, retry later", "rate_limit_exceeded"),
              error(503, "The server is overloaded"),
              reply("GIVE UP: nothing to try")]
    with ScriptedOpenAI(script) as server:
        res = evolve("run", "t", "--operator", "agent", "--api-base", server.url, "--model", "openai/scripted",
                     "--iterations", "1", "--llm-retries", "2", "--device", "cpu")
    assert res.exit_code == 0, res.output
    assert len(server.requests) == 3 and res.output.count("! model call failed") == 2
    errors = read_jsonl(lineage.root / "llm-errors.jsonl")
    assert [(e["kind"], e["status_code"]) for e in errors] == [("transient", 429), ("transient", 503)]
    assert all(e["time"] for e in errors) and lineage.load_state()["status"] == "finished"
