"""Tables of records for the screen and for files (tabulate does the formatting)."""
from __future__ import annotations

import csv
import io
import json
from collections import defaultdict
from typing import Any, Iterable, Sequence

from tabulate import tabulate

from kbench.enums import Status
from kbench.record import Record, as_records

FORMATS = ("table", "markdown", "csv", "json")
_TABULATE = {"table": "simple", "markdown": "github", "html": "html"}


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


def record_row(rec: Record) -> list[str]:
    status = str(rec.status) if rec.passed else f"{rec.status}: {rec.reason or ''}".strip()
    roof = ""
    if rec.metric("roof_fraction") is not None:
        roof = f"{fmt_pct(rec.metric('roof_fraction'))} {rec.metric('bound') or ''}"
    return [rec.case_id, rec.backend, status, fmt_time(rec.median), fmt_pct(rec.spread), fmt_num(rec.tflops),
            fmt_num(rec.bandwidth), roof.strip(), fmt_num(rec.rel_l2, 2)]


#: columns added when a record carries energy (CUDA device with NVML: telemetry.energy)
ENERGY_HEADERS = ("J/call", "W", "TFLOP/s/W")


def energy_row(rec: Record) -> list[str]:
    """Joules per call, average watts and TFLOP/s per watt (attained TFLOP/s over the average power)."""
    energy = rec.energy
    if not energy:
        return ["", "", ""]
    tflops = rec.tflops
    return [fmt_num(energy.get("joules_per_call")), fmt_num(energy["average_w"]),
            fmt_num(tflops / energy["average_w"] if tflops else None)]


def record_columns(records: Sequence[Record]) -> tuple[tuple[str, ...], list[list[str]]]:
    """Headers and rows of a records table; the energy columns only when some record measured energy."""
    with_energy = any(r.energy for r in records)
    headers = RECORD_HEADERS + (ENERGY_HEADERS if with_energy else ())
    return headers, [record_row(r) + (energy_row(r) if with_energy else []) for r in records]


def split_skipped(records: Iterable[Record | dict[str, Any]]) -> tuple[list[Record], dict[str, str]]:
    """Skipped records with one reason for every case of a backend collapse into one line each."""
    records = as_records(records)
    by_backend: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        by_backend[r.backend].append(r)
    collapsed: dict[str, str] = {}
    for name, recs in by_backend.items():
        reasons = {r.reason for r in recs}
        if all(r.status is Status.SKIPPED for r in recs) and len(reasons) == 1:
            collapsed[name] = reasons.pop() or ""
    shown = [r for r in records if r.backend not in collapsed]
    return shown, collapsed


def records_table(records: Iterable[Record | dict[str, Any]], fmt: str = "table") -> str:
    records = as_records(records)
    if fmt == "json":
        return render(RECORD_HEADERS, [], fmt, raw=[r.to_json() for r in records])
    if fmt == "csv":
        return render(*record_columns(records), fmt)
    shown, collapsed = split_skipped(records)
    text = render(*record_columns(shown), fmt) if shown else ""
    if collapsed:
        lines = [f"  {name}: {reason}" for name, reason in sorted(collapsed.items())]
        text += ("\n\n" if text else "") + "skipped on every case:\n" + "\n".join(lines)
    return text


#: the order of statuses in a summary line: outcomes that need a look first after the passed ones
_SUMMARY_ORDER = (Status.PASSED, Status.FAILED, Status.ERROR, Status.CRASHED, Status.TIMEOUT, Status.SKIPPED)


def status_summary(records: Iterable[Record | dict[str, Any]]) -> str:
    counts: dict[Status, int] = defaultdict(int)
    for r in as_records(records):
        counts[r.status] += 1
    return ", ".join(f"{counts[s]} {s}" for s in _SUMMARY_ORDER if counts.get(s))


# -- comparisons (kbench.compare) -------------------------------------------------------------------

COMPARE_HEADERS = ("mark", "before", "after", "ratio", "95% CI", "p", "change", "backend", "case", "why")


def compare_row(pair) -> list[str]:
    """One (case, backend) of ``kbench compare BASE NEW``; ratio is new time / base time."""
    t = pair.test

    def side(rec: Record | None) -> str:
        if rec is None:
            return "-"
        return fmt_time(_median(rec)) if rec.passed else str(rec.status)
    ci = f"{t.ci_low:.3f}-{t.ci_high:.3f}" if t else ""
    return [pair.change.mark, side(pair.base), side(pair.new), f"{t.ratio:.3f}" if t else "", ci,
            f"{t.p_value:.2g}" if t else "", pair.change.value, pair.backend, pair.case_id, pair.note]


def _median(rec) -> float | None:
    from kbench.compare import median_of

    return median_of(rec)


def compare_table(pairs, fmt: str = "table") -> str:
    pairs = list(pairs)
    if fmt == "json":
        return render(COMPARE_HEADERS, [], fmt, raw=[p.to_json() for p in pairs])
    headers = COMPARE_HEADERS if fmt in ("csv", "html") else ("",) + COMPARE_HEADERS[1:]
    return render(headers, [compare_row(p) for p in pairs], fmt)


def speedup_rows(table) -> tuple[list[str], list[list[str]]]:
    """Rows of a BaselineTable: each case, then a geometric-mean row per group, then one for all cases.

    A cell is the backend's speedup over the baseline in percent (AVO style, "+3.5%"); a trailing
    "?" means the difference is within the noise (not significant).
    """
    from kbench.compare import fmt_speedup

    headers = ["case", f"{table.baseline} (baseline)"] + [f"{b} vs {table.baseline}" for b in table.backends]
    rows: list[list[str]] = []

    def cell(case_id, backend):
        s = table.cells.get((case_id, backend))
        if s is None:
            return "-"
        if s.speedup is None:
            return s.note.split(":")[0]
        return fmt_speedup(s.speedup) + ("" if s.significant else "?")
    for group, ids in table.groups.items():
        for cid in ids:
            base = table.baseline_median.get(cid)
            rows.append([cid, fmt_time(base) if base else "not passed"] + [cell(cid, b) for b in table.backends])
        if len(table.groups) > 1 or len(ids) > 1:
            rows.append([f"geomean {group} ({len(ids)} cases)", ""]
                        + [fmt_speedup(table.group_geomean(group, b)) for b in table.backends])
    if len(table.groups) > 1:
        rows.append([f"geomean, all {len(table.cases)} cases", ""]
                    + [fmt_speedup(table.overall_geomean(b)) for b in table.backends])
    return headers, rows


def speedup_table(table, fmt: str = "table") -> str:
    if fmt == "json":
        geo = {b: {"all": table.overall_geomean(b), **{g: table.group_geomean(g, b) for g in table.groups}}
               for b in table.backends}
        data = {"baseline": table.baseline, "geomean": geo, "cells": [s.to_json() for s in table.cells.values()],
                "never_passed": table.never_passed}
        return json.dumps(data, indent=1)
    headers, rows = speedup_rows(table)
    return render(headers, rows, fmt)


def speedup_summary(table) -> list[str]:
    """AVO-style lines: "numpy-flash vs numpy: -15.2% (geomean of 10 cases, -18.0% to -10.1%)"."""
    from kbench.compare import fmt_speedup

    lines = []
    for b in table.backends:
        vals = [s.speedup for (c, name), s in table.cells.items() if name == b and s.speedup is not None]
        if not vals:
            lines.append(f"{b} vs {table.baseline}: no case where both passed")
            continue
        lines.append(f"{b} vs {table.baseline}: {fmt_speedup(table.overall_geomean(b))} "
                     f"(geomean of {len(vals)} cases, {fmt_speedup(min(vals))} to {fmt_speedup(max(vals))})")
    by_reason: dict[str, list[str]] = defaultdict(list)
    for b, why in sorted(table.never_passed.items()):
        by_reason[why].append(b)
    for why, names in by_reason.items():
        lines.append(f"not compared, never passed: {', '.join(names)} ({why})")
    return lines
