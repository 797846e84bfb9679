#!/usr/bin/env python3
"""The harness's own cost and the noise it reaches, on a fixed CPU workload.

Prints, for REPEATS runs side by side:
  * one (case, backend) judged in-process with the default timing settings: wall time of the
    record vs the sum of its timed samples (the rest is warm-up, correctness checks, references,
    input generation and statistics, and in the first run one-time imports), samples taken, stop reason,
    relative spread and rel. SE reached, and the record's phases (`timing.accounting.phases`);
  * `kbench run suites/smoke.yaml` as a user runs it: process wall time vs the sum of every timed sample;
  * the precision the parent's clock accounting leaves: a kernel that busy-waits exactly 20 ms, its median
    and fastest sample against 20 ms, and the fraction of the parent's batch time its samples explain.

Usage: python benchmarks/harness_overhead.py [--repeats 3]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kbench.judge.context import RunContext
from kbench.run.pool import execute_in_process
from kbench.plugins import PluginManager
from kbench.suite import CheckSettings
from kbench.timing import TimingSettings

ROOT = Path(__file__).resolve().parents[1]
CASE = {"batch": 1, "seqlen": 512, "heads": 8, "head_dim": 64, "causal": False, "dtype": "fp32"}


def one_record(pm: PluginManager, backend: str) -> dict:
    reg = pm.registry
    op, dev = reg.op("attention"), reg.device("cpu")
    ctx = RunContext(op=op, device=dev, check=CheckSettings(), timing=TimingSettings(),
                      hardware=pm.detect_hardware(dev))
    t0 = time.perf_counter()
    rec = execute_in_process(ctx, reg.backends[backend], op.make_case(CASE))
    wall = time.perf_counter() - t0
    timed = sum(rec["timing"]["samples"])
    return {"wall": wall, "timed": timed, "n": len(rec["timing"]["samples"]), "stop": rec["timing"]["stop_reason"],
            "median": rec["stats"]["median"], "rel_spread": rec["stats"]["rel_spread"], "rel_se": rec["stats"]["rel_se"],
            "phases": rec["timing"]["accounting"]["phases"]}


def spin_precision(pm: PluginManager, target: float = 0.02) -> dict:
    from kbench.builtin.numpy_backends import attention_numpy
    from kbench.ops.attention import softmax_scale
    from kbench.testing import FunctionBackend

    def spin(q, k, v, out, case):  # a right answer, then busy-wait until exactly `target` after the start
        end = time.perf_counter() + target
        attention_numpy(q, k, v, out, causal=case["causal"], scale=softmax_scale(case))
        while time.perf_counter() < end:
            pass
    reg = pm.registry
    op, dev = reg.op("attention"), reg.device("cpu")
    ctx = RunContext(op=op, device=dev, check=CheckSettings(seeds=1),
                      timing=TimingSettings(warmup_time=0.0, min_samples=30, min_time=0.0, max_time=3.0,
                                            target_rel_se=0.0))
    rec = execute_in_process(ctx, FunctionBackend(spin), op.make_case({"seqlen": 16, "heads": 1, "head_dim": 8}))
    samples = rec["timing"]["samples"]
    return {"median": statistics.median(samples), "min": min(samples), "n": len(samples),
            "explained": rec["timing"]["accounting"]["explained"], "status": rec["status"]}


def smoke_run() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "smoke.json"
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "kbench.cli", "run", str(ROOT / "suites/smoke.yaml"), "-o", str(out),
                        "--no-progress"], check=False, capture_output=True, cwd=ROOT)
        wall = time.perf_counter() - t0
        data = json.loads(out.read_text())
    timed = sum(sum((r.get("timing") or {}).get("samples", [])) for r in data["records"])
    return {"wall": wall, "timed": timed, "records": len(data["records"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    pm = PluginManager()
    print(f"fixed workload: numpy / numpy-flash attention {CASE}, default timing settings "
          f"(target rel. SE {TimingSettings().target_rel_se:.1%}, max {TimingSettings().max_time} s)\n")
    one_record(pm, "numpy")  # not counted: the process's first record imports what judging needs (scipy.stats)
    for backend in ("numpy", "numpy-flash"):
        runs = [one_record(pm, backend) for _ in range(args.repeats)]
        med = {k: statistics.median(r[k] for r in runs) for k in ("wall", "timed", "n", "median", "rel_spread", "rel_se")}
        print(f"{backend:12s} record wall {med['wall']:.2f} s, timed {med['timed']:.2f} s "
              f"({med['timed'] / med['wall']:.0%} of wall), {med['n']:.0f} samples, "
              f"median sample {med['median'] * 1e3:.2f} ms, IQR/median {med['rel_spread']:.2%}, "
              f"rel. SE {med['rel_se']:.2%}, stop: {', '.join(sorted({r['stop'] for r in runs}))}")
        phases = {k: statistics.median(r["phases"].get(k, 0.0) for r in runs) for k in runs[0]["phases"]}
        print(" " * 13 + "phases (median s): " + ", ".join(f"{k} {v:.3f}" for k, v in phases.items()))
    spin = spin_precision(pm)
    print(f"\n20 ms busy-wait: median sample {spin['median'] * 1e3:.3f} ms ({spin['median'] / 0.02 - 1:+.2%}), "
          f"fastest {spin['min'] * 1e3:.3f} ms ({spin['min'] / 0.02 - 1:+.2%}), {spin['n']} samples; the samples "
          f"explain {spin['explained']:.1%} of the parent's net batch time")
    runs = [smoke_run() for _ in range(args.repeats)]
    walls = ", ".join(f"{r['wall']:.2f}" for r in runs)
    wall = statistics.median(r["wall"] for r in runs)
    timed = statistics.median(r["timed"] for r in runs)
    print(f"\nkbench run suites/smoke.yaml ({runs[0]['records']} records): process wall {wall:.2f} s, "
          f"timed samples {timed:.2f} s ({timed / wall:.0%}); medians of {args.repeats} runs "
          f"(walls: {walls})")


if __name__ == "__main__":
    main()
