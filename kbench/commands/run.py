"""``kbench run SUITE``: measure every selected backend on every case of a suite."""
from __future__ import annotations

import sys
from pathlib import Path

import click

from kbench.suite import load_suite
from kbench.tables import records_table, status_summary


def _is_kernel_file(pattern: str) -> bool:
    return pattern.endswith(".py") or Path(pattern).is_file()


@click.command("run")
@click.argument("suite", type=click.Path(dir_okay=False, path_type=Path))
@click.option("-b", "--backend", "backends", multiple=True, metavar="PATTERN",
              help="Backend name pattern (fnmatch, '!' excludes) or a kernel file path; repeatable. "
                   "Default: the suite's selection.")
@click.option("-k", "keyword", metavar="EXPR", help='Keyword expression over backend and case id, e.g. "d=128 and not causal".')
@click.option("--device", default="auto", show_default=True, help="cpu, cuda, or auto (accelerator if usable).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Result file (default results/<machine>/<suite>-<time>.json).")
@click.option("--progress/--no-progress", default=None, help="Progress display (default: when stderr is a terminal).")
@click.option("--format", "fmt", type=click.Choice(["table", "markdown", "csv", "json"]), default="table",
              show_default=True, help="Format of the table printed at the end.")
@click.pass_obj
def run_command(pm, suite, backends, keyword, device, output, progress, fmt):
    """Run SUITE (a YAML file) on this machine and write a result file.

    Exit status: 0 when every measured case passed, 1 when some failed or errored, 2 on bad input.
    """
    from kbench.runner import RunRequest, exit_code, plan_run, run_suite

    req = RunRequest(suite=load_suite(suite), device=device,
                     backend_patterns=[b for b in backends if not _is_kernel_file(b)],
                     kernel_files=[b for b in backends if _is_kernel_file(b)], keyword=keyword, output=output)
    planned = plan_run(pm, req)
    work = planned.work()
    click.echo(f"kbench: {req.suite.name} on {planned.ctx.device.name}"
               f" ({planned.ctx.hardware.title if planned.ctx.hardware else 'no hardware profile'}): "
               f"{len(planned.plan.cases)} cases x {len(planned.backends)} backends = {len(work)} records"
               f" -> {planned.output}", err=True)
    show_progress = sys.stderr.isatty() if progress is None else progress
    writer = _run_with_progress(pm, planned, len(work)) if show_progress else run_suite(pm, planned)
    click.echo(records_table(writer.records, fmt))
    click.echo(f"\n{status_summary(writer.records)}; results in {planned.output}", err=True)
    sys.exit(exit_code(writer.records))


def _run_with_progress(pm, planned, total):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from kbench.runner import run_suite

    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("{task.fields[last]}"))
    with Progress(*columns, transient=False) as bar:
        task = bar.add_task("measuring", total=total, last="")

        def on_record(rec, i, n):
            bar.update(task, completed=i, last=f"{rec['backend']} {rec['status']}")
        return run_suite(pm, planned, on_record=on_record)
