"""The static history site: HTML pages with their data inline, plotly.js copied beside them.

Pages: ``index.html`` (machines, suites, backends, lineages), ``machine-<id>.html`` (one chart per
(case, backend), filterable), ``summary.html`` (the newest commit's runs against the previous
commit's, per machine and suite, judged by ``kbench.compare``), ``regressions.html`` (every step
found) and ``lineage-<name>.html``.
Data is embedded in each page as JSON (no fetch: browsers refuse it from ``file://``), and the charts
are drawn by ``assets/history.js`` with the plotly.js bundle that the ``plotly`` package ships, so the
site needs no network and no server.
"""
from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Sequence

from kbench.history.changepoints import Fit
from kbench.history.lineages import LineageHistory
from kbench.history.regressions import Found, find_steps, returned_steps, sort_found, undone_steps
from kbench.history.runs import Run, relpath
from kbench.history.series import History

#: case parameters the pages filter on (besides machine, op and backend)
FILTER_PARAMS = ("dtype", "head_dim", "causal")


@dataclass(frozen=True)
class Links:
    """How a point links to its result file and its commit."""

    site: Path
    results_url: str | None = None   # prefix for result files on a static host; else a relative path
    results_root: Path | None = None  # what results_url stands for
    commit_url: str | None = None    # e.g. https://github.com/ORG/REPO/commit/{commit}

    def result(self, path: Path) -> str:
        if self.results_url and self.results_root is not None:
            return self.results_url.rstrip("/") + "/" + relpath(path, self.results_root)
        return relpath(path, self.site)

    def commit(self, sha: str | None) -> str | None:
        return self.commit_url.format(commit=sha) if self.commit_url and sha else None


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "_"


def _json_script(data: Any) -> str:
    # "</" inside a JSON string would end the script element
    return json.dumps(data, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")


def _page(title: str, body: str, *, data: Any = None, charts: bool = False) -> str:
    scripts = ""
    if data is not None:
        scripts += f'<script type="application/json" id="kbench-data">{_json_script(data)}</script>\n'
    if charts:
        scripts += '<script src="assets/plotly.min.js"></script>\n<script src="assets/history.js"></script>\n'
    nav = ('<nav><a href="index.html">machines</a> \u00b7 <a href="summary.html">latest vs previous</a> \u00b7 '
           '<a href="regressions.html">steps</a></nav>')
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<link rel="stylesheet" href="assets/history.css"></head>\n<body>{nav}\n'
            f'<h1>{html.escape(title)}</h1>\n{body}\n{scripts}</body></html>\n')


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, escape: bool = True) -> str:
    esc = html.escape if escape else (lambda s: s)
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{esc(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _a(href: str | None, text: str) -> str:
    return f'<a href="{html.escape(href)}">{html.escape(text)}</a>' if href else html.escape(text)


def machine_page_name(machine: str) -> str:
    return f"machine-{slug(machine)}.html"


def _g(value: float) -> float:
    """Six significant digits: far below any timing noise, and half the page size of full floats."""
    return float(f"{value:.6g}")


def history_data(history: History, fits: dict[str, Fit], links: Links) -> dict[str, Any]:
    """What one machine page draws: runs, environment changes, and each series with its fit."""
    runs = [{"id": r.id, "time": r.time.isoformat(), "created": r.created.isoformat(), "commit": r.commit,
             "dirty": r.dirty, "machine": r.machine_id, "suite": r.suite, "file": links.result(r.path),
             "commit_url": links.commit(r.commit), "by_commit_date": r.commit_time is not None}
            for r in history.runs]
    series = []
    for s in history.series:
        fit = fits[s.key]
        undone = undone_steps(fit.steps) | returned_steps(s, fit)
        params = {k: s.case.get(k) for k in FILTER_PARAMS if k in s.case}
        series.append({
            "key": s.key, "op": s.op, "backend": s.backend, "case": s.case_id, "params": params,
            "x": s.runs, "m": [_g(p.median) for p in s.points], "lo": [_g(p.ci_low) for p in s.points],
            "hi": [_g(p.ci_high) for p in s.points], "n": [p.n for p in s.points],
            "levels": [[s.runs[a], s.runs[b], lv] for a, b, lv in fit.levels],
            "outliers": [s.runs[i] for i in fit.outliers],
            "steps": [{"before": s.runs[st.before], "after": s.runs[st.after], "size": st.size,
                       "confidence": st.confidence, "undone": i in undone} for i, st in enumerate(fit.steps)],
            "unconfirmed": ({"run": s.runs[fit.unconfirmed.index], "size": fit.unconfirmed.size}
                            if fit.unconfirmed else None),
        })
    return {"kind": "history", "machine": history.machine, "mixed": history.mixed, "runs": runs,
            "env": [{"run": e.run, "text": e.text} for e in history.env_changes], "series": series}


def lineage_data(lineage: LineageHistory) -> dict[str, Any]:
    versions = [{"number": v.number, "label": f"v{v.number}", "committed": v.committed, "operator": v.operator,
                 "rationale": v.rationale[:300], "geomean": v.geomean} for v in lineage.versions]
    series = [{"key": "geomean", "case": "geomean of all cases", "backend": f"evolved:{lineage.name}",
               "x": [v.number for v in lineage.versions], "m": [v.geomean for v in lineage.versions]}]
    for case in lineage.cases:
        vs = [v for v in lineage.versions if case in v.scores]
        series.append({"key": case, "case": case, "backend": f"evolved:{lineage.name}", "x": [v.number for v in vs],
                       "m": [v.scores[case] for v in vs],
                       "lo": [v.bands.get(case, (v.scores[case],) * 2)[0] for v in vs],
                       "hi": [v.bands.get(case, (v.scores[case],) * 2)[1] for v in vs]})
    return {"kind": "lineage", "name": lineage.name, "versions": versions, "series": series}


def latest_pair(runs: Sequence[Run]) -> tuple[list[Run], list[Run]]:
    """The runs of the newest commit and those of the commit before it (runs in history order). Re-runs of
    one commit are pooled, never compared with each other: "latest vs previous" is a change of code. Runs
    without a commit stand alone; when every run measured one commit, the last run is set against the others."""
    groups: list[list[Run]] = []
    for r in runs:
        if groups and r.commit and groups[-1][-1].commit == r.commit:
            groups[-1].append(r)
        else:
            groups.append([r])
    if len(groups) >= 2:
        return groups[-2], groups[-1]
    return list(runs[:-1]), [runs[-1]]


def _side_label(runs: Sequence[Run]) -> str:
    first = runs[-1]
    commit = f"{first.commit[:10]}{'-dirty' if first.dirty else ''}" if first.commit else f"run {first.id}"
    return commit + (f" ({len(runs)} runs pooled)" if len(runs) > 1 else f" ({first.created:%Y-%m-%d %H:%M})")


def _summary_section(history: History, compare_latest: Callable[[Sequence[Run], Sequence[Run]], str]) -> str:
    """Per suite of the machine: its newest commit's runs against the commit before (same suite)."""
    by_suite: dict[str, list[Run]] = {}
    for r in history.runs:
        by_suite.setdefault(r.suite, []).append(r)
    parts = [f"<h2>{html.escape(history.machine)}</h2>"]
    for suite, runs in sorted(by_suite.items()):
        if len(runs) < 2:
            parts.append(f"<p>suite <b>{html.escape(suite)}</b>: one run only ({html.escape(runs[0].label)}), "
                         "nothing to compare yet.</p>")
            continue
        prev, last = latest_pair(runs)
        same = prev[-1].commit is not None and prev[-1].commit == last[-1].commit
        parts.append(f"<h3>suite {html.escape(suite)}: {html.escape(_side_label(last))} vs "
                     f"{html.escape(_side_label(prev))}</h3>")
        if same:
            parts.append("<p>Every run of this suite measured the same commit: the newest run against the "
                         "others, which shows the machine's noise, not a change of code.</p>")
        parts.append(compare_latest(prev, last))
    return "\n".join(parts)


def _index(histories: Sequence[History], lineages: Sequence[LineageHistory], found: Sequence[Found]) -> str:
    rows = []
    for h in histories:
        backends = sorted({s.backend for s in h.series})
        suites = sorted({r.suite for r in h.runs})
        first, last = h.runs[0], h.runs[-1]
        steps = sum(1 for f in found if f.series.machine == h.machine)
        rows.append([_a(machine_page_name(h.machine), h.machine), str(len(h.runs)),
                     html.escape(f"{first.created:%Y-%m-%d} .. {last.created:%Y-%m-%d}"),
                     html.escape(", ".join(suites)), html.escape(", ".join(backends)), str(len(h.series)),
                     str(len(h.env_changes)), str(steps)])
    body = ("<p>Median time of every (case, backend) over the runs of each machine, with the 95% confidence "
            "interval of the median; runs ordered by the date of their git commit (by run time where the "
            "commit is unknown). Steps are found as in <code>kbench regressions</code>.</p>"
            + _table(["machine", "runs", "dates", "suites", "backends", "series", "environment changes", "steps"],
                     rows, escape=False))
    if lineages:
        lrows = [[_a(f"lineage-{slug(lin.name)}.html", lin.name), str(len(lin.versions)), str(lin.attempts),
                  f"{lin.versions[-1].geomean:.4g}" if lin.versions else ""] for lin in lineages]
        body += "<h2>evolve lineages</h2>" + _table(["lineage", "versions", "attempts", "best geomean TFLOP/s"],
                                                    lrows, escape=False)
    return body


def _steps_table(found: Sequence[Found], links: Links) -> str:
    rows = []
    for f in sort_found(found):
        s = f.step
        commits = [_a(links.commit(r.commit), (r.commit or r.id)[:10]) for r in (f.before, f.after)]
        rows.append([("undone " if f.undone else "") + ("slower" if s.slower else "faster"),
                     f"{100 * s.size:+.1f}%",
                     f"{100 * s.size_low:+.1f}% .. {100 * s.size_high:+.1f}%", f"{s.confidence:.4f}",
                     html.escape(f.series.machine), html.escape(f.series.backend), html.escape(f.series.case_id),
                     f"{commits[0]} .. {commits[1]}",
                     f"{_a(links.result(f.before.path), f.before.id)} .. {_a(links.result(f.after.path), f.after.id)}",
                     html.escape("; ".join(e.text for e in f.env))])
    if not rows:
        return "<p>No step in any series.</p>"
    return _table(["change", "size", "95% CI", "confidence", "machine", "backend", "case", "commits", "runs",
                   "environment changed"], rows, escape=False)


def _write(path: Path, text: str, *, encoding: str = "utf-8") -> None:
    """One page or asset, atomically and under the one rule of output paths (a regular file or a new path)."""
    from kbench.outputs import write_text

    write_text(path, text, option="-o")


def write_site(out: Path, histories: Sequence[History], lineages: Sequence[LineageHistory], links: Links,
               compare_latest: Callable[[Sequence[Run], Sequence[Run]], str]) -> dict[str, Any]:
    """Write every page and asset under ``out``; returns counts for the command's last line."""
    from kbench.outputs import check_output_dir

    check_output_dir(out, option="-o")
    assets = check_output_dir(out / "assets", option="-o")
    from plotly.offline import get_plotlyjs  # the plotly.js bundle the package ships: no network at view time

    _write(assets / "plotly.min.js", get_plotlyjs(), encoding="utf-8")
    static = resources.files("kbench.history").joinpath("static")
    for name in ("history.js", "history.css"):
        _write(assets / name, static.joinpath(name).read_text(encoding="utf-8"), encoding="utf-8")

    all_found: list[Found] = []
    charts = 0
    for h in histories:
        fits: dict[str, Fit] = {}
        found = find_steps(h, fits)
        all_found.extend(found)
        charts += len(h.series)
        body = ('<div id="filters"></div><div id="details" class="details">click a point for its run, '
                'result file and commit</div><div id="charts"></div>')
        _write(out / machine_page_name(h.machine),
            _page(f"history of {h.machine}", body, data=history_data(h, fits, links), charts=True), encoding="utf-8")
    for lin in lineages:
        body = (f"<p>{len(lin.versions)} committed versions, {lin.attempts} attempts. TFLOP/s of each version "
                "(higher is better); bands: 95% interval from the run that measured the version.</p>"
                '<div id="details" class="details">click a point for its version</div><div id="charts"></div>')
        _write(out / f"lineage-{slug(lin.name)}.html",
            _page(f"lineage {lin.name}", body, data=lineage_data(lin), charts=True), encoding="utf-8")
        charts += 1 + len(lin.cases)
    _write(out / "index.html", _page("kbench history", _index(histories, lineages, all_found)), encoding="utf-8")
    _write(out / "regressions.html", _page("steps found in the histories", _steps_table(all_found, links)),
                                          encoding="utf-8")
    summary = "\n".join(_summary_section(h, compare_latest) for h in histories)
    _write(out / "summary.html", _page("latest commit vs previous commit", summary), encoding="utf-8")
    return {"pages": 3 + len(histories) + len(lineages), "charts": charts, "steps": len(all_found)}
