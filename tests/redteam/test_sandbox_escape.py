"""Kernel files that try to get out of the sandbox (attack classes 6, 8 and 9 of docs/integrity.md), with real
bwrap.

Each corpus kernel is run twice: as kbench runs it (sandbox + audit hook: the attempt is refused and
the record fails naming the event) and with the audit hook left out (the OS sandbox alone must stop
it). Static checks are off in both, so the kernels' code really runs. What is checked is the outside
world: secrets not read, no connection to the test's listener, no file outside the scratch directory,
no process left alive, no state carried from one run to the next.
"""
from __future__ import annotations

import dataclasses
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from kbench.plugins import PluginManager
from kbench.run.runner import RunRequest, plan_run, run_suite
from kbench.run.sandbox import probe
from kbench.suite import suite_from_data
from kbench.run.pool import WorkerPool

HERE = Path(__file__).parent

#: the corpus files of this test (test_redteam.py covers the others)
SANDBOX_KERNELS = ("read_parent_secrets", "loopback_listener", "write_outside_scratch", "detached_process",
                   "temp_dir_cache")

# one xdist worker runs the module (its module-scoped escape runs are made once; --dist loadgroup)
pytestmark = [pytest.mark.skipif(not probe().available, reason=f"no sandbox here: {probe().reason}"),
              pytest.mark.xdist_group("sandbox-escape")]

SUITE = {
    "name": "sandbox-escape",
    "grid": [{"seqlen": 64, "heads": 2, "head_dim": 32, "dtype": "fp32"}],
    "check": {"seeds": 2},
    "timing": {"warmup_time": 0.0, "min_samples": 3, "min_time": 0.0, "max_time": 0.05, "target_rel_se": 1.0,
               "rotate": 2, "case_timeout": 120},
    "integrity": {"static_checks": "none"},  # the sandbox is under test here, not the static checks
}

SECRET = "kbench-redteam-secret"
#: secrets under names a deny-list misses, and a URL with a password
SECRETS = {"DB_PASS": SECRET, "MYSQL_PWD": SECRET, "X_PASSPHRASE": SECRET, "MY_SERVICE_CRED": SECRET,
           "DATABASE_URL": f"postgres://user:{SECRET}@db.internal/app", "PGSERVICEFILE_DATA": SECRET,
           "KBENCH_TEST_API_KEY": SECRET, "OMP_SECRET_SAUCE": SECRET}


class UnguardedPool(WorkerPool):
    """kbench's own pool with the audit hook left out, to test the OS sandbox alone."""

    def _setup(self, sandbox):
        return dataclasses.replace(super()._setup(sandbox), guard=False)


def marked_processes(marker: str) -> list[int]:
    """Host pids whose command line holds ``marker`` (the host's /proc sees into every namespace)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                if marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
            except OSError:
                pass
    return found


def wait_gone(marker: str, seconds: float = 20.0) -> list[int]:
    """The marked processes still alive after up to ``seconds`` (namespace teardown is asynchronous)."""
    deadline = time.monotonic() + seconds
    while True:
        left = marked_processes(marker)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


class Listener:
    """A TCP listener on 127.0.0.1 outside the sandbox, counting the connections it accepts."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.sock.close()


def run(files, out: Path, *, guard: bool, on_record=None) -> dict[str, dict]:
    pm = PluginManager()
    planned = plan_run(pm, RunRequest(suite=suite_from_data(SUITE), device="cpu", kernel_files=[str(f) for f in files],
                                      output=out))
    pool = (WorkerPool if guard else UnguardedPool)(pm, planned.ctx, case_timeout=120)
    with pool:
        records = run_suite(pm, planned, executor=pool, on_record=on_record).records
    return {r["backend"].removeprefix("file:"): r for r in records}


@pytest.fixture(scope="module", params=[True, False], ids=["sandbox+guard", "sandbox-only"])
def escape_run(request, tmp_path_factory):
    guard = request.param
    tmp = tmp_path_factory.mktemp("escape")
    listener = Listener()
    loopback = tmp / "loopback_listener.py"
    loopback.write_text((HERE / "loopback_listener.py").read_text().replace("PORT = 0", f"PORT = {listener.port}"))
    files = [HERE / f"{n}.py" for n in SANDBOX_KERNELS if n != "loopback_listener"] + [loopback,
                                                                                        HERE / "honest_numpy.py"]
    alive_after_record: dict[str, list[int]] = {}

    def on_record(rec, i, n):  # the worker of this backend is still alive here, idle until its next case
        alive_after_record[rec["backend"]] = marked_processes("kbench-redteam-detached")

    with pytest.MonkeyPatch.context() as mp:
        for name, value in SECRETS.items():
            mp.setenv(name, value)
        try:
            records = run(files, tmp / "run.json", guard=guard, on_record=on_record)
        finally:
            listener.close()
    yield guard, records, listener, alive_after_record
    for pid in marked_processes("kbench-redteam-detached"):  # never leave the machine busy, whatever happened
        os.kill(pid, 9)


def _no_escape(records):
    for name, rec in records.items():
        text = f"{rec.get('reason')} {rec.get('stderr_tail')}"
        assert "ESCAPED" not in text, (name, text)


def test_honest_kernel_passes_in_the_sandbox(escape_run):
    _, records, _, _ = escape_run
    assert records["honest_numpy"]["status"] == "passed", records["honest_numpy"]["reason"]


def test_parent_secrets_are_not_readable(escape_run):
    _, records, _, _ = escape_run
    _no_escape(records)
    # nothing was refused: the secrets are simply not there (not in the environment, no parent in /proc)
    assert records["read_parent_secrets"]["status"] == "passed", records["read_parent_secrets"]["reason"]


def test_a_listener_on_the_host_loopback_is_unreachable(escape_run):
    guard, records, listener, _ = escape_run
    assert listener.accepted == 0
    _no_escape(records)
    rec = records["loopback_listener"]
    if guard:
        assert rec["status"] == "failed" and rec["reason"].startswith("audit: refused socket."), rec["reason"]
    else:
        assert rec["status"] == "passed", rec["reason"]  # tried, found no network, went on


def test_nothing_is_written_outside_the_scratch_dir(escape_run):
    import importlib.util

    guard, records, _, _ = escape_run
    spec = importlib.util.spec_from_file_location("write_outside_scratch", HERE / "write_outside_scratch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    written = [str(p) for p in module.targets() if p.exists()]
    assert not written
    rec = records["write_outside_scratch"]
    if guard:
        assert rec["status"] == "failed" and "audit: refused open" in rec["reason"] and "for writing" in rec["reason"]
    else:
        assert rec["status"] == "passed", rec["reason"]


def test_no_process_outlives_its_record(escape_run):
    guard, records, _, alive_after_record = escape_run
    rec = records["detached_process"]
    assert alive_after_record["file:detached_process"] == []
    assert wait_gone("kbench-redteam-detached") == []
    assert rec["status"] == "failed"
    if guard:
        assert rec["reason"].startswith("audit: refused os.posix_spawn"), rec["reason"]
    else:  # the processes were started, found after the call and killed with the record failed
        assert "left 2 processes running after the call" in rec["reason"], rec["reason"]
        assert "kbench-redteam-detached" in rec["reason"]


@pytest.mark.parametrize("guard", [True, False], ids=["sandbox+guard", "sandbox-only"])
def test_temp_dir_state_does_not_reach_the_next_run(tmp_path, guard):
    first = run([HERE / "temp_dir_cache.py"], tmp_path / "a.json", guard=guard)["temp_dir_cache"]
    second = run([HERE / "temp_dir_cache.py"], tmp_path / "b.json", guard=guard)["temp_dir_cache"]
    for rec in (first, second):
        assert "ESCAPED" not in str(rec["reason"])
        if guard:  # its writes to the host's /tmp and /dev/shm were refused
            assert rec["status"] == "failed" and "audit: refused open '/tmp/kbench-redteam-cache.txt'" in rec["reason"]
        else:
            assert rec["status"] == "passed", rec["reason"]
    assert not Path("/tmp/kbench-redteam-cache.txt").exists() and not Path("/dev/shm/kbench-redteam-cache.txt").exists()
