"""kbench evolve against a hostile model or provider, round two: notes that broke the digest, numbers no counter
can hold, a provider that never finishes a reply or sends 80 MB, and any sequence of tool calls with restarts.

Providers are real HTTP servers on 127.0.0.1 (openai_server.py) reached through litellm's normal path."""
from __future__ import annotations

import json
import math
import shutil
import time

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from kbench.testing import cli
from kbench_evolve.llm import MAX_COUNT, _cost, _count
from kbench_evolve.prompt import fence, memory_text
from kbench_evolve.store import Lineage, read_jsonl

from openai_server import ScriptedOpenAI, drip, huge, reply


def evolve(*args, **env):
    return CliRunner().invoke(cli, ["evolve", *args], env=env or None, catch_exceptions=True)


def agent_run(server, *extra, command="run", steps="4"):
    more = ("--operator", "agent", "--iterations", "1", "--max-steps", steps, "--device", "cpu") \
        if command == "run" else ()
    return evolve(command, "t", *more, "--model", "openai/scripted", "--api-base", server.url, "--llm-retries", "0",
                  *extra)


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    """Lineage `t` of the badly tuned seed, measured once for the module; each test gets a copy."""
    from evolve_testlib import init_bad_seed_lineage

    return init_bad_seed_lineage(tmp_path_factory.mktemp("robust-seed"))


@pytest.fixture
def lineage(seeded, workspace):
    shutil.copytree(seeded, workspace / "t", ignore=shutil.ignore_patterns(".run.lock"))
    return Lineage.open(workspace, "t")


@pytest.fixture
def api_key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")


# -- the notes' digest ------------------------------------------------------------------------------------------

def test_a_note_of_a_dash_then_long_notes_leave_every_note_readable_in_the_digest():
    """A note ``-`` made an empty entry whose first line did not exist: IndexError at every later brief."""
    memory = "- -\n- \n" + "".join(f"- note {i}: " + "detail " * 60 + "\n" for i in range(15)) + "- -\n"
    text = memory_text(memory, cap=6000)
    assert "(older notes, first lines only)\n- -\n- note 0: detail" in text  # a blank note has no line
    assert "note 14: detail" in text
    assert text.rstrip().endswith("- -")  # the newest note, "-", shown as written


notes = st.lists(st.one_of(st.sampled_from(["-", "- ", " ", "\n", "- -", "\n- \n", "-\n-", "x" * 3000]),
                           st.text(min_size=0, max_size=400)), max_size=60)


@settings(max_examples=150, deadline=None)
@given(notes, st.integers(min_value=50, max_value=8000))
def test_the_digest_of_any_notes_never_fails_and_stays_near_its_cap(entries, cap):
    memory = "".join(f"- {n.strip()}\n" for n in entries)
    text = memory_text(memory, cap=cap)
    assert isinstance(text, str)
    assert len(text) <= max(len(memory), cap + cap // 3 + 400)


# -- numbers from a provider --------------------------------------------------------------------------------------

odd_json = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.integers(min_value=10**15, max_value=10**400),
              st.integers(max_value=-1), st.floats(allow_nan=True, allow_infinity=True),
              st.text(max_size=40), st.sampled_from(["NaN", "inf", "-1", "1e400", "12", " 7 ", "0x10", "10" * 30])),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12)


@settings(max_examples=400, deadline=None)
@given(odd_json)
def test_a_token_count_from_odd_json_is_a_bounded_whole_number_or_unknown(value):
    n = _count(value)
    assert n is None or (type(n) is int and 0 <= n < MAX_COUNT)
    c = _cost(value)
    assert c is None or (type(c) is float and math.isfinite(c) and c >= 0)


def test_plain_counts_are_taken_as_given():
    assert _count(1234) == 1234 and _count("1234") == 1234 and _count(12.0) == 12
    assert _count(10**400) is None and _count(float("nan")) is None and _count(-3) is None and _count(True) is None
    assert _cost(10**400) is None and _cost(-1.0) == 0.0 and _cost(0.25) == 0.25


def _usage_reply(usage):
    status, payload = reply("GIVE UP: done")
    payload["usage"] = usage
    return status, payload


@pytest.mark.parametrize("usage, code, status", [
    ({"prompt_tokens": 10**400, "completion_tokens": 5, "total_tokens": 10**400}, 0, "finished"),
    ({"prompt_tokens": 100, "completion_tokens": 5, "total_tokens": 105,
      "prompt_tokens_details": {"cached_tokens": 10**400}}, 0, "finished"),
    # litellm itself refuses a reply whose counts are not numbers: a provider error, the run paused intact
    ({"prompt_tokens": "many", "completion_tokens": [1], "total_tokens": {"a": 1}}, 3, "paused"),
], ids=["huge-prompt", "huge-cached", "strings-and-nesting"])
def test_a_provider_number_no_counter_holds_is_bounded_and_the_run_ends_cleanly(lineage, api_key, usage, code,
                                                                                 status):
    with ScriptedOpenAI([_usage_reply(usage)]) as server:
        res = agent_run(server)
    assert "Traceback" not in res.output and not isinstance(res.exception, (OverflowError, TypeError, ValueError))
    assert res.exit_code == code, res.output
    state = lineage.load_state()
    assert state["status"] == status and 0 <= state["spent"]["tokens"] < MAX_COUNT
    json.dumps(state, allow_nan=False)  # the state holds no number JSON cannot write back


# -- every model call under a wall-clock deadline; no reply read whole past a bound ------------------------------

def test_a_provider_sending_a_byte_every_2_s_ends_each_call_at_its_deadline_and_the_lineage_resumes(lineage,
                                                                                                    api_key):
    timeout = 4.0
    with ScriptedOpenAI([drip(2.0)]) as server:
        res = agent_run(server, "--llm-timeout", str(timeout))
        ended = time.monotonic()
    assert res.exit_code == 3, res.output  # a paused run: the model unavailable
    assert "Traceback" not in res.output and "deadline of 4 s" in res.output
    (arrived,) = server.arrivals
    assert ended - arrived < timeout + 2.0, ended - arrived  # the call's end and the pause, within 2 s of it
    errors = read_jsonl(lineage.root / "llm-errors.jsonl")
    assert errors and errors[-1]["kind"] == "transient" and "deadline" in errors[-1]["message"]
    with ScriptedOpenAI([reply("GIVE UP: the champion is good")]) as server:
        again = agent_run(server, command="resume")
    assert again.exit_code == 0, again.output
    assert lineage.load_state()["status"] == "finished"


def test_an_80_mb_reply_is_not_read_whole_and_the_run_pauses_cleanly(lineage, api_key):
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with ScriptedOpenAI([huge(80 * 2**20)]) as server:
        res = agent_run(server)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert res.exit_code == 3 and "Traceback" not in res.output, res.output
    errors = read_jsonl(lineage.root / "llm-errors.jsonl")
    assert "larger than" in errors[-1]["message"] and errors[-1]["kind"] == "transient"
    assert grown_mib < 80, grown_mib  # the body was cut at REPLY_BYTES, never held whole


# -- the champion's source reaches the model inside the fence ------------------------------------------------------

def test_the_champions_source_reaches_the_model_inside_the_fence(pm, lineage):
    from kbench_evolve.engine import Budget, Spent, VariationContext
    from kbench_evolve.fitness import Evaluator
    from kbench_evolve.prompt import brief

    ev = Evaluator(pm, lineage.current_suite(), lineage.scratch("runs"), device="cpu")
    ctx = VariationContext(pm, lineage, ev, Budget(), Spent(), {}, "agent")
    text = brief(ctx)
    champ = lineage.champion()
    assert fence(champ.source, f"the champion {champ.label}'s source") in text
    assert "```" not in text  # no Markdown block a docstring could close


# -- any sequence of tool calls, with resumes and restarts, leaves state that reads back ----------------------------

def test_random_tool_call_sequences_with_resume_and_restart_leave_readable_state(pm, seeded, tmp_path_factory):
    from kbench_evolve.engine import Budget, Spent, VariationContext
    from kbench_evolve.fitness import Evaluator
    from kbench_evolve.supervisor import Supervisor
    from kbench_evolve.tools import AgentTools

    odd_args = st.one_of(st.none(), st.text(max_size=60), st.sampled_from(["{", "[]", "null", '{"note": null}',
                                                                             '{"note": 1e400}', '{"version": "v\\u00b2"}',
                                                                             '{"source": "def f(:"}']))
    note_text = st.one_of(st.sampled_from(["-", "- ", "x", "\n- \n", "- -", "y" * 2000]), st.text(min_size=1,
                                                                                                  max_size=300))

    class Tools(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            ws = tmp_path_factory.mktemp("machine") / "evolve"
            shutil.copytree(seeded, ws / "t", ignore=shutil.ignore_patterns(".run.lock"))
            self.ws = ws
            self.noted: list[str] = []
            self.open()

        def open(self) -> None:
            """Resume: everything rebuilt from what is on disk."""
            self.lineage = Lineage.open(self.ws, "t")
            state = self.lineage.load_state() or {}
            ev = Evaluator(pm, self.lineage.current_suite(), self.lineage.scratch("runs"), device="cpu")
            self.ctx = VariationContext(pm, self.lineage, ev, Budget(), Spent(), state, "agent", echo=lambda s: None)
            self.tools = AgentTools(self.ctx, Supervisor(state))

        @rule(note=note_text)
        def write_memory(self, note):
            answer = self.tools.call("write_memory", json.dumps({"note": note}))
            if answer.startswith("noted"):
                self.noted.append(note.strip())

        @rule(name=st.sampled_from(["read_memory", "list_versions", "read_version", "list_knowledge",
                                    "write_candidate", "write_memory", "profile", "nope"]), args=odd_args)
        def any_call(self, name, args):
            answer = self.tools.call(name, args)
            assert isinstance(answer, str)

        @rule(version=st.sampled_from(["v1", "best", "latest", "v9", "champion"]))
        def read_version(self, version):
            answer = self.tools.call("read_version", json.dumps({"version": version}))
            assert answer.startswith("ERROR") or "<untrusted" in answer

        @rule()
        def save_and_resume(self):
            self.ctx.save()
            self.open()

        @rule()
        def restart(self):
            self.lineage.save_state(None)  # --restart: the unfinished run's state discarded
            self.open()

        @invariant()
        def state_reads_back(self):
            memory = self.lineage.read_memory()
            assert isinstance(memory, str)
            memory_text(memory, 6000)
            for note in self.noted[-5:]:  # far below the memory's bound: every recent note is there
                assert f"- {note}\n" in memory
            self.lineage.attempts()
            state = self.lineage.load_state()
            assert state is None or isinstance(state, dict)

    run_state_machine_as_test(Tools, settings=settings(max_examples=12, stateful_step_count=12, deadline=None,
                                                       suppress_health_check=list(HealthCheck)))
