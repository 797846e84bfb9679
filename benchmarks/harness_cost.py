#!/usr/bin/env python3
"""What the harness costs beside the kernel on the reference sweep, and whether every record got its samples.

Runs ``kbench run SUITE --device DEVICE`` as a user does (a subprocess: start-up, workers, result file
included) and prints: the process's wall time, the sum of every timed sample, their ratio (the target for
suites/attention.yaml on an idle 2-core CPU is <= 1.5x), where the rest went (per-record durations, the
parent's batch time vs the samples inside it), and the passed records below their suite's min_samples.

Usage: python benchmarks/harness_cost.py [--suite suites/attention.yaml] [--device cpu] [--repeats 1] [-- ARGS...]
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

ROOT = Path(__file__).resolve().parents[1]


def one_run(suite: str, device: str, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "kbench.cli", "run", suite, "--device", device, "-o", str(out),
                               "--no-progress", *extra], capture_output=True, text=True, cwd=ROOT)
        wall = time.perf_counter() - t0
        if not out.exists():
            raise SystemExit(f"kbench run wrote no result (exit {proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        data = json.loads(out.read_text())
    from kbench.tables import min_samples_of

    passed = [r for r in data["records"] if r["status"] == "passed"]
    min_samples = min_samples_of(data)
    timed = sum(sum(r["timing"]["samples"]) for r in passed)
    durations = sum(r.get("duration") or 0.0 for r in data["records"])
    parent = sum(r["timing"]["accounting"]["parent_seconds"] for r in passed)
    failed = [f"{r['backend']} {r['case_id']}: {r.get('reason')}" for r in data["records"]
              if r["status"] not in ("passed", "skipped")]
    # untrusted records (judged on the parent's clock): the share of the credited time the parent's clock added
    # over the worker's own samples (harness time the twin's minimum did not explain, load included)
    enforced = [r["timing"]["accounting"] for r in passed if "raised_seconds" in r["timing"]["accounting"]]
    slack = [a["raised_seconds"] / max(a["sample_seconds"], 1e-12) for a in enforced]
    return {"wall": wall, "timed": timed, "records": len(data["records"]), "passed": len(passed), "failed": failed,
            "slack": slack,
            "durations": durations, "parent_batches": parent,
            "below": sum(len(r["timing"]["samples"]) < min_samples for r in passed),
            "samples": statistics.median(len(r["timing"]["samples"]) for r in passed) if passed else 0,
            "min_samples": min_samples}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="suites/attention.yaml")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("extra", nargs="*", help="more arguments for kbench run (after --)")
    args = ap.parse_args()
    runs = [one_run(args.suite, args.device, args.extra) for _ in range(args.repeats)]
    for i, r in enumerate(runs, 1):
        print(f"run {i}: {r['records']} records ({r['passed']} passed, {len(r['failed'])} failed): wall {r['wall']:.1f} s, timed samples "
              f"{r['timed']:.1f} s -> wall / timed = {r['wall'] / max(r['timed'], 1e-9):.2f}x; records' own time "
              f"{r['durations']:.1f} s (the rest is start-up, skipped records, the result file); the parent's timed "
              f"batches {r['parent_batches']:.1f} s hold {r['timed'] / max(r['parent_batches'], 1e-9):.0%} kernel time; "
              f"median samples per record {r['samples']:.0f}; passed records below min_samples "
              f"({r['min_samples']}): {r['below']}")
        if r["slack"]:
            q = statistics.quantiles(r["slack"], n=10) if len(r["slack"]) > 1 else r["slack"] * 9
            print(f"  untrusted records: {len(r['slack'])}; the parent's clock raised the worker's samples by "
                  f"(raised / credited): median {statistics.median(r['slack']):.1%}, p90 {q[-1]:.1%}, max {max(r['slack']):.1%}")
        for line in r["failed"]:
            print(f"  failed: {line}")
    if len(runs) > 1:
        ratio = statistics.median(r["wall"] / max(r["timed"], 1e-9) for r in runs)
        print(f"median wall / timed over {len(runs)} runs: {ratio:.2f}x")


if __name__ == "__main__":
    main()
