#!/usr/bin/env python3
"""Honest kernel files judged as untrusted: how many records fail, out of how many, idle or beside busy loops.

An untrusted kernel's time is the parent's clock less the harness twin's cost (docs/integrity.md), and "forged"
is said only on evidence load cannot produce; so an honest kernel must never fail, however busy the machine.
Runs the OpenEvolve example's seed, the Shinka initial program, the evolve plugin's seeds and the red-team's
honest NumPy attention as untrusted kernel files (sandboxed workers, the default integrity settings) on a few of
the CPU reference sweep's shapes, ``--rounds`` rounds each, ``--repeats`` times, beside ``--busy N`` processes
that spin (started here, killed by their pid at the end), and prints every record that did not pass.

Usage: python benchmarks/honest_untrusted.py [--busy 2] [--rounds 3] [--repeats 2] [--seqlen 256 512]
"""
from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = [ROOT / "examples/openevolve/seed.py", ROOT / "examples/shinka/initial.py",
         ROOT / "tests/redteam/honest_numpy.py",
         *sorted((ROOT / "plugins/kbench-evolve/kbench_evolve/seeds").glob("*_seed.py"))]


def suite(seqlens: list[int], rounds: int) -> dict:
    return {"name": "honest-untrusted", "op": "attention",
            "check": {"seeds": 2, "max_rows": 64},
            # the CPU reference sweep's timing (suites/attention.yaml), in rounds
            "timing": {"warmup_time": 0.02, "min_samples": 5, "min_time": 0.1, "max_time": 1.0,
                       "target_rel_se": 0.01, "rounds": rounds, "case_timeout": 300},
            "grid": [{"batch": 1, "seqlen": seqlens, "heads_q,heads_kv": [[8, 8], [8, 2]], "head_dim": 64,
                      "causal": [False, True], "dtype": "fp32"}]}


def one_run(seqlens: list[int], rounds: int) -> list[dict]:
    from kbench.plugins import PluginManager
    from kbench.run.runner import RunRequest, plan_run, run_suite
    from kbench.source import literal_globals
    from kbench.suite import suite_from_data

    pm = PluginManager()
    files = [p for p in FILES
             if literal_globals(p.read_text(), ("SUBSTRATE",)).get("SUBSTRATE", "numpy") in pm.registry.substrates]
    with tempfile.TemporaryDirectory() as tmp:
        req = RunRequest(suite=suite_from_data(suite(seqlens, rounds)), device="cpu", backend_patterns=[],
                         kernel_files=[str(p) for p in files], output=Path(tmp) / "r.json")
        writer = run_suite(pm, plan_run(pm, req))
        return list(writer.records)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--busy", type=int, default=0, help="processes spinning beside the run (default 0)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--seqlen", type=int, nargs="+", default=[256, 512])
    args = ap.parse_args()
    hogs = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(args.busy)]
    outcomes: collections.Counter = collections.Counter()
    bad: list[str] = []
    load = []
    t0 = time.perf_counter()
    try:
        for _ in range(args.repeats):
            for rec in one_run(args.seqlen, args.rounds):
                outcomes[(rec["backend"], rec["status"])] += 1
                if rec["status"] != "passed":
                    bad.append(f"{rec['backend']} {rec['case_id']}: {rec['status']}: {str(rec.get('reason'))[:300]}")
            load.append(os.getloadavg()[0])
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    total = sum(outcomes.values())
    failed = sum(n for (_, status), n in outcomes.items() if status != "passed")
    print(f"honest kernel files judged untrusted: {failed} of {total} records did not pass "
          f"(busy loops: {args.busy}, rounds: {args.rounds}, repeats: {args.repeats}, seqlen {args.seqlen}; "
          f"load average after each repeat {', '.join(f'{x:.1f}' for x in load)}; {time.perf_counter() - t0:.0f} s)")
    for (backend, status), n in sorted(outcomes.items()):
        print(f"  {backend:40s} {status:8s} {n}")
    for line in bad:
        print("  not passed:", line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
