#!/usr/bin/env python3
"""Is `kbench compare` quiet on the same code and loud on a real slowdown? Both, from the same runs.

Makes ``--runs`` pairs of back-to-back runs of suites/smoke.yaml with every backend plus ``numpy-slowed``
(tests/slow_backend_plugin.py: the numpy backend's work, each call stretched to KBENCH_TEST_SLOWDOWN times its
duration): the first run of a pair at slowdown 1, the second at ``--slowdown`` (default 1.25). Each pair is
compared as ``kbench compare FIRST SECOND`` compares it. The unchanged backends (numpy, numpy-flash,
torch-sdpa: 30 timed pairs a comparison) are same-code comparisons: every ``+``/``-`` among them is a false
alarm. ``numpy-slowed`` (10 pairs a comparison) really is ``--slowdown`` times slower: each pair not ``+`` is
a miss. The same files are judged by the rule of 6cf3c74 (factor, significance on the samples, spread,
minimum moved: no run-to-run term, no test of the records beside it) for contrast. ``--busy N`` runs N busy loops beside the runs (the loaded case).

``--rounds 1,3`` (the default) makes every run both ways, side by side: with ``kbench run --rounds 1`` (a record's
samples all at once) and ``--rounds 3`` (in three rounds spread over the run, kbench.run.rounds); each is judged
apart.

Usage: python benchmarks/compare_noise.py [--runs 10] [--slowdown 1.25] [--busy 0] [--dir DIR] [--pool K] [--rounds 1,3]
       python benchmarks/compare_noise.py --analyse DIR [--pool K]     (judge runs made before)
"""
from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHANGED = "numpy-slowed"


def loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "?"


def make_runs(directory: Path, runs: int, slowdown: float, busy: int, rounds: list[int]) -> list[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "tests"),
                                                                      os.environ.get("PYTHONPATH")]))}
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    loads = []
    try:
        for i in range(runs):
            for r, (side, factor) in ((r, s) for r in rounds for s in (("base", 1.0), ("new", slowdown))):
                out = directory / f"r{r}" / f"{side}-{i:02d}.json"
                out.parent.mkdir(exist_ok=True)
                loads.append(loadavg())
                t0 = time.perf_counter()
                proc = subprocess.run(["kbench", "-p", "slow_backend_plugin", "run", str(ROOT / "suites/smoke.yaml"),
                                       "-o", str(out), "--rounds", str(r)],
                                      env={**env, "KBENCH_TEST_SLOWDOWN": str(factor)}, capture_output=True, text=True)
                if not out.exists():
                    sys.exit(f"kbench run failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
                print(f"  r{r}/{out.name}: {time.perf_counter() - t0:.0f} s, load average {loads[-1]}", flush=True)
    finally:
        for p in loops:
            p.kill()
            p.wait()
    return loads


def old_rule(pairs, settings) -> None:
    """The rule of 6cf3c74 on the same tests: factor, significance on the samples, spread, the minimum moved."""
    from kbench.compare import Change

    for p in pairs:
        if p.change in (Change.SLOWER, Change.FASTER, Change.AMBIGUOUS, Change.SAME):
            slower, faster = p.test.ratio >= settings.factor, p.test.ratio <= 1 / settings.factor
            if not (slower or faster):
                p.change = Change.SAME
            elif (p.test.significant(settings.alpha) and abs(math.log(p.test.ratio)) > math.log1p(p.test.noise)
                  and (p.test.min_ratio >= settings.factor if slower else p.test.min_ratio <= 1 / settings.factor)):
                p.change = Change.SLOWER if slower else Change.FASTER
            else:
                p.change = Change.AMBIGUOUS


def judge(directory: Path, old: bool, pool: int = 1) -> tuple[int, int, int, int, list[int]]:
    """(false alarms, same-code pairs, slowdowns flagged slower, slowed pairs, false alarms per comparison);
    ``pool``: runs pooled a side (consecutive pairs of runs grouped, as `kbench compare a1,a2 b1,b2`)."""
    from kbench.compare import Change, Settings, compare_runs, pool_runs
    from kbench.results import load_result

    settings = Settings()
    false = same = hit = slowed = 0
    per = []
    bases = [b for b in sorted(directory.glob("base-*.json")) if b.with_name(b.name.replace("base-", "new-")).exists()]
    for g in range(0, len(bases) - pool + 1, pool):
        group = bases[g:g + pool]
        base = pool_runs([load_result(b) for b in group])
        new = pool_runs([load_result(b.with_name(b.name.replace("base-", "new-"))) for b in group])
        pairs = [p for p in compare_runs(base, new, settings) if p.test]
        if old:
            old_rule(pairs, settings)
        mine = [p for p in pairs if p.backend != CHANGED]
        per.append(sum(p.change in (Change.SLOWER, Change.FASTER) for p in mine))
        false += per[-1]
        same += len(mine)
        hit += sum(p.change is Change.SLOWER for p in pairs if p.backend == CHANGED)
        slowed += sum(p.backend == CHANGED for p in pairs)
    return false, same, hit, slowed, per


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10, help="pairs of runs (comparisons)")
    ap.add_argument("--slowdown", type=float, default=1.25)
    ap.add_argument("--busy", type=int, default=0, help="busy loops beside the runs")
    ap.add_argument("--dir", type=Path, help="where the runs go (default: a temporary directory)")
    ap.add_argument("--analyse", type=Path, metavar="DIR", help="judge the runs in DIR, make none")
    ap.add_argument("--pool", type=int, default=1, help="also judge with this many runs pooled a side")
    ap.add_argument("--rounds", default="1,3", help="kbench run --rounds settings, each run side by side with the "
                                                     "others (comma-separated)")
    args = ap.parse_args()
    if args.analyse:
        directory = args.analyse
    else:
        directory = args.dir or Path(tempfile.mkdtemp(prefix="kbench-compare-noise-"))
        directory.mkdir(parents=True, exist_ok=True)
        print(f"{args.runs} pairs of smoke runs in {directory} (slowdown {args.slowdown:g}, {args.busy} busy loops; "
              f"{os.cpu_count()} CPUs)", flush=True)
        loads = make_runs(directory, args.runs, args.slowdown, args.busy, [int(r) for r in args.rounds.split(",")])
        print(f"load average (1 min) before each run: {' '.join(loads)}")
    # runs made by this script: one folder per rounds setting; older layouts: the runs in DIR itself
    folders = sorted((d for d in directory.glob("r*") if d.is_dir() and d.name[1:].isdigit()),
                     key=lambda d: int(d.name[1:])) or [directory]
    for folder in folders:
        print(f"-- {folder.name if folder != directory else directory}"
              + (f" (kbench run --rounds {folder.name[1:]})" if folder != directory else ""))
        for label, old in (("kbench compare", False), ("the rule of 6cf3c74 (four tests)", True)):
            false, same, hit, slowed, per = judge(folder, old)
            print(f"{label}: same code flagged in {false} of {same} pairs ({100 * false / max(same, 1):.1f}%; per "
                  f"comparison {per}); {CHANGED} flagged slower in {hit} of {slowed} pairs "
                  f"({100 * hit / max(slowed, 1):.0f}%)")
        if args.pool > 1:
            false, same, hit, slowed, per = judge(folder, False, args.pool)
            print(f"kbench compare, {args.pool} runs pooled a side: same code flagged in {false} of {same} pairs "
                  f"(per comparison {per}); {CHANGED} flagged slower in {hit} of {slowed} pairs")


if __name__ == "__main__":
    main()
