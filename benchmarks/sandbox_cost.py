"""The cost of the sandbox: an untrusted worker's start, and whole runs, with and without bubblewrap.

1. Starts kbench's own untrusted worker (kbench.run.pool.Worker, the setup WorkerPool gives it: limits,
   the audit hook) until it reports ready, then closes it, ``--repeat`` times per mode.
2. With ``--runs N``: ``kbench run SUITE -b KERNEL`` N times per mode, sandboxed and unsandboxed (the
   latter as a machine without user namespaces runs it: ``KBENCH_BWRAP=false --allow-unsandboxed``),
   wall time per record.

The modes alternate so drift in machine load hits both alike. Prints every measurement, the medians
side by side and their ratio, and the one-off probe (once per kbench process). A figure, not a test.

    python benchmarks/sandbox_cost.py                         # 10 starts per mode
    python benchmarks/sandbox_cost.py --repeat 20 --runs 3    # and 3 runs of suites/smoke.yaml per mode
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kbench.judge.context import RunContext
from kbench.plugins import PluginManager
from kbench.run.sandbox import probe
from kbench.suite import CheckSettings
from kbench.timing import TimingSettings
from kbench.run.pool import Worker, WorkerPool


def start_seconds(setup) -> float:
    worker = Worker(setup, "bench")
    t0 = time.perf_counter()
    worker.start()
    elapsed = time.perf_counter() - t0
    worker.close()
    return elapsed


ROOT = Path(__file__).resolve().parents[1]
RUN_MODES = {"bubblewrap": ({}, []), "no bubblewrap": ({"KBENCH_BWRAP": "false"}, ["--allow-unsandboxed"])}


def run_seconds_per_record(suite: str, kernel: str, env: dict, flags: list[str]) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        cmd = [sys.executable, "-c", "from kbench.cli import main; main()", "run", suite, "-b", kernel, "-o", str(out),
               "--no-progress", "--format", "csv", *flags]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise SystemExit(f"kbench run failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
        records = json.loads(out.read_text())["records"]
        failed = [r for r in records if r["status"] != "passed"]
        if failed:  # a figure of records that did not run would mean nothing
            raise SystemExit(f"{len(failed)} records did not pass, e.g. {failed[0]['reason']}")
    return wall / len(records)


def compare_runs(suite: str, kernel: str, runs: int) -> None:
    per_record: dict[str, list[float]] = {m: [] for m in RUN_MODES}
    for i in range(runs):
        for mode, (env, flags) in RUN_MODES.items():
            per_record[mode].append(run_seconds_per_record(suite, kernel, env, flags))
        print(f"run {i + 1}: " + "  ".join(f"{m} {per_record[m][-1]:.2f} s/record" for m in RUN_MODES))
    med = {m: statistics.median(v) for m, v in per_record.items()}
    print(f"median wall per record of `kbench run {suite} -b {kernel}`: "
          + "  ".join(f"{m} {med[m]:.2f} s" for m in RUN_MODES)
          + f"  ratio {med['bubblewrap'] / med['no bubblewrap']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10, help="worker starts per mode")
    parser.add_argument("--runs", type=int, default=0, help="kbench runs per mode (0: none)")
    parser.add_argument("--suite", default=str(ROOT / "suites" / "smoke.yaml"))
    parser.add_argument("--kernel", default=str(ROOT / "tests" / "redteam" / "honest_numpy.py"))
    args = parser.parse_args()

    t0 = time.perf_counter()
    probe.cache_clear()
    status = probe()
    probe_seconds = time.perf_counter() - t0
    print(f"sandbox: {status.describe()}; probe {probe_seconds * 1e3:.0f} ms (once per process)")
    if not status.available:
        raise SystemExit("no sandbox here: nothing to compare")

    pm = PluginManager()
    reg = pm.registry
    device = reg.device("cpu")
    ctx = RunContext(op=reg.op("attention"), device=device, check=CheckSettings(), timing=TimingSettings(),
                      hardware=pm.detect_hardware(device))
    sandboxed = WorkerPool(pm, ctx)._setup(True)
    modes = {"bubblewrap": sandboxed, "no bubblewrap": dataclasses.replace(sandboxed, bwrap=False)}
    times: dict[str, list[float]] = {m: [] for m in modes}
    for i in range(args.repeat):
        for mode, setup in modes.items():
            times[mode].append(start_seconds(setup))
        print(f"start {i + 1:2d}: " + "  ".join(f"{m} {times[m][-1] * 1e3:6.0f} ms" for m in modes))
    medians = {m: statistics.median(v) for m, v in times.items()}
    print("median: " + "  ".join(f"{m} {medians[m] * 1e3:.0f} ms" for m in modes)
          + f"  ratio {medians['bubblewrap'] / medians['no bubblewrap']:.2f}"
          + f"  (+{(medians['bubblewrap'] - medians['no bubblewrap']) * 1e3:.0f} ms per untrusted worker)")
    if args.runs:
        compare_runs(args.suite, args.kernel, args.runs)


if __name__ == "__main__":
    main()
