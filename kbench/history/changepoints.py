"""Steps in a noisy series of medians: a penalised piecewise-constant fit weighted by the series' own noise.

The method is asv's in spirit (its ``step_detect`` fits a piecewise-constant function with a penalty
per jump, weighting each point by its uncertainty), written for our records:

1. Work on ``log(median)``, so a step is a ratio whatever the case's size.
2. Each point's variance is the run's own uncertainty of its median (from the 95% confidence interval
   ``kbench run`` stores, order statistics) plus the run-to-run scatter of the series, estimated
   robustly from the median absolute difference of consecutive points (a difference's expected value
   is 0 on a level, so it is not centred: centring on the typical difference calls two levels that each
   moved alike between their runs "no scatter" and turns a step into two outliers). Within-run
   intervals alone are far too narrow: two runs of identical code differ by more than their CIs
   (docs/compare.md).
3. Isolated outliers -- one run in a slow window of the machine, 1.4-2x slower for a while -- are set
   aside first: a point further than ``OUTLIER_SIGMAS`` noise widths from the running median of its
   neighbours (7 wide; 3, one-sided, at the ends), the noise taken at its one-sided 95% upper bound (a
   short series knows its scatter poorly). A median filter keeps step edges where they are, and no kept
   point is left alone at its level (``_set_aside``), so a true step is never an outlier, except a
   step at the newest run, which one run cannot tell from a slow window: that run is reported as
   *unconfirmed* until another run agrees with it.
4. The optimal partition of the remaining points (dynamic programming over all partitions) minimises
   the weighted squared error plus ``penalty`` per change; segments have at least ``MIN_SEGMENT`` points.
5. Each change is then tested on its own: the difference of the two adjacent segments' weighted means
   against its standard error gives a z score, the confidence (1 - two-sided p) and a 95% interval of
   the step's size.

The penalty is ``PENALTY_PER_LOG_N * log(n) + PENALTY_BASE`` (in units of chi-square): a BIC-like
growth with the series' length, set so that flat synthetic histories with this project's measured noise
rarely show a step (tests/test_history.py measures both rates; docs/history.md quotes them).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
from scipy import stats

OUTLIER_SIGMAS = 5.0
RUNNING_MEDIAN_HALF = 3
MIN_SEGMENT = 2
PENALTY_PER_LOG_N = 2.0
PENALTY_BASE = 12.0
#: no series is trusted to be steadier than 0.1%: timer resolution and rounding of medians
NOISE_FLOOR = 1e-3
#: chi-square (1 degree of freedom) at 95%: positions of a step this close to the best fit are as likely
LOCATION_CHI2 = 3.841
#: asymptotic efficiency of the median absolute deviation against the standard deviation (normal data)
MAD_EFFICIENCY = 0.37
#: the run-to-run scatter (of log median) assumed of a series too short to show its own: two runs of the same
#: code on a CPU differ by ~1-2% outside slow windows (docs/compare.md), so 3% is on the safe side
RUN_TO_RUN_PRIOR = 0.03
#: how many degrees of freedom the prior counts as when blended with a series' own estimate (a few runs' worth)
PRIOR_DOF = 2.0
#: the newest run is reported (unconfirmed) when it is this many noise widths from the level before it
NEWEST_SIGMAS = 5.0
_Z95 = float(stats.norm.ppf(0.975))


@dataclass(frozen=True)
class Step:
    """A change of level between two points of a series (indices into the series' points)."""

    before: int           # last point surely at the old level
    after: int            # first point surely at the new level (the step lies in (before, after])
    size: float           # new / old - 1 of the time: > 0 slower
    size_low: float       # 95% interval of ``size``
    size_high: float
    confidence: float     # 1 - two-sided p of the difference of the two levels
    level_before: float   # fitted median time of each level (seconds)
    level_after: float

    @property
    def slower(self) -> bool:
        return self.size > 0


@dataclass(frozen=True)
class Unconfirmed:
    """The newest point is far from the level before it, and no later run can say whether it stays."""

    index: int
    size: float


@dataclass
class Fit:
    """The result of ``detect``: steps, the fitted levels, the points set aside, the noise used."""

    steps: list[Step] = field(default_factory=list)
    levels: list[tuple[int, int, float]] = field(default_factory=list)  # (first, last point, median time)
    outliers: list[int] = field(default_factory=list)
    unconfirmed: Unconfirmed | None = None
    noise: float = 0.0    # run-to-run scatter of log(median) (about the relative scatter)


def _within_run_sigma(median: np.ndarray, ci_low: np.ndarray, ci_high: np.ndarray) -> np.ndarray:
    """Standard error of log(median) from its 95% interval (half its width over 1.96)."""
    lo = np.where(ci_low > 0, ci_low, median)
    hi = np.where(ci_high > 0, ci_high, median)
    return np.maximum(np.log(hi) - np.log(lo), 0.0) / (2 * _Z95)


def run_to_run_noise(y: np.ndarray, within: np.ndarray) -> float:
    """Scatter of log(median) between runs beyond each run's own uncertainty, robust to steps and outliers.

    Consecutive differences cancel a level, so a few steps spoil only a few of them; their median
    absolute value (x 1.4826 for a normal, / sqrt 2 for a difference of two) is the total scatter.
    """
    if y.size < 3:
        return NOISE_FLOOR
    d = np.diff(y)
    total = 1.4826 * float(np.median(np.abs(d))) / math.sqrt(2)
    return max(math.sqrt(max(total ** 2 - float(np.median(within ** 2)), 0.0)), NOISE_FLOOR)


def noise_upper_factor(n: int) -> float:
    """How much larger the run-to-run scatter of an ``n``-point series may be than its estimate (one-sided
    95%): a median absolute deviation of m values has the precision of a variance from ~0.37 m (its
    asymptotic efficiency), so its chi-square bound. The outlier test uses the bound: a short series does
    not know its noise well enough to set aside a point at 5 of its estimated widths."""
    dof = max(MAD_EFFICIENCY * (n - 1), 1.0)
    return math.sqrt(dof / float(stats.chi2.ppf(0.05, dof)))


def _running_median(y: np.ndarray) -> np.ndarray:
    n, h = y.size, RUNNING_MEDIAN_HALF
    out = np.empty(n)
    if n > 2 * h:
        out[h: n - h] = np.median(np.lib.stride_tricks.sliding_window_view(y, 2 * h + 1), axis=1)
    for i in (i for i in range(n) if i < h or i >= n - h):  # near the ends: narrower windows
        k = min(h, i, n - 1 - i)
        if k == 0:  # an end: the point and its two neighbours on the one side it has
            window = y[max(0, i - 2): i + 1] if i else y[: 3]
        else:
            window = y[i - k: i + k + 1]
        out[i] = np.median(window)
    return out


def _set_aside(y: np.ndarray, limit: np.ndarray) -> np.ndarray:
    """The points to set aside as outliers: further than ``limit`` from the running median of their
    neighbours, as long as that leaves no kept point alone at its level. A point alone (its nearest kept
    neighbours further than ``limit``) would have to be joined to another level (a segment holds at
    least ``MIN_SEGMENT`` points), which puts a step at the wrong run with the wrong size. Such a point
    takes back the set-aside neighbour nearest to it when one is nearer to it than any kept point (the
    two are a level: a step's edge in a noisier stretch of the series), else it is set aside too."""
    out = np.abs(y - _running_median(y)) > limit
    keep = np.flatnonzero(~out)
    if keep.size < 2:  # no level left to be unlike: nothing can be set aside
        return np.zeros(y.size, dtype=bool)
    gaps = np.abs(np.diff(y[keep]))
    nearest = np.minimum(np.append(gaps, np.inf), np.insert(gaps, 0, np.inf))
    for i in keep[nearest > limit[keep]]:
        gap = nearest[np.searchsorted(keep, i)]
        partners = [k for k in (i - 1, i + 1) if 0 <= k < y.size and out[k] and abs(y[k] - y[i]) < gap]
        if partners:
            out[min(partners, key=lambda k: abs(y[k] - y[i]))] = False
        else:
            out[i] = True
    return out


def _partition(y: np.ndarray, w: np.ndarray, penalty: float, min_size: int) -> list[int]:
    """Optimal partition of y (weights w) into segments of >= min_size points: the first index of each
    segment after the first. Exact dynamic programming, O(n^2) with the inner loop in NumPy."""
    n = y.size
    cw = np.concatenate(([0.0], np.cumsum(w)))
    cwy = np.concatenate(([0.0], np.cumsum(w * y)))
    cwyy = np.concatenate(([0.0], np.cumsum(w * y * y)))
    best = np.full(n + 1, np.inf)
    best[0] = -penalty  # the first segment costs no change
    last = np.zeros(n + 1, dtype=np.int64)
    for end in range(min_size, n + 1):
        starts = np.arange(0, end - min_size + 1)
        starts = starts[np.isfinite(best[starts])]
        if starts.size == 0:
            continue
        sw = cw[end] - cw[starts]
        swy = cwy[end] - cwy[starts]
        cost = (cwyy[end] - cwyy[starts]) - swy * swy / sw
        total = best[starts] + cost + penalty
        k = int(np.argmin(total))
        best[end], last[end] = total[k], starts[k]
    cuts, end = [], n
    while end > 0:
        start = int(last[end])
        if start > 0:
            cuts.append(start)
        end = start
    return sorted(cuts)


def _plausible_cuts(y: np.ndarray, w: np.ndarray, start: int, cut: int, end: int) -> tuple[int, int]:
    """The first and last position of a change between ``start`` and ``end`` that the data cannot tell
    from the best one: a likelihood-ratio interval (chi-square, 1 degree of freedom, 95%)."""
    cw, cwy, cwyy = (np.concatenate(([0.0], np.cumsum(v))) for v in (w[start:end], (w * y)[start:end],
                                                                      (w * y * y)[start:end]))
    t = np.arange(MIN_SEGMENT, end - start - MIN_SEGMENT + 1)  # positions relative to ``start``
    left = cwyy[t] - cwy[t] ** 2 / cw[t]
    right = (cwyy[-1] - cwyy[t]) - (cwy[-1] - cwy[t]) ** 2 / (cw[-1] - cw[t])
    cost = left + right
    plausible = t[cost - cost[cut - start - MIN_SEGMENT] <= LOCATION_CHI2] + start
    return int(plausible.min()), int(plausible.max())


def penalty_for(n: int) -> float:
    return PENALTY_PER_LOG_N * math.log(max(n, 2)) + PENALTY_BASE


def detect(median: Sequence[float], ci_low: Sequence[float] | None = None, ci_high: Sequence[float] | None = None,
           *, penalty: float | None = None) -> Fit:
    """Steps in a series of median times (history order), each with its size and confidence."""
    med = np.asarray(median, dtype=np.float64)
    if med.size == 0 or np.any(~np.isfinite(med)) or np.any(med <= 0):
        raise ValueError("medians must be positive and finite")
    lo = np.asarray(ci_low if ci_low is not None else med, dtype=np.float64)
    hi = np.asarray(ci_high if ci_high is not None else med, dtype=np.float64)
    y = np.log(med)
    within = _within_run_sigma(med, lo, hi)
    tau = run_to_run_noise(y, within)
    sigma = np.sqrt(within ** 2 + tau ** 2)
    fit = Fit(noise=tau)
    n = y.size
    if n < 2 * MIN_SEGMENT:  # too short for a step (two levels of two runs): only the newest run can be judged
        fit.levels = [(0, n - 1, float(np.exp(np.median(y))))]
        fit.unconfirmed = newest_run(y, within, np.arange(n - 1))
        return fit

    # The noise decides what is an outlier and what is a step, and is itself estimated from the points:
    # start from the robust difference estimate, then take the scatter around the fitted levels (a
    # more efficient estimate once the steps are known), never going below the robust one.
    outlier = np.zeros(n, dtype=bool)
    cuts: list[int] = []
    widen = noise_upper_factor(n)
    for _ in range(3):
        outlier = _set_aside(y, OUTLIER_SIGMAS * np.sqrt(within ** 2 + (widen * tau) ** 2))
        keep = np.flatnonzero(~outlier)
        yk, wk = y[keep], 1.0 / sigma[keep] ** 2
        if keep.size < 2 * MIN_SEGMENT:
            cuts = []
            break
        cuts = _partition(yk, wk, penalty_for(keep.size) if penalty is None else penalty, MIN_SEGMENT)
        resid = np.concatenate([seg - np.average(seg, weights=wseg)
                                for seg, wseg in zip(np.split(yk, cuts), np.split(wk, cuts))])
        scatter = 1.4826 * float(np.median(np.abs(resid)))  # robust: a slow run left in does not inflate it
        around_fit = math.sqrt(max(scatter ** 2 - float(np.median(within[keep] ** 2)), 0.0))
        new_tau = max(run_to_run_noise(yk, within[keep]), around_fit)
        if math.isclose(new_tau, tau, rel_tol=1e-3):
            break
        tau = new_tau
        sigma = np.sqrt(within ** 2 + tau ** 2)
    fit.noise = tau
    fit.outliers = [int(i) for i in np.flatnonzero(outlier) if i != n - 1]
    bounds = [0, *cuts, keep.size]
    last_level = keep[bounds[-2]:]
    if not outlier[-1] and last_level.size == MIN_SEGMENT and n > 2 * MIN_SEGMENT:
        # the newest run and the one before it make the last level: a step of two runs, or a newest run far
        # off that had to be joined to a run of the old level. The second when the run before it agrees with
        # the level before it and the newest does not: the fit without the newest run stands, and it is
        # unconfirmed (a step at the wrong run and half the size otherwise).
        before = detect(median[:-1], lo[:-1], hi[:-1], penalty=penalty)
        first, last, _ = before.levels[-1]
        level = np.array([i for i in range(first, last + 1) if i not in before.outliers])
        newest = newest_run(y, within, level) if before.unconfirmed is None else None
        if newest is not None:
            before.unconfirmed = newest
            return before
    fit.unconfirmed = newest_run(y, within, last_level[last_level < n - 1], forced=bool(outlier[-1]))
    means, ses = [], []
    for a, b in zip(bounds[:-1], bounds[1:]):
        sw = float(wk[a:b].sum())
        means.append(float((wk[a:b] * yk[a:b]).sum() / sw))
        ses.append(1.0 / math.sqrt(sw))
        fit.levels.append((int(keep[a]), int(keep[b - 1]), float(math.exp(means[-1]))))
    for j, cut in enumerate(cuts):
        first, last = _plausible_cuts(yk, wk, bounds[j], cut, bounds[j + 2])
        delta = means[j + 1] - means[j]
        se = math.hypot(ses[j], ses[j + 1])
        z = abs(delta) / se
        fit.steps.append(Step(before=int(keep[first - 1]), after=int(keep[last]), size=math.expm1(delta),
                              size_low=math.expm1(delta - _Z95 * se), size_high=math.expm1(delta + _Z95 * se),
                              confidence=float(1.0 - 2.0 * stats.norm.sf(z)),
                              level_before=math.exp(means[j]), level_after=math.exp(means[j + 1])))
    return fit


def newest_run(y: np.ndarray, within: np.ndarray, level: np.ndarray, *, forced: bool = False) -> Unconfirmed | None:
    """The newest point, when it is beyond the noise of the level before it (the points ``level``): no later
    run can say yet whether it is a step or a slow moment of the machine, so it is *unconfirmed*.

    Beyond the noise: more than ``NEWEST_SIGMAS`` widths from the median of the level, a width being the
    newest run's own uncertainty, the level's, and the run-to-run scatter. The scatter is the level's own
    (median absolute deviation around its median: one slow run among five does not inflate it) blended with
    ``RUN_TO_RUN_PRIOR`` as ``PRIOR_DOF`` degrees of freedom, so a series of two or three runs, which
    cannot show its scatter, is judged by the documented one, and a long series mostly by its own.
    ``forced``: the newest run was set aside as an outlier (``detect``'s own test), which reports it whatever
    this test says.
    """
    if level.size == 0:
        return None
    ys = y[level]
    centre = float(np.median(ys))
    own = 1.4826 * float(np.median(np.abs(ys - centre))) if ys.size >= 3 else 0.0
    tau = max(math.sqrt(max(own ** 2 - float(np.median(within[level] ** 2)), 0.0)), NOISE_FLOOR)
    dof = MAD_EFFICIENCY * max(ys.size - 1, 0)
    blended = math.sqrt((dof * tau ** 2 + PRIOR_DOF * RUN_TO_RUN_PRIOR ** 2) / (dof + PRIOR_DOF))
    # the median of m points is known to ~1.25 sigma / sqrt(m) (its efficiency for normal data)
    level_se = 1.2533 * math.sqrt(blended ** 2 + float(np.median(within[level] ** 2))) / math.sqrt(ys.size)
    width = math.sqrt(float(within[-1]) ** 2 + blended ** 2 + level_se ** 2)
    delta = float(y[-1]) - centre
    if forced or abs(delta) > NEWEST_SIGMAS * width:
        return Unconfirmed(int(y.size - 1), float(math.expm1(delta)))
    return None
