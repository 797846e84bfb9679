"""The cost of isolation: wall time of `kbench run SUITE` with workers (default) and with --no-isolate.

Runs the two modes alternately (so drift in machine load hits both alike) and prints each run, then the
medians side by side and their ratio. A figure, not a test: nothing here asserts.

    python benchmarks/isolation_cost.py                      # suites/smoke.yaml, 5 runs per mode
    python benchmarks/isolation_cost.py --repeat 9 -- -b numpy -b numpy-flash
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

MODES = {"workers (default)": [], "--no-isolate": ["--no-isolate"]}


def one_run(suite: str, extra: list[str], out: str) -> float:
    cmd = [sys.executable, "-m", "kbench.cli", "run", suite, "-o", out, "--no-progress", "--format", "csv", *extra]
    start = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        sys.exit(f"kbench run failed ({proc.returncode}):\n{proc.stderr}")
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="suites/smoke.yaml")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("extra", nargs="*", help="more `kbench run` arguments (after --)")
    args = parser.parse_args()
    times: dict[str, list[float]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat):
            order = list(MODES) if i % 2 == 0 else list(reversed(MODES))
            for mode in order:
                t = one_run(args.suite, MODES[mode] + args.extra, os.path.join(tmp, f"{i}.json"))
                times[mode].append(t)
                print(f"run {i + 1}/{args.repeat}  {mode:<18} {t:7.2f} s", flush=True)
    iso, direct = (statistics.median(times[m]) for m in MODES)
    print(f"\n{'mode':<18} {'median':>8} {'min':>8} {'max':>8}   (seconds, {args.repeat} runs, {args.suite})")
    for mode, ts in times.items():
        print(f"{mode:<18} {statistics.median(ts):8.2f} {min(ts):8.2f} {max(ts):8.2f}")
    print(f"\nisolation costs {iso - direct:+.2f} s per run: {iso / direct:.2f}x the in-process wall time")


if __name__ == "__main__":
    main()
