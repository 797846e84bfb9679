"""Helpers of the tests (a uniquely named module: another plugin's tests have a conftest too): a real
``kbench serve`` on 127.0.0.1 (a subprocess the test can SIGKILL and restart), a small task, tokens."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[3]
REDTEAM = ROOT / "tests" / "redteam"

TASK = """\
id: tiny
description: attention, fp32, one case of 64 tokens
baseline: numpy-flash
device: cpu
held_out: {held_out}
case_timeout: {case_timeout}
suite:
  version: 1
  name: serve-tiny
  op: attention
  check: {{seeds: 1}}
  timing: {{warmup_time: 0.0, min_samples: 5, min_time: 0.0, max_time: 0.05, target_rel_se: 1.0}}
  integrity: {{memory_limit: 2GiB}}
  grid:
    - {{batch: 1, seqlen: 64, heads: 2, head_dim: 32, causal: false, dtype: fp32}}
"""

TOKENS = {"alice": "alice-token-0123456789abcdef", "bob": "bob-token-0123456789abcdef"}


def write_tasks(folder: Path, *, held_out: int = 0, case_timeout: float = 5) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tiny.yaml").write_text(TASK.format(held_out=held_out, case_timeout=case_timeout))
    return folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``kbench serve`` in a subprocess of its own session (a SIGKILL takes its workers too)."""

    def __init__(self, tmp: Path, *args: str, tokens: bool = True) -> None:
        self.tmp, self.args, self.tokens = tmp, list(args), tokens
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.db = tmp / "serve.sqlite"
        self.proc: subprocess.Popen | None = None
        self.log = tmp / "server.log"

    def start(self, timeout: float = 60) -> Server:
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        if self.tokens:
            env["KBENCH_SERVE_TOKENS"] = ",".join(f"{n}:{t}" for n, t in TOKENS.items())
        else:
            env.pop("KBENCH_SERVE_TOKENS", None)
        tasks = self.tmp / "tasks"
        if not tasks.exists():
            write_tasks(tasks)
        cmd = [sys.executable, "-m", "kbench.cli", "serve", "--tasks", str(tasks), "--port", str(self.port),
               "--db", str(self.db), *self.args]
        self.proc = subprocess.Popen(cmd, env=env, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT,
                                     start_new_session=True)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"the server did not answer within {timeout} s: {self.log.read_text()[-2000:]}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


def auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[name]}"}


def kernel(name: str) -> str:
    return (REDTEAM / f"{name}.py").read_text()
