"""``kbench regressions RESULTS_DIR...``: steps in every (machine, case, backend) history, for people and CI."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from kbench.tables import FORMATS


def parse_threshold(text: str, *, option: str = "--threshold", upper: float = 10.0) -> float:
    """``2%`` or ``0.02``: a relative change (the smallest step that counts, a run-to-run scatter), below ``upper``."""
    from kbench.errors import BadInput

    raw = text.strip()
    name = option.lstrip("-").replace("-", " ")
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise BadInput(f"bad {name} {text!r}", where=option, fix="write it as 2% or 0.02") from None
    if not 0 <= value < upper:
        raise BadInput(f"{name} {text!r} is out of range", where=option, fix="e.g. 2% (a change of 2%)")
    return value


def step_columns():
    """The columns of the steps table: on screen the mark column has no header; CSV holds every one, numbers."""
    from kbench.tables import Column

    return (
        Column("", "change", lambda f: "undone" if f.undone else "machine-wide" if f.machine
               else "slower" if f.step.slower else "faster",
               lambda f: "~" if f.undone else "m" if f.machine else "+" if f.step.slower else "-"),
        Column("size", "size", lambda f: f.step.size, lambda f: f"{100 * f.step.size:+.1f}%"),
        Column("95% CI", "size_ci_low", lambda f: f.step.size_low,
               lambda f: f"{100 * f.step.size_low:+.1f}%..{100 * f.step.size_high:+.1f}%"),
        Column("", "size_ci_high", lambda f: f.step.size_high),
        Column("confidence", "confidence", lambda f: f.step.confidence, lambda f: f"{f.step.confidence:.4f}"),
        Column("machine", "machine", lambda f: f.series.machine),
        Column("backend", "backend", lambda f: f.series.backend),
        Column("case", "case_id", lambda f: f.series.case_id),
        Column("commits", "commits", lambda f: f.commit_range),
        Column("", "level_before_s", lambda f: f.step.level_before),
        Column("", "level_after_s", lambda f: f.step.level_after),
        Column("environment changed", "environment_changed", lambda f: "; ".join(e.text for e in f.env)),
        Column("machine-wide", "machine_wide", lambda f: f.machine),
    )


def print_steps(found, newest, fmt: str, *, n_runs: int, n_series: int, limit: float, since: str | None) -> None:
    """The steps (and unconfirmed newest runs) as JSON, CSV, or a table with a summary for people."""
    from kbench.tables import render, render_columns

    if fmt == "json":
        click.echo(json.dumps({"steps": [f.to_json() for f in found], "unconfirmed": [u.to_json() for u in newest]},
                              indent=1))
        return
    columns = step_columns()
    if fmt not in ("table", "markdown"):  # csv: numbers (sizes as fractions, levels in seconds)
        click.echo(render_columns(columns, found, fmt))
        return
    if found:
        shown = [columns[0]] + [c for c in columns[1:] if c.header]
        click.echo(render([""] + [c.header for c in shown[1:]], [[c.show(f) for c in shown] for f in found], fmt))
    slower = sum(1 for f in found if f.step.slower and not f.undone and not f.machine)
    faster = sum(1 for f in found if not f.step.slower and not f.undone and not f.machine)
    undone = sum(1 for f in found if f.undone)
    machine = sum(1 for f in found if f.machine and not f.undone)
    click.echo(f"\n{n_runs} runs, {n_series} series: {slower} slower and {faster} faster steps of "
               f"{100 * limit:g}% or more" + (f" since {since}" if since else "")
               + (f"; {undone} undone (~: a later step brought the series back)" if undone else "")
               + (f"; {machine} machine-wide (m: the other backends of the run moved alike)" if machine else "")
               + (f"; {len(newest)} unconfirmed newest run{'s' * (len(newest) != 1)}" if newest else ""))
    for u in newest:
        if u.machine:
            click.echo(f"machine-wide {'slower' if u.slower else 'faster'}: {u.text}; {u.machine}")
        else:
            click.echo(f"unconfirmed {'slower' if u.slower else 'faster'}: {u.text}; the backends measured beside "
                       "it did not move alike, but one run cannot tell a step from a slow moment of its own: the "
                       "next run will (or time old and new in one run: kbench ab, docs/compare.md)")


def fail_on(found, newest, *, limit: float, ignore_unconfirmed: bool) -> None:
    """``--fail``: exit 1 naming up to five lasting slower steps and (unless ignored) slower unconfirmed runs;
    never for a machine-wide one (the control rule: the other backends of the same run moved alike)."""
    bad = [f"{f.series.backend} {f.series.case_id} {100 * f.step.size:+.1f}% in {f.commit_range}"
           for f in found if f.step.slower and not f.undone and not f.machine]
    bad += [] if ignore_unconfirmed else [f"{u.series.backend} {u.series.case_id} {100 * u.size:+.1f}% in the "
                                          f"newest run {u.run.id} (unconfirmed)"
                                          for u in newest if u.slower and not u.machine]
    if bad:
        click.echo(f"kbench: {len(bad)} regressions of {100 * limit:g}% or more: " + ", ".join(bad[:5])
                   + (" ..." if len(bad) > 5 else ""), err=True)
        sys.exit(1)


@click.command("regressions")
@click.argument("results_dirs", nargs=-1, required=True)
@click.option("--since", metavar="REF", help="Only steps after REF: a date, a commit or run id, or a git ref.")
@click.option("--threshold", default="2%", show_default=True,
              help="Smallest step listed (and failed on), relative: 2% or 0.02.")
@click.option("--fail", is_flag=True, help="Exit 1 when a slower step beyond the threshold lies in the range, or a "
                                           "newest run is that much slower than the level before it (CI).")
@click.option("--ignore-unconfirmed", is_flag=True,
              help="With --fail: do not fail on a slower newest run that no later run has confirmed yet.")
@click.option("--repo", type=click.Path(file_okay=False, path_type=Path),
              help="Git repository whose commit dates order the runs (default: the one holding RESULTS_DIR).")
@click.option("--mix-machines", is_flag=True, help="One history of all machines (default: one per machine).")
@click.option("--cache", type=click.Path(dir_okay=False, path_type=Path),
              help="File of result files already read (default: one per RESULTS_DIRs in ~/.cache/kbench).")
@click.option("--no-cache", is_flag=True, help="Read every result file again.")
@click.option("-j", "--jobs", type=click.IntRange(1, 256), help="Processes reading result files (default: CPUs).")
@click.option("-k", "keyword", metavar="EXPR", help="Only records whose backend/case match EXPR.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True)
def regressions_command(results_dirs, since, threshold, fail, ignore_unconfirmed, repo, mix_machines, cache, no_cache,
                        jobs, keyword, fmt):
    """Find steps in the history of every (case, backend) of the result files under RESULTS_DIR.

    Each series is the median time over the runs of one machine, ordered by commit date. A step is a
    change of level found by a penalised piecewise-constant fit weighted by the noise of the runs (their
    confidence intervals and the series' run-to-run scatter); each is listed with the commit range where
    it happened, its size with a 95% interval, and its confidence. A newest run beyond the noise of the
    level before it is listed as unconfirmed (from two runs on). See docs/history.md.

    Marks: + slower, - faster, ~ undone (the next step brings the series back: slow windows of the
    machine in a row, or a regression already fixed), m machine-wide (the other backends of the same run
    moved alike: the rule of kbench compare; listed, never failed on).

    Exit status: 0; 1 with --fail when a lasting slower step beyond --threshold lies after --since, or an
    unconfirmed newest run is slower by the threshold (unless --ignore-unconfirmed), and it is not
    machine-wide; 2 on bad input.
    """
    from kbench.commands import read_histories
    from kbench.history import default_repo
    from kbench.history.regressions import resolve_since, steps_and_newest

    limit = parse_threshold(threshold)
    repo = repo or default_repo(results_dirs)
    runs, hists = read_histories(results_dirs, repo=repo, mix_machines=mix_machines, keyword=keyword, cache=cache,
                                 no_cache=no_cache, jobs=jobs)
    found, newest = steps_and_newest(hists, resolve_since(since, runs, repo) if since else None, limit)
    print_steps(found, newest, fmt, n_runs=len(runs), n_series=sum(len(h.series) for h in hists), limit=limit,
                since=since)
    if fail:
        fail_on(found, newest, limit=limit, ignore_unconfirmed=ignore_unconfirmed)
