"""`kbench serve` under load: 16 concurrent clients on loopback, N evaluations of a one-case CPU task.

The mix: honest kernels, wrong ones, a slow but right one, one that hangs (stopped at the task's case timeout)
and red-team exploits from tests/redteam. Every submission's text is unique (a comment with its number), so
no stored verdict short-cuts it. Printed: throughput (evaluations/min), p50/p99 latency (submission to verdict),
the service's overhead per evaluation against calling ``score_kernel`` directly (the same task, measured
alternately with the service idle: direct, served, direct, ...), the idle p50 of one evaluation, whether
anything was lost or done twice (the database's rows), and whether every kind's verdict equals `kbench run`'s
(the status of the suite's case in the report's records; `kbench run` checks no held-out shapes, so the
service's outcome may be `held_out` where the case passed).
A figure, not a test; it exits 1 when something was lost or a verdict differs.

    python benchmarks/serve_load.py                 # N=1000 (about an hour on a 2-core machine)
    python benchmarks/serve_load.py --n 64 --pairs 8
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REDTEAM = ROOT / "tests" / "redteam"
sys.path[:0] = [str(ROOT), str(ROOT / "plugins" / "kbench-serve")]

TASK = """\
id: bench
description: attention fp32, one case of 64 tokens
baseline: numpy-flash
device: cpu
held_out: 3
case_timeout: 3
suite:
  version: 1
  name: serve-bench
  op: attention
  check: {seeds: 1}
  timing: {warmup_time: 0.005, min_samples: 5, min_time: 0.01, max_time: 0.1, target_rel_se: 0.05}
  grid:
    - {batch: 1, seqlen: 64, heads: 2, head_dim: 32, causal: false, dtype: fp32}
"""

SLOW = '''"""Right, and slow on purpose: one query head at a time, with a pause per head."""
import time

import numpy as np


def attention(q, k, v, out, *, causal, scale):
    sq, sk = q.shape[1], k.shape[1]
    group = q.shape[2] // k.shape[2]
    for h in range(q.shape[2]):
        time.sleep(0.002)
        s = np.einsum("bqd,bkd->bqk", q[:, :, h].astype(np.float32), k[:, :, h // group].astype(np.float32))
        s = s * np.float32(scale)
        if causal:
            s = np.where(np.arange(sk)[None, :] <= np.arange(sq)[:, None] + (sk - sq), s, -np.inf)
        m = s.max(-1, keepdims=True)
        p = np.exp(s - np.where(np.isfinite(m), m, 0))
        l = p.sum(-1, keepdims=True)
        out[:, :, h] = np.einsum("bqk,bkd->bqd", p / np.where(l == 0, 1, l), v[:, :, h // group].astype(np.float32))
'''

#: kind -> (weight, source)
def mix() -> dict[str, tuple[float, str]]:
    red = lambda n: (REDTEAM / f"{n}.py").read_text()  # noqa: E731
    return {"honest": (0.40, red("honest_numpy")), "wrong": (0.15, red("zero_output")), "slow": (0.15, SLOW),
            "hanging": (0.04, red("infinite_loop")), "input_modified": (0.08, red("input_modified")),
            "forbidden_call": (0.06, red("forbidden_call")), "timer_patch": (0.06, red("timer_patch")),
            "low_precision": (0.06, red("low_precision"))}


def percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


def start_server(tmp: Path, port: int) -> subprocess.Popen:
    (tmp / "tasks").mkdir()
    (tmp / "tasks" / "bench.yaml").write_text(TASK)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", KBENCH_SERVE_TOKENS="",
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    proc = subprocess.Popen([sys.executable, "-m", "kbench.cli", "serve", "--tasks", str(tmp / "tasks"), "--port",
                             str(port), "--db", str(tmp / "db.sqlite"), "--rate", "1000", "--burst", "100000"],
                            env=env, stdout=open(tmp / "server.log", "wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    import httpx

    for _ in range(600):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.1)
    raise SystemExit(f"the server did not start: {(tmp / 'server.log').read_text()[-2000:]}")


async def load(url: str, jobs: list[tuple[str, str]], clients: int):
    from kbench_serve.client import AsyncClient

    queue: asyncio.Queue = asyncio.Queue()
    for j in jobs:
        queue.put_nowait(j)
    results = []

    async def client():
        async with AsyncClient(url, timeout=60) as c:
            while not queue.empty():
                kind, source = queue.get_nowait()
                t0 = time.perf_counter()
                ev = await c.evaluate("bench", source, deadline=1800)
                mine = [r["status"] for r in (ev["report"] or {}).get("records", []) if r["backend"] == "file:kernel"]
                status = "failed" if ev["outcome"] in ("limits", "static") else (mine[0] if mine else ev["outcome"])
                results.append((kind, ev["id"], ev["outcome"], time.perf_counter() - t0, status))

    await asyncio.gather(*(client() for _ in range(clients)))
    return results


def cli_verdicts(tmp: Path, kinds: dict[str, tuple[float, str]]) -> dict[str, str]:
    """Each kind's status under `kbench run` (the same suite; a kernel file per kind)."""
    import yaml

    suite = tmp / "suite.yaml"
    suite.write_text(yaml.safe_dump(yaml.safe_load(TASK)["suite"]))
    args = []
    for kind, (_, source) in kinds.items():
        (tmp / f"{kind}.py").write_text(source)
        args += ["-b", str(tmp / f"{kind}.py")]
    subprocess.run([sys.executable, "-m", "kbench.cli", "run", str(suite), *args, "--device", "cpu", "-o",
                    str(tmp / "cli.json"), "--case-timeout", "3"], capture_output=True, timeout=900,
                   env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    records = json.loads((tmp / "cli.json").read_text())["records"]
    return {r["backend"].split(":", 1)[1]: r["status"] for r in records if r["backend"].startswith("file:")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1000, help="evaluations under load")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--pairs", type=int, default=10, help="direct/served pairs for the overhead, service idle")
    ap.add_argument("--seed", type=int, default=0)
    opts = ap.parse_args()
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from kbench_serve.client import Client
    from kbench_serve.tasks import load_task

    from kbench.evaluators import score_kernel

    kinds = mix()
    rng = random.Random(opts.seed)
    names = list(kinds)
    weights = [kinds[k][0] for k in names]
    picked = [rng.choices(names, weights)[0] for _ in range(opts.n)]
    jobs = [(k, f"# submission {i}\n" + kinds[k][1]) for i, k in enumerate(picked)]
    print(f"load average at start: {open('/proc/loadavg').read().split()[:3]} ({os.cpu_count()} CPUs; shared machine)")
    with tempfile.TemporaryDirectory(prefix="serve-load-") as tmp_name:
        tmp = Path(tmp_name)
        port = 20000 + rng.randrange(20000)
        url = f"http://127.0.0.1:{port}"
        server = start_server(tmp, port)
        try:
            # 1. the overhead, idle: direct score_kernel and a served evaluation, alternately
            task = load_task(tmp / "tasks" / "bench.yaml")
            honest = kinds["honest"][1]
            direct, direct_warm, served = [], [], []
            from kbench_serve.warm import WarmWorkers

            warm = WarmWorkers()

            def call(i, tag):
                path = tmp / f"{tag}{i}.py"
                path.write_text(f"# {tag} {i}\n" + honest)
                t0 = time.perf_counter()
                score_kernel(path, suite=task.suite, baseline=task.baseline, device=task.device,
                             held_out=task.held_out, case_timeout=task.case_timeout)
                return time.perf_counter() - t0

            with Client(url, timeout=60) as c:
                for i in range(opts.pairs):
                    direct.append(call(i, "direct"))  # cold: every worker started in the call
                    warm.install()
                    warm.refill()  # not timed, as the service refills after its verdict
                    direct_warm.append(call(i, "warm"))
                    warm.uninstall()
                    warm.refill()
                    t0 = time.perf_counter()
                    ev = c.evaluate("bench", f"# served {i}\n" + honest)
                    served.append(time.perf_counter() - t0)
                    assert ev["outcome"] == "passed", ev
            warm.close()
            idle_load = open("/proc/loadavg").read().split()[:3]
            # 2. the load
            t0 = time.perf_counter()
            results = asyncio.run(load(url, jobs, opts.clients))
            wall = time.perf_counter() - t0
            load_after = open("/proc/loadavg").read().split()[:3]
        finally:
            server.terminate()
            server.wait(timeout=30)
        with sqlite3.connect(tmp / "db.sqlite") as db:
            rows = db.execute("SELECT id, status, attempt FROM evaluations").fetchall()
        cli = cli_verdicts(tmp, kinds)

    lat = [r[3] for r in results]  # kind, id, outcome, latency, the case's status
    ids = [r[1] for r in results]
    print(f"\nidle ({opts.pairs} pairs, load average {idle_load}):")
    print(f"  score_kernel, workers started in the call  p50 {statistics.median(direct):.3f} s")
    print(f"  score_kernel, warm workers                 p50 {statistics.median(direct_warm):.3f} s")
    print(f"  served (HTTP, queue, SQLite; warm workers) p50 {statistics.median(served):.3f} s (goal <= 1.5 s)")
    over = statistics.median(served) / statistics.median(direct_warm) - 1
    print(f"  service overhead per evaluation over score_kernel with the same warm workers: {over * 100:+.1f}% "
          f"(goal <= 10%); over a cold score_kernel: "
          f"{(statistics.median(served) / statistics.median(direct) - 1) * 100:+.1f}%")
    print(f"\nunder load: {opts.n} evaluations, {opts.clients} clients, 1 slot, load average after {load_after}")
    print(f"  throughput {len(results) / wall * 60:.1f} evaluations/min ({wall:.0f} s)")
    print(f"  latency p50 {percentile(lat, 50):.2f} s, p99 {percentile(lat, 99):.2f} s (queueing included)")
    by_kind: dict[str, set[str]] = {}
    case_status: dict[str, set[str]] = {}
    for kind, _, outcome, _, status in results:
        by_kind.setdefault(kind, set()).add(outcome)
        case_status.setdefault(kind, set()).add(status)
    lost = opts.n + opts.pairs - len(rows)
    twice = len(ids) - len(set(ids))
    not_done = sum(1 for r in rows if r[1] != "done")
    retried = sum(1 for r in rows if r[2] != 1)
    print(f"  rows {len(rows)} for {opts.n + opts.pairs} submissions: lost {lost}, duplicated {twice}, "
          f"not done {not_done}, claimed more than once {retried}")
    bad = 0
    for kind in names:
        served_as = sorted(by_kind.get(kind, set()))
        statuses = sorted(case_status.get(kind, set()))
        agree = statuses == [cli.get(kind)] or not statuses
        bad += not agree
        print(f"  {kind:15} outcome {', '.join(served_as) or '-':12} case status {', '.join(statuses) or '-':9} "
              f"kbench run: {cli.get(kind):8} {'same verdict' if agree else 'DIFFERENT'}")
    return 1 if (lost or twice or not_done or bad) else 0


if __name__ == "__main__":
    sys.exit(main())
