"""Summary statistics of timing samples (scipy does the statistics; this module only arranges them).

SciPy is imported where a statistic is computed, not with this module: the CLI, the plugin manager and every
worker import modules that import this one, and ``scipy.stats`` alone takes most of a second to load.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np


def rel_standard_error(samples: Sequence[float]) -> float:
    """Standard error of the mean over the mean; inf with fewer than two samples."""
    n = len(samples)
    if n < 2:
        return math.inf
    from scipy import stats

    arr = np.asarray(samples, dtype=np.float64)
    mean = arr.mean()
    return float(stats.sem(arr) / mean) if mean > 0 else math.inf


def median_ci(samples: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """Distribution-free confidence interval of the median (order statistics, scipy.stats.quantile_test)."""
    from scipy import stats

    arr = np.asarray(samples, dtype=np.float64)
    if len(arr) < 6:
        return float(arr.min()), float(arr.max())
    ci = stats.quantile_test(arr, q=float(np.median(arr)), p=0.5).confidence_interval(confidence)
    low = float(ci.low) if np.isfinite(ci.low) else float(arr.min())
    high = float(ci.high) if np.isfinite(ci.high) else float(arr.max())
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
