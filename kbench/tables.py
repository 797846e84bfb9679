"""Tables of records for the screen and for files (tabulate does the formatting)."""
from __future__ import annotations

import csv
import io
import json
from collections import defaultdict
from typing import Any, Iterable, Sequence

from tabulate import tabulate

FORMATS = ("table", "markdown", "csv", "json")
_TABULATE = {"table": "simple", "markdown": "github"}


def fmt_time(seconds: float | None) -> str:
    if seconds is None:
        return ""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def fmt_num(value: float | None, digits: int = 3) -> str:
    return "" if value is None else f"{value:.{digits}g}"


def fmt_pct(value: float | None) -> str:
    return "" if value is None else f"{100 * value:.1f}%"


def render(headers: Sequence[str], rows: Sequence[Sequence[Any]], fmt: str, *, raw: Iterable[dict] | None = None) -> str:
    """Render rows as a table, markdown, CSV, or (with ``raw``) JSON of the underlying dicts."""
    if fmt == "json":
        return json.dumps(list(raw) if raw is not None else [dict(zip(headers, r)) for r in rows], indent=1)
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.writer(buf)
        writer.writerow(headers)
        writer.writerows(rows)
        return buf.getvalue()
    return tabulate(rows, headers=headers, tablefmt=_TABULATE.get(fmt, "simple"), disable_numparse=True)


RECORD_HEADERS = ("case", "backend", "status", "median", "spread", "TFLOP/s", "GB/s", "roof", "rel_l2")


def record_row(rec: dict[str, Any]) -> list[str]:
    stats = rec.get("stats") or {}
    metrics = rec.get("metrics") or {}
    corr = rec.get("correctness") or {}
    status = rec["status"] if rec["status"] == "passed" else f"{rec['status']}: {rec.get('reason') or ''}".strip()
    roof = ""
    if metrics.get("roof_fraction") is not None:
        roof = f"{fmt_pct(metrics['roof_fraction'])} {metrics.get('bound', '')}"
    return [rec["case_id"], rec["backend"], status, fmt_time(stats.get("median")), fmt_pct(stats.get("rel_spread")),
            fmt_num(metrics.get("tflops")), fmt_num(metrics.get("gbps")), roof.strip(), fmt_num(corr.get("rel_l2"), 2)]


def split_skipped(records: Iterable[dict[str, Any]]):
    """Skipped records with one reason for every case of a backend collapse into one line each."""
    records = list(records)
    by_backend: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        by_backend[r["backend"]].append(r)
    collapsed: dict[str, str] = {}
    for name, recs in by_backend.items():
        reasons = {r.get("reason") for r in recs}
        if all(r["status"] == "skipped" for r in recs) and len(reasons) == 1:
            collapsed[name] = reasons.pop() or ""
    shown = [r for r in records if r["backend"] not in collapsed]
    return shown, collapsed


def records_table(records: Iterable[dict[str, Any]], fmt: str = "table") -> str:
    records = list(records)
    if fmt == "json":
        return render(RECORD_HEADERS, [], fmt, raw=records)
    if fmt == "csv":
        return render(RECORD_HEADERS, [record_row(r) for r in records], fmt)
    shown, collapsed = split_skipped(records)
    text = render(RECORD_HEADERS, [record_row(r) for r in shown], fmt) if shown else ""
    if collapsed:
        lines = [f"  {name}: {reason}" for name, reason in sorted(collapsed.items())]
        text += ("\n\n" if text else "") + "skipped on every case:\n" + "\n".join(lines)
    return text


def status_summary(records: Iterable[dict[str, Any]]) -> str:
    counts: dict[str, int] = defaultdict(int)
    for r in records:
        counts[r["status"]] += 1
    order = ("passed", "failed", "error", "crashed", "timeout", "skipped")
    return ", ".join(f"{counts[s]} {s}" for s in order if counts.get(s))
