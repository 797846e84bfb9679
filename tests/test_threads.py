"""Threads kbench decides for its workers, and the load it records before timing."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner
from synthetic_results import lognormal, record, result, write

from kbench.cli import cli
from kbench.errors import BadInput
from kbench.threads import (SETTING_VARIABLE, THREAD_VARIABLES, apply_threads, busy, decided, in_process_threads,
                            load_line, load_state, parse_threads, restore_threads, thread_environment)

SMOKE = "suites/smoke.yaml"


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES and k != SETTING_VARIABLE}
    env.update(extra)
    return env


def test_by_default_every_variable_is_one_and_a_callers_own_is_kept():
    env = thread_environment(clean_env())
    assert env == {v: "1" for v in THREAD_VARIABLES}
    assert decided(clean_env()).threads == 1 and decided(clean_env()).source == "default"
    kept = thread_environment(clean_env(OMP_NUM_THREADS="4"))
    assert "OMP_NUM_THREADS" not in kept and kept["OPENBLAS_NUM_THREADS"] == "1"
    assert "OMP_NUM_THREADS kept" in decided(clean_env(OMP_NUM_THREADS="4")).source


def test_threads_set_explicitly_override_everything_and_zero_leaves_the_libraries_alone():
    env = thread_environment(clean_env(OMP_NUM_THREADS="4", **{SETTING_VARIABLE: "3"}))
    assert env == {v: "3" for v in THREAD_VARIABLES}
    assert thread_environment(clean_env(**{SETTING_VARIABLE: "0"})) == {}
    for bad in ("x", "-1", "100000", ""):
        with pytest.raises(BadInput, match="thread count"):
            parse_threads(bad)


def test_a_worker_spawned_with_that_environment_runs_one_blas_thread():
    """The variables do what they say: a fresh interpreter started with a worker's environment (trusted and
    sandboxed alike) has its BLAS pool at one thread, whatever the cores."""
    from kbench.run.pool import worker_environment

    probe = ("import numpy, threadpoolctl; "
             "print(max(p['num_threads'] for p in threadpoolctl.threadpool_info()))")
    for scratch in (None, "/tmp"):
        env = worker_environment(clean_env(), scratch=scratch)
        assert all(env[v] == "1" for v in THREAD_VARIABLES)
        out = subprocess.run([sys.executable, "-c", probe], env={**env, "HOME": os.environ.get("HOME", "/tmp")},
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "1"


def test_in_process_limits_hold_until_restored():
    before = in_process_threads()
    environ = dict(clean_env())
    setting = apply_threads(1, environ, in_process=True)
    try:
        assert setting.threads == 1 and environ[SETTING_VARIABLE] == "1"
        assert all(n == 1 for n in in_process_threads().values())
    finally:
        restore_threads(environ)
    assert in_process_threads() == before
    assert SETTING_VARIABLE not in environ and "OMP_NUM_THREADS" not in environ


def test_load_above_the_cores_is_busy_and_the_line_says_what_to_do(monkeypatch):
    monkeypatch.setattr(os, "getloadavg", lambda: (9.5, 7.0, 3.0))
    state = load_state()
    assert state["busy"] is (9.5 > state["cores"]) and state["load1"] == 9.5
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    state = load_state()
    assert state == {"load1": 9.5, "load5": 7.0, "load15": 3.0, "cores": 2, "busy": True}
    line = load_line(state)
    assert "9.50 on 2 cores" in line and "BUSY" in line and "kbench ab" in line
    assert "BUSY" not in load_line({**state, "load1": 1.0, "busy": False})


def test_run_records_threads_and_load_and_show_prints_them(tmp_path):
    """`kbench run --threads 2`: the result's machine.threads holds the variables the workers got, machine.
    thread_setting the decision and machine.load the load before and after; the screen says the load; show
    prints all of it; and this process's environment is as it was."""
    was = {v: os.environ.get(v) for v in (SETTING_VARIABLE, *THREAD_VARIABLES)}
    out = tmp_path / "r.json"
    res = CliRunner().invoke(cli, ["run", SMOKE, "-b", "numpy", "-k", "d=64 and fp16", "-o", str(out),
                                   "--threads", "2"])
    assert res.exit_code == 0, res.output + res.stderr
    assert "load average" in res.stderr and "2 BLAS/OpenMP/torch threads per worker (--threads)" in res.stderr
    machine = json.loads(out.read_text())["machine"]
    assert machine["threads"]["OMP_NUM_THREADS"] == "2" and machine["threads"]["OPENBLAS_NUM_THREADS"] == "2"
    assert machine["thread_setting"] == {"threads": 2, "source": "--threads"}
    assert {"before", "after"} <= set(machine["load"]) and machine["load"]["before"]["cores"] >= 1
    shown = CliRunner().invoke(cli, ["show", str(out)]).output
    assert "threads: 2 BLAS/OpenMP/torch threads per worker" in shown and "load before" in shown
    assert {v: os.environ.get(v) for v in was} == was
    res = CliRunner().invoke(cli, ["run", SMOKE, "-b", "numpy", "-o", str(tmp_path / "x.json"), "--threads", "lots"])
    assert res.exit_code == 2 and "--threads" in res.stderr


def test_compare_flags_a_side_measured_on_a_busy_machine_and_offers_the_ab_command(tmp_path):
    params = {"seqlen": 64, "heads": 4, "head_dim": 32}
    base = result([record("numpy", params, lognormal(1e-4, 0.02, 50, seed=1))])
    new = result([record("numpy", params, lognormal(1.3e-4, 0.3, 50, seed=2))])
    new["machine"]["load"] = {"before": {"load1": 7.5, "load5": 5, "load15": 3, "cores": 2, "busy": True},
                              "after": None}
    assert busy(new) and not busy(base)
    a, b = write(tmp_path / "a.json", base), write(tmp_path / "b.json", new)
    res = CliRunner().invoke(cli, ["compare", a, b])
    assert res.exit_code == 0
    assert f"WARNING: {b} was measured on a busy machine (load average up to 7.50 on 2 cores)" in res.output
    # 1.36x inside a 40% spread: ambiguous from two runs, and the command that can decide is offered
    assert "1 pair: 1 ambiguous" in res.output
    assert "cannot decide 1 pair (numpy) from two runs measured on a busy machine" in res.output
    assert "kbench ab SUITE.yaml OLD NEW --fail-on-regression" in res.output
