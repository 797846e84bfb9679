"""Interrupted runs: a killed `kbench run` leaves a valid, incomplete file; --resume finishes only what is missing."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from kbench import results
from kbench.errors import BadInput
from kbench.results import load_result

ARGS = ["run", "suites/smoke.yaml", "-b", "numpy", "-b", "numpy-flash", "-k", "noncausal", "--no-progress",
        "--format", "csv"]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def kbench(*args, **kw):
    return subprocess.Popen([sys.executable, "-m", "kbench.cli", *args], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, **kw)


def records_in(path):
    try:
        return load_result(path)["records"]  # the journal's records included
    except BadInput:
        return []


def kill_after(proc, path, n, sig):
    """Send ``sig`` once ``path`` holds at least ``n`` records (the run is halfway)."""
    deadline = time.time() + 120
    while len(records_in(path)) < n:
        assert proc.poll() is None, proc.stderr.read()
        assert time.time() < deadline, "the run made no progress"
        time.sleep(0.05)
    proc.send_signal(sig)
    proc.wait(timeout=60)
    return proc.returncode


def outcome(records):
    return sorted((r["case_id"], r["backend"], r["status"]) for r in records)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("full") / "full.json"
    proc = kbench(*ARGS, "-o", str(out))
    assert proc.wait(timeout=300) == 0, proc.stderr.read()
    data = load_result(out)
    assert data["complete"] is True and len(data["records"]) == 8
    return data["records"]


@pytest.mark.parametrize("sig, code, why", [(signal.SIGTERM, 143, "terminated (SIGTERM)"),
                                            (signal.SIGINT, 130, "interrupted by the user (Ctrl-C)"),
                                            (signal.SIGKILL, -9, None)])
def test_kill_halfway_then_resume_gives_the_same_records(tmp_path, uninterrupted, sig, code, why):
    out = tmp_path / "r.json"
    proc = kbench(*ARGS, "-o", str(out))
    assert kill_after(proc, out, len(uninterrupted) // 2, sig) == code
    part = load_result(out)  # valid: written atomically record by record
    assert part["complete"] is False and part.get("interrupted") == why
    assert 0 < len(part["records"]) < len(uninterrupted)
    if sig != signal.SIGKILL:
        assert "kbench run --resume" in proc.stderr.read()
    for rec in part["records"]:  # no worker outlives the run (its own process group, killed with the parent)
        pid = (rec.get("worker") or {}).get("pid")
        if pid:
            deadline = time.time() + 5
            while _alive(pid) and time.time() < deadline:
                time.sleep(0.05)
            assert not _alive(pid), f"worker {pid} outlived the run"

    resumed = kbench("run", "--resume", str(out))
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read()
    done = load_result(out)
    assert done["complete"] is True
    assert outcome(done["records"]) == outcome(uninterrupted)
    # only the missing records ran: the first part is kept as it was
    assert done["records"][:len(part["records"])] == part["records"]


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except OSError:
        return False


def test_resume_of_a_complete_run_runs_nothing(tmp_path, uninterrupted):
    from kbench.cli import cli
    from click.testing import CliRunner

    out = tmp_path / "r.json"
    assert CliRunner().invoke(cli, [*ARGS, "-o", str(out), "--no-isolate"]).exit_code == 0
    before = load_result(out)["records"]
    again = kbench("run", "--resume", str(out))
    assert again.wait(timeout=120) == 0
    assert "0 left to run" in again.stderr.read()
    assert load_result(out)["records"] == before


def test_resume_refuses_a_suite_argument(tmp_path):
    proc = kbench("run", "suites/smoke.yaml", "--resume", str(tmp_path / "x.json"))
    assert proc.wait(timeout=60) == 2 and "--resume takes the suite" in proc.stderr.read()


# -- what may block a resume, and what the environment spoiled --------------------------------------------------

@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    """One tiny run of this machine, in process (the file a resume is checked against)."""
    from click.testing import CliRunner

    from kbench.cli import cli

    out = tmp_path_factory.mktemp("small") / "r.json"
    res = CliRunner().invoke(cli, ["run", "suites/smoke.yaml", "-b", "numpy", "-k", "sq=64 and noncausal and hkv=4 "
                                   "and fp32", "--no-progress", "--no-isolate", "-o", str(out)])
    assert res.exit_code == 0, res.output
    return json.loads(out.read_text())


def test_a_plugin_that_measures_nothing_here_does_not_block_a_resume(tmp_path, small_run):
    from kbench.plugins import get_plugin_manager
    from kbench.run.runner import resume_request

    pm = get_plugin_manager()
    data = json.loads(json.dumps(small_run))
    plugins = data["environment"]["plugins"]
    installed_since = "kbench.builtin.commands"  # owns no backend, op or device of this run
    plugins.pop(installed_since)
    plugins["uninstalled-since"] = "1.0"
    out = tmp_path / "r.json"
    out.write_text(json.dumps(data))
    req, records = resume_request(pm, out)  # "plugins.X: None -> 0.1.0" was enough to refuse before
    assert len(records) == 1 and req.suite.name == "smoke"

    plugins["kbench.builtin.numpy_backends"] = "0.0.1"  # the plugin of the measured backend: refused, and said
    out.write_text(json.dumps(data))
    with pytest.raises(BadInput) as err:
        resume_request(pm, out)
    assert "plugin 'kbench.builtin.numpy_backends' (backend numpy): 0.0.1 -> " in err.value.message
    assert "uninstalled-since" not in err.value.message and installed_since not in err.value.message


def test_records_the_environment_spoiled_leave_the_file_incomplete_and_are_measured_again(tmp_path, small_run):
    from kbench.plugins import get_plugin_manager
    from kbench.run.runner import resume_request

    out = tmp_path / "r.json"
    header = {k: v for k, v in small_run.items() if k not in ("records", "complete", "interrupted", "journal")}
    w = results.ResultWriter(out, header)
    good = small_run["records"][0]
    spoiled = {**good, "backend": "numpy-flash", "status": "error", "cause": "infrastructure",
               "reason": "the judge could not set up the case's shared-memory arena: [Errno 27] File too large"}
    for key in ("timing", "stats", "metrics", "correctness"):
        spoiled.pop(key, None)
    w.append(good)
    w.append(spoiled)
    w.finish()
    data = load_result(out)
    assert data["complete"] is False  # not marked complete: --resume has work left
    assert data["interrupted"].startswith("1 of 2 records could not be measured because the environment failed")
    assert "File too large" in data["interrupted"] and f"kbench run --resume {out}" in data["interrupted"]
    _, kept = resume_request(get_plugin_manager(), out)
    assert [r["backend"] for r in kept] == ["numpy"]  # the spoiled one is run again



def test_sigterm_while_the_file_is_finished_exits_143_with_the_file_complete(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from kbench.cli import cli

    real = results.atomic_write_json

    def write(target, data):
        if isinstance(data, dict) and data.get("complete") is True:
            os.kill(os.getpid(), signal.SIGTERM)  # the last rewrite, marking the file complete
        real(target, data)

    monkeypatch.setattr(results, "atomic_write_json", write)
    out = tmp_path / "r.json"
    res = CliRunner().invoke(cli, ["run", "suites/smoke.yaml", "-b", "numpy", "-k", "sq=64 and noncausal and hkv=4 "
                                   "and fp32", "--no-progress", "--no-isolate", "-o", str(out)])
    assert res.exit_code == 143 and "kbench: terminated (SIGTERM)" in res.output, res.output
    assert load_result(out)["complete"] is True  # held until the file was written, then obeyed
