#!/usr/bin/env python3
"""How often `kbench regressions` finds a step, and how often it invents one, on synthetic histories.

Histories of 30 runs from tests/history_synthetic.py (the noise this project measures: 1% run-to-run
jitter, a slow window in one run of twenty, within-run spreads of 1-5%): SEEDS flat ones, and SEEDS
with a step of 5%, 3% and 2% at a run drawn from 5-25. A step counts as found when exactly one step is
reported and its run range holds the planted run. Seeds differ from the tests' (those use 0-9, 1000-1009).
Then a newest run 1.25x and 2x slower (histories of 2-30 runs: reported as unconfirmed, which fails the gate
unless --ignore-unconfirmed), and 4x steps in short histories (2-7 runs on each side), the case a new user's
first few runs make.

Usage: python benchmarks/step_detection.py [--seeds 200]
"""
from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import history_synthetic as hs  # noqa: E402
from kbench.history.changepoints import detect  # noqa: E402
from kbench.history.regressions import undone_steps  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=200)
    n = ap.parse_args().seeds
    flat = gate = newest = 0
    for seed in range(n):
        fit = detect(*hs.medians(5000 + seed, n=30))
        steps = fit.steps
        flat += bool(steps)
        undone = undone_steps(steps)
        gate += any(s.slower and s.size >= 0.02 and i not in undone for i, s in enumerate(steps))
        newest += bool(fit.unconfirmed and fit.unconfirmed.size >= 0.02)
    print(f"flat: a step reported in {flat} of {n}; `kbench regressions --fail` (2%) would fail on {gate} for a "
          f"step, and on {newest} more for a slower unconfirmed newest run (the generator puts one run in "
          f"{round(1 / hs.P_SLOW_WINDOW)} in a slow window; --ignore-unconfirmed: {gate})")
    newest_runs(n)
    for size in (0.05, 0.03, 0.02):
        found, width = 0, collections.Counter()
        for seed in range(n):
            k = int(np.random.default_rng(9000 + seed).integers(5, 26))
            steps = detect(*hs.medians(9000 + seed, n=30, step_at=k, step=size)).steps
            if len(steps) == 1 and steps[0].before < k <= steps[0].after:
                found += 1
                width[steps[0].after - steps[0].before] += 1
        print(f"{100 * size:.0f}% step: found at its run in {found} of {n}; range widths (runs: count) "
              f"{dict(sorted(width.items()))}")
    short_histories(20 * n)


def newest_runs(count: int) -> None:
    """A newest run 1.25x and 2x slower than the runs before it (histories of 2-30 runs, the generator's
    noise): how often `--fail` fails (an unconfirmed newest run, or a step: a slow window just before it and
    the newest run can make a two-run level)."""
    for size in (0.25, 1.0):
        for runs in (2, 3, 6, 30):
            seen = 0
            for seed in range(count):
                fit = detect(*hs.medians(7000 + seed, n=runs, step_at=runs - 1, step=size))
                undone = undone_steps(fit.steps)
                seen += bool(fit.unconfirmed and fit.unconfirmed.size >= 0.02) or any(
                    s.slower and s.size >= 0.02 and i not in undone for i, s in enumerate(fit.steps))
            print(f"newest run {1 + size:g}x slower after {runs - 1} runs: `--fail` fails in {seen} of {count}")


def short_histories(count: int) -> None:
    """A 4x step in short histories: 2-7 runs on each side, run-to-run scatter 0.5-5% drawn for each side
    apart (a kernel 4x slower need not be as steady), within-run intervals +-0.2% to +-10%."""
    rng = np.random.default_rng(77)
    found = at_size = 0
    for _ in range(count):
        nb, na = (int(v) for v in rng.integers(2, 8, 2))
        med = np.concatenate([0.65e-3 * np.exp(rng.normal(0, rng.choice([0.005, 0.02, 0.05]), nb)),
                              2.64e-3 * np.exp(rng.normal(0, rng.choice([0.005, 0.02, 0.05]), na))])
        w = rng.choice([0.002, 0.005, 0.03, 0.1])
        steps = [s for s in detect(med, med * (1 - w), med * (1 + w)).steps if s.before < nb <= s.after]
        found += bool(steps)
        at_size += any(2.5 < s.size < 3.7 for s in steps)
    print(f"4x step, 2-7 runs on each side: found at its run in {found} of {count}, at its size (+250..+370%) "
          f"in {at_size}")


if __name__ == "__main__":
    main()
