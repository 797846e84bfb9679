"""``kbench report``: result files -> one self-contained HTML page (plots inline as SVG) or PNG images.

The page holds: throughput against sequence length per head_dim x causal, speedup over a baseline
backend, the roofline of the result's hardware with every measured case on it, a noise view, the
tables (records, speedups, changes between runs) and the machine and environment of each run.
"""
from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from kbench.enums import Status
from kbench.errors import BadInput
from kbench.record import Record, records_of


@dataclass
class Run:
    """One result file: its label on the page, its path, and its data with the records as Records."""

    label: str
    path: str
    data: dict[str, Any]

    @property
    def records(self) -> list[Record]:
        return self.data["records"]


@dataclass
class Figures:
    """name -> (title, caption, Figure); the order is the page's order."""

    items: dict[str, tuple[str, str, Any]] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)     # name -> why there is no plot


def label_runs(paths: Sequence[str], datas: Sequence[dict[str, Any]]) -> list[Run]:
    """Short, distinct labels: the file stem, or stem#i when two files share a stem."""
    stems = [Path(p).stem for p in paths]
    return [Run(s if stems.count(s) == 1 else f"{s}#{i + 1}", str(p), {**d, "records": records_of(d, file=str(p))})
            for i, (s, p, d) in enumerate(zip(stems, paths, datas))]


def series_rows(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """Every record with its series name: the backend, plus the run's label when there are several runs."""
    many = len(runs) > 1
    return [{"series": f"{r.backend} @ {run.label}" if many else r.backend, "run": run.label, "rec": r}
            for run in runs for r in run.records]


def pick_baseline(runs: Sequence[Run], requested: str | None) -> str | None:
    """--baseline, else the first backend of the first run that passed somewhere."""
    backends = list(dict.fromkeys(r.backend for r in runs[0].records))
    if requested is not None:
        if requested not in backends:
            raise BadInput(f"backend {requested!r} is not in {runs[0].path}", file=runs[0].path, where="--baseline",
                           fix=f"use one of: {', '.join(backends)}")
        return requested
    passed = [b for b in backends if any(r.backend == b and r.passed for r in runs[0].records)]
    return passed[0] if len(passed) > 1 else None


def build_figures(runs: Sequence[Run], group_key: Callable[[Record], str], baseline: str | None,
                  settings=None):
    """The figures, the speedup table (or None) and the changes between runs (list of (run, pairs))."""
    import matplotlib

    from kbench.compare import Settings, compare_runs, speedup_vs_baseline
    from kbench.report import figures as F

    settings = settings or Settings()
    rows = series_rows(runs)
    # colours go to series that have something to plot, so a run full of skipped GPU backends keeps the palette
    palette = F.colors([r["series"] for r in rows if r["rec"].passed])
    palette.update({r["series"]: "#999999" for r in rows if r["series"] not in palette})
    out = Figures()
    table = None
    with matplotlib.rc_context(F.STYLE):
        fig = F.throughput(rows, palette)
        _add(out, "throughput", "Throughput against sequence length",
             "TFLOP/s (useful FLOPs of the causal or full attention over the median time) per backend, one "
             "panel per head_dim and masking, as in the FlashAttention-3 paper's figure 5; both axes "
             "logarithmic. Error bars: the 95% interval of the median time, as a rate. Other parameters "
             "that differ inside a panel (heads, dtype) get their own line style.", fig,
             "no passed record with a sequence length and head_dim")
        if baseline is not None:
            table = speedup_vs_baseline(runs[0].data, baseline, group_key, settings, file=runs[0].path)
            first = {r["rec"].backend: r["series"] for r in rows if r["run"] == runs[0].label}
            fig = F.speedup(table, {b: palette.get(first.get(b, b), "#999999") for b in table.backends})
            _add(out, "speedup", f"Speedup over {baseline}",
                 f"Median time of {baseline} divided by the backend's, per case of {runs[0].label}, on a "
                 "logarithmic axis (2x faster and 2x slower are bars of one length). Error bars are 95% "
                 "bootstrap intervals of the ratio of medians; a pale bar is one the statistics cannot call: "
                 "within the noise, or too few samples.", fig,
                 f"no case where {baseline} and another backend both passed")
        else:
            out.missing["speedup"] = "only one backend passed: there is nothing to compare with a baseline"
        hardware = runs[0].data.get("hardware")
        fig = F.roofline(rows, hardware, palette)
        _add(out, "roofline", "Roofline",
             "Each passed record at its operational intensity (FLOPs over the minimum bytes that must cross "
             "DRAM) and attained TFLOP/s. Solid lines: datasheet roofs of the result's hardware profile; "
             "dashed: roofs measured by `kbench calibrate`, when the profile has them. A point above a "
             "datasheet roof would be impossible.", fig, "no passed record with an intensity")
        fig, left_out = F.noise(rows, palette)
        caption = ("Every raw timing sample relative to its record's median. A wide box means the median "
                   "is less certain; comparisons call changes inside this spread ambiguous.")
        if left_out:
            caption += f" The {left_out} quietest records are left out."
        _add(out, "noise", "Noise per record", caption, fig, "no passed record with timing samples")
    changes = []
    for run in runs[1:]:
        changes.append((run, compare_runs(runs[0].data, run.data, settings)))
    return out, table, changes


def _add(out: Figures, name: str, title: str, caption: str, fig, why_missing: str) -> None:
    if fig is None:
        out.missing[name] = why_missing
    else:
        out.items[name] = (title, caption, fig)


def svg_of(fig) -> str:
    """The figure as an inline <svg> element (no XML prolog or DOCTYPE, which HTML does not want)."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    text = buf.getvalue()
    return text[text.index("<svg"):]


def write_pngs(figs: Figures, directory: Path, dpi: int = 130) -> list[Path]:
    """One PNG per figure in ``directory``; an unwritable directory or a failed write is an OutputError."""
    from kbench.outputs import check_output_dir, save_figure

    check_output_dir(directory, option="-o")
    return [save_figure(fig, directory / f"{name}.png", option="-o", format="png", dpi=dpi, bbox_inches="tight",
                        facecolor="white") for name, (_, _, fig) in figs.items.items()]


#: characters of a record's status shown in its table row; the whole message goes in a list under the table
STATUS_WIDTH = 60


def cut_status(headers: Sequence[str], cells: list[list[str]], recs) -> tuple[list[list[str]], str]:
    """The records table's cells with each status cut to ``STATUS_WIDTH`` characters (a traceback's message
    made a column 250+ characters wide) and numbered, and the HTML list of the whole messages so numbered."""
    from html import escape

    if "status" not in headers:
        return cells, ""
    col = list(headers).index("status")
    full = []
    for row, rec in zip(cells, recs):
        if len(row[col]) > STATUS_WIDTH:
            full.append((rec, row[col]))
            row[col] = f"{row[col][:STATUS_WIDTH - 8].rstrip()}... [{len(full)}]"
    if not full:
        return cells, ""
    items = "".join(f"<li><b>{escape(rec.backend)}</b> {escape(rec.case_id)}: <code>{escape(text)}</code></li>"
                    for rec, text in full)
    return cells, f'<p>Whole status of the rows cut short above:</p><ol class="errors">{items}</ol>'


def render_html(runs: Sequence[Run], figs: Figures, table, changes) -> str:
    from html import escape

    from kbench.compare import both_skipped, counts, is_regression
    from kbench.report.page import html_table, page
    from kbench.tables import COMPARE_HEADERS, compare_row, min_samples_of, record_columns, record_rows, \
        screen_rows, speedup_rows, speedup_summary, split_skipped, status_summary, table_notes

    cards = []
    for run in runs:
        d = run.data
        recs = run.records
        bad = sum(r.status not in (Status.PASSED, Status.SKIPPED) for r in recs)
        state = "complete" if d["complete"] else f"INCOMPLETE: {d.get('interrupted') or 'still running or killed'}"
        hw = (d.get("hardware") or {}).get("title") or "no hardware profile"
        cards.append(f'<div class="card"><div class="sub">{escape(run.label)}</div>'
                     f'<div class="big">{escape(d["suite"]["name"])}: {len(recs)} records</div>'
                     f'<div class="{"bad" if bad else "ok"}">{escape(status_summary(recs, min_samples_of(d)))}</div>'
                     f'<div class="sub">{escape(d["machine"]["id"])} · {escape(d["device"])} · {escape(hw)}<br>'
                     f'{escape(d["created"])} · {escape(state)}</div></div>')
    if table is not None:
        lines = "<br>".join(escape(s) for s in speedup_summary(table))
        cards.append(f'<div class="card"><div class="sub">speedup over {escape(table.baseline)} '
                     f'(geometric mean)</div><div>{lines}</div></div>')
    for run, pairs in changes:
        n = counts(pairs)
        text = ", ".join(f"{k} {c}" for c, k in n.items() if k)
        cls = "bad" if is_regression(pairs) else "ok"
        cards.append(f'<div class="card"><div class="sub">{escape(runs[0].label)} → {escape(run.label)}</div>'
                     f'<div class="{cls}">{escape(text)}</div></div>')

    tables = []
    if table is not None:
        headers, rows = speedup_rows(table)
        classes = ["geomean" if r[0].startswith("geomean") else "" for r in rows]
        tables.append(("speedup-table", f"Speedup table ({table.baseline} = baseline)",
                       "<p>Per case, then the geometric mean per group (head_dim × causal × heads × dtype). "
                       "A trailing ? marks a difference within the noise; (n=a/b) a difference the samples "
                       "(a of the backend, b of the baseline) are too few to call either way.</p>"
                       + html_table(headers, rows, classes=classes, numeric=range(1, len(headers)), wrap=(0,))))
    for run, pairs in changes:
        pairs = [p for p in pairs if not both_skipped(p)]
        rows = [compare_row(p) for p in pairs]
        tables.append((f"changes-{run.label}", f"Changes {runs[0].label} → {run.label}",
                       "<p>ratio = new / old median time; n = samples before/after; marks as asv: + slower, "
                       "- faster, ~ ambiguous, ! newly failing, * fixed, x incomparable.</p>"
                       + html_table(COMPARE_HEADERS, rows, classes=[p.change.value for p in pairs],
                                    numeric=(1, 2, 3, 4, 6), wrap=(8, 9, 10))))
    for run in runs:
        recs, collapsed = split_skipped(run.records)
        note = ""
        if collapsed:
            note = ("<p>Skipped on every case: " + "; ".join(f"<b>{escape(b)}</b> ({escape(why)})"
                                                            for b, why in sorted(collapsed.items())) + ".</p>")
        rows = record_rows(recs, min_samples_of(run.data))
        headers, cells = screen_rows(record_columns(recs), rows)
        cells, errors = cut_status(headers, cells, recs)
        notes = "".join(f"<p>{escape(n)}</p>" for n in table_notes(rows)) + errors
        tables.append((f"records-{run.label}", f"Records of {run.label}",
                       html_table(headers, cells, classes=[r.status.value for r in recs],
                                  numeric=[i for i, h in enumerate(headers) if h not in ("case", "backend", "status",
                                                                                         "stop", "roof")],
                                  wrap=[i for i, h in enumerate(headers) if h in ("case", "backend", "status",
                                                                                  "roof")]) + notes + note))
        from kbench.profiling import PROFILE_HEADERS, profile_rows

        if profile_rows(recs):
            tables.append((f"profiles-{run.label}", f"Nsight Compute profiles of {run.label} (outside the timed "
                           "samples)", html_table(PROFILE_HEADERS, profile_rows(recs), numeric=range(2, 10))))
    names = ", ".join(dict.fromkeys(r.data["suite"]["name"] for r in runs))
    return page(title=f"kbench: {names}", runs=runs, summary_cards=cards, figures=figs, tables=tables,
                svg_of=svg_of)
