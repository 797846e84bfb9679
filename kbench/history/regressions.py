"""Steps found in every series of a history, with the commit range, size and confidence of each."""
from __future__ import annotations

import dataclasses
import datetime as _dt
import math
from dataclasses import dataclass
from typing import Any, Sequence

from kbench.history.changepoints import Fit, Step, detect
from kbench.history.runs import EnvChange, Run
from kbench.history.series import History, Series


@dataclass(frozen=True)
class Found:
    """One step of one series, placed in its history: the runs (and commits) between which it happened."""

    series: Series
    step: Step
    before: Run           # last run at the old level
    after: Run            # first run at the new level
    env: tuple[EnvChange, ...]  # environment changes inside the range: they may explain the step
    undone: bool = False        # a step the other way brought the series back (see ``undone_steps``)
    #: why the control rule calls it the machine's (kbench.compare.machine_moves), or "": never failed on
    machine: str = ""

    @property
    def commit_range(self) -> str:
        a = self.before.commit[:10] if self.before.commit else self.before.id
        b = self.after.commit[:10] if self.after.commit else self.after.id
        return f"{a}..{b}" if a != b else f"{a} (same commit: the machine or its software changed)"

    def to_json(self) -> dict[str, Any]:
        s = self.step
        return {"machine": self.series.machine, "op": self.series.op, "case_id": self.series.case_id,
                "backend": self.series.backend, "change": "slower" if s.slower else "faster",
                "size": s.size, "size_ci": [s.size_low, s.size_high], "confidence": s.confidence,
                "before": {"run": self.before.id, "commit": self.before.commit, "file": str(self.before.path),
                           "time": self.before.time.isoformat()},
                "after": {"run": self.after.id, "commit": self.after.commit, "file": str(self.after.path),
                          "time": self.after.time.isoformat()},
                "level_before": s.level_before, "level_after": s.level_after, "undone": self.undone,
                "machine_wide": self.machine or None, "environment_changes": [e.text for e in self.env]}


@dataclass(frozen=True)
class NewestRun:
    """The newest run of a series, beyond the noise of the level before it, with no later run to confirm it."""

    series: Series
    run: Run
    size: float           # new / old - 1 of the time: > 0 slower
    machine: str = ""     # why the control rule calls it the machine's (kbench.compare.machine_moves), or ""

    @property
    def slower(self) -> bool:
        return self.size > 0

    def to_json(self) -> dict[str, Any]:
        return {"machine": self.series.machine, "backend": self.series.backend, "case_id": self.series.case_id,
                "change": "slower" if self.slower else "faster", "run": self.run.id, "commit": self.run.commit,
                "file": str(self.run.path), "size": self.size, "machine_wide": self.machine or None}

    @property
    def text(self) -> str:
        return (f"{self.series.backend} {self.series.case_id} on {self.series.machine}: the newest run {self.run.id} "
                f"is {100 * self.size:+.1f}% off the level before it")


def steps_and_newest(hists: Sequence[History], since: _dt.datetime | None,
                     threshold: float) -> tuple[list[Found], list[NewestRun]]:
    """What ``kbench regressions`` lists: the steps of every series at or beyond ``threshold`` whose new level
    starts at or after ``since`` (lasting slower ones first), and the unconfirmed newest runs as far off; each
    held against the other backends of its run by the control rule (:func:`with_controls`)."""
    found: list[Found] = []
    newest: list[NewestRun] = []
    for h in hists:
        fits: dict[str, Fit] = {}
        found_here = [f for f in find_steps(h, fits) if in_range(f, since) and beyond(f, threshold)]
        newest_here: list[NewestRun] = []
        for s in h.series:
            u = fits[s.key].unconfirmed
            run = h.runs[s.runs[u.index]] if u else None
            if u and abs(u.size) >= threshold and (since is None or run.time >= since):
                newest_here.append(NewestRun(s, run, u.size))
        found_here, newest_here = with_controls(h, fits, found_here, newest_here, threshold)
        found += found_here
        newest += newest_here
    newest.sort(key=lambda u: (not u.slower, -abs(u.size), u.series.key))
    return sort_found(found), newest


def run_moves(history: History, fits: dict[str, Fit], run_index: int) -> tuple[list[tuple[str, float]], list[Series]]:
    """Every series' move at run ``run_index`` of ``history``, in the order the run measured its records:
    (backend, log of the point's median over the level the series was at before it), and the series."""
    by_point = {(s.op, s.case_id, s.backend, s.method): s for s in history.series}
    run = history.runs[run_index]
    moves, series = [], []
    for p in run.points:
        s = by_point.get((p.op, p.case_id, p.backend, run.method))
        if s is None or run_index not in s.runs:
            continue
        i = s.runs.index(run_index)
        if i == 0:
            continue
        level = next((lv for a, b, lv in fits[s.key].levels if a <= i - 1 <= b), s.points[i - 1].median)
        if level > 0 and p.median > 0:
            moves.append((p.backend, math.log(p.median / level)))
            series.append(s)
    return moves, series


def with_controls(history: History, fits: dict[str, Fit], found: list[Found], newest: list[NewestRun],
                  threshold: float) -> tuple[list[Found], list[NewestRun]]:
    """The control rule of ``kbench compare`` (kbench.compare.machine_moves, one function for every verdict):
    a step, or an unconfirmed newest run, whose series moved as the other backends of the same run did (the
    whole run alike, or the records measured beside it) is the machine's, not the code's: kept, listed as
    machine-wide, never failed on."""
    from kbench.compare import Settings, machine_moves

    factor = max(1 + threshold, Settings().factor)
    index = {id(r): i for i, r in enumerate(history.runs)}
    at_run: dict[int, list[tuple[str, Any]]] = {}
    for k, f in enumerate(found):
        at_run.setdefault(index[id(f.after)], []).append(("step", k))
    for k, u in enumerate(newest):
        if id(u.run) in index:
            at_run.setdefault(index[id(u.run)], []).append(("newest", k))
    found, newest = list(found), list(newest)
    for r, items in at_run.items():
        moves, series = run_moves(history, fits, r)
        where = {s.key: m for m, s in enumerate(series)}
        wanted = {}
        for kind, k in items:
            key = (found[k] if kind == "step" else newest[k]).series.key
            if key in where:
                wanted.setdefault(where[key], []).append((kind, k))
        for m, why in machine_moves(moves, wanted, factor).items():
            for kind, k in wanted[m]:
                if kind == "step":
                    found[k] = dataclasses.replace(found[k], machine=why)
                else:
                    newest[k] = dataclasses.replace(newest[k], machine=why)
    return found, newest


def fit_series(series: Series) -> Fit:
    return detect([p.median for p in series.points], [p.ci_low for p in series.points],
                  [p.ci_high for p in series.points])


def find_steps(history: History, fits: dict[str, Fit] | None = None) -> list[Found]:
    """Every step of every series of ``history``; ``fits`` (by series key) is filled when given."""
    found = []
    for s in history.series:
        fit = fit_series(s)
        if fits is not None:
            fits[s.key] = fit
        undone = undone_steps(fit.steps) | returned_steps(s, fit)
        for i, step in enumerate(fit.steps):
            before, after = s.runs[step.before], s.runs[step.after]
            env = tuple(e for e in history.env_changes if before < e.run <= after)
            found.append(Found(s, step, history.runs[before], history.runs[after], env, i in undone))
    return found


def undone_steps(steps: Sequence[Step]) -> set[int]:
    """Indices of pairs of adjacent steps where the second brings the series back to within a quarter of
    the first step of where it was: several slow windows of the machine in a row, or a regression that
    was fixed. Both are listed, but neither is a regression to fail on: the series is back."""
    out: set[int] = set()
    for i in range(len(steps) - 1):
        a, b = steps[i], steps[i + 1]
        if a.slower != b.slower and (abs(math.log(b.level_after / a.level_before))
                                     <= 0.25 * abs(math.log(a.level_after / a.level_before))):
            out.update((i, i + 1))
    return out


def returned_steps(series: Series, fit: Fit) -> set[int]:
    """The last step when the newest run (unconfirmed: no run after it) is back within a quarter of the step
    of where the series was before it: one slow (or fast) moment of the machine in the run before, undone by
    the next one, as :func:`undone_steps` says of two steps. Listed, not failed on; a run after the newest
    tells whether the level returned for good."""
    u = fit.unconfirmed
    if not fit.steps or u is None or u.index != len(series.points) - 1:
        return set()
    last = fit.steps[-1]
    newest = series.points[u.index].median
    if last.after < u.index and newest > 0 and last.level_before > 0 and last.level_after > 0 and \
            abs(math.log(newest / last.level_before)) <= 0.25 * abs(math.log(last.level_after / last.level_before)):
        return {len(fit.steps) - 1}
    return set()


def in_range(found: Found, since: _dt.datetime | None) -> bool:
    """A step lies after ``since`` when its first run at the new level does."""
    return since is None or found.after.time >= since


def beyond(found: Found, threshold: float) -> bool:
    return abs(found.step.size) >= threshold


def sort_found(found: Sequence[Found]) -> list[Found]:
    """Lasting regressions first, largest first; then improvements; undone pairs last."""
    return sorted(found, key=lambda f: (f.undone, not f.step.slower, -abs(f.step.size), f.series.key))


def resolve_since(ref: str, runs: Sequence[Run], repo) -> _dt.datetime:
    """``--since``: an ISO date or time, a commit (prefix) of one of the runs, a run id, or a git ref."""
    from kbench.errors import BadInput
    from kbench.history.runs import commit_times

    try:
        t = _dt.datetime.fromisoformat(ref)
        return t if t.tzinfo else t.replace(tzinfo=_dt.timezone.utc)
    except ValueError:
        pass
    for r in runs:
        if r.id == ref or (r.commit and len(ref) >= 4 and r.commit.startswith(ref)):
            return r.time
    if repo is not None:
        import subprocess

        proc = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
                              capture_output=True, text=True)
        sha = proc.stdout.strip()
        if proc.returncode == 0 and sha:
            times = commit_times([sha], repo)
            if sha in times:
                return times[sha]
    raise BadInput(f"cannot place {ref!r} in the history", where="--since",
                   fix="give an ISO date (2026-11-01), a commit or run id of one of the runs, or a git ref of "
                       "the repository (--repo)")
