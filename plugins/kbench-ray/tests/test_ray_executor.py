"""The ray executor on a real local Ray cluster (2 CPUs, a custom resource ``kdev`` standing in for 2 GPUs)."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

ray = pytest.importorskip("ray")

from kbench.api import (RunInterrupted, RunRequest, get_plugin_manager, load_result, load_suite,  # noqa: E402
                        plan_run, resume_request, run_suite)
from kbench.testing import cli  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
SMOKE = str(ROOT / "suites/smoke.yaml")
RAY = ["--executor", "ray", "--executor-opt", "resource=kdev"]

#: an untrusted kernel file: travels to the node as text, runs in the node's sandboxed worker
KERNEL = '''
import numpy as np
from kbench.builtin.numpy_backends import attention_numpy

NAME = "file:honest"


def attention(q, k, v, out, *, causal, scale):
    attention_numpy(q, k, v, out, causal=causal, scale=scale)
'''

#: a trusted kernel file whose first call kills the process that hosts its worker (the Ray actor)
KILLER = '''
import os
import signal
from kbench.builtin.numpy_backends import attention_numpy

NAME = "file:killer"
MARK = {mark!r}


def attention(q, k, v, out, *, causal, scale):
    if not os.path.exists(MARK):
        open(MARK, "w").close()
        os.kill(os.getppid(), signal.SIGKILL)
    attention_numpy(q, k, v, out, causal=causal, scale=scale)
'''


#: one Ray cluster at a time when the suite runs in several processes (pytest-xdist, --dist loadgroup)
pytestmark = pytest.mark.xdist_group("ray")


@pytest.fixture(scope="module")
def cluster():
    from kbench_ray.loopback import keep_loopback

    keep_loopback()  # node address 127.0.0.1: every server of this cluster listens on loopback only
    ray.init(num_cpus=2, resources={"kdev": 2}, include_dashboard=False, log_to_driver=False,
             logging_level="warning", _node_ip_address="127.0.0.1")
    yield
    ray.shutdown()


def run_cli(*args):
    res = CliRunner().invoke(cli, ["run", *args, "--no-progress"])
    assert res.exit_code in (0, 1), res.output
    return res


def triples(path):
    return sorted((r["case_id"], r["backend"], r["status"]) for r in load_result(path)["records"])


def test_ray_gives_the_same_records_as_local(cluster, tmp_path):
    kernel = tmp_path / "honest.py"
    kernel.write_text(textwrap.dedent(KERNEL))
    common = [SMOKE, "-b", "numpy", "-b", str(kernel), "-k", "d=32 and noncausal and sq=64"]
    run_cli(*common, "-o", str(tmp_path / "local.json"))
    run_cli(*common, "-o", str(tmp_path / "ray.json"), *RAY)
    local, remote = triples(tmp_path / "local.json"), triples(tmp_path / "ray.json")
    assert remote == local and {s for *_, s in local} == {"passed"} and len(local) == 4
    data = load_result(tmp_path / "ray.json")
    assert data["executor"]["name"] == "ray" and data["executor"]["resource"] == "kdev"
    where = [r["placement"] for r in data["records"]]
    assert {p["executor"] for p in where} == {"ray"} and {p["slot"] for p in where} <= {0, 1}
    assert all(p["node"] and p["profile"] == "cpu" and p["inputs"] == "per-case key" for p in where)
    files = [r for r in data["records"] if r["backend"] == "file:honest"]
    assert all(r["worker"]["sandbox"] for r in files)  # the node ran the kernel file in its sandbox


@pytest.mark.slow
def test_a_killed_ray_worker_gives_a_record_and_a_retry_elsewhere(cluster, tmp_path):
    kernel = tmp_path / "killer.py"
    kernel.write_text(textwrap.dedent(KILLER.format(mark=str(tmp_path / "killed-once"))))
    out = tmp_path / "r.json"
    run_cli(SMOKE, "-b", str(kernel), "--trust-kernel-files", "-k", "d=32 and noncausal and sq=64 and hkv=4",
            "-o", str(out), *RAY)
    (rec,) = load_result(out)["records"]
    assert rec["status"] == "passed"
    (lost,) = rec["attempts"]
    assert lost["status"] == "crashed" and "Ray actor (slot" in lost["reason"] and "was lost" in lost["reason"]
    assert lost["placement"]["slot"] != rec["placement"]["slot"]  # retried on the other slot


@pytest.mark.slow
def test_resume_after_ctrl_c_with_ray(cluster, tmp_path):
    pm = get_plugin_manager()
    req = RunRequest(suite=load_suite(SMOKE), device="cpu", backend_patterns=["numpy"], keyword="d=32",
                     output=tmp_path / "r.json", executor="ray", executor_settings={"resource": "kdev"})
    planned = plan_run(pm, req)

    def stop(rec, i, n):
        if i == 1:
            raise KeyboardInterrupt

    with pytest.raises(RunInterrupted):
        run_suite(pm, planned, on_record=stop)
    part = load_result(planned.output)
    assert part["interrupted"] and 1 <= len(part["records"]) < len(planned.work())
    req, existing = resume_request(pm, planned.output)
    req.executor, req.executor_settings = "ray", {"resource": "kdev"}
    full = run_suite(pm, plan_run(pm, req), existing=existing).records
    assert sorted(r["case_id"] for r in full) == sorted(c.id for c, _ in planned.work())
    assert {r["status"] for r in full} == {"passed"}


def test_list_says_why_a_cluster_is_unreachable_without_importing_ray(tmp_path):
    code = ("import sys\nfrom kbench.testing import cli\ncli(['list', '--format', 'json'], standalone_mode=False)\n"
            "print('RAY', 'ray' in sys.modules)")
    env = {**__import__("os").environ, "RAY_ADDRESS": "127.0.0.1:9"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.stdout.strip().endswith("RAY False"), out.stderr
    listing = json.loads(out.stdout.rsplit("RAY", 1)[0])
    (row,) = [e for e in listing["executors"] if e["executor"] == "ray"]
    assert row["status"].startswith("available; ray 2.60.0; cluster at 127.0.0.1:9 (from RAY_ADDRESS) is not "
                                    "reachable: Connection refused"), row


def test_bad_address_is_a_clean_message(tmp_path):
    from kbench_ray.plugin import cluster_note, split_address

    assert split_address("ray://head:10001") == ("head", 10001) and split_address("10.0.0.1:6379") == ("10.0.0.1", 6379)
    assert "cannot tell where" in cluster_note("nohostport")


def test_a_node_that_cannot_measure_gives_error_records_naming_why(cluster, tmp_path):
    out = tmp_path / "r.json"  # no GPU here: every node fails to open the cuda device, and says so
    res = CliRunner().invoke(cli, ["run", SMOKE, "--device", "cuda", "-b", "cupy", "-k", "d=64 and fp16", "-o",
                                   str(out), *RAY, "--no-progress"])
    assert res.exit_code == 2, res.output  # the environment's failure: the file waits for --resume
    (rec,) = load_result(out)["records"]
    assert rec["status"] == "error" and rec["cause"] == "infrastructure" and "attempts" not in rec
    assert rec["reason"].startswith("the Ray node on ") and "device 'cuda' is not available" in rec["reason"]


def test_ray_messages_lose_colour_codes_and_reprs():
    from kbench_ray.executor import _first_line

    exc = RuntimeError("The actor died in \x1b[36mray::Node.__init__()\x1b[39m (pid=1, repr=<kbench_ray.Node at 0x7f>)"
                       "\nTraceback ...")
    assert _first_line(exc) == "The actor died in ray::Node.__init__() (pid=1)"


def test_an_address_nobody_answers_at_is_refused_at_once(tmp_path):
    """ray.init retries such an address for minutes: a run with --address 127.0.0.1:9 hung there."""
    import time

    out = tmp_path / "r.json"
    begin = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "kbench.cli", "run", str(SMOKE), "-b", "numpy", "--no-progress",
                          "--executor", "ray", "--address", "127.0.0.1:9", "-o", str(out)],
                         capture_output=True, text=True, timeout=240)
    assert res.returncode == 2, res.stderr
    assert "cannot reach the Ray cluster at 127.0.0.1:9: is not reachable: Connection refused" in res.stderr
    assert "--address" in res.stderr and "Traceback" not in res.stderr
    assert time.monotonic() - begin < 120  # start-up and the probe, no retrying
    assert not out.exists()


def test_the_factory_check_refuses_a_dead_address_for_evolve_too(monkeypatch):
    """`kbench evolve run --executor ray --address ...` checks the executor through the factory before any work."""
    from kbench.api import BadInput, executor_kit
    from kbench_ray.factory import RayExecutorFactory

    opts = executor_kit.ExecutorOptions(devices=None, address="127.0.0.1:9", settings={})
    with pytest.raises(BadInput, match="cannot reach the Ray cluster at 127.0.0.1:9") as err:
        RayExecutorFactory().check(opts)
    assert err.value.where == "--address" and err.value.exit_code == 2
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:9")
    with pytest.raises(BadInput) as err:
        RayExecutorFactory().check(executor_kit.ExecutorOptions(devices=None, address=None, settings={}))
    assert err.value.where == "RAY_ADDRESS"
    monkeypatch.delenv("RAY_ADDRESS")
    RayExecutorFactory().check(executor_kit.ExecutorOptions(devices=None, address=None, settings={}))  # local: fine


def test_the_probe_knows_a_ray_head_from_any_listening_port(cluster):
    """ray.init hung for minutes on a port that listens but is not Ray's; the probe asks for gRPC's reply."""
    import socket
    import threading

    from kbench_ray.plugin import unreachable

    gcs = ray.get_runtime_context().gcs_address  # the running local cluster's head
    assert unreachable(gcs) is None
    for banner in (b"", b"SSH-2.0-OpenSSH_9.6\r\n"):  # a silent service, and one that speaks first
        server = socket.create_server(("127.0.0.1", 0))
        port = server.getsockname()[1]

        def serve(server=server, banner=banner):
            conn, _ = server.accept()
            conn.sendall(banner)
            threading.Event().wait(5)
            conn.close()
        threading.Thread(target=serve, daemon=True).start()
        why = unreachable(f"127.0.0.1:{port}")
        assert why is not None and why.startswith("answers, but not as a Ray cluster"), why
        server.close()


def test_without_an_address_a_run_starts_its_own_cluster_not_the_one_of_ray_start(tmp_path, monkeypatch):
    """ray.init(address=None) joins the cluster a `ray start --head` on this host wrote to its address file:
    without --address or RAY_ADDRESS the executor asks for a local cluster ("local"), and says so."""
    from kbench_ray.plugin import cluster_note, current_cluster_file, init_address

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))  # where Ray itself looks for the address file
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text("127.0.0.1:9\n")
    assert current_cluster_file() == tmp_path / "ray" / "ray_current_cluster"
    assert init_address(None) == "local" and init_address("auto") == "auto" and init_address("h:1") == "h:1"
    note = cluster_note(None)
    assert note.startswith("a run with --executor ray starts a local cluster for itself")
    assert "(at 127.0.0.1:9, from " in note and "joined only with --address auto" in note
    assert cluster_note("auto").startswith("cluster at 127.0.0.1:9 (from ") and "not reachable" in cluster_note("auto")
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert init_address(None) == "10.0.0.1:6379" and init_address("h:1") == "h:1"


@pytest.fixture
def standing_cluster(tmp_path_factory):
    """A cluster of `ray start --head --block` with a resource only it has (``standing``), in a Ray temporary
    directory of its own (RAY_TMPDIR: other Ray users of this host neither see it nor are seen); stopped by
    signalling its own session, never with `ray stop` (which stops every Ray process of the host)."""
    import os
    import shutil
    import signal
    import socket
    import tempfile
    import time

    tmp = tempfile.mkdtemp(prefix="kr", dir="/tmp")  # short: Ray's socket paths live under it
    env = {**os.environ, "RAY_TMPDIR": tmp}
    env.pop("RAY_ADDRESS", None)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    head = subprocess.Popen([sys.executable, "-m", "kbench_ray.loopback",  # `ray start` kept on loopback
                             "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(port),
                             "--num-cpus", "1", "--resources", '{"standing": 1}', "--include-dashboard", "false",
                             "--disable-usage-stats", "--block"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        address_file = Path(tmp) / "ray" / "ray_current_cluster"
        deadline = time.monotonic() + 180
        while not address_file.is_file() and head.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert address_file.is_file(), f"ray start --head did not come up (exit {head.poll()})"
        yield env
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(head.pid, signal.SIGKILL)  # whatever of its session is still shutting down
        except ProcessLookupError:
            pass
        head.wait()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.slow
def test_a_run_without_an_address_ignores_a_standing_cluster_and_auto_joins_it(standing_cluster, tmp_path):
    base = [sys.executable, "-m", "kbench.cli", "run", SMOKE, "-b", "numpy", "-k", "d=32 and noncausal and sq=64 and hkv=4",
            "--device", "cpu", "--no-progress", "--executor", "ray", "--executor-opt", "resource=standing"]
    own = subprocess.run([*base, "-o", str(tmp_path / "own.json")], env=standing_cluster, capture_output=True,
                         text=True, timeout=300)
    # its own local cluster has no `standing`: it did not join the one `ray start` left in the address file
    assert own.returncode == 2 and "the Ray cluster has no 'standing' resource" in own.stderr, own.stderr
    joined = subprocess.run([*base, "--address", "auto", "-o", str(tmp_path / "auto.json")], env=standing_cluster,
                            capture_output=True, text=True, timeout=300)
    assert joined.returncode == 0, joined.stderr
    (rec,) = load_result(tmp_path / "auto.json")["records"]
    assert rec["status"] == "passed" and rec["placement"]["executor"] == "ray"
