"""One line pointing at what a run recorded but its table cannot show: the tracebacks of error records.

An ``error`` record keeps the end of the backend's traceback in the result file (``traceback``);
the table shows only the reason. :func:`traceback_hint` is printed after a run's summary.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable


def traceback_hint(records: Iterable[dict[str, Any]], result: str | Path) -> str | None:
    """``None`` when no record has a traceback; else where to read them, naming the first one."""
    with_tb = [r for r in records if r.get("traceback")]
    if not with_tb:
        return None
    first = with_tb[0]
    reason = (first.get("reason") or "").splitlines()[0] if first.get("reason") else ""
    count = f"{len(with_tb)} records" if len(with_tb) > 1 else "1 record"
    return (f"kbench: {count} ended with an error; the traceback{'s are' if len(with_tb) > 1 else ' is'} in "
            f"{result} (key \"traceback\" of each record). First: {first.get('backend')} on {first.get('case_id')}: "
            f"{reason}\n  see it with: kbench show {result} --format json -k {_quoted(first.get('backend', ''))}")


def _quoted(word: str) -> str:
    return f"'{word}'" if any(c in word for c in "[]*?! ") else word
