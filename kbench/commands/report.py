"""``kbench report RESULT... -o report.html``: plots and tables a person would rather look at than read."""
from __future__ import annotations

from pathlib import Path

import click


#: most series (backend x run) one report draws: beyond, the lines cannot be told apart, and each costs memory
#: and seconds on every panel (1,000 series of 1,000-character names took 1 GB and minutes)
MAX_SERIES = 100


@click.command("report")
@click.argument("results", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="HTML file (default report.html), or the directory of images with --format png.")
@click.option("--format", "fmt", type=click.Choice(["html", "png"]), default="html", show_default=True,
              help="html: one self-contained page; png: one image per plot in a directory.")
@click.option("--baseline", metavar="BACKEND",
              help="Backend the speedup plot divides by (default: the first backend of the first result).")
@click.option("-k", "keyword", metavar="EXPR", help="Only records whose backend/case match EXPR.")
@click.pass_obj
def report_command(pm, results, output, fmt, baseline, keyword):
    """Write a report of one or more result files (several runs: each run's backends are separate series,
    and the changes from the first run to each other are tabled)."""
    from kbench.compare import group_key_for, machine_mismatch
    from kbench.errors import BadInput
    from kbench.report import build_figures, label_runs, pick_baseline, render_html, write_pngs
    from kbench.results import load_result
    from kbench.selection import Keyword

    from kbench.outputs import check_output_dir, check_output_file, write_text
    from kbench.commands import keep_matching

    # the output is checked before the (slow) figures are made
    if fmt == "png":
        check_output_dir(output or Path("report"), option="-o")
    else:
        check_output_file(output or Path("report.html"), option="-o")
    kw = Keyword(keyword)
    datas = [load_result(p) for p in results]
    for path, d in zip(results, datas):
        d["records"] = keep_matching(kw, d["records"], file=path)
    series = {(i, r["backend"]) for i, d in enumerate(datas) for r in d["records"] if r["status"] == "passed"}
    if len(series) > MAX_SERIES:  # each is a line, a legend entry and a colour on every panel: refused up front
        raise BadInput(f"the report would draw {len(series):,} series (backends x runs; at most {MAX_SERIES})",
                       file=results[0] if len(results) == 1 else None, where="RESULTS",
                       fix="narrow it with -k to the backends to look at, or give fewer runs")
    runs = label_runs(results, datas)
    for run in runs[1:]:
        why = machine_mismatch(runs[0].data, run.data)
        if why:
            click.echo(f"kbench: warning: {run.path} is from another machine than {runs[0].path} "
                       f"({'; '.join(why)}); its changes compare machines, not code", err=True)
    figs, table, changes = build_figures(runs, group_key_for(pm.registry), pick_baseline(runs, baseline))
    if fmt == "png":
        directory = output or Path("report")
        for path in write_pngs(figs, directory):
            click.echo(str(path))
        for name, why in figs.missing.items():
            click.echo(f"kbench: no {name} plot: {why}", err=True)
        return
    output = output or Path("report.html")
    html = render_html(runs, figs, table, changes)
    write_text(output, html, option="-o")
    click.echo(f"{output} ({len(figs.items)} plots, {sum(len(r.data['records']) for r in runs)} records)")
