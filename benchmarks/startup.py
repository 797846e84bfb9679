#!/usr/bin/env python3
"""Start-up times a user and the test suite pay before anything is measured, medians of --repeats runs.

Prints, each in a fresh interpreter: ``kbench --version``, ``kbench list``, ``PluginManager()``, the import of
everything a worker loads (the worker side plus its plugins: ops, devices, substrates, backends), and a
trusted worker's start (spawn to "ready", as the pool does it). Targets on an idle 2-core machine:
--version <= 0.5 s, list <= 2 s, PluginManager() <= 0.5 s, a worker's imports <= 0.3 s, a worker ready <= 1 s.

Usage: python benchmarks/startup.py [--repeats 5]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

WORKER_IMPORTS = ("import time; t = time.perf_counter(); "
                  "import kbench.worker.main, kbench.worker.calls, kbench.worker.watches, kbench.worker.guard; "
                  "from kbench.plugins import get_plugin_manager; r = get_plugin_manager((), worker=True).registry; "
                  "r.device('cpu'); r.op('attention'); print(time.perf_counter() - t)")
PLUGIN_MANAGER = ("import time; t = time.perf_counter(); from kbench.plugins import PluginManager; PluginManager(); "
                  "print(time.perf_counter() - t)")
WORKER_READY = """
import time
from kbench.plugins import PluginManager
from kbench.judge.context import RunContext
from kbench.run.pool import Worker, WorkerPool
from kbench.suite import CheckSettings
from kbench.timing import TimingSettings
pm = PluginManager()
ctx = RunContext(op=pm.registry.op("attention"), device=pm.registry.device("cpu"), check=CheckSettings(),
                 timing=TimingSettings())
worker = Worker(WorkerPool(pm, ctx)._setup(sandbox=False), "trusted")
t = time.perf_counter()
worker.start()
print(time.perf_counter() - t)
worker.close()
"""


def wall(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, capture_output=True, check=True)
    return time.perf_counter() - t0


def printed(code: str) -> float:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    kbench = [sys.executable, "-m", "kbench.cli"]
    rows = [("kbench --version (process)", 0.5, lambda: wall([*kbench, "--version"])),
            ("kbench list (process)", 2.0, lambda: wall([*kbench, "list"])),
            ("PluginManager() (in-process)", 0.5, lambda: printed(PLUGIN_MANAGER)),
            ("a worker's imports (in-process)", 0.3, lambda: printed(WORKER_IMPORTS)),
            ("a trusted worker ready (spawn to ready)", 1.0, lambda: printed(WORKER_READY))]
    for name, target, fn in rows:
        times = [fn() for _ in range(args.repeats)]
        med = statistics.median(times)
        print(f"{name:42s} median {med:.3f} s (min {min(times):.3f}, max {max(times):.3f}; target <= {target:g} s: "
              f"{'met' if med <= target else 'NOT met'})")


if __name__ == "__main__":
    main()
