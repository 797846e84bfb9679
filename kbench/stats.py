"""Summary statistics of timing samples.

SciPy is imported where a statistic needs it, not with this module: the CLI, the plugin manager and every worker
import modules that import this one. The judge's summaries use ``scipy.special`` only; ``scipy.stats`` alone takes
about half a second to load, which every ``kbench run`` paid for a standard error and a binomial.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np


def rel_standard_error(samples: Sequence[float]) -> float:
    """Standard error of the mean over the mean; inf with fewer than two samples.

    NumPy's sample standard deviation over sqrt(n) (what ``scipy.stats.sem`` computes): the judge asks this after
    every timed batch, and scipy's wrapper costs ~0.2 ms a call and the import of ``scipy.stats``."""
    n = len(samples)
    if n < 2:
        return math.inf
    arr = np.asarray(samples, dtype=np.float64)
    mean = arr.mean()
    return float(arr.std(ddof=1) / math.sqrt(n) / mean) if mean > 0 else math.inf


def median_ci(samples: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """Distribution-free confidence interval of the median: the order statistics that a Binomial(n, 1/2) count
    puts outside the interval with probability (1 - confidence) / 2 on each side (the interval
    ``scipy.stats.quantile_test(x, q, p=0.5).confidence_interval(confidence)`` gives; tests/test_stats.py holds
    them equal). The binomial comes from ``scipy.special`` (a seventh of the import time of ``scipy.stats``,
    which every ``kbench run`` would otherwise load for this alone)."""
    from scipy import special

    arr = np.sort(np.asarray(samples, dtype=np.float64))
    n = len(arr)
    if n < 6:
        return float(arr.min()), float(arr.max())
    tail = (1.0 - confidence) / 2
    k = np.arange(n + 1, dtype=np.float64)
    cdf = special.bdtr(k, n, 0.5)    # P(X <= k)
    sf = special.bdtrc(k, n, 0.5)    # P(X > k)
    low_index = int(np.searchsorted(cdf, tail, side="left")) - 1   # scipy.stats: binom.ppf(tail) - 1
    high_index = int(np.searchsorted(-sf, -tail, side="left"))     # scipy.stats: binom.isf(tail)
    low = float(arr[low_index]) if low_index >= 0 else float(arr[0])
    high = float(arr[high_index]) if high_index < n else float(arr[-1])
    return low, high


def summarize(samples: Sequence[float]) -> dict[str, float]:
    """Median, min, max, mean, std, quartiles, relative spread (IQR/median), rel. SE, 95% CI of the median."""
    arr = np.asarray(samples, dtype=np.float64)
    if arr.size == 0:
        return {}
    q1, med, q3 = (float(x) for x in np.percentile(arr, [25, 50, 75]))
    low, high = median_ci(arr)
    return {
        "n": int(arr.size),
        "median": med,
        "min": float(arr.min()),
        "max": float(arr.max()),
        "mean": float(arr.mean()),
        "std": float(arr.std(ddof=1)) if arr.size > 1 else 0.0,
        "q1": q1,
        "q3": q3,
        "rel_spread": (q3 - q1) / med if med > 0 else math.inf,
        "rel_se": rel_standard_error(arr),
        "ci_low": low,
        "ci_high": high,
    }
