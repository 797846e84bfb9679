"""Executors: the runner's job API, the local executor on several devices, faults, the CLI."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from kbench.cli import cli
from kbench.errors import BadInput
from kbench.run.executors import Job, LocalDevicesExecutor, SlotExecutor, SlotLost, job_record, node_key, parse_devices
from kbench.plugins import get_plugin_manager
from kbench.results import load_result
from kbench.run.runner import RunInterrupted, RunRequest, plan_run, resume_request, run_suite
from kbench.suite import load_suite

ROOT = Path(__file__).resolve().parents[1]
SMOKE = str(ROOT / "suites/smoke.yaml")


def triples(records):
    return [(r["case_id"], r["backend"], r["status"]) for r in records]


def planned_run(tmp_path, name="r.json", **kw):
    pm = get_plugin_manager()
    kw.setdefault("backend_patterns", ["numpy", "numpy-flash"])
    req = RunRequest(suite=load_suite(SMOKE), device="cpu", keyword=kw.pop("keyword", "d=32 and noncausal"),
                     output=tmp_path / name, **kw)
    return pm, plan_run(pm, req)


class DelayedExecutor(SlotExecutor):
    """Two slots that finish jobs out of order: the later a job is in the list, the sooner it is done."""

    name = "delayed"

    def __init__(self, planned, n_jobs):
        super().__init__(2)
        self.planned, self.n_jobs = planned, n_jobs
        self.started: list[int] = []
        # one in-process job at a time (as kbench runs them): two at once in one process see each other's threads,
        # and the judge's thread check failed a record when this file ran alone (no BLAS pool started yet)
        self.one_at_a_time = threading.Lock()
        self.start()

    def run_on(self, slot, job):
        from kbench.run.pool import execute_in_process

        self.started.append(job.index)
        time.sleep(0.05 * (self.n_jobs - job.index))
        with self.one_at_a_time:
            rec = execute_in_process(self.planned.ctx, job.backend, job.case)
        rec["placement"] = {"slot": slot}
        return rec


def test_out_of_order_records_are_written_in_the_work_order(tmp_path):
    pm, planned = planned_run(tmp_path, isolate=False)
    work = planned.work()
    ex = DelayedExecutor(planned, len(work))
    seen = []
    writer = run_suite(pm, planned, executor=ex, on_record=lambda rec, i, n: seen.append(i))
    recs = load_result(planned.output)["records"]
    assert [(r["case_id"], r["backend"]) for r in recs] == [(c.id, b.name) for c, b in work]
    assert {r["status"] for r in recs} == {"passed"} and {r["placement"]["slot"] for r in recs} == {0, 1}
    assert seen == list(range(1, len(work) + 1))  # progress counts written records, in order


class FlakySlots(SlotExecutor):
    """Slot 0 is lost under the first job it takes (every job with ``lose_all``), then replaced."""

    name = "flaky"

    def __init__(self, planned, lose_all=False):
        super().__init__(1 if lose_all else 2)
        self.planned, self.replaced, self.lose_all = planned, [], lose_all
        self.start()

    def run_on(self, slot, job):
        from kbench.run.pool import execute_in_process

        if slot == 0 and (self.lose_all or not self.replaced):
            raise SlotLost(f"slot {slot} died", job_record(self.planned, job, "crashed", f"slot {slot} died",
                                                          placement={"slot": slot}))
        rec = execute_in_process(self.planned.ctx, job.backend, job.case)
        rec["placement"] = {"slot": slot}
        return rec

    def replace(self, slot):
        self.replaced.append(slot)


def test_a_job_lost_with_its_slot_is_retried_once_elsewhere(tmp_path):
    pm, planned = planned_run(tmp_path, isolate=False)
    ex = FlakySlots(planned)
    recs = run_suite(pm, planned, executor=ex).records
    assert len(recs) == len(planned.work()) and {r["status"] for r in recs} == {"passed"}
    lost = [r for r in recs if "attempts" in r]
    assert len(lost) == 1 and lost[0]["placement"] == {"slot": 1}  # retried elsewhere
    assert lost[0]["attempts"] == [{"status": "crashed", "reason": "slot 0 died", "placement": {"slot": 0}}]
    assert ex.replaced == [0] and {r["placement"]["slot"] for r in recs} == {0, 1}  # the fresh slot 0 works


def test_a_job_lost_twice_is_a_crashed_record_naming_both_losses(tmp_path):
    pm, planned = planned_run(tmp_path, isolate=False, backend_patterns=["numpy"])
    recs = run_suite(pm, planned, executor=FlakySlots(planned, lose_all=True)).records
    assert {r["status"] for r in recs} == {"crashed"}
    assert all(r["reason"] == "lost twice: slot 0 died; slot 0 died" and len(r["attempts"]) == 2 for r in recs)


def test_local_devices_gives_the_default_runs_records_in_its_order(tmp_path):
    pm, planned = planned_run(tmp_path, name="one.json")
    one = run_suite(pm, planned).records
    pm, planned = planned_run(tmp_path, name="two.json", devices=["0", "1"])
    writer = run_suite(pm, planned)
    two = load_result(planned.output)
    assert triples(two["records"]) == triples(one) and {r["status"] for r in one} == {"passed"}
    assert two["executor"] == {"name": "local", "slots": 2, "devices": ["0", "1"]}
    assert {r["placement"]["slot"] for r in two["records"]} == {0, 1}
    assert all(r["placement"]["profile"] == planned.ctx.hardware.name and r["placement"]["executor"] == "local"
               for r in [*one, *two["records"]])


def test_a_device_pool_pins_its_workers_with_cuda_visible_devices(tmp_path):
    from kbench.run.pool import WorkerPool

    pm, planned = planned_run(tmp_path, backend_patterns=["numpy"])
    case, backend = planned.work()[0]
    with WorkerPool(pm, planned.ctx, device_env={"CUDA_VISIBLE_DEVICES": "3"}) as pool:
        assert pool(backend, case)["status"] == "passed"
        pid = pool.workers["trusted"].proc.pid
        env = dict(e.split("=", 1) for e in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in e)
    assert env["CUDA_VISIBLE_DEVICES"] == "3"


def test_ctrl_c_with_jobs_in_flight_keeps_finished_records_and_resumes(tmp_path):
    pm, planned = planned_run(tmp_path, devices=["0", "1"], keyword="noncausal")
    work = planned.work()

    def stop(rec, i, n):
        if i == 2:
            raise KeyboardInterrupt

    start = time.monotonic()
    with pytest.raises(RunInterrupted):
        run_suite(pm, planned, on_record=stop)
    assert time.monotonic() - start < 60  # the jobs in flight were cancelled, not waited for
    data = load_result(planned.output)
    assert data["interrupted"] and 2 <= len(data["records"]) < len(work)
    assert not any(t.name.startswith("kbench-local-slot") for t in threading.enumerate())
    req, existing = resume_request(pm, planned.output)
    req.devices = ["0", "1"]
    full = run_suite(pm, plan_run(pm, req), existing=existing).records
    assert sorted((r["case_id"], r["backend"]) for r in full) == sorted((c.id, b.name) for c, b in work)
    assert {r["status"] for r in full} == {"passed"}


def test_parse_devices():
    assert parse_devices("0, 2,3") == ["0", "2", "3"] and parse_devices(None) is None and parse_devices("") is None
    for bad in ("0,x", "1,1", "-1"):
        with pytest.raises(BadInput, match="bad device list"):
            parse_devices(bad)


def test_node_keys_are_per_case_and_not_the_secret():
    secret = os.urandom(32)
    a, b = node_key(secret, "case-a"), node_key(secret, "case-b")
    assert len(a) == 32 and a != b and secret not in (a, b) and node_key(secret, "case-a") == a


@pytest.mark.parametrize("args, message", [
    (["--executor", "nope"], "unknown executor 'nope'"),
    (["--devices", "0,zero"], "bad device list"),
    (["--address", "127.0.0.1:1"], "the local executor takes no --address"),
    (["--executor", "ray", "--executor-opt", "slots=0"], "bad ray setting slots"),
    (["--executor", "ray", "--devices", "0,1"], "--devices is for the local executor"),
    (["--executor-opt", "slots"], "is not KEY=VALUE"),
])
def test_bad_executor_options_are_exit_2(tmp_path, args, message):
    res = CliRunner().invoke(cli, ["run", SMOKE, "-b", "numpy", "-k", "d=32", "-o", str(tmp_path / "x.json"), *args])
    assert res.exit_code == 2, res.output
    assert message in res.output and "Traceback" not in res.output


def test_list_shows_the_executors():
    res = CliRunner().invoke(cli, ["list", "--format", "json"])
    assert res.exit_code == 0, res.output
    listing = {e["executor"]: e for e in json.loads(res.output)["executors"]}
    assert listing["local"]["status"] == "available" and listing["local"]["plugin"] == "kbench.run.executors"


def test_the_default_executor_never_imports_ray(tmp_path):
    code = ("import sys\nfrom kbench.cli import cli\n"
            f"try:\n    cli(['run', {SMOKE!r}, '-b', 'numpy', '-k', 'd=32 and noncausal and fp32', '--no-isolate',"
            f" '-o', {str(tmp_path / 'r.json')!r}, '--no-progress'])\n"
            "except SystemExit as e:\n    assert e.code == 0, e.code\n"
            "cli(['list'], standalone_mode=False)\n"
            "print('RAY', 'ray' in sys.modules, 'kbench_ray.executor' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert "RAY False False" in out.stdout, out.stdout + out.stderr


def test_records_of_several_hardware_profiles_are_called_out():
    from kbench.run.executors import profiles_note

    recs = [{"placement": {"profile": "h100-sxm"}}, {"placement": {"profile": "a100-sxm"}}, {"status": "passed"}]
    assert profiles_note(recs) == ("records measured on 2 hardware profiles (a100-sxm, h100-sxm): compare timings "
                                   "only within one profile (each record's placement.profile; docs/scale-out.md)")
    assert profiles_note(recs[:1] * 3 + recs[2:]) is None
