"""Lineage store (atomic commits, torn logs, stale temp dirs), kernel-source editing, statistics."""
from __future__ import annotations

import os

import numpy as np
import pytest

from kbench.api import BadInput
from kbench_evolve import source as src
from kbench_evolve.fitness import speedup_interval
from kbench_evolve.store import IN_FLIGHT, Lineage, read_jsonl

from evolve_testlib import bad_seed_source


def suite_file(tmp_path) -> str:
    path = tmp_path / "s.yaml"
    path.write_text("version: 1\nname: s\nop: attention\ngrid: [{seqlen: 16}]\n")
    return str(path)


def test_lineage_keeps_its_suite_by_content_and_works_from_another_directory(tmp_path, monkeypatch):
    lin = Lineage.create(tmp_path / "ws", "x", seed=tmp_path / "s.py", suite_path=suite_file(tmp_path))
    stored = lin.meta["suite"]
    assert stored.startswith("suites/") and lin.meta["suite_origin"] == str((tmp_path / "s.yaml").resolve())
    (tmp_path / "s.yaml").write_text("changed later")  # the original may change or go: the copy stays
    monkeypatch.chdir(tmp_path / "ws")
    assert open(lin.current_suite()).read().startswith("version: 1") and lin.current_suite_record() == stored


def test_commit_numbers_versions_and_champion_is_newest(tmp_path):
    lin = Lineage.create(tmp_path, "x", seed=tmp_path / "s.py", suite_path=suite_file(tmp_path))
    v1 = lin.commit("A = 1\n", {"geomean": 1.0, "suite": "s.yaml"})
    v2 = lin.commit("A = 2\n", {"geomean": 2.0, "parent": 1, "suite": "s.yaml"})
    assert (v1.label, v2.label) == ("v1", "v2")
    assert lin.champion().source == "A = 2\n"
    assert lin.version("v1").source == "A = 1\n" and lin.version("@v1").number == 1 and lin.version(2).number == 2
    with pytest.raises(BadInput, match="no version"):
        lin.version("v9")
    with pytest.raises(BadInput, match="already exists"):
        Lineage.create(tmp_path, "x", seed=tmp_path / "s.py", suite_path=suite_file(tmp_path))


def test_what_a_killed_process_left_is_ignored_then_cleaned_by_the_next_holder(tmp_path):
    lin = Lineage.create(tmp_path, "x", seed=tmp_path / "s.py", suite_path=suite_file(tmp_path))
    lin.commit("A = 1\n", {"geomean": 1.0, "suite": "s.yaml"})
    stale = lin.root / "versions" / ".tmp-abc"
    stale.mkdir()
    (stale / "kernel.py").write_text("half")
    unfinished = lin.root / "runs" / IN_FLIGHT / "20260101-screen"
    unfinished.mkdir(parents=True)
    (unfinished / "20260101-screen.json").write_text("{")
    assert [v.label for v in lin.versions()] == ["v1"]
    Lineage.open(tmp_path, "x")  # reading a lineage removes nothing: another process may be writing these
    assert stale.exists() and unfinished.exists()
    with Lineage.open(tmp_path, "x").hold() as lease:
        assert not stale.exists() and not (lin.root / "runs" / IN_FLIGHT).exists()
        assert lease.previous is None and lin.holder()["pid"] == os.getpid() and not lin.holder()["ended"]
        with pytest.raises(BadInput, match=f"being measured by another process \\(pid {os.getpid()}"):
            with lin.hold():
                pass
        assert lin.commit("A = 3\n", {"geomean": 3.0, "suite": "s.yaml"}).label == "v2"
    assert lin.holder()["ended"] and lin.holder()["token"] == lease.token
    with lin.hold() as again:  # the next holder sees that the one before ended (not killed)
        assert again.previous["token"] == lease.token and again.previous["ended"]


def test_attempts_log_survives_a_torn_last_line(tmp_path):
    lin = Lineage.create(tmp_path, "x", seed=tmp_path / "s.py", suite_path=suite_file(tmp_path))
    lin.log_attempt({"outcome": "rejected", "reason": "slow"})
    with open(lin.attempts_path, "a") as fh:
        fh.write('{"outcome": "rejec')  # killed mid-append
    assert [a["reason"] for a in read_jsonl(lin.attempts_path)] == ["slow"]


def test_with_tunables_rewrites_only_the_defaults():
    text = bad_seed_source()
    new = src.with_tunables(text, {"block_k": 64})
    t = src.tunables(new)
    assert t["block_k"]["default"] == 64 and t["block_q"]["default"] == 8
    assert t["block_k"]["choices"] == [8, 16, 32, 64, 128]
    changed = [(a, b) for a, b in zip(text.splitlines(), new.splitlines()) if a != b]
    assert changed == [('    "block_k": {"default": 8, "choices": [8, 16, 32, 64, 128]},',
                        '    "block_k": {"default": 64, "choices": [8, 16, 32, 64, 128]},')]


def test_patch_must_match_exactly_once():
    text = "a = 1\nb = 2\na = 1\n"
    assert src.apply_patch("x = 1\n", "<<<<<<< SEARCH\nx = 1\n=======\nx = 2\n>>>>>>> REPLACE") == "x = 2\n"
    with pytest.raises(src.PatchError, match="occurs 2 times"):
        src.apply_patch(text, "<<<<<<< SEARCH\na = 1\n=======\na = 3\n>>>>>>> REPLACE")
    with pytest.raises(src.PatchError, match="does not occur"):
        src.apply_patch(text, "<<<<<<< SEARCH\nz = 1\n=======\nz = 3\n>>>>>>> REPLACE")
    with pytest.raises(src.PatchError, match="no SEARCH/REPLACE"):
        src.apply_patch(text, "just rewrite it")


def test_speedup_interval_separates_real_gains_from_noise():
    rng = np.random.default_rng(1)
    champ = {c: list(1.0 + 0.05 * rng.standard_normal(12)) for c in "abc"}
    faster = {c: list(0.5 + 0.025 * rng.standard_normal(12)) for c in "abc"}
    same = {c: list(1.0 + 0.05 * rng.standard_normal(12)) for c in "abc"}
    point, (lo, hi) = speedup_interval(champ, faster)
    assert 1.8 < point < 2.2 and lo > 1.5
    point, (lo, hi) = speedup_interval(champ, same)
    assert lo < 1.0 < hi


def test_knowledge_base_ships_notes_and_takes_user_folders(tmp_path, monkeypatch):
    from kbench_evolve.knowledge import KnowledgeBase

    kb = KnowledgeBase()
    for doc in ("attention-online-softmax.md", "avo-optimisations.md", "flashattention-2-3-4.md",
                "hopper-blackwell-tips.md", "numpy-cpu-kernels.md", "kernel-files.md"):
        assert doc in kb.names()
    assert "branchless" in kb.read("avo-optimisations.md").lower()
    mine = tmp_path / "notes"
    mine.mkdir()
    (mine / "my-gpu.md").write_text("# Our cluster\nL2 is 60 MB\n")
    (mine / "avo-optimisations.md").write_text("# replaced\n")
    monkeypatch.setenv("KBENCH_EVOLVE_KNOWLEDGE", str(mine))
    kb = KnowledgeBase()
    assert kb.title("my-gpu.md") == "Our cluster" and kb.read("avo-optimisations.md") == "# replaced\n"
    assert "- my-gpu.md: Our cluster" in kb.index()


def test_supervisor_redirects_on_each_signal_with_a_new_direction_each_time():
    from kbench_evolve.supervisor import DIRECTIONS, Supervisor

    state: dict = {}
    sup = Supervisor(state, stall_steps=3, repeat_limit=2, failure_limit=2)
    sup.on_candidate("aaa")
    assert sup.check() is None
    sup.on_candidate("aaa")
    first = sup.check()
    assert first.startswith("SUPERVISOR: the same candidate (aaa)") and DIRECTIONS[0] in first
    assert sup.check() is None  # each signal is reported once, then reset
    sup.on_correctness(False)
    sup.on_correctness(False)
    second = sup.check()
    assert "2 correctness failures in a row" in second and DIRECTIONS[1] in second
    for _ in range(3):
        sup.on_step()
    third = sup.check()
    assert "3 steps without a commit" in third and DIRECTIONS[2] in third
    sup.on_step()
    sup.on_commit()
    assert sup.check() is None
    # the counters live in the run state, so a resumed run continues them
    assert Supervisor(state).interventions == sup.interventions and len(sup.interventions) == 3


def test_agent_context_compaction_elides_oldest_tool_results_only():
    from kbench_evolve.operators.agent import compact

    msgs = [{"role": "system", "content": "s" * 100}, {"role": "user", "content": "brief"}]
    for i in range(10):
        msgs.append({"role": "assistant", "content": None, "tool_calls": [{"id": f"c{i}"}]})
        msgs.append({"role": "tool", "tool_call_id": f"c{i}", "name": "read_version", "content": "x" * 1000})
    n = compact(msgs, limit=6000, keep_last=4)
    assert n == 5  # 10 x 1000 chars of results; elided oldest-first until under 6000
    assert msgs[3]["content"].startswith("[elided: 1000 characters of an older read_version")
    assert msgs[-1]["content"] == "x" * 1000 and msgs[0]["content"] == "s" * 100
    assert sum(1 for m in msgs if m.get("role") == "tool") == 10  # pairing kept


def test_store_and_fitness_use_the_core_utilities(tmp_path):
    """One now_iso, one atomic write, one geometric mean, the core's: evolve keeps only its zero rule."""
    import kbench.api as api
    from kbench_evolve import fitness, store

    assert store.now_iso is api.now_iso
    assert fitness.geomean([2.0, 8.0]) == pytest.approx(4.0) == api.geomean([2.0, 8.0])
    assert fitness.geomean([2.0, 0.0]) == 0.0 and fitness.geomean([]) == 0.0  # a failed case: worth nothing
    assert api.geomean([2.0, 0.0]) == pytest.approx(2.0)                       # the core leaves it out
    target = tmp_path / "deep" / "file.txt"
    store.atomic_write_text(target, "é\n")
    assert target.read_text(encoding="utf-8") == "é\n" and list(target.parent.iterdir()) == [target]


def test_lineages_reach_the_history_site_through_the_core_hook(tmp_path):
    from kbench.api import LineageHistory, get_plugin_manager

    lin = Lineage.create(tmp_path, "x", seed=tmp_path / "s.py", suite_path=suite_file(tmp_path))
    lin.commit("A = 1\n", {"geomean": 1.0, "operator": "seed", "scores": {"c": 1.0}, "result_files": ["/r/1.json"]})
    lin.commit("A = 2\n", {"geomean": 2.0, "operator": "mutate", "rationale": "bigger", "scores": {"c": 2.0}})
    lin.log_attempt({"outcome": "rejected", "reason": "slow"})
    (tmp_path / "not-a-lineage").mkdir()
    answers = get_plugin_manager().hook.kbench_read_lineages(workspace=tmp_path)
    (history,) = [h for answer in answers for h in answer]
    assert isinstance(history, LineageHistory) and history.name == "x" and history.attempts == 1
    assert [(v.number, v.operator, v.geomean, v.scores, v.result_file) for v in history.versions] == [
        (1, "seed", 1.0, {"c": 1.0}, "/r/1.json"), (2, "mutate", 2.0, {"c": 2.0}, None)]
    assert get_plugin_manager().hook.kbench_read_lineages(workspace=tmp_path / "not-a-lineage") == [[]]
