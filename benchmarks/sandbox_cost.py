"""The cost of the sandbox: start time of an untrusted worker with and without bubblewrap.

Starts kbench's own untrusted worker (kbench.workers.Worker, the setup WorkerPool gives it: limits,
the audit hook) until it reports ready, then closes it; the modes alternate so drift in machine load
hits both alike. Prints every start, then the medians side by side and their ratio, plus the one-off
probe of the sandbox (once per kbench process). A figure, not a test: nothing here asserts.

    python benchmarks/sandbox_cost.py               # 10 starts per mode
    python benchmarks/sandbox_cost.py --repeat 20
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

from kbench.execute import ExecContext
from kbench.plugins import PluginManager
from kbench.sandbox import probe
from kbench.suite import CheckSettings
from kbench.timing import TimingSettings
from kbench.workers import Worker, WorkerPool


def start_seconds(setup) -> float:
    worker = Worker(setup, "bench")
    t0 = time.perf_counter()
    worker.start()
    elapsed = time.perf_counter() - t0
    worker.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
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
    ctx = ExecContext(op=reg.op("attention"), device=device, check=CheckSettings(), timing=TimingSettings(),
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


if __name__ == "__main__":
    main()
