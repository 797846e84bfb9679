"""Evaluations through a real server on 127.0.0.1: verdicts, reward, the stored result, a server SIGKILLed
mid-load and restarted (every accepted evaluation ends exactly once), and the red-team corpus judged as the CLI
judges it."""
from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time

import pytest

from serve_support import REDTEAM, TOKENS, kernel
from kbench_serve.client import Client
from kbench_serve.env import KernelAction, KernelEnv, reward_function
from kbench_serve.store import Store


def test_verdicts_reward_cache_force_and_the_clients(server_factory):
    server = server_factory().start()
    alice = Client(server.url, token=TOKENS["alice"])
    honest = alice.evaluate("tiny", kernel("honest_numpy"), deadline=120)
    assert honest["outcome"] == "passed" and honest["reward"] > 0
    stages = [s["stage"] for s in honest["report"]["stages"]]
    assert stages == ["limits", "static", "import", "correctness", "timing", "reward"]  # held_out: 0 in this task
    reward_stage = honest["report"]["stages"][-1]
    lo, hi = reward_stage["reward_ci"]
    assert lo <= honest["reward"] <= hi or abs(hi - lo) < 1e-9
    assert {r["backend"] for r in honest["report"]["records"]} == {"file:kernel", "numpy-flash"}

    wrong = alice.evaluate("tiny", kernel("zero_output"), deadline=120)
    assert wrong["outcome"] == "correctness" and wrong["reward"] == 0.0
    assert "relative L2 error" in wrong["report"]["stages"][-2]["reason"]
    static = alice.evaluate("tiny", kernel("forbidden_call"), deadline=120)
    assert static["outcome"] == "static" and "forbidden" in static["report"]["stages"][1]["reason"]
    broken = alice.evaluate("tiny", "def attention(q, k, v, out, *, causal, scale):\n    return undefined_name\n",
                            deadline=120)
    assert broken["outcome"] == "correctness" and "NameError" in json.dumps(broken["report"])

    # the same source for the same task: the stored verdict, under a new id of the new token
    bob = Client(server.url, token=TOKENS["bob"])
    again = bob.evaluate("tiny", kernel("honest_numpy"), deadline=120)
    assert again["cached_from"] == honest["id"] and again["reward"] == honest["reward"] and again["id"] != honest["id"]
    forced = bob.evaluate("tiny", kernel("honest_numpy"), force=True, deadline=120)
    assert forced["cached_from"] is None and forced["outcome"] == "passed"
    assert forced["report"]["records"][0]["started"] != honest["report"]["records"][0]["started"]  # measured again

    # the environment and the reward function over the same server
    env = KernelEnv(alice, "tiny", max_steps=2)
    first = env.reset()
    assert first.done is False and first.observation.task["id"] == "tiny"
    step = env.step(KernelAction(kernel("zero_output")))
    assert step.reward == 0.0 and not step.done and "correctness: FAILED" in step.observation.feedback
    step = env.step(KernelAction(kernel("honest_numpy")))
    assert step.done and step.reward == forced["reward"]  # the latest measurement of that source stands
    reward = reward_function(alice, "tiny")
    got = reward(["```python\n" + kernel("honest_numpy") + "```", [{"role": "assistant", "content": kernel("zero_output")}]])
    assert got[0] == forced["reward"] and got[1] == 0.0
    metrics = alice.http.get("/metrics").text
    assert 'kbench_serve_outcomes_total{stage="passed"}' in metrics
    assert "kbench_serve_latency_seconds_bucket" in metrics


def test_a_server_killed_mid_load_finishes_every_accepted_evaluation_exactly_once(server_factory):
    server = server_factory().start()
    client = Client(server.url, token=TOKENS["alice"])
    mix = ["honest_numpy", "zero_output", "input_modified", "infinite_loop", "honest_numpy", "low_precision"]
    ids = [client.submit("tiny", f"# {i}\n" + kernel(name))["id"] for i, name in enumerate(mix)]
    end = time.monotonic() + 120
    while time.monotonic() < end:  # kill once one has finished and another is running (the endless loop: 5 s)
        counts = client.health()
        done = sum(client.get(i)["status"] == "done" for i in ids)
        if done >= 1 and counts["running"] >= 1:
            break
        time.sleep(0.1)
    server.kill()
    with sqlite3.connect(server.db) as db:
        before = dict(db.execute("SELECT id, status FROM evaluations").fetchall())
    assert "running" in before.values() and "queued" in before.values()
    server.start()
    client = Client(server.url, token=TOKENS["alice"])
    final = {i: client.get(i, wait=60) for i in ids}
    end = time.monotonic() + 180
    while any(e["status"] != "done" for e in final.values()) and time.monotonic() < end:
        final = {i: client.get(i, wait=10) for i in ids}
    assert all(e["status"] == "done" for e in final.values())
    with sqlite3.connect(server.db) as db:
        rows = db.execute("SELECT id, status, attempt FROM evaluations").fetchall()
    assert sorted(r[0] for r in rows) == sorted(ids)  # nothing lost, nothing added
    assert all(r[1] == "done" and 1 <= r[2] <= 2 for r in rows)
    outcomes = [final[i]["outcome"] for i in ids]
    assert outcomes == ["passed", "correctness", "correctness", "correctness", "passed", "correctness"]


def test_a_claim_ends_once_and_a_stale_claim_cannot_overwrite(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    row, _ = store.submit("a", "tiny", "x", idempotency_key=None, force=False)
    first = store.claim([])
    assert first["attempt"] == 1
    assert store.recover() == 1  # the server that held it is gone: back to the queue
    second = store.claim([])
    assert second["id"] == row["id"] and second["attempt"] == 2
    assert not store.finish(row["id"], 1, "passed", 1.0, {})  # the dead server's claim
    assert store.finish(row["id"], 2, "passed", 1.0, {})
    assert not store.finish(row["id"], 2, "passed", 1.0, {})  # and only once


def test_fair_share_serves_tokens_in_turn(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    for i in range(4):
        store.submit("greedy", "tiny", f"g{i}", idempotency_key=None, force=False)
    store.submit("modest", "tiny", "m0", idempotency_key=None, force=False)
    order: list[str] = []
    served = []
    while (row := store.claim(order)) is not None:
        served.append(row["principal"])
        if row["principal"] in order:
            order.remove(row["principal"])
        order.append(row["principal"])
    assert served == ["greedy", "modest", "greedy", "greedy", "greedy"]


REDTEAM_KERNELS = ["honest_numpy", "zero_output", "input_modified", "forbidden_call", "segfault", "timer_patch",
                   "lazy_result", "low_precision"]


@pytest.mark.parametrize("names", [REDTEAM_KERNELS[:4]], ids=["some"])
def test_red_team_kernels_get_the_verdicts_of_kbench_run(server_factory, tmp_path, names):
    _same_verdicts(server_factory, tmp_path, names)


@pytest.mark.slow
def test_the_whole_red_team_corpus_gets_the_verdicts_of_kbench_run(server_factory, tmp_path):
    names = sorted(p.stem for p in REDTEAM.glob("*.py") if not p.stem.startswith("test_")
                   and p.stem not in ("infinite_loop", "memory_blowup", "detached_process", "empty_loop_burner",
                                      "slow_check_batches",
                                      # verdicts that depend on timing, by design (tests/redteam says which)
                                      "work_shift", "sometimes_zeros"))
    _same_verdicts(server_factory, tmp_path, names)


def _same_verdicts(server_factory, tmp_path, names):
    server = server_factory().start()
    client = Client(server.url, token=TOKENS["alice"])
    served = {n: client.evaluate("tiny", kernel(n), deadline=300) for n in names}
    # kbench run on the same suite, the same kernel files (copied under their names: file:<name>)
    import yaml

    task = yaml.safe_load((tmp_path / "tasks" / "tiny.yaml").read_text())
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump(task["suite"]))
    args = [a for n in names for a in ("-b", str(REDTEAM / f"{n}.py"))]
    out = tmp_path / "cli.json"
    subprocess.run([sys.executable, "-m", "kbench.cli", "run", str(suite), *args, "--device", "cpu", "-o", str(out)],
                   capture_output=True, text=True, timeout=600)
    cli = {r["backend"].split(":", 1)[1]: r for r in json.loads(out.read_text())["records"]}
    for n in names:
        ev = served[n]
        if ev["outcome"] == "static":  # refused before a worker, as the CLI refuses it before running it
            assert cli[n]["status"] == "failed" and "static check" in cli[n]["reason"], n
            continue
        mine = [r for r in ev["report"]["records"] if r["backend"] == "file:kernel"]
        assert [r["status"] for r in mine] == [cli[n]["status"]], n
        assert (ev["outcome"] == "passed") == (cli[n]["status"] == "passed"), n
