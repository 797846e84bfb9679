"""A Ray cluster of several nodes on this host, listening on loopback only: for tests and benchmarks.

A head and ``workers`` worker nodes, each started with ``python -m kbench_ray.loopback start ... --block``
(:mod:`kbench_ray.loopback`: node address 127.0.0.1, every server on 127.0.0.1), each in a session of its
own, in a Ray temporary directory of their own (``RAY_TMPDIR``: other Ray users of this host neither see it
nor are seen), with Ray's token authentication on (a fresh random token, ``RAY_AUTH_TOKEN``). Each node has
``cpus`` CPUs and a resource naming it (``node0``, ``node1``...). :meth:`LocalCluster.stop` ends exactly the
processes it started (its sessions and their descendants, by pid): never ``ray stop``, which stops every
Ray process of the host.

    with LocalCluster(workers=2) as cluster:      # three nodes
        env = cluster.env                          # RAY_ADDRESS, RAY_TMPDIR, RAY_AUTH_MODE/TOKEN for a client
        cluster.kill_raylet(1)                     # the first worker node dies
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kbench_ray.loopback import LOOPBACK, is_loopback


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


class LocalCluster:
    def __init__(self, workers: int = 1, cpus: int = 1, timeout: float = 240.0) -> None:
        self.workers, self.cpus, self.timeout = workers, cpus, timeout
        self.tmp = tempfile.mkdtemp(prefix="kr", dir="/tmp")  # short: Ray's socket paths live under it
        self.port = free_port()
        self.address = f"{LOOPBACK}:{self.port}"
        self.env = {**os.environ, "RAY_TMPDIR": self.tmp, "RAY_AUTH_MODE": "token",
                    "RAY_AUTH_TOKEN": secrets.token_hex(32), "RAY_ADDRESS": self.address,
                    # Ray's default (10 s) for a raylet to register is short on a loaded host
                    "RAY_raylet_start_wait_time_s": "120"}
        self.env.pop("RAY_AUTH_TOKEN_PATH", None)
        self.nodes: list[subprocess.Popen] = []
        #: every process seen under the node launchers: pid -> its start time (a pid reused later is not ours)
        self.seen: dict[int, int] = {}

    # -- start and stop ------------------------------------------------------------------------------

    def _start(self, index: int, *head_or_address: str) -> subprocess.Popen:
        resources = json.dumps({f"node{index}": 1})
        log = open(Path(self.tmp) / f"node{index}.log", "wb")  # noqa: SIM115 - kept open by the child
        env = {k: v for k, v in self.env.items() if k != "RAY_ADDRESS"}
        proc = subprocess.Popen([sys.executable, "-m", "kbench_ray.loopback", "start", *head_or_address,
                                 "--node-ip-address", LOOPBACK, "--num-cpus", str(self.cpus), "--num-gpus", "0",
                                 "--resources", resources, "--disable-usage-stats", "--block"],
                                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.nodes.append(proc)
        return proc

    def start(self) -> LocalCluster:
        try:
            self._start(0, "--head", "--port", str(self.port), "--include-dashboard", "false")
            self.wait_nodes(1)
            for i in range(1, self.workers + 1):  # one at a time: a loaded host times out concurrent starts
                self._start(i, "--address", self.address)
                self.wait_nodes(i + 1)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_nodes(self, n: int) -> None:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            dead = [p for p in self.nodes if p.poll() is not None]
            if dead:
                raise RuntimeError(f"a Ray node exited ({dead[0].returncode}): {self.log(self.nodes.index(dead[0]))}")
            if len(self.alive_nodes()) >= n:
                return
            time.sleep(1.0)
        raise TimeoutError(f"{n} Ray nodes not up within {self.timeout:g} s: {self.log(len(self.nodes) - 1)}")

    def log(self, index: int) -> str:
        try:
            return (Path(self.tmp) / f"node{index}.log").read_text(errors="replace")[-3000:]
        except OSError:
            return "(no log)"

    def alive_nodes(self) -> list[dict]:
        """The cluster's live nodes as its GCS sees them (``ray list nodes`` in a subprocess: this process
        may be a driver of another cluster)."""
        out = subprocess.run([sys.executable, "-m", "kbench_ray.localcluster", "nodes", self.address], env=self.env,
                             capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            return []
        try:
            return [n for n in json.loads(out.stdout) if n["alive"]]
        except ValueError:
            return []

    def processes(self) -> list[int]:
        """The pids of every live process this cluster started: the node launchers and their descendants
        (remembered, so that a process whose parent died is still found)."""
        for proc in self.nodes:
            for pid in [proc.pid, *descendants(proc.pid)]:
                started = start_time(pid)
                if started is not None:
                    self.seen.setdefault(pid, started)
        return [pid for pid, started in self.seen.items() if start_time(pid) == started]

    def raylet(self, index: int) -> int:
        (pid,) = [p for p in descendants(self.nodes[index].pid) if proc_name(p) == "raylet"]
        return pid

    def kill_raylet(self, index: int) -> int:
        """SIGKILL the raylet of node ``index`` (0: the head): the node is lost. Its pid."""
        self.processes()
        pid = self.raylet(index)
        os.kill(pid, signal.SIGKILL)
        return pid

    def stop(self) -> None:
        self.processes()
        for proc in self.nodes:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + 15
        for proc in self.nodes:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for proc in self.nodes:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
        self.processes()  # descendants that left the sessions (Ray's workers start their own)
        for pid, started in self.seen.items():
            if start_time(pid) == started:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 10
        while self.left() and time.monotonic() < deadline:
            time.sleep(0.2)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def left(self) -> list[int]:
        """Processes this cluster started that still run (zombies count as gone)."""
        return [pid for pid, started in self.seen.items() if start_time(pid) == started and proc_state(pid) != "Z"]

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# -- /proc: processes and their sockets (Linux; no third-party library) ---------------------------------


def _stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses
    return [raw[raw.index("(") + 1:raw.rindex(")")], *raw[raw.rindex(")") + 2:].split()]


def start_time(pid: int) -> int | None:
    st = _stat(pid)
    return int(st[20]) if st else None


def proc_state(pid: int) -> str | None:
    st = _stat(pid)
    return st[1] if st else None


def proc_name(pid: int) -> str | None:
    st = _stat(pid)
    return st[0] if st else None


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st:
                children.setdefault(int(st[2]), []).append(int(entry))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _decode(hex_addr: str) -> tuple[str, int]:
    import ipaddress

    addr, port = hex_addr.split(":")
    raw = bytes.fromhex(addr)
    # /proc/net stores each 32-bit word in host (little-endian) order
    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(raw)), int(port, 16)


def listeners(pids) -> list[tuple[str, int, int, str]]:
    """(address, port, pid, name) of every listening TCP socket and unconnected UDP socket of ``pids``
    (their socket inodes in /proc/PID/fd, matched in /proc/PID/net/{tcp,tcp6,udp,udp6})."""
    out = []
    for pid in pids:
        try:
            inodes = {os.readlink(f"/proc/{pid}/fd/{fd}")[8:-1] for fd in os.listdir(f"/proc/{pid}/fd")
                      if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:[")}
        except OSError:
            continue
        for table in ("tcp", "tcp6", "udp", "udp6"):
            try:
                lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
            except OSError:
                continue
            for line in lines:
                f = line.split()
                local, remote, state, inode = f[1], f[2], f[3], f[9]
                listening = state == "0A" if table.startswith("tcp") else _decode(remote)[1] == 0
                if inode in inodes and listening:
                    out.append((*_decode(local), pid, proc_name(pid) or "?"))
    return out


def not_loopback(pids) -> list[tuple[str, int, int, str]]:
    """The listeners of ``pids`` on an address other than loopback (the wildcard included)."""
    return [entry for entry in listeners(pids) if not is_loopback(entry[0])]


def gcs_nodes(address: str) -> list[dict]:
    """The nodes the GCS at ``address`` knows (no driver: Ray's GCS client alone)."""
    from ray._raylet import GcsClient
    from ray.core.generated.gcs_pb2 import GcsNodeInfo

    from kbench_ray.loopback import keep_loopback

    keep_loopback()
    infos = GcsClient(address=address).get_all_node_info(timeout=10).values()
    return [{"node": i.node_id.hex(), "address": i.node_manager_address,
             "alive": i.state == GcsNodeInfo.GcsNodeState.ALIVE, "resources": dict(i.resources_total)} for i in infos]


if __name__ == "__main__":
    if sys.argv[1:2] == ["nodes"]:
        print(json.dumps(gcs_nodes(sys.argv[2])))
