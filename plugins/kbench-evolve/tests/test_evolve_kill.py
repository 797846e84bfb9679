"""A SIGKILL in the middle of a screening run, then `kbench evolve resume`: the killed step is an attempt line,
its time is spent, and the unfinished run's files are gone."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from click.testing import CliRunner

from kbench.testing import cli
from kbench_evolve.store import IN_FLIGHT


def test_a_kill_during_screening_is_an_interrupted_attempt_whose_time_and_step_count(lineage, workspace, tmp_path):
    runs = lineage.root / "runs"
    kept = sorted(p.name for p in runs.rglob("*"))  # the seed's result file
    proc = subprocess.Popen([sys.executable, "-m", "kbench.cli", "evolve", "run", "t", "--operator", "mutate",
                             "--iterations", "1", "--max-steps", "3", "--rounds", "1", "--device", "cpu"],
                            env={**os.environ, "KBENCH_EVOLVE_DIR": str(workspace)}, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        # wait until a screening run has written its result file and been going for half a second by the
        # heartbeat of the lineage's lock
        state, ticket, deadline = {}, None, time.monotonic() + 180
        while ticket is None and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
            state = lineage.load_state() or {}
            alive = (lineage.holder() or {}).get("alive", 0.0)
            ticket = next((t for t in (state.get("in_flight") or {}).values()
                           if t["stage"] == "screening" and alive - t["started"] >= 0.5), None)
            if ticket and not list((runs / IN_FLIGHT).glob("*/*-screen*.json")):
                ticket = None
        assert ticket is not None and proc.poll() is None, proc.stdout.read().decode() if proc.poll() is not None else ""
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    steps = state["spent"]["steps"]  # the killed step included: saved before its screening started
    assert steps >= 1 and state["spent"]["bench_calls"] == steps  # --rounds 1: one kbench run per submit
    assert list((runs / IN_FLIGHT).rglob("*.json"))  # the killed screening's unfinished result file

    # resume with the step budget the killed process had used: the variation ends without measuring again
    res = CliRunner().invoke(cli, ["evolve", "resume", "t", "--max-steps", str(steps)])
    assert res.exit_code == 0, res.output
    assert "interrupted during its screening" in res.output and "step budget" in res.output, res.output
    attempts = [a for a in lineage.attempts() if a.get("operator") == "mutate"]
    assert len(attempts) == steps  # every step spent has its attempt line, the killed one too
    *settled, killed = attempts
    assert all(a["outcome"] in ("rejected", "committed") for a in settled)
    assert killed["outcome"] == "interrupted" and killed["stage"] == "screening"
    assert killed["sha"] == ticket["attempt"]["sha"] and killed["time_s"] >= 0.5
    final = lineage.load_state()
    assert final["status"] == "finished" and final["spent"]["bench_calls"] == steps and "in_flight" not in final
    # the killed process's time until its last heartbeat is spent: at least what it had saved plus the screening
    assert final["spent"]["time"] >= state["spent"]["time"] + killed["time_s"]
    # runs/ keeps only complete result files: the unfinished one, its journal and lock are gone
    assert sorted(p.name for p in runs.rglob("*")) == sorted(kept + [p.name for p in runs.glob("*-screen*.json")])
    assert len(list(runs.glob("*-screen*.json"))) == steps - 1 and not (runs / IN_FLIGHT).exists()
