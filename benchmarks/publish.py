#!/usr/bin/env python3
"""Time to publish a history of RUNS result files of realistic size, the site's size, and `kbench regressions`.

Each run is the committed CPU reference run (results/cpu-amd-epyc-2c/attention-*.json: 364 records, 84
passed with their raw samples, ~400 KB) with every passed record's samples and time statistics scaled
by that run's noise: 1% run-to-run jitter per record, one record in twenty 1.3-1.8x slower (a slow
window), a 5% step of backend `numpy` from run 0.7 * RUNS on, and a torch upgrade at run 0.4 * RUNS.
Runs are one hour apart, each with its own (made-up) commit.

Prints: the size of the history on disk, the wall time of `kbench publish` (cold, then again with every
file in its cache, as a nightly job finds it) and of `kbench regressions` (process wall time, as a user
sees it), the site's size with and without plotly.min.js, and the steps found (expected: the numpy step
in each of its 28 series, nothing else).

Usage: python benchmarks/publish.py [--runs 1000] [--keep DIR]
"""
from __future__ import annotations

import argparse
import copy
import datetime as _dt
import hashlib
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "results" / "cpu-amd-epyc-2c" / "attention-20261129-183310.json"
TIME_STATS = ("median", "min", "max", "mean", "std", "q1", "q3", "ci_low", "ci_high")


def make_history(directory: Path, runs: int, seed: int = 0) -> int:
    reference = json.loads(REFERENCE.read_text())
    rng = np.random.default_rng(seed)
    start = _dt.datetime(2026, 1, 1, tzinfo=_dt.timezone.utc)
    out = directory / reference["machine"]["id"]
    out.mkdir(parents=True, exist_ok=True)
    total = 0
    for i in range(runs):
        data = copy.deepcopy(reference)
        created = start + _dt.timedelta(hours=i)
        data["id"] = f"attention-{i:05d}"
        data["created"] = data["updated"] = created.isoformat()
        data["environment"]["git_commit"] = hashlib.sha1(f"bench{i}".encode()).hexdigest()
        if i >= 0.4 * runs:
            data["environment"]["torch"] = "2.14.0+cpu"
        for rec in data["records"]:
            if rec["status"] != "passed":
                continue
            factor = math.exp(rng.normal(0.0, 0.01))
            if rng.random() < 0.05:
                factor *= rng.uniform(1.3, 1.8)
            if rec["backend"] == "numpy" and i >= 0.7 * runs:
                factor *= 1.05
            rec["timing"]["samples"] = [s * factor for s in rec["timing"]["samples"]]
            for key in TIME_STATS:
                rec["stats"][key] *= factor
        path = out / f"{data['id']}.json"
        path.write_text(json.dumps(data, indent=1))
        total += path.stat().st_size
    return total


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def timed(cmd: list[str]) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    return time.perf_counter() - t0, proc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--keep", type=Path, help="write the history and the site here (default: a temporary dir)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kbench-publish-") as tmp:
        work = args.keep or Path(tmp)
        history, site = work / "results", work / "site"
        t0 = time.perf_counter()
        size = make_history(history, args.runs)
        print(f"history: {args.runs} result files, {size / 1e6:.0f} MB, made in {time.perf_counter() - t0:.0f} s")
        kbench = [sys.executable, "-m", "kbench.cli"]
        cache = work / "history-cache.json"
        cache.unlink(missing_ok=True)
        common = ["--repo", str(work), "--cache", str(cache)]
        wall, proc = timed(kbench + ["publish", str(history), "-o", str(site), *common])
        if proc.returncode != 0:
            sys.exit(proc.stderr)
        print(f"kbench publish: {wall:.1f} s wall ({1e3 * wall / args.runs:.1f} ms per result file); "
              f"{proc.stdout.strip()}")
        wall, proc = timed(kbench + ["publish", str(history), "-o", str(site), *common])
        print(f"kbench publish again (every file in the cache): {wall:.1f} s wall")
        total, plotly_js = du(site), (site / "assets" / "plotly.min.js").stat().st_size
        print(f"site: {total / 1e6:.1f} MB ({(total - plotly_js) / 1e6:.1f} MB of pages and data, "
              f"{plotly_js / 1e6:.1f} MB plotly.min.js); largest page "
              f"{max(p.stat().st_size for p in site.glob('*.html')) / 1e6:.1f} MB; the cache (not in the site) "
              f"{cache.stat().st_size / 1e6:.1f} MB")
        wall, proc = timed(kbench + ["regressions", str(history), "--format", "json", *common])
        steps = json.loads(proc.stdout)["steps"]
        by_backend = {}
        for s in steps:
            key = (s["backend"], s["change"], s["before"]["run"] < f"attention-{int(0.7 * args.runs):05d}"
                   <= s["after"]["run"])
            by_backend[key] = by_backend.get(key, 0) + 1
        print(f"kbench regressions: {wall:.1f} s wall; steps (backend, change, at the planted run): {by_backend}")


if __name__ == "__main__":
    main()
