"""Performance history: runs over time per machine, steps found in them despite noise, a static site.

``runs`` reads result files and orders them; ``series`` cuts them into one series per (machine, case,
backend); ``changepoints`` finds steps in a series; ``regressions`` places steps in commit ranges;
``lineages`` reads evolve lineages; ``site`` writes the pages. The commands are ``kbench publish``
and ``kbench regressions`` (docs/history.md).
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from kbench.history.runs import Run, default_cache, default_repo, load_runs
from kbench.history.series import History, histories


def load_histories(paths: Sequence[str | Path], *, repo: Path | None = None, mix_machines: bool = False,
                   keyword: str | None = None, cache: Path | None = None,
                   jobs: int | None = None, skipped: list | None = None) -> tuple[list[Run], list[History]]:
    """Runs under ``paths`` (commit dates from ``repo``, default the git tree holding them) and their
    histories, keeping only the records whose backend/case match ``keyword`` (``-k``). ``skipped``: collects
    the files the reader refuses instead of raising the first (see :func:`kbench.history.runs.load_runs`)."""
    from kbench.selection import Keyword

    runs = load_runs(paths, repo=repo if repo is not None else default_repo(paths), cache=cache, jobs=jobs,
                     skipped=skipped)
    kw = Keyword(keyword)
    if keyword:
        for r in runs:
            r.points = [p for p in r.points if kw.matches(p.backend, p.case_id)]
    return runs, histories(runs, mix_machines=mix_machines)
