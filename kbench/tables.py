"""Tables of records for the screen and for files (tabulate does the formatting)."""
from __future__ import annotations

import csv
import io
import json
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from tabulate import tabulate

from kbench.enums import Status
from kbench.record import Record, as_records
from kbench.text import safe_text

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


def render(headers: Sequence[str], rows: Sequence[Sequence[Any]], fmt: str, *, raw: Iterable[dict] | None = None,
           max_width: int | None = None) -> str:
    """Render rows as a table, markdown, CSV, or (with ``raw``) JSON of the underlying dicts.

    ``max_width`` (table format): the widest columns wrap onto more lines until a row fits in that many
    characters (no column is narrowed below ``MIN_WRAPPED`` characters)."""
    if fmt == "json":  # ASCII: a lone surrogate is written as its escape, never raw
        return json.dumps(list(raw) if raw is not None else [dict(zip(headers, r)) for r in rows], indent=1)
    # text from records (names, case ids, reasons) reaches the screen escaped, however the record was made
    rows = [[safe_text(c) if isinstance(c, str) else c for c in r] for r in rows]
    headers = [safe_text(h) if isinstance(h, str) else h for h in headers]
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.writer(buf)
        writer.writerow(headers)
        writer.writerows(rows)
        return buf.getvalue()
    widths = None
    if max_width and fmt == "table" and rows:
        widths = fit_widths(headers, rows, max_width)
    # names with hyphens (nvidia-cudnn-frontend, flash-attn) stay whole when a column wraps
    return tabulate(rows, headers=headers, tablefmt=_TABULATE.get(fmt, "simple"), disable_numparse=True,
                    maxcolwidths=widths, break_on_hyphens=False)


#: the narrowest a wrapped column gets (a reason or a description still reads as a phrase)
MIN_WRAPPED = 24


def fit_widths(headers: Sequence[str], rows: Sequence[Sequence[Any]], max_width: int) -> list[int | None] | None:
    """Widths that bring a table's rows within ``max_width`` characters: one cap for every column wider than
    it, the largest cap that fits (the widest columns share the narrowing), never below ``MIN_WRAPPED``;
    None for a column left as it is, and None when the table fits already."""
    # tabulate pads a header by 2 (its MIN_PADDING) where the header is the widest entry of its column
    natural = [max([len(str(h)) + 2] + [max((len(line) for line in str(r[i]).splitlines()), default=0)
                                        for r in rows]) for i, h in enumerate(headers)]
    gap = 2 * (len(natural) - 1)
    if sum(natural) + gap <= max_width:
        return None
    cap = max(natural)
    while cap > MIN_WRAPPED and sum(min(w, cap) for w in natural) + gap > max_width:
        cap -= 1
    return [cap if w > cap else None for w in natural]


@dataclass(frozen=True)
class Column:
    """One column of a table: a short header and text on screen; in CSV and JSON a name that carries its
    unit (``median_s``) and the number itself, never a formatted string ("176 us", "41.6%")."""

    header: str                          # on screen ("" for a data-only column)
    key: str                             # in CSV and JSON ("" for a screen-only column)
    value: Callable[[Any], Any]          # the item's number (or text) for CSV and JSON
    text: Callable[[Any], str] | None = None  # on screen, from the item (default: the value as text)

    def show(self, item: Any) -> str:
        if self.text is not None:
            return self.text(item)
        v = self.value(item)
        return "" if v is None else str(v)


def render_columns(columns: Sequence[Column], items: Sequence[Any], fmt: str) -> str:
    """``items`` as a table of ``columns``: text on screen (table, markdown, html), numbers in CSV and JSON."""
    if fmt in ("csv", "json"):
        cols = [c for c in columns if c.key]
        rows = [[c.value(item) for c in cols] for item in items]
        if fmt == "json":
            return json.dumps([dict(zip((c.key for c in cols), row)) for row in rows], indent=1)
        return render([c.key for c in cols], [["" if v is None else v for v in row] for row in rows], "csv")
    cols = [c for c in columns if c.header]
    return render([c.header for c in cols], [[c.show(item) for c in cols] for item in items], fmt)


def screen_rows(columns: Sequence[Column], items: Sequence[Any]) -> tuple[list[str], list[list[str]]]:
    """Headers and text rows as the screen shows them (the report's HTML tables)."""
    cols = [c for c in columns if c.header]
    return [c.header for c in cols], [[c.show(item) for c in cols] for item in items]


# -- records (kbench show, the end of kbench run, the report) ----------------------------------------

@dataclass(frozen=True)
class Row:
    """A record with what its table needs beside it: the suite's ``min_samples`` (None: unknown)."""

    rec: Record
    min_samples: int | None = None

    @property
    def n(self) -> int | None:
        return len(self.rec.samples) if self.rec.timing else None

    @property
    def below_min(self) -> bool:
        """A passed record that stopped sampling before the suite's ``min_samples`` (its time limit came first)."""
        return bool(self.rec.passed and self.min_samples and self.n is not None and self.n < self.min_samples)


def _n_text(row: Row) -> str:
    if row.n is None:
        return ""
    return f"{row.n} <{row.min_samples}" if row.below_min else str(row.n)


def _roof_text(rec: Record) -> str:
    if rec.metric("roof_fraction") is None:
        return ""
    return f"{fmt_pct(rec.metric('roof_fraction'))} {rec.metric('bound') or ''}".strip()


def _tflops_per_w(rec: Record) -> float | None:
    energy, tflops = rec.energy, rec.tflops
    return tflops / energy["average_w"] if energy and tflops else None


RECORD_COLUMNS = (
    Column("case", "case_id", lambda r: r.rec.case_id),
    Column("backend", "backend", lambda r: r.rec.backend),
    Column("status", "status", lambda r: str(r.rec.status),
           lambda r: str(r.rec.status) if r.rec.passed else f"{r.rec.status}: {r.rec.reason or ''}".strip()),
    Column("", "reason", lambda r: r.rec.reason),
    Column("n", "n", lambda r: r.n, _n_text),
    Column("", "min_samples", lambda r: r.min_samples if r.n is not None else None),
    Column("", "below_min_samples", lambda r: r.below_min if r.rec.passed else None),
    Column("stop", "stop_reason", lambda r: (r.rec.timing or {}).get("stop_reason")),
    Column("median", "median_s", lambda r: r.rec.median, lambda r: fmt_time(r.rec.median)),
    Column("spread", "spread_iqr_over_median", lambda r: r.rec.spread, lambda r: fmt_pct(r.rec.spread)),
    Column("TFLOP/s", "tflop_per_s", lambda r: r.rec.tflops, lambda r: fmt_num(r.rec.tflops)),
    Column("GB/s", "gb_per_s", lambda r: r.rec.bandwidth, lambda r: fmt_num(r.rec.bandwidth)),
    Column("roof", "roof_fraction", lambda r: r.rec.metric("roof_fraction"), lambda r: _roof_text(r.rec)),
    Column("", "roof_bound", lambda r: r.rec.metric("bound")),
    Column("rel_l2", "rel_l2", lambda r: r.rec.rel_l2, lambda r: fmt_num(r.rec.rel_l2, 2)),
)
#: columns added when a record carries energy (CUDA device with NVML: telemetry.energy)
ENERGY_COLUMNS = (
    Column("J/call", "joules_per_call", lambda r: r.rec.energy.get("joules_per_call"),
           lambda r: fmt_num(r.rec.energy.get("joules_per_call"))),
    Column("W", "average_w", lambda r: r.rec.energy.get("average_w"),
           lambda r: fmt_num(r.rec.energy.get("average_w"))),
    Column("TFLOP/s/W", "tflop_per_s_per_w", lambda r: _tflops_per_w(r.rec),
           lambda r: fmt_num(_tflops_per_w(r.rec))),
)
RECORD_HEADERS = tuple(c.header for c in RECORD_COLUMNS if c.header)
ENERGY_HEADERS = tuple(c.header for c in ENERGY_COLUMNS)


def energy_row(rec: Record) -> list[str]:
    """Joules per call, average watts and TFLOP/s per watt (attained TFLOP/s over the average power)."""
    return [c.show(Row(rec)) for c in ENERGY_COLUMNS]


def record_columns(records: Sequence[Record]) -> tuple[Column, ...]:
    """The columns of a records table; the energy columns only when some record measured energy."""
    return RECORD_COLUMNS + (ENERGY_COLUMNS if any(r.energy for r in records) else ())


def min_samples_of(result: Mapping[str, Any]) -> int | None:
    """The ``min_samples`` a result's suite asked of its device: the device's ``timing`` over the suite's
    top-level ``timing`` over the default (the resolved suite is stored in the result file)."""
    suite = (result.get("suite") or {}).get("data")
    if not isinstance(suite, Mapping):
        return None
    devices = suite.get("devices")
    per = (devices.get(result.get("device")) or {}) if isinstance(devices, Mapping) else {}
    for timing in ((per if isinstance(per, Mapping) else {}).get("timing"), suite.get("timing")):
        if isinstance(timing, Mapping) and isinstance(timing.get("min_samples"), int):
            return timing["min_samples"]
    from kbench.timing import TimingSettings

    return TimingSettings().min_samples


def record_rows(records: Iterable[Record | Mapping[str, Any]], min_samples: int | None = None) -> list[Row]:
    return [Row(r, min_samples) for r in as_records(records)]


def records_table(records: Iterable[Record | dict[str, Any]], fmt: str = "table", *,
                  min_samples: int | None = None) -> str:
    """The records as a table; ``json`` gives the records themselves (every field, tracebacks included)."""
    records = as_records(records)
    if fmt == "json":
        return render((), [], fmt, raw=[r.to_json() for r in records])
    if fmt == "csv":
        return render_columns(record_columns(records), record_rows(records, min_samples), fmt)
    shown, collapsed = split_skipped(records)
    rows = record_rows(shown, min_samples)
    text = render_columns(record_columns(shown), rows, fmt) if shown else ""
    notes = table_notes(rows)
    if notes:
        text += "\n\n" + "\n".join(notes)
    if collapsed:
        lines = [f"  {name}: {reason}" for name, reason in sorted(collapsed.items())]
        text += ("\n\n" if text else "") + "skipped on every case:\n" + "\n".join(lines)
    return text


def table_notes(rows: Sequence[Row]) -> list[str]:
    """Lines under a records table: records below min_samples, and why the roof column is empty."""
    notes = []
    below = [r for r in rows if r.below_min]
    if below:
        notes.append(f"n <{below[0].min_samples}: {len(below)} passed records stopped sampling before the suite's "
                     f"min_samples ({_stop_reasons(below)}): their medians rest on few samples; raise the "
                     "suite's timing.max_time for more")
    passed = [r.rec for r in rows if r.rec.passed]
    if passed and all(r.metric("roof_fraction") is None for r in passed):
        notes.append("roof: empty, the hardware profile has no peak figures for these records; "
                     "`kbench calibrate` measures them on this machine")
    return notes


def _stop_reasons(rows: Sequence[Row]) -> str:
    reasons: dict[str, int] = defaultdict(int)
    for r in rows:
        reasons[(r.rec.timing or {}).get("stop_reason") or "no stop reason"] += 1
    return ", ".join(f"{k} {v}" for k, v in sorted(reasons.items()))


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


#: the order of statuses in a summary line: outcomes that need a look first after the passed ones
_SUMMARY_ORDER = (Status.PASSED, Status.FAILED, Status.ERROR, Status.CRASHED, Status.TIMEOUT, Status.SKIPPED)


def status_summary(records: Iterable[Record | dict[str, Any]], min_samples: int | None = None) -> str:
    """"80 passed (33 below min_samples 5), 4 skipped": the passed records that stopped sampling before the
    suite's ``min_samples`` are counted when it is given."""
    rows = record_rows(records, min_samples)
    counts: dict[Status, int] = defaultdict(int)
    for r in rows:
        counts[r.rec.status] += 1
    below = sum(r.below_min for r in rows)
    return ", ".join(f"{counts[s]} {s}" + (f" ({below} below min_samples {min_samples})"
                                           if s is Status.PASSED and below else "")
                     for s in _SUMMARY_ORDER if counts.get(s))


# -- comparisons (kbench.compare) -------------------------------------------------------------------

def _side(rec: Record | None) -> str:
    if rec is None:
        return "-"
    return fmt_time(_median(rec)) if rec.passed else str(rec.status)


def _n_pair(pair) -> str:
    from kbench.compare import n_of

    a, b = n_of(pair.base), n_of(pair.new)
    return "" if a is None and b is None else f"{'-' if a is None else a}/{'-' if b is None else b}"


def _status_of(rec: Record | None) -> str | None:
    return None if rec is None else str(rec.status)


def _compare_columns():
    from kbench.compare import n_of, stop_of

    t = lambda p: p.test  # noqa: E731
    return (
        Column("", "mark", lambda p: p.change.mark),
        Column("before", "before_median_s", lambda p: _median(p.base) if p.base and p.base.passed else None,
               lambda p: _side(p.base)),
        Column("after", "after_median_s", lambda p: _median(p.new) if p.new and p.new.passed else None,
               lambda p: _side(p.new)),
        Column("", "before_status", lambda p: _status_of(p.base)),
        Column("", "after_status", lambda p: _status_of(p.new)),
        Column("n", "n_before", lambda p: n_of(p.base), _n_pair),
        Column("", "n_after", lambda p: n_of(p.new)),
        Column("", "stop_reason_before", lambda p: stop_of(p.base)),
        Column("", "stop_reason_after", lambda p: stop_of(p.new)),
        Column("ratio", "ratio", lambda p: t(p) and t(p).ratio, lambda p: f"{t(p).ratio:.3f}" if t(p) else ""),
        Column("95% CI", "ratio_ci_low", lambda p: t(p) and t(p).ci_low,
               lambda p: f"{t(p).ci_low:.3f}-{t(p).ci_high:.3f}" if t(p) else ""),
        Column("", "ratio_ci_high", lambda p: t(p) and t(p).ci_high),
        Column("p", "p_value", lambda p: t(p) and t(p).p_value, lambda p: f"{t(p).p_value:.2g}" if t(p) else ""),
        Column("change", "change", lambda p: p.change.value),
        Column("backend", "backend", lambda p: p.backend),
        Column("case", "case_id", lambda p: p.case_id),
        Column("why", "note", lambda p: p.note),
    )


def compare_columns() -> tuple[Column, ...]:
    return _compare_columns()


COMPARE_HEADERS = ("mark", "before", "after", "n", "ratio", "95% CI", "p", "change", "backend", "case", "why")


def compare_row(pair) -> list[str]:
    """One (case, backend) of ``kbench compare BASE NEW`` as the screen shows it; ratio is new / base time."""
    return [pair.change.mark] + [c.show(pair) for c in compare_columns() if c.header]


def _median(rec) -> float | None:
    from kbench.compare import median_of

    return median_of(rec)


def compare_table(pairs, fmt: str = "table") -> str:
    """Pairs as a table; ``json`` gives each pair whole (medians in seconds, the test, n, stop reasons)."""
    pairs = list(pairs)
    if fmt == "json":
        return render(COMPARE_HEADERS, [], fmt, raw=[p.to_json() for p in pairs])
    if fmt == "csv":
        return render_columns(compare_columns(), pairs, fmt)
    headers = ("",) + COMPARE_HEADERS[1:] if fmt in ("table", "markdown") else COMPARE_HEADERS
    return render(headers, [compare_row(p) for p in pairs], fmt)


def speedup_cell(cell) -> str:
    """"2.1x faster", "2.1x faster?" (within the noise), "76x slower (n=2/2)" (too few samples to tell)."""
    from kbench.compare import fmt_speedup

    if cell is None:
        return "-"
    if cell.speedup is None:
        return cell.note.split(":")[0]
    mark = cell.mark
    return fmt_speedup(cell.speedup) + (f" {mark}" if mark.startswith("(") else mark)


def speedup_rows(table, *, numbers: bool = False) -> tuple[list[str], list[list[Any]]]:
    """Rows of a BaselineTable: each case, then a geometric-mean row per group, then one for all cases.

    On screen a cell is the speedup as an x-ratio ("2.1x faster", "1.9x slower"), with "?" when the
    difference is within the noise and "(n=2/2)" when the samples are too few for any verdict; with
    ``numbers`` (CSV) a cell is the speedup itself (baseline time / backend time) and the baseline's
    median is in seconds.
    """
    from kbench.compare import fmt_speedup

    if numbers:
        headers = ["case", f"{table.baseline}_median_s"] + [f"{b}_speedup_x" for b in table.backends]
    else:
        headers = ["case", f"{table.baseline} (baseline)"] + [f"{b} vs {table.baseline}" for b in table.backends]
    rows: list[list[Any]] = []

    def cell(case_id, backend):
        s = table.cells.get((case_id, backend))
        if numbers:
            return "" if s is None or s.speedup is None else s.speedup
        return speedup_cell(s)

    def geo(value):
        return ("" if value is None else value) if numbers else fmt_speedup(value)
    for group, ids in table.groups.items():
        for cid in ids:
            base = table.baseline_median.get(cid)
            first = ("" if base is None else base) if numbers else (fmt_time(base) if base else "not passed")
            rows.append([cid, first] + [cell(cid, b) for b in table.backends])
        if len(table.groups) > 1 or len(ids) > 1:
            rows.append([f"geomean {group} ({len(ids)} cases)", ""]
                        + [geo(table.group_geomean(group, b)) for b in table.backends])
    if len(table.groups) > 1:
        rows.append([f"geomean, all {len(table.cases)} cases", ""]
                    + [geo(table.overall_geomean(b)) for b in table.backends])
    return headers, rows


def speedup_table(table, fmt: str = "table") -> str:
    if fmt == "json":
        geo = {b: {"all": table.overall_geomean(b), **{g: table.group_geomean(g, b) for g in table.groups}}
               for b in table.backends}
        data = {"baseline": table.baseline, "geomean": geo, "cells": [s.to_json() for s in table.cells.values()],
                "never_passed": table.never_passed}
        return json.dumps(data, indent=1)
    headers, rows = speedup_rows(table, numbers=fmt == "csv")
    return render(headers, rows, fmt)


def speedup_summary(table) -> list[str]:
    """Lines such as "numpy-flash vs numpy: 1.18x slower (geomean of 10 cases, from 1.22x slower to 1.11x
    slower)"; the cases too few samples could not decide are counted."""
    from kbench.compare import fmt_speedup

    lines = []
    for b in table.backends:
        vals = [s.speedup for (c, name), s in table.cells.items() if name == b and s.speedup is not None]
        if not vals:
            lines.append(f"{b} vs {table.baseline}: no case where both passed")
            continue
        few = sum(1 for (c, name), s in table.cells.items() if name == b and s.few_samples)
        lines.append(f"{b} vs {table.baseline}: {fmt_speedup(table.overall_geomean(b))} "
                     f"(geomean of {len(vals)} cases, from {fmt_speedup(min(vals))} to {fmt_speedup(max(vals))}"
                     + (f"; {few} with too few samples to tell" if few else "") + ")")
    by_reason: dict[str, list[str]] = defaultdict(list)
    for b, why in sorted(table.never_passed.items()):
        by_reason[why].append(b)
    for why, names in by_reason.items():
        lines.append(f"not compared, never passed: {', '.join(names)} ({why})")
    return lines


class SkippedTally:
    """Skipped records counted per backend and reason, for a log that gets one line per skipped backend instead of
    one per skipped record (a CPU run's GPU backends, skipped on every case, would bury the measured records)."""

    def __init__(self) -> None:
        self.counts: dict[str, dict[str, int]] = {}

    def add(self, backend: str, reason: str) -> None:
        per = self.counts.setdefault(backend, {})
        per[reason] = per.get(reason, 0) + 1

    def lines(self, most_reasons: int = 3) -> list[str]:
        """``backend: N records skipped: reason`` per backend (its commonest reasons first)."""
        out = []
        for backend, reasons in self.counts.items():
            total = sum(reasons.values())
            ranked = sorted(reasons.items(), key=lambda kv: -kv[1])
            shown = "; ".join(f"{reason}" + (f" ({n})" if len(reasons) > 1 else "") for reason, n in ranked[:most_reasons])
            more = f"; and {len(ranked) - most_reasons} other reasons" if len(ranked) > most_reasons else ""
            out.append(f"{backend}: {total} record{'s' if total != 1 else ''} skipped: {shown}{more}")
        return out
