"""Synthetic performance histories with the noise this project measures (shared by test_history.py,
test_publish.py and benchmarks/publish.py).

A run's samples of one record: lognormal around the level with a within-run spread of 1-5%, a 5% tail
of samples 1.2-3x slower (preemption), as many samples as ``kbench run``'s stopping rule takes to reach
a 0.5% standard error (10 to 400); each run moves the level by a run-to-run jitter of 1% (lognormal), and
one run in twenty falls in a slow window of the machine, every sample 1.3-1.8x slower, as docs/compare.md
measured on the development VM.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import math
from pathlib import Path
from typing import Sequence

import numpy as np

from kbench.stats import summarize

JITTER = 0.01
P_SLOW_WINDOW = 0.05


def run_samples(rng: np.random.Generator, level: float) -> np.ndarray:
    """The timing samples of one record in one run whose true time is ``level``."""
    factor = math.exp(rng.normal(0.0, JITTER))
    if rng.random() < P_SLOW_WINDOW:
        factor *= rng.uniform(1.3, 1.8)
    spread = rng.uniform(0.01, 0.05)
    n = int(np.clip((spread / 0.005) ** 2, 10, 400))
    samples = level * factor * np.exp(rng.normal(0.0, spread, n))
    tail = rng.random(n) < 0.05
    samples[tail] *= rng.uniform(1.2, 3.0, int(tail.sum()))
    return samples


def levels(n: int, base: float, step_at: int | None, step: float) -> list[float]:
    return [base * (1 + step if step_at is not None and i >= step_at else 1.0) for i in range(n)]


def medians(seed: int, n: int = 30, step_at: int | None = None, step: float = 0.05):
    """(median, ci_low, ci_high) of each run of one series, through kbench's own ``summarize``."""
    rng = np.random.default_rng(seed)
    out = [summarize(run_samples(rng, lv)) for lv in levels(n, rng.uniform(50e-6, 5e-3), step_at, step)]
    return [s["median"] for s in out], [s["ci_low"] for s in out], [s["ci_high"] for s in out]


def fake_commit(i: int, salt: str = "") -> str:
    return hashlib.sha1(f"{salt}{i}".encode()).hexdigest()


def write_history(directory: Path, *, seed: int, n: int = 30, step_at: int | None = None, step: float = 0.05,
                  machine: dict | None = None, backends: Sequence[str] = ("numpy",), env_change_at: int | None = None,
                  start: _dt.datetime = _dt.datetime(2026, 10, 1, tzinfo=_dt.timezone.utc)) -> list[Path]:
    """``n`` result files, one a day, of two cases per backend; ``step_at`` slows backend[0]'s first case."""
    from synthetic_results import CPU_MACHINE, record, result

    machine = dict(machine or CPU_MACHINE)
    rng = np.random.default_rng(seed)
    cases = [{"batch": 1, "seqlen_q": 64, "seqlen_kv": 64, "heads_q": 4, "heads_kv": 4, "head_dim": 32,
              "causal": False, "dtype": "fp32"},
             {"batch": 1, "seqlen_q": 64, "seqlen_kv": 64, "heads_q": 4, "heads_kv": 4, "head_dim": 64,
              "causal": True, "dtype": "fp32"}]
    base = {(b, i): rng.uniform(50e-6, 5e-3) for b in backends for i in range(len(cases))}
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for run in range(n):
        recs = []
        for b in backends:
            for i, params in enumerate(cases):
                stepped = (b, i) == (backends[0], 0) and step_at is not None and run >= step_at
                recs.append(record(b, params, run_samples(rng, base[(b, i)] * (1 + step if stepped else 1))))
        data = result(recs, machine=machine, name=f"attention-{run:04d}")
        created = start + _dt.timedelta(days=run)
        data["created"] = created.isoformat()
        torch = "2.13.0" if env_change_at is not None and run >= env_change_at else "2.12.1"
        data["environment"] = {"kbench": "0.1.0", "python": "3.11.7", "git_commit": fake_commit(run, machine["id"]),
                               "torch": torch, "numpy": "2.4.6"}
        data["suite"]["name"] = "attention"
        path = directory / machine["id"] / f"attention-{created:%Y%m%d}-{run:04d}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        import json

        path.write_text(json.dumps(data))
        paths.append(path)
    return paths
