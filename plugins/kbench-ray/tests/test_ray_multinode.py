"""The ray executor on a Ray cluster of several nodes on this host (a head and two workers of one CPU each,
all on loopback: kbench_ray.localcluster), against the local executor's records; a node lost mid-run; a
parent killed and resumed; and what every cluster kbench and these tests start listens on."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from kbench.api import load_result  # noqa: E402
from kbench_ray.localcluster import LocalCluster, descendants, listeners, not_loopback  # noqa: E402
from kbench_ray.loopback import is_loopback, keep_loopback  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
SMOKE = str(ROOT / "suites/smoke.yaml")
#: 8 cases x 2 backends = 16 jobs
SELECT = ["-k", "d=32"]

#: an untrusted kernel file: travels to the nodes as text, runs in their sandboxed workers
KERNEL = '''
import time
from kbench.builtin.numpy_backends import attention_numpy

NAME = "file:honest"


def attention(q, k, v, out, *, causal, scale):
    time.sleep({sleep})
    attention_numpy(q, k, v, out, causal=causal, scale=scale)
'''

#: one Ray cluster at a time when the suite runs in several processes (pytest-xdist, --dist loadgroup)
pytestmark = pytest.mark.xdist_group("ray")


def test_multinode_loopback_addresses_are_kept_as_loopback():
    assert all(is_loopback(a) for a in ("127.0.0.1", "127.0.0.3", "::1", "[::1]", "::ffff:127.0.0.1", "localhost"))
    assert not any(is_loopback(a) for a in ("0.0.0.0", "::", "192.0.2.2", "10.0.0.1", "fd00::2", "head-node"))
    from ray._private import services

    keep_loopback()
    keep_loopback()  # idempotent
    # Ray's own function turns 127.0.0.1 into the host's network address (and its servers then listen on
    # every interface); kept, a loopback node or cluster address stays on loopback
    assert services.resolve_ip_for_localhost("127.0.0.1") == "127.0.0.1"
    assert services.resolve_ip_for_localhost("localhost") == "127.0.0.1"
    assert services.resolve_ip_for_localhost("10.1.2.3") == "10.1.2.3"
    assert services.canonicalize_bootstrap_address("127.0.0.1:6379") == "127.0.0.1:6379"


def local_triples(tmp_path, *args):
    from click.testing import CliRunner

    from kbench.testing import cli

    out = tmp_path / "local.json"
    res = CliRunner().invoke(cli, ["run", SMOKE, *args, "-o", str(out), "--no-progress"])
    assert res.exit_code == 0, res.output
    return triples(out)


def triples(path):
    """(case, backend, status, verdict) of each record: the verdict is the check's (error within its bound,
    seeds) and the integrity checks made; timings and errors themselves differ from run to run."""
    out = []
    for r in load_result(path)["records"]:
        corr = r.get("correctness") or {}
        within = corr.get("rel_l2") is not None and corr["rel_l2"] <= corr["bound"]
        out.append((r["case_id"], r["backend"], r["status"], within, corr.get("seeds"),
                    tuple((r.get("integrity") or {}).get("checks") or ())))
    return sorted(out)


def kbench(*args, env, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "kbench.cli", "run", *args, "--no-progress"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def records_so_far(path: Path) -> list[dict]:
    try:
        return load_result(path)["records"]
    except Exception:  # noqa: BLE001 - not written yet, or being written
        return []


class Watch:
    """Samples the listening sockets of the cluster's processes and of a kbench run while it runs."""

    def __init__(self, cluster: LocalCluster, proc: subprocess.Popen) -> None:
        self.cluster, self.proc = cluster, proc
        self.bad: set = set()
        self.seen: set = set()
        self.samples = 0

    def sample(self) -> None:
        pids = [*self.cluster.processes(), self.proc.pid, *descendants(self.proc.pid)]
        self.seen.update((ip, port, name) for ip, port, _, name in listeners(pids))
        self.bad.update((ip, port, name) for ip, port, _, name in not_loopback(pids))
        self.samples += 1


def finish(proc: subprocess.Popen, watch: Watch | None = None, timeout: float = 600,
           during=None) -> tuple[int, str]:
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        if watch is not None:
            watch.sample()
        if during is not None:
            during()
        time.sleep(0.5)
    if proc.poll() is None:
        proc.kill()
    _, err = proc.communicate()
    return proc.returncode, err


@pytest.fixture(scope="module")
def three_nodes():
    """A head and two worker nodes of one CPU each, on loopback, token authentication on."""
    with LocalCluster(workers=2, cpus=1) as cluster:
        yield cluster
    assert not cluster.left(), f"processes of the cluster still running: {cluster.left()}"


@pytest.mark.slow
def test_multinode_a_local_cluster_kbench_starts_listens_on_loopback_only(tmp_path):
    """`--executor ray` without an address starts Ray in the process: every listening socket of it and of the
    processes it starts (GCS, raylet, agents, the actors and their workers) is on loopback, so is its node."""
    from kbench.api import RunRequest, get_plugin_manager, load_suite, plan_run, run_suite

    assert not ray.is_initialized()
    pm = get_plugin_manager()
    req = RunRequest(suite=load_suite(SMOKE), device="cpu", backend_patterns=["numpy"],
                     keyword="d=32 and noncausal and sq=64", output=tmp_path / "r.json", executor="ray")
    planned = plan_run(pm, req)
    seen: dict = {}

    def look(rec, i, n):
        pids = [os.getpid(), *descendants(os.getpid())]
        seen["all"] = listeners(pids)
        seen["bad"] = not_loopback(pids)
        seen["nodes"] = [n["NodeManagerAddress"] for n in ray.nodes()]

    writer = run_suite(pm, planned, on_record=look)
    assert {r["status"] for r in writer.records} == {"passed"} and len(writer.records) == 2
    names = {name for *_, name in seen["all"]}
    assert {"gcs_server", "raylet"} <= names, seen["all"]  # the sockets were found, not an empty list
    assert seen["bad"] == [], seen["bad"]
    assert seen["nodes"] == ["127.0.0.1"]
    assert {r["placement"]["address"] for r in writer.records} == {"127.0.0.1"}
    assert not ray.is_initialized()


@pytest.mark.slow
def test_multinode_three_nodes_give_the_local_records_from_every_node_on_loopback(three_nodes, tmp_path):
    kernel = tmp_path / "k" / "honest.py"
    kernel.parent.mkdir()
    kernel.write_text(textwrap.dedent(KERNEL.format(sleep=0.05)))
    common = [SMOKE, "-b", "numpy", "-b", str(kernel), *SELECT]
    local = local_triples(tmp_path, *common[1:])
    out = tmp_path / "ray.json"
    proc = kbench(*common, "-o", str(out), "--executor", "ray", "--address", three_nodes.address,
                  env=three_nodes.env)
    watch = Watch(three_nodes, proc)

    def drop_the_kernel_file():
        # the nodes got the kernel's text with each job: the file on disk is not needed after planning
        if kernel.exists() and records_so_far(out):
            kernel.unlink()
            kernel.parent.rmdir()

    code, err = finish(proc, watch, during=drop_the_kernel_file)
    assert code == 0, err
    assert not kernel.exists()
    assert triples(out) == local and len(local) == 16 and {t[2] for t in local} == {"passed"}
    data = load_result(out)
    nodes = {n["node"] for n in three_nodes.alive_nodes()}
    assert len(nodes) == 3 and {n["node"] for n in data["executor"]["nodes"]} == nodes
    where = [r["placement"] for r in data["records"]]
    assert {p["node"] for p in where} == nodes  # every node measured some
    assert {p["address"] for p in where} == {"127.0.0.1"} and all(p["host"] for p in where)
    assert all(r["worker"]["sandbox"] for r in data["records"] if r["backend"] == "file:honest")
    assert "records measured on 3 nodes" in err, err
    # nothing of the cluster, the run, its actors or their workers listened beyond loopback
    assert watch.samples >= 3 and any(name == "gcs_server" for *_, name in watch.seen), watch.seen
    assert watch.bad == set(), watch.bad


@pytest.mark.slow
def test_multinode_resume_after_the_parent_is_killed(three_nodes, tmp_path):
    kernel = tmp_path / "honest.py"
    kernel.write_text(textwrap.dedent(KERNEL.format(sleep=0.05)))
    common = [SMOKE, "-b", "numpy", "-b", str(kernel), *SELECT]
    out = tmp_path / "ray.json"
    proc = kbench(*common, "-o", str(out), "--executor", "ray", "--address", three_nodes.address,
                  env=three_nodes.env, start_new_session=True)
    deadline = time.monotonic() + 400
    while len(records_so_far(out)) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.3)
    os.kill(proc.pid, signal.SIGKILL)  # the parent dies: no chance to mark its file
    proc.communicate()
    part = records_so_far(out)
    assert 2 <= len(part) < 16, len(part)
    res = kbench("--resume", str(out), "--executor", "ray", "--address", three_nodes.address, env=three_nodes.env)
    code, err = finish(res)
    assert code == 0, err
    full = load_result(out)
    assert full["complete"] and len(full["records"]) == 16
    keys = [(r["case_id"], r["backend"]) for r in full["records"]]
    assert len(set(keys)) == 16  # none twice
    assert {r["status"] for r in full["records"]} == {"passed"}
    assert [(r["case_id"], r["backend"]) for r in full["records"][:len(part)]] == \
        [(r["case_id"], r["backend"]) for r in part]  # the records of the killed run were kept as they were


@pytest.mark.slow
def test_multinode_evolve_screens_candidates_on_different_nodes(three_nodes, tmp_path):
    """`kbench evolve run --parallel 2 --executor ray --address ...`: the two screening runs go to the cluster
    at once (one run per screening, in threads of one process sharing its Ray connection), each on a node of
    its own; every screening record passed, none retried, and the lineage stays whole."""
    sys.path.insert(0, str(ROOT / "plugins/kbench-evolve/tests"))
    from evolve_testlib import TINY_SUITE, bad_seed_source

    (tmp_path / "tiny.yaml").write_text(TINY_SUITE)
    (tmp_path / "seed.py").write_text(bad_seed_source())
    env = {**three_nodes.env, "KBENCH_EVOLVE_DIR": str(tmp_path / "evolve"), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    base = [sys.executable, "-m", "kbench.cli", "evolve"]
    init = subprocess.run([*base, "init", "t", "--seed", "seed.py", "--suite", "tiny.yaml", "--device", "cpu"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert init.returncode == 0, init.stderr
    run = subprocess.run([*base, "run", "t", "--operator", "mutate", "--parallel", "2", "--iterations", "1",
                          "--max-steps", "2", "--rounds", "1", "--device", "cpu", "--executor", "ray",
                          "--address", three_nodes.address], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, run.stdout + run.stderr
    screenings = [load_result(p) for p in (tmp_path / "evolve").rglob("runs/*-screen*.json")]
    assert len(screenings) == 2, [p.name for p in (tmp_path / "evolve").rglob("runs/*.json")]
    nodes = [{r["placement"]["node"] for r in d["records"]} for d in screenings]
    assert all(len(n) == 1 for n in nodes) and nodes[0] != nodes[1], nodes  # one node each, two nodes
    assert all(d["executor"]["name"] == "ray" and d["executor"]["slots"] == 1 for d in screenings)
    records = [r for d in screenings for r in d["records"]]
    assert records and {r["status"] for r in records} == {"passed"} and not [r for r in records if r.get("attempts")]
    keys = [(r["case_id"], r["backend"]) for d in screenings for r in d["records"]]
    assert all(len(d["records"]) == len({(r["case_id"], r["backend"]) for r in d["records"]}) for d in screenings)
    assert len(keys) == 2 * len(screenings[0]["records"])


@pytest.mark.slow
def test_multinode_a_node_lost_mid_run_loses_no_record(three_nodes, tmp_path):
    """The raylet of a worker node is killed while its slot holds a job: the job is retried on another node,
    the slot retires, every record is there once and the run says what happened. (Last in this module: the
    cluster has two nodes afterwards.)"""
    kernel = tmp_path / "slow.py"
    kernel.write_text(textwrap.dedent(KERNEL.format(sleep=0.3)))  # jobs of seconds: the kill meets one
    common = [SMOKE, "-b", "numpy", "-b", str(kernel), *SELECT]
    local = local_triples(tmp_path, *common[1:])
    out = tmp_path / "ray.json"
    proc = kbench(*common, "-o", str(out), "--executor", "ray", "--address", three_nodes.address,
                  env=three_nodes.env)
    victim = {n["node"] for n in three_nodes.alive_nodes() if "node2" in n["resources"]}
    killed: dict = {}

    def kill_a_node():
        if not killed and len(records_so_far(out)) >= 2:
            killed["at"] = len(records_so_far(out))
            killed["pid"] = three_nodes.kill_raylet(2)

    code, err = finish(proc, during=kill_a_node)
    assert killed, "the run ended before a node could be killed"
    assert code == 0, err
    data = load_result(out)
    assert triples(out) == local and len(data["records"]) == 16  # none lost, none twice, all passed
    retried = [r for r in data["records"] if r.get("attempts")]
    assert retried, "no job was in flight on the lost node"
    for r in retried:
        (lost,) = r["attempts"]
        assert lost["status"] == "crashed" and "was lost" in lost["reason"], lost
        assert r["placement"]["node"] not in victim  # the retry ran on a node still there
    assert "retried after" in err and "then passed" in err, err
    # the GCS marks a killed raylet dead after its health checks fail: seconds after the run may have ended
    deadline = time.monotonic() + 60
    while len(three_nodes.alive_nodes()) != 2 and time.monotonic() < deadline:
        time.sleep(1.0)
    assert len(three_nodes.alive_nodes()) == 2


@pytest.mark.slow
def test_multinode_two_nodes_left_give_the_local_records(three_nodes, tmp_path):
    """After the node loss above: the two nodes left measure a whole run, records equal to a local run's."""
    if len(three_nodes.alive_nodes()) != 2:
        pytest.skip("runs after test_multinode_a_node_lost_mid_run_loses_no_record")
    common = [SMOKE, "-b", "numpy", *SELECT]
    local = local_triples(tmp_path, *common[1:])
    out = tmp_path / "ray.json"
    code, err = finish(kbench(*common, "-o", str(out), "--executor", "ray", "--address", three_nodes.address,
                              env=three_nodes.env))
    assert code == 0, err
    assert triples(out) == local and len(local) == 8
    data = load_result(out)
    assert data["executor"]["slots"] == 2 and len({r["placement"]["node"] for r in data["records"]}) == 2


def _slot_executor(gone: set[int], jobs: int = 6):
    """A two-slot executor whose slots in ``gone`` have lost their device for good (SlotRetired)."""
    from kbench.api import executor_kit as kx

    retired = threading.Event()

    class Slots(kx.SlotExecutor):
        name = "fake"

        def run_on(self, slot, job):
            if slot in gone:
                retired.set()
                raise kx.SlotRetired(f"slot {slot}'s node left", {"status": "error", "reason": "no node left"})
            # a slot that still has its node holds its first job until the other has met its loss, so the lost
            # slot surely takes a job (else a fast slot 0 could answer all six first and nothing retires)
            retired.wait(10 if gone else 0)
            return {"status": "passed", "slot": slot}

    ex = Slots(2)
    ex.start()
    for i in range(jobs):
        ex.submit(kx.Job(i, None, None))
    done = []
    deadline = time.monotonic() + 30
    while len(done) < jobs and time.monotonic() < deadline:
        got = ex.next_done(0.2)
        if got is not None:
            done.append((got[0].index, got[1]))
    ex.close()
    return ex, done


def test_multinode_a_slot_whose_node_left_hands_its_jobs_to_the_others():
    ex, done = _slot_executor({1})
    assert sorted(i for i, _ in done) == list(range(6))  # each job once
    assert {rec["slot"] for _, rec in done} == {0} and {rec["status"] for _, rec in done} == {"passed"}
    assert ex.live == 1 and list(ex.retired) == [1] and "node left" in ex.retired[1]
    assert all("attempts" not in rec for _, rec in done)  # handing a job back spends no attempt


def test_multinode_the_last_slot_never_retires_it_answers_the_jobs_left():
    ex, done = _slot_executor({0, 1})
    assert sorted(i for i, _ in done) == list(range(6))  # a record for each, no hang
    assert {rec["status"] for _, rec in done} == {"error"} and ex.live == 1 and len(ex.retired) == 1
