"""A thousand jobs: does the parent's writing stay flat from the first record to the last?

A synthetic suite of N tiny cases (one backend, ``numpy``) runs with the local executor and with the ray
executor (on a cluster of several nodes of this host, loopback only: ``kbench_ray.localcluster``; or a
local one). For every record the parent's resident memory (``VmRSS`` of /proc/self/status) and the time
its result writer took to append the record (``ResultWriter.append``: validation, the journal's fsync'd
line, and the checkpoints that fall due) are kept; the script prints both at records 1, 10, 100, 250,
500, 750 and N, the growth of memory from record 100 to record N, and whether the ray run's records equal
the local run's case by case (case, status, cause, verdict). A figure, not a test: it exits 1 when the
records differ or memory grew by more than ``--max-growth-mb`` (50) from record 100 to the last.

    python benchmarks/thousand_jobs.py                           # 1000 jobs, local and ray on 3 nodes
    python benchmarks/thousand_jobs.py --jobs 200 --executors local
    python benchmarks/thousand_jobs.py --nodes 0                 # ray on a local cluster it starts itself
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

MARKS = (1, 10, 100, 250, 500, 750)


def suite_data(jobs: int) -> dict:
    seqlens = list(range(4, 4 + (jobs + 1) // 2))
    return {"version": 1, "name": f"thousand-{jobs}", "op": "attention", "backends": ["numpy"],
            "check": {"seeds": 1},
            "timing": {"warmup_time": 0, "min_samples": 3, "min_time": 0, "max_time": 0.005,
                       "target_rel_se": 0.5, "rotate": 1},
            "grid": [{"batch": 1, "seqlen": seqlens, "heads": 1, "head_dim": 8, "causal": [False, True],
                      "dtype": "fp32"}]}


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def verdict(rec: dict) -> tuple:
    """What must be equal whatever executor measured it (timings are not)."""
    corr = rec.get("correctness") if isinstance(rec.get("correctness"), dict) else {}
    within = corr["rel_l2"] <= corr["bound"] if corr.get("rel_l2") is not None and corr.get("bound") else None
    integrity = rec.get("integrity") if isinstance(rec.get("integrity"), dict) else {}
    return (rec["case_id"], rec["backend"], rec["status"], rec.get("cause"), within, corr.get("seeds"),
            tuple(integrity.get("checks") or ()))


def one_run(pm, jobs: int, executor: str, out: Path, address: str | None) -> dict:
    from kbench.api import RunRequest, plan_run, run_suite, suite_from_data
    from kbench.results import ResultWriter

    req = RunRequest(suite=suite_from_data(suite_data(jobs), path="<thousand_jobs>"), device="cpu",
                     backend_patterns=["numpy"], output=out, force=True, executor=executor)
    if executor == "ray":
        req.executor_address = address
    planned = plan_run(pm, req)
    assert len(planned.work()) == jobs, len(planned.work())
    writes: list[float] = []
    memory: list[float] = []
    original = ResultWriter.append

    def timed_append(self, record):
        start = time.perf_counter()
        try:
            return original(self, record)
        finally:
            writes.append(time.perf_counter() - start)

    def on_record(rec, i, n):
        memory.append(rss_mb())

    ResultWriter.append = timed_append  # the benchmark's stopwatch around the writer, nothing else changed
    start = time.perf_counter()
    try:
        writer = run_suite(pm, planned, on_record=on_record)
    finally:
        ResultWriter.append = original
    wall = time.perf_counter() - start
    return {"executor": executor, "wall": wall, "writes": writes, "memory": memory, "records": writer.records,
            "header": writer.data.get("executor")}


def report(run: dict, jobs: int) -> float:
    writes, memory = run["writes"], run["memory"]
    print(f"\n{run['executor']}: {jobs} jobs in {run['wall']:.0f} s"
          + (f"; executor {run['header']['name']}, {run['header'].get('slots')} slots" if run["header"] else ""))
    print(f"{'record':>8} {'parent RSS MB':>14} {'write ms':>9} {'write ms, median of the 50 before':>34}")
    for mark in [m for m in MARKS if m < jobs] + [jobs]:
        window = writes[max(0, mark - 50):mark]
        print(f"{mark:>8} {memory[mark - 1]:>14.1f} {writes[mark - 1] * 1e3:>9.2f} "
              f"{statistics.median(window) * 1e3:>34.2f}")
    base = 100 if jobs > 100 else 1
    growth = memory[-1] - memory[base - 1]
    first = statistics.median(writes[:100])
    last = statistics.median(writes[-100:])
    print(f"memory growth from record {base} to {jobs}: {growth:+.1f} MB; median write time of the first 100 "
          f"records {first * 1e3:.2f} ms, of the last 100 {last * 1e3:.2f} ms (x{last / first:.2f})")
    return growth


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--executors", default="local,ray")
    ap.add_argument("--nodes", type=int, default=3, help="Ray nodes of this host (0: a local cluster)")
    ap.add_argument("--max-growth-mb", type=float, default=50.0)
    args = ap.parse_args(argv)
    from kbench.api import get_plugin_manager

    pm = get_plugin_manager()
    runs = {}
    with tempfile.TemporaryDirectory(prefix="kbench-1k-") as tmp:
        for executor in args.executors.split(","):
            cluster = None
            if executor == "ray" and args.nodes > 0:
                import os

                from kbench_ray.localcluster import LocalCluster

                cluster = LocalCluster(workers=args.nodes - 1, cpus=1).start()
                for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_TMPDIR"):  # this process is its client
                    os.environ[key] = cluster.env[key]
            try:
                runs[executor] = one_run(pm, args.jobs, executor, Path(tmp) / f"{executor}.json",
                                         cluster.address if cluster else None)
            finally:
                if cluster is not None:
                    cluster.stop()
            growth = report(runs[executor], args.jobs)
            runs[executor]["growth"] = growth
    bad = [e for e, r in runs.items() if r["growth"] > args.max_growth_mb]
    if "local" in runs and "ray" in runs:
        local = [verdict(r) for r in runs["local"]["records"]]
        remote = [verdict(r) for r in runs["ray"]["records"]]
        differ = sum(a != b for a, b in zip(local, remote)) + abs(len(local) - len(remote))
        nodes = {r["placement"].get("node") for r in runs["ray"]["records"]}
        print(f"\nray vs local, case by case: {len(remote)} and {len(local)} records, {differ} differ "
              f"(case, status, cause, verdict); ray records from {len(nodes)} nodes; statuses "
              f"{sorted({r['status'] for r in runs['local']['records']})}")
        if differ:
            bad.append("records differ")
    if bad:
        print(f"\nFAILED: {', '.join(bad)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
