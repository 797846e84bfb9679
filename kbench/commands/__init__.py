"""The core's CLI commands, one module each; registered by kbench.builtin.commands."""
from __future__ import annotations

from typing import Any


def keep_matching(keyword: Any, records: list[dict[str, Any]], *, file: str, option: str = "-k") -> list[dict[str, Any]]:
    """The records ``keyword`` (a :class:`kbench.selection.Keyword`) matches; none at all is bad input (exit 2),
    not an empty table with exit 0. An empty file with no ``-k`` is not an error: there was nothing to select."""
    kept = [r for r in records if keyword.matches(r["backend"], r["case_id"])]
    if records and not kept:
        from kbench.errors import BadInput

        raise BadInput(f"{keyword.expr!r} matches none of the {len(records)} records", file=file, where=option,
                       fix=f"a record is a backend ({records[0]['backend']}) and a case id ({records[0]['case_id']}); "
                           "words match parts of either")
    return kept


def warn_skipped(skipped: list[Any]) -> None:
    """One warning per result file a history command left out (the reader refused it): the file, the place,
    what is wrong and the fix, as the error would have said it. The other files are still read."""
    import click

    for exc in skipped:
        click.echo(f"kbench: warning: skipped {exc.format()}", err=True)


def read_histories(results_dirs: Any, *, repo: Any, mix_machines: bool, keyword: Any, cache: Any, no_cache: bool,
                   jobs: Any) -> tuple[list[Any], list[Any]]:
    """The runs and histories under ``results_dirs`` for ``publish`` and ``regressions``: a result file the
    reader refuses is left out with a warning (:func:`warn_skipped`), and the history goes on without it."""
    from kbench.history import default_cache, load_histories

    skipped: list[Any] = []
    try:
        return load_histories(results_dirs, repo=repo, mix_machines=mix_machines, keyword=keyword,
                              cache=None if no_cache else (cache or default_cache(results_dirs)), jobs=jobs,
                              skipped=skipped)
    finally:
        warn_skipped(skipped)
