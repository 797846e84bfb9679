"""The HTML page of ``kbench report``: one file, inline CSS and SVG, nothing fetched from anywhere."""
from __future__ import annotations

import datetime as _dt
import json
from html import escape
from typing import Any, Iterable, Mapping, Sequence

from kbench import __version__

CSS = """
:root { --fg:#1d2330; --muted:#5b6473; --line:#e3e6eb; --bg:#f7f8fa; --accent:#1f5fbf; }
* { box-sizing: border-box; }
body { font: 14px/1.5 -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; color: var(--fg);
       margin: 0; background: var(--bg); }
main { max-width: 1320px; margin: 0 auto; padding: 24px 28px 64px; }
header h1 { font-size: 26px; margin: 8px 0 2px; }
header p { color: var(--muted); margin: 0 0 12px; }
h2 { font-size: 19px; margin: 36px 0 8px; padding-bottom: 4px; border-bottom: 2px solid var(--line); }
h3 { font-size: 15px; margin: 20px 0 6px; }
nav { background: white; border: 1px solid var(--line); border-radius: 8px; padding: 8px 14px; margin: 14px 0; }
nav { display: flex; flex-wrap: wrap; gap: 2px 16px; }
nav a { color: var(--accent); text-decoration: none; white-space: nowrap; }
.cards { display: grid; grid-template-columns: repeat(auto-fit, minmax(250px, 1fr)); gap: 12px; }
.card { background: white; border: 1px solid var(--line); border-radius: 8px; padding: 12px 16px; }
.card .big { font-size: 22px; font-weight: 600; }
.card .sub { color: var(--muted); font-size: 12.5px; }
.ok { color: #1a7f37; } .bad { color: #c62828; } .warn { color: #9a6700; }
figure { background: white; border: 1px solid var(--line); border-radius: 8px; margin: 12px 0; padding: 12px; }
figure svg { width: 100%; height: auto; }
figcaption { color: var(--muted); font-size: 13px; margin-top: 6px; }
.missing { background: #fff8e6; border: 1px solid #f0d48a; border-radius: 8px; padding: 10px 14px; }
.scroll { overflow-x: auto; background: white; border: 1px solid var(--line); border-radius: 8px; }
table { border-collapse: collapse; font-size: 12.5px; width: 100%; }
th, td { padding: 4px 7px; text-align: left; border-bottom: 1px solid var(--line); white-space: nowrap; }
th { background: #eef1f5; position: sticky; top: 0; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: normal; }
td.wrap { white-space: normal; }
th { white-space: normal; }
tr.slower td, tr.failing td { background: #fdecea; } tr.faster td, tr.fixed td { background: #eaf6ec; }
tr.ambiguous td { background: #fff8e6; } tr.geomean td { font-weight: 600; background: #f2f5fa; }
tr.skipped td, tr.incomparable td { color: var(--muted); }
dl.kv { display: grid; grid-template-columns: max-content 1fr; gap: 2px 16px; background: white;
        border: 1px solid var(--line); border-radius: 8px; padding: 10px 14px; margin: 0; font-size: 12.5px; }
dl.kv dt { color: var(--muted); } dl.kv dd { margin: 0; word-break: break-all; }
ol.errors code { white-space: pre-wrap; word-break: break-all; }
footer { color: var(--muted); font-size: 12px; margin-top: 40px; }
"""


def html_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, classes: Sequence[str] | None = None,
               numeric: Iterable[int] = (), wrap: Iterable[int] = ()) -> str:
    """An escaped HTML table; ``classes`` gives each row a CSS class (e.g. its status or change);
    ``wrap``: columns whose long text (case ids, reasons) may break across lines, so the table fits the page."""
    numeric, wrap = set(numeric), set(wrap)
    head = "".join(f"<th>{escape(str(h))}</th>" for h in headers)
    body = []

    def td(j: int, v: Any) -> str:
        text = escape(str(v))
        if j in numeric:  # a figure stays on one line; a note after it ("(n=2/2)") may go to the next
            figure, sep, note = text.partition(" (")
            return f'<td class="num">{figure.replace(" ", "&nbsp;")}{" (" + note if sep else ""}</td>'
        if j in wrap:  # long ids and names break after their separators, so the table fits the page
            for sep in (",", "[", "_", "="):
                text = text.replace(sep, sep + "<wbr>")
            return f'<td class="wrap">{text}</td>'
        return f"<td>{text}</td>"
    for i, row in enumerate(rows):
        cls = f' class="{escape(classes[i])}"' if classes and classes[i] else ""
        cells = "".join(td(j, v) for j, v in enumerate(row))
        body.append(f"<tr{cls}>{cells}</tr>")
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'


def kv_list(items: Mapping[str, Any]) -> str:
    rows = "".join(f"<dt>{escape(str(k))}</dt><dd>{escape(_text(v))}</dd>" for k, v in items.items())
    return f'<dl class="kv">{rows}</dl>'


def _text(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, (dict, list)):
        return json.dumps(v, sort_keys=True)
    return str(v)


def flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def hardware_items(hw: Mapping[str, Any] | None) -> dict[str, Any]:
    if not hw:
        return {"profile": "none detected: rates only, no roofs"}
    items: dict[str, Any] = {"profile": f"{hw.get('title') or hw.get('name')} ({hw.get('name')})"}
    for dt, v in (hw.get("peak_flops") or {}).items():
        items[f"peak {dt}"] = f"{v / 1e12:.4g} TFLOP/s"
    if hw.get("bandwidth"):
        items["bandwidth"] = f"{hw['bandwidth'] / 1e9:.4g} GB/s"
    if hw.get("capacity"):
        items["capacity"] = f"{hw['capacity'] / 1e9:.4g} GB"
    for dt, v in (hw.get("measured_flops") or {}).items():
        items[f"measured {dt}"] = f"{v / 1e12:.4g} TFLOP/s"
    if hw.get("measured_bandwidth"):
        items["measured bandwidth"] = f"{hw['measured_bandwidth'] / 1e9:.4g} GB/s"
    for key in ("source", "measured_source", "notes"):
        if hw.get(key):
            items[key.replace("_", " ")] = hw[key]
    if not hw.get("peak_flops") and not hw.get("measured_flops"):
        items["roofs"] = "no peak figures: the roofline plot shows the points without roofs"
    return items


ENERGY_TABLE_HEADERS = ("case", "backend", "TFLOP/s", "J/call", "W", "TFLOP/s/W", "idle W", "power limit W",
                        "SM MHz (median)", "throttled", "energy from", "flag")


def energy_tables(runs) -> list[tuple[str, str, str]]:
    """(anchor, heading, html) of an energy table per run that has records with NVML energy."""
    from kbench.tables import energy_row, fmt_num, fmt_pct

    out = []
    for run in runs:
        recs = [r for r in run.records if r.passed and r.energy]
        if not recs:
            continue
        rows = []
        for r in recs:
            energy = r.energy
            limit = energy.get("power_limit_w") or r.telemetry_item("after", "power_limit_w")
            rows.append([r.case_id, r.backend, fmt_num(r.tflops), *energy_row(r), fmt_num(energy.get("idle_w")),
                         fmt_num(limit), fmt_num(energy.get("sm_clock_mhz_median")),
                         fmt_pct(energy.get("throttled_fraction")), energy.get("source", ""), energy.get("flag", "")])
        note = ("<p>Energy from a sustained loop of back-to-back calls after the timed samples (no new inputs, no "
                "cache flush between them), NVML's energy counter read at its two synchronised ends: W is the "
                "loop's average power, J/call its energy over its calls, TFLOP/s/W the attained TFLOP/s over that "
                "power; clocks and throttling sampled by a thread during the loop; idle W measured with the GPU "
                "idle. A power outside [idle, limit] cannot be the kernel's and is flagged.</p>")
        out.append((f"energy-{run.label}", f"Energy of {run.label}",
                    note + html_table(ENERGY_TABLE_HEADERS, rows, numeric=range(2, 10), wrap=(0, 1, 10, 11))))
    return out


def page(*, title: str, runs, summary_cards: Sequence[str], figures, tables: Sequence[tuple[str, str, str]],
         svg_of) -> str:
    """Assemble the page. ``tables``: (anchor, heading, html); ``figures``: a report.Figures.

    Runs whose records measured energy (CUDA with NVML) get an energy table after the given tables.
    """
    tables = list(tables) + energy_tables(runs)
    nav = [("summary", "Summary")]
    nav += [(name, t) for name, (t, _, _) in figures.items.items()]
    nav += [(a, h) for a, h, _ in tables] + [("machine", "Machine and environment")]
    parts = [f"<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
             f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
             f"<title>{escape(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n<main>\n"]
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    parts.append(f"<header><h1>{escape(title)}</h1><p>kbench {escape(__version__)} report, generated {stamp}, "
                 f"from {len(runs)} result file{'s' if len(runs) > 1 else ''}: "
                 f"{escape(', '.join(r.path for r in runs))}</p></header>\n")
    parts.append("<nav>" + " ".join(f'<a href="#{a}">{escape(t)}</a>' for a, t in nav) + "</nav>\n")
    parts.append('<section id="summary"><h2>Summary</h2><div class="cards">' + "".join(summary_cards)
                 + "</div></section>\n")
    for name, (t, caption, fig) in figures.items.items():
        parts.append(f'<section id="{name}"><h2>{escape(t)}</h2><figure>{svg_of(fig)}'
                     f"<figcaption>{escape(caption)}</figcaption></figure></section>\n")
    for name, why in figures.missing.items():
        parts.append(f'<section id="{name}"><h2>{escape(name.capitalize())}</h2>'
                     f'<p class="missing">No plot: {escape(why)}.</p></section>\n')
    for anchor, heading, body in tables:
        parts.append(f'<section id="{anchor}"><h2>{escape(heading)}</h2>{body}</section>\n')
    parts.append('<section id="machine"><h2>Machine and environment</h2>')
    for run in runs:
        d = run.data
        parts.append(f"<h3>{escape(run.label)}: {escape(d['suite']['name'])} on {escape(d['machine']['id'])}</h3>")
        parts.append("<h3>machine</h3>" + kv_list(flatten(d["machine"])))
        parts.append("<h3>hardware profile</h3>" + kv_list(hardware_items(d.get("hardware"))))
        parts.append("<h3>environment</h3>" + kv_list(flatten(d.get("environment") or {})))
        run_info = {"created": d.get("created"), "updated": d.get("updated"), "complete": d.get("complete"),
                    "interrupted": d.get("interrupted"), "device": d.get("device"),
                    "suite file": d["suite"].get("path"), "selection": d.get("selection")}
        parts.append("<h3>run</h3>" + kv_list(run_info))
    parts.append("</section>\n<footer>Plots: matplotlib (SVG inline). Statistics: scipy (Mann-Whitney U, bootstrap "
                 "of the ratio of medians). Everything on this page is in this one file.</footer>\n"
                 "</main>\n</body>\n</html>\n")
    return "".join(parts)
