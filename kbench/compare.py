"""Compare timings with statistics: two runs (asv-style marks) or every backend against a baseline.

A pair is ``slower`` or ``faster`` only when six things agree: the ratio of medians is beyond
``factor``; the difference is statistically significant on the raw samples (Mann-Whitney U *and* a
bootstrap confidence interval of the median ratio that excludes 1, both from scipy); it is significant
against the variation between runs too (the bootstrap's standard error plus a run-to-run scatter
``run_noise`` per run, a z test at ``alpha``); the change is larger than the record's own spread
(IQR / median) unless the fastest samples moved alike; the fastest samples moved beyond the factor and the
run-to-run limit; and the records of other backends measured beside it did not move alike (a slow moment
of the machine). A change beyond the factor that fails any test is ``ambiguous``: shown, never a regression.

Within-run samples say nothing about the variation between runs (another process, another memory layout,
the clock), which moves every record of a run by a few percent; interference from other processes only
ever adds time, so it moves the median and widens the spread but leaves the fastest samples alone, while
a change in the code moves every sample (Chen and Revels, "Robust benchmarking in noisy environments",
2016, judge by the minimum); and a slow moment of the machine slows every backend measured in it.
docs/compare.md gives the reasoning and the measurements.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from kbench.enums import Status
from kbench.errors import BadInput
from kbench.record import Record, records_of


#: the default run-to-run scatter of a record's median (per run, relative): kbench.history's prior is the same
RUN_NOISE = 0.03


class Change(str, Enum):
    """What happened to one (case, backend) between two runs."""

    SLOWER = "slower"
    FASTER = "faster"
    SAME = "same"
    AMBIGUOUS = "ambiguous"        # beyond the factor, but not significant or inside the noise
    MACHINE = "machine-wide"       # beyond the factor, but the other backends of the run moved alike (machine_moves)
    FAILING = "failing"            # passed before, does not pass now
    FIXED = "fixed"                # did not pass before, passes now
    INCOMPARABLE = "incomparable"  # missing on one side, or not passed on either

    def __str__(self) -> str:
        return self.value

    @property
    def mark(self) -> str:
        return _MARKS[self]


_MARKS = {Change.SLOWER: "+", Change.FASTER: "-", Change.SAME: " ", Change.AMBIGUOUS: "~", Change.MACHINE: "m",
          Change.FAILING: "!", Change.FIXED: "*", Change.INCOMPARABLE: "x"}

#: the classes --only-changed keeps and the order --sort change uses
CHANGED = (Change.FAILING, Change.SLOWER, Change.FASTER, Change.FIXED)
_CHANGE_ORDER = {c: i for i, c in enumerate(CHANGED + (Change.MACHINE, Change.AMBIGUOUS, Change.INCOMPARABLE,
                                                         Change.SAME))}


@dataclass(frozen=True)
class Settings:
    factor: float = 1.05         # a ratio of medians within [1/factor, factor] is "same"
    alpha: float = 0.01          # significance level of the Mann-Whitney U test
    confidence: float = 0.95     # of the bootstrap interval of the ratio
    n_resamples: int = 2000
    seed: int = 0                # bootstrap resampling is seeded: the same files give the same table
    #: the scatter of a record's log median from one run of the same code to the next (process, memory layout,
    #: clock): 3% covers this project's CPU measurements (docs/compare.md); a GPU with locked clocks is quieter
    run_noise: float = RUN_NOISE

    def __post_init__(self) -> None:
        if not self.factor > 1:
            raise BadInput(f"--factor must be greater than 1, got {self.factor}", where="--factor",
                           fix="e.g. --factor 1.05 (a change of 5%)")
        if not 0 < self.alpha < 1:
            raise BadInput(f"--alpha must be between 0 and 1, got {self.alpha}", where="--alpha", fix="e.g. 0.01")
        if not 0 <= self.run_noise < 1:
            raise BadInput(f"--run-noise must be between 0% and 100%, got {self.run_noise:g}", where="--run-noise",
                           fix="e.g. --run-noise 3% (two runs of the same code differ by a few percent)")


@dataclass(frozen=True)
class RatioTest:
    """``ratio`` = median(new) / median(base) of times (> 1: new is slower), its CI, and the U test."""

    ratio: float
    ci_low: float
    ci_high: float
    p_value: float
    n_base: int
    n_new: int
    noise: float                 # the larger relative spread (IQR / median) of the two sides
    min_ratio: float = math.nan  # min(new) / min(base): the fastest samples, which interference cannot slow
    se_log: float = math.nan     # standard error of log(ratio) from the samples (the bootstrap interval's width)
    runs: tuple[int, int] = (1, 1)  # runs pooled on each side (base, new)

    def significant(self, alpha: float) -> bool:
        """Both tests agree: the U test rejects at ``alpha`` and the CI of the ratio excludes 1."""
        return self.p_value < alpha and (self.ci_low > 1 or self.ci_high < 1)

    def run_z(self, run_noise: float) -> float:
        """|log ratio| in standard errors of a difference between runs: the samples' own uncertainty plus a
        run-to-run scatter ``run_noise`` per run (divided by the runs pooled on each side)."""
        within = self.se_log if math.isfinite(self.se_log) else 0.0
        se = math.sqrt(within ** 2 + run_noise ** 2 * (1 / self.runs[0] + 1 / self.runs[1]))
        return abs(math.log(self.ratio)) / se if se > 0 else math.inf

    def run_limit(self, settings: Settings) -> float:
        """The smallest ratio (above 1) that is beyond the variation between runs at ``settings.alpha``."""
        within = self.se_log if math.isfinite(self.se_log) else 0.0
        se = math.sqrt(within ** 2 + settings.run_noise ** 2 * (1 / self.runs[0] + 1 / self.runs[1]))
        return math.exp(_z(settings.alpha) * se)


@functools.lru_cache(maxsize=16)
def _z(alpha: float) -> float:
    """The two-sided normal quantile of ``alpha``: 2.58 for 0.01."""
    from scipy import stats

    return float(stats.norm.isf(alpha / 2))


def _median_ratio(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.median(b, axis=axis) / np.median(a, axis=axis)


def _rel_iqr(arr: np.ndarray) -> float:
    q1, med, q3 = np.percentile(arr, [25, 50, 75])
    return float((q3 - q1) / med) if med > 0 else math.inf


def ratio_test(base: Sequence[float], new: Sequence[float], settings: Settings = Settings()) -> RatioTest:
    """Ratio of medians of two sets of time samples with a bootstrap CI and a Mann-Whitney U p-value."""
    from scipy import stats  # lazily: the CLI imports this module at start-up

    a = np.asarray(base, dtype=np.float64)
    b = np.asarray(new, dtype=np.float64)
    if a.size < 2 or b.size < 2:
        raise ValueError("each side needs at least two samples")
    ratio = float(_median_ratio(a, b))
    p = float(stats.mannwhitneyu(a, b, alternative="two-sided").pvalue)
    # batch bounds the resampled arrays to ~2M floats whatever the sample counts (faster, and little memory)
    batch = max(1, int(2e6 // (a.size + b.size)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # degenerate (constant) samples: the CI collapses, handled below
        res = stats.bootstrap((a, b), _median_ratio, n_resamples=settings.n_resamples, vectorized=True,
                              confidence_level=settings.confidence, method="percentile", batch=batch,
                              rng=np.random.default_rng(settings.seed))
    low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if not (math.isfinite(low) and math.isfinite(high)):
        low = high = ratio
    if math.isnan(p):  # every sample equal on both sides
        p = 1.0
    low, high = min(low, ratio), max(high, ratio)
    se_log = (math.log(high) - math.log(low)) / (2 * _z(1 - settings.confidence)) if low > 0 else math.nan
    return RatioTest(ratio, low, high, p, int(a.size), int(b.size),
                     max(_rel_iqr(a), _rel_iqr(b)), float(b.min() / a.min()) if a.min() > 0 else math.nan, se_log)


@functools.lru_cache(maxsize=256)
def smallest_p(n_base: int, n_new: int) -> float:
    """The smallest p-value the two-sided Mann-Whitney U test can give for these sample counts (two sets
    with no overlap at all): 0.33 for 2 against 2, 0.1 for 3 against 3, 0.008 for 5 against 5. When it is
    not below alpha, no difference, however large, can be significant: the samples are too few to tell."""
    from scipy import stats

    return float(stats.mannwhitneyu(np.arange(n_base), np.arange(n_base, n_base + n_new),
                                    alternative="two-sided").pvalue)


def too_few_samples(test: RatioTest, alpha: float) -> bool:
    return smallest_p(test.n_base, test.n_new) >= alpha


def few_samples_note(test: RatioTest, alpha: float) -> str:
    return (f"too few samples to tell (n={test.n_base} and {test.n_new}: the U test cannot reach "
            f"p<{alpha:g} with so few, its floor is {smallest_p(test.n_base, test.n_new):.2g})")


def fastest_agree(test: RatioTest) -> bool:
    """The fastest samples moved the way the median did, by half to one and a half times as much (in log)."""
    move = math.log(test.ratio)
    return math.isfinite(test.min_ratio) and test.min_ratio > 0 and \
        abs(math.log(test.min_ratio) - move) <= 0.5 * abs(move)


def limit_reason(test: RatioTest, settings: Settings) -> str:
    """What the smallest ratio a verdict needs here is made of, in words: the samples' own uncertainty (a
    standard error of the log ratio) and the run-to-run scatter, and which of the two dominates."""
    within = test.se_log if math.isfinite(test.se_log) else 0.0
    between = settings.run_noise * math.sqrt(1 / test.runs[0] + 1 / test.runs[1])
    mostly = "the samples' own uncertainty" if within >= between else "the run-to-run scatter"
    return (f"a verdict needs a ratio beyond {test.run_limit(settings):.3f} here, mostly from {mostly}: samples "
            f"+-{100 * within:.1f}%, runs +-{100 * between:.1f}% (run-to-run scatter {100 * settings.run_noise:g}%)")


def classify(test: RatioTest, settings: Settings = Settings()) -> tuple[Change, str]:
    """The class of a timing change and, for ``ambiguous``, why it is not a verdict."""
    slower, faster = test.ratio >= settings.factor, test.ratio <= 1 / settings.factor
    if not (slower or faster):
        return Change.SAME, ""
    if not test.significant(settings.alpha):
        if too_few_samples(test, settings.alpha):
            return Change.AMBIGUOUS, few_samples_note(test, settings.alpha)
        return Change.AMBIGUOUS, (f"not significant (p={test.p_value:.2g}, "
                                  f"ratio CI {test.ci_low:.3f}-{test.ci_high:.3f})")
    if test.run_z(settings.run_noise) <= _z(settings.alpha):
        return Change.AMBIGUOUS, f"within the variation between runs ({limit_reason(test, settings)})"
    # a record's own spread is its noise floor, unless its fastest samples moved as the median did: interference
    # widens the spread (and hides a change of the median in it) but leaves the fastest samples clean
    if abs(math.log(test.ratio)) <= math.log1p(test.noise) and not fastest_agree(test):
        return Change.AMBIGUOUS, f"inside the noise (spread {100 * test.noise:.1f}%)"
    if not (test.min_ratio >= settings.factor if slower else test.min_ratio <= 1 / settings.factor):
        return Change.AMBIGUOUS, (f"the fastest samples did not move (min ratio {test.min_ratio:.3f}): "
                                  "interference from other work, not the code?")
    # a change in the code moves every sample: the fastest too, beyond what runs of the same code differ by
    if abs(math.log(test.min_ratio)) <= math.log(test.run_limit(settings)):
        return Change.AMBIGUOUS, (f"the fastest samples moved less than runs differ (min ratio "
                                  f"{test.min_ratio:.3f}, median ratio {test.ratio:.3f}): interference, not the code?")
    return (Change.SLOWER if slower else Change.FASTER), ""


# -- two runs -------------------------------------------------------------------------------------

def _passed(rec: Record | None) -> bool:
    """Passed with at least two samples: what a ratio test needs."""
    return rec is not None and rec.passed and len(rec.samples) >= 2


@dataclass
class Pair:
    """One (case, backend) seen in the base run, the new run, or both."""

    case_id: str
    backend: str
    base: Record | None
    new: Record | None
    change: Change = Change.INCOMPARABLE
    test: RatioTest | None = None
    note: str = ""

    @property
    def key(self) -> tuple[str, str]:
        return self.case_id, self.backend

    def to_json(self) -> dict[str, Any]:
        t = self.test
        return {"case_id": self.case_id, "backend": self.backend, "change": self.change.value,
                "mark": self.change.mark, "base_status": self.base and self.base.status.value,
                "new_status": self.new and self.new.status.value, "base_median": median_of(self.base),
                "new_median": median_of(self.new), "ratio": t and t.ratio, "ci_low": t and t.ci_low,
                "ci_high": t and t.ci_high, "p_value": t and t.p_value, "noise": t and t.noise,
                "min_ratio": t and t.min_ratio, "se_log": t and t.se_log, "runs": t and list(t.runs),
                "n_base": n_of(self.base), "n_new": n_of(self.new),
                "stop_reason_base": stop_of(self.base), "stop_reason_new": stop_of(self.new), "note": self.note}


def n_of(rec: Record | None) -> int | None:
    """Timed samples of a record (pooled runs: of all of them), None when it was not timed."""
    return len(rec.samples) if rec is not None and rec.timing else None


def stop_of(rec: Record | None) -> str | None:
    return (rec.timing or {}).get("stop_reason") if rec is not None else None


def median_of(rec: Record | None) -> float | None:
    """Median of the raw samples (of pooled runs too, whose summary statistics are per run)."""
    samples = rec.samples if rec is not None else []
    return float(np.median(samples)) if samples else None


def both_skipped(pair: Pair) -> bool:
    """Skipped in both runs (e.g. a GPU backend on a CPU machine): nothing to say per case."""
    return (pair.base is not None and pair.new is not None
            and pair.base.status is pair.new.status is Status.SKIPPED)


def compare_pair(pair: Pair, settings: Settings, runs: tuple[int, int] = (1, 1)) -> Pair:
    """Judge one pair; ``runs``: how many runs each side pools (their medians vary less between runs)."""
    base_ok, new_ok = _passed(pair.base), _passed(pair.new)
    if base_ok and new_ok:
        pair.test = dataclasses.replace(ratio_test(pair.base.samples, pair.new.samples, settings), runs=runs)
        pair.change, pair.note = classify(pair.test, settings)
    elif base_ok and pair.new is not None and pair.new.status is not Status.SKIPPED:
        pair.change, pair.note = Change.FAILING, pair.new.status_text
    elif new_ok and pair.base is not None and pair.base.status is not Status.SKIPPED:
        pair.change, pair.note = Change.FIXED, f"was {pair.base.status_text}"
    else:
        pair.change = Change.INCOMPARABLE
        if pair.base is None or pair.new is None:
            pair.note = "only in " + ("the new run" if pair.base is None else "the base run")
        else:
            pair.note = "; ".join(f"{side}: {r.status_text}" for side, r in (("base", pair.base), ("new", pair.new))
                                  if not _passed(r))
    changed = settings_changed(pair.base, pair.new)
    if changed:
        pair.note = "; ".join(n for n in (pair.note, changed) if n)
    return pair


def settings_changed(base: Record | None, new: Record | None) -> str:
    """The tunables that differ between two records of one backend name (a changed default), or ""."""
    if base is None or new is None or not (base.tunables and new.tunables) or base.tunables == new.tunables:
        return ""
    names = sorted(set(base.tunables) | set(new.tunables))
    return "settings differ: " + ", ".join(f"{n} {base.tunables.get(n, '-')} -> {new.tunables.get(n, '-')}"
                                           for n in names if base.tunables.get(n) != new.tunables.get(n))


def machine_mismatch(base: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Why two results are not from the same machine and hardware (empty when they are)."""
    why = []
    b_id, n_id = base["machine"]["id"], new["machine"]["id"]
    if b_id != n_id:
        why.append(f"machine {b_id!r} vs {n_id!r}")
    if base.get("device") != new.get("device"):
        why.append(f"device {base.get('device')!r} vs {new.get('device')!r}")
    b_hw, n_hw = (base.get("hardware") or {}).get("name"), (new.get("hardware") or {}).get("name")
    if b_hw != n_hw:
        why.append(f"hardware profile {b_hw!r} vs {n_hw!r}")
    return why


def check_same_machine(base: Mapping[str, Any], new: Mapping[str, Any], *, base_file: str = "BASE",
                       new_file: str = "NEW") -> None:
    why = machine_mismatch(base, new)
    if why:
        raise BadInput(f"results come from different machines ({'; '.join(why)}) compared with {base_file}: "
                       "a time ratio across machines measures the machines, not the code",
                       file=new_file, where="machine",
                       fix="compare two runs from one machine, or pass --allow-different-machines to compare anyway")


def pool_runs(results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Repeated runs of one side as one: the samples of each (case, backend) concatenated.

    The pooled spread then includes the run-to-run variation (another process on the machine,
    a different memory layout per process), which one run's samples cannot show; a change must
    exceed it to be a verdict. A record that did not pass in any run stands for that pair.
    """
    if len(results) == 1:
        return {**results[0], "records": records_of(results[0])}
    merged: dict[tuple[str, str, str | None], Record] = {}
    for data in results:
        for rec in records_of(data):
            key = (*rec.key, profile_of(rec, data))
            have = merged.get(key)
            if have is None or (have.passed and not rec.passed):
                merged[key] = rec
            elif have.passed and rec.passed:
                merged[key] = have.with_samples(have.samples + rec.samples)
    return {**results[0], "records": list(merged.values()), "pooled": [d.get("id") for d in results]}


# -- records of several hardware profiles in one file (a run across GPU models: docs/scale-out.md) ----

def profile_of(rec: Record, data: Mapping[str, Any]) -> str | None:
    """The hardware profile a record ran on: its ``placement.profile``, else its result's header ``hardware``."""
    return rec.profile or (data.get("hardware") or {}).get("name")


def mixed_profiles(data: Mapping[str, Any], records: Sequence[Record]) -> bool:
    """Whether a result holds records measured on more than one hardware profile."""
    return len({profile_of(r, data) for r in records} - {None}) > 1


def case_label(rec: Record, data: Mapping[str, Any], mixed: bool) -> str:
    """What a record is paired and shown by: its case id, and where results mix hardware profiles the
    profile it ran on too (``CASE @ PROFILE``), so a time on one GPU model is never set against another's."""
    profile = profile_of(rec, data) if mixed else None
    return f"{rec.case_id} @ {profile}" if profile else rec.case_id


def compare_runs(base: Mapping[str, Any], new: Mapping[str, Any], settings: Settings = Settings()) -> list[Pair]:
    """Match records by (case id, backend), and by hardware profile where a run mixes profiles; in the base
    run's order, then the new run's extras."""
    base_recs, new_recs = records_of(base), records_of(new)
    mixed = mixed_profiles(base, base_recs) or mixed_profiles(new, new_recs)
    new_by_key = {(case_label(r, new, mixed), r.backend): r for r in new_recs}
    pairs: dict[tuple[str, str], Pair] = {}
    for rec in base_recs:
        key = (case_label(rec, base, mixed), rec.backend)
        pairs[key] = Pair(*key, base=rec, new=new_by_key.get(key))
    for key, rec in new_by_key.items():
        pairs.setdefault(key, Pair(*key, base=None, new=rec))
    runs = (len(base.get("pooled") or [None]), len(new.get("pooled") or [None]))
    return machine_moved([compare_pair(p, settings, runs) for p in pairs.values()], settings)


#: how :func:`machine_moves` begins its reason when the whole run moved alike
WHOLE_RUN = "the backends of the run moved alike"


def machine_moves(moves: Sequence[tuple[str, float]], examine: Iterable[int], factor: float) -> dict[int, str]:
    """The control rule: which of the moves at indices ``examine`` the machine explains, and why.

    ``moves`` are (backend, log of new / old time) of the timed records of one run, in the order they were
    measured. Two tests, each holding a record against records of *other* backends measured in the same runs:

    * **the whole run moved**: the record's backend moved, typically (the median over its records), beyond
      ``factor``, and every other backend typically moved the same way at least half as far (with half of them
      enough, a slow window over half the run made a slowed backend machine-wide: 87 of 100 named instead of 98):
      a slow (or fast) run of the machine, or something every backend shares (kbench, the libraries), not one
      backend's code. A backend that changed beside unchanged ones is not explained.
    * **a slow moment**: the record lies in a stretch of three consecutive records (two at either end of the
      run) that all moved alike, the others of other backends: a slow window of the machine (about a second, 1.4-2x, every sample and the
      minimum too: docs/compare.md) slows whatever runs in it, while a change in the code slows its own
      backend. Each move is counted from its backend's typical move, so a backend that changed on every case
      is not explained away, and one that changed still shows a slow moment beside it: only a record beyond
      ``factor`` *from its backend's typical move* is examined, and the other two must each have moved at
      least half as far the same way from theirs. A record that moved less than its backend typically did is
      never explained so (a slow moment adds to a move): the unaffected cases of a backend that changed, beside
      its cases that also met a slow moment, are that backend's change.

    With one backend there is nothing to hold a record against, and nothing is explained. ``kbench compare``,
    ``kbench regressions`` and ``publish``'s summary all judge by this one rule."""
    limit = math.log(factor)
    if len(moves) < 2:
        return {}
    per_backend: dict[str, list[float]] = {}
    for backend, lg in moves:
        per_backend.setdefault(backend, []).append(lg)
    typical = {b: float(np.median(v)) for b, v in per_backend.items()}
    devs = [lg - typical[b] for b, lg in moves]
    out: dict[int, str] = {}
    for k in examine:
        backend, lg = moves[k]
        t = typical[backend]
        others = [v for b, v in typical.items() if b != backend]
        if others and abs(t) > limit and lg * t > 0 and all(v * t >= 0.5 * t * t for v in others):
            out[k] = (WHOLE_RUN + " (" + ", ".join(
                f"{b} x{math.exp(v):.2f}" for b, v in sorted(typical.items())) + "): machine-wide (the machine, "
                "or what every backend shares), not this backend's code")
            continue
        dev = devs[k]
        if abs(dev) <= limit or dev * lg <= 0:  # a slow moment adds to a record's move, never takes from it
            continue
        # stretches of three consecutive records holding k; at either end of the run, of two (a window that
        # began before the run's first record or outlasted its last covers fewer)
        stretches = [range(first, first + 3) for first in range(max(k - 2, 0), min(k, len(moves) - 3) + 1)]
        if k == 0 or k == len(moves) - 1:
            stretches.append(range(k, k + 2) if k == 0 else range(k - 1, k + 1))
        for stretch in stretches:
            near = [m for m in stretch if m != k]
            if all(moves[m][0] != backend and devs[m] * dev >= 0.5 * dev * dev for m in near):
                out[k] = ("the records measured beside it moved alike ("
                          + ", ".join(f"{moves[m][0]} x{math.exp(moves[m][1]):.2f}" for m in near)
                          + "): a slow moment of the machine, not the code?")
                break
    return out


def machine_moved(pairs: list[Pair], settings: Settings) -> list[Pair]:
    """Withdraw a verdict where the control rule (:func:`machine_moves`) says the machine moved: ``machine-wide``
    when the whole run moved alike (never a regression for the gate, but reported), ``ambiguous`` when the
    records measured beside it did."""
    timed = [i for i, p in enumerate(pairs) if p.test is not None]
    if len(timed) < 2:
        return pairs
    moves = [(pairs[i].backend, math.log(pairs[i].test.ratio)) for i in timed]
    examine = [k for k, i in enumerate(timed) if pairs[i].change in (Change.SLOWER, Change.FASTER)]
    for k, why in machine_moves(moves, examine, settings.factor).items():
        p = pairs[timed[k]]
        p.change = Change.MACHINE if why.startswith(WHOLE_RUN) else Change.AMBIGUOUS
        p.note = "; ".join(n for n in (why, p.note) if n)
    return pairs


def sort_pairs(pairs: list[Pair], how: str) -> list[Pair]:
    if how == "name":
        return sorted(pairs, key=lambda p: (p.case_id, p.backend))
    if how == "ratio":  # worst (largest time ratio) first; pairs without a ratio last
        return sorted(pairs, key=lambda p: -p.test.ratio if p.test else math.inf)
    if how == "change":
        return sorted(pairs, key=lambda p: (_CHANGE_ORDER[p.change], -(p.test.ratio if p.test else 0)))
    return list(pairs)  # "run": the order of the runs


SORTS = ("run", "name", "ratio", "change")


def counts(pairs: Iterable[Pair]) -> dict[Change, int]:
    out = {c: 0 for c in Change}
    for p in pairs:
        out[p.change] += 1
    return out


def geomean(values: Iterable[float]) -> float | None:
    from scipy import stats

    vals = [v for v in values if v and v > 0 and math.isfinite(v)]
    return float(stats.gmean(vals)) if vals else None


def is_regression(pairs: Iterable[Pair]) -> bool:
    """What --fail-on-regression fails on: a pair slower, or a pair that passed before and no longer does."""
    return any(p.change in (Change.SLOWER, Change.FAILING) for p in pairs)


# -- one run, every backend against a baseline ---------------------------------------------------

@dataclass
class Speedup:
    """``speedup`` = median(baseline time) / median(backend time): > 1 means the backend is faster."""

    case_id: str
    group: str
    backend: str
    speedup: float | None
    ci_low: float | None = None
    ci_high: float | None = None
    p_value: float | None = None
    significant: bool = False
    #: not significant only because the U test cannot reach alpha with so few samples (``n`` of each side)
    few_samples: bool = False
    n: tuple[int, int] | None = None   # samples of (backend, baseline)
    note: str = ""

    @property
    def mark(self) -> str:
        """"" significant, "?" within the noise, "(n=2/3)" too few samples to tell either way."""
        if self.speedup is None or self.significant:
            return ""
        return f"(n={self.n[0]}/{self.n[1]})" if self.few_samples and self.n else "?"

    def to_json(self) -> dict[str, Any]:
        out = dict(vars(self))
        out["n"] = list(self.n) if self.n else None
        return out


@dataclass
class BaselineTable:
    baseline: str
    backends: list[str]
    cases: list[str]                                  # case ids in run order
    groups: dict[str, list[str]]                      # group key -> case ids
    baseline_median: dict[str, float | None]          # case id -> seconds
    cells: dict[tuple[str, str], Speedup] = field(default_factory=dict)   # (case id, backend)
    never_passed: dict[str, str] = field(default_factory=dict)            # backend -> why (first reason)

    def group_geomean(self, group: str, backend: str) -> float | None:
        return geomean(self.cells[(c, backend)].speedup for c in self.groups[group] if (c, backend) in self.cells)

    def overall_geomean(self, backend: str) -> float | None:
        return geomean(s.speedup for (c, b), s in self.cells.items() if b == backend)


def group_key_for(registry) -> Callable[[Record], str]:
    """record -> its op's group key (head_dim x causal x heads x dtype for attention), or the op name."""
    from kbench.errors import KbenchError

    def key(rec: Record) -> str:
        try:
            op = registry.op(rec.op)
            return op.group_key(op.make_case(rec.case))
        except (KbenchError, ValueError, KeyError):  # op not installed here, or an old parameter set
            return rec.op
    return key


def speedup_vs_baseline(result: Mapping[str, Any], baseline: str, group_key: Callable[[Record], str],
                        settings: Settings = Settings(), *, file: str | None = None) -> BaselineTable:
    records = records_of(result, file=file)
    backends = list(dict.fromkeys(r.backend for r in records))
    if baseline not in backends:
        raise BadInput(f"backend {baseline!r} is not in this result", file=file, where="--baseline",
                       fix=f"use one of: {', '.join(backends)}")
    mixed = mixed_profiles(result, records)
    labels = [case_label(r, result, mixed) for r in records]   # case ids, "CASE @ PROFILE" across GPU models
    by_key = {(label, r.backend): r for label, r in zip(labels, records)}
    cases = list(dict.fromkeys(labels))
    groups: dict[str, list[str]] = {}
    first = {label: r for label, r in reversed(list(zip(labels, records)))}
    for cid in cases:
        group = group_key(first[cid])
        profile = profile_of(first[cid], result) if mixed else None
        groups.setdefault(f"{group} @ {profile}" if profile else group, []).append(cid)
    never = {b: next(r for r in records if r.backend == b).status_text for b in backends
             if b != baseline and not any(_passed(r) for r in records if r.backend == b)}
    table = BaselineTable(baseline, [b for b in backends if b != baseline and b not in never], cases, groups,
                          {c: median_of(by_key.get((c, baseline))) if _passed(by_key.get((c, baseline))) else None
                           for c in cases}, never_passed=never)
    for group, ids in groups.items():
        for cid in ids:
            base = by_key.get((cid, baseline))
            for name in table.backends:
                rec = by_key.get((cid, name))
                if rec is None:
                    continue
                cell = Speedup(cid, group, name, None)
                if not _passed(base):
                    cell.note = f"baseline {base.status_text if base else 'missing'}"
                elif not _passed(rec):
                    cell.note = rec.status_text
                else:
                    t = ratio_test(rec.samples, base.samples, settings)  # base/rec times: > 1 is faster
                    cell.speedup, cell.ci_low, cell.ci_high, cell.p_value = t.ratio, t.ci_low, t.ci_high, t.p_value
                    cell.significant = t.significant(settings.alpha)
                    cell.n = (t.n_base, t.n_new)
                    # the interval excludes 1 but the U test cannot say so with so few samples: not "noise"
                    cell.few_samples = (not cell.significant and (t.ci_low > 1 or t.ci_high < 1)
                                        and too_few_samples(t, settings.alpha))
                table.cells[(cid, name)] = cell
    return table


def fmt_speedup(speedup: float | None) -> str:
    """A speedup as a ratio that reads the same way for 3% and 76x: 1.035 -> "1.03x faster",
    0.5 -> "2.00x slower", 0.0131 -> "76.3x slower"."""
    if speedup is None or not speedup > 0:
        return ""
    x = speedup if speedup >= 1 else 1 / speedup
    digits = 2 if x < 10 else 1 if x < 100 else 0
    return f"{x:.{digits}f}x {'faster' if speedup >= 1 else 'slower'}"
