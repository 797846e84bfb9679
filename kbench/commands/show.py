"""``kbench show RESULT``: the records of a result file as a table."""
from __future__ import annotations

import click

from kbench.tables import FORMATS, min_samples_of, records_table, status_summary


@click.command("show")
@click.argument("result", type=click.Path(dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True)
@click.option("-k", "keyword", metavar="EXPR", help="Only records whose backend/case match EXPR.")
@click.option("--profile", "profile", is_flag=True, help="Also the Nsight Compute profile of each record "
                                                          "(`kbench run --profile ncu`).")
@click.option("--repro", "repro", is_flag=True, help="Also the command that measures each record again.")
def show_command(result, fmt, keyword, profile, repro):
    """Print the records of RESULT (a result JSON file).

    Columns: n is the number of timed samples ("2 <5": fewer than the suite's min_samples, the time limit
    came first), stop why sampling stopped (noise_target, time_limit, max_samples). CSV holds numbers with
    their unit in the column name (median_s, tflop_per_s, ...); JSON gives the records themselves.
    """
    from kbench.record import as_records
    from kbench.results import load_result
    from kbench.selection import Keyword

    from kbench.commands import keep_matching

    data = load_result(result)
    records = as_records(keep_matching(Keyword(keyword), data["records"], file=result))
    if fmt in ("table", "markdown"):
        hw = (data.get("hardware") or {}).get("title", "no hardware profile")
        state = "complete" if data["complete"] else f"INCOMPLETE ({data.get('interrupted') or 'still running or killed'})"
        from kbench.run.rounds import rounds_of

        state += f", each record in {rounds_of(data)} rounds" if rounds_of(data) > 1 else ""
        click.echo(f"{data['suite']['name']} on {data['machine']['id']} ({data['device']}, {hw}), "
                   f"{data['created']}, {state}")
        from kbench.threads import describe as describe_threads

        click.echo(f"{describe_threads(data) or ''}\n")
    least = min_samples_of(data)
    click.echo(records_table(records, fmt, min_samples=least))
    if fmt in ("table", "markdown"):
        click.echo(f"\n{status_summary(records, least)}")
    if profile:
        from kbench.profiling import profile_table

        click.echo(f"\nProfiles (Nsight Compute, outside the timed samples):\n{profile_table(records, fmt)}")
    if repro and fmt != "json":  # JSON: every record holds its ``repro`` already
        from kbench.record import repro_lines
        from kbench.text import safe_text

        # one line per record, whatever the file holds: a newline (or any control character) in a repro is shown
        # escaped, never as a line of its own that looks like another command
        lines = (safe_text(repro_lines([r])).replace("\t", "\\t").replace("\n", "\\n") for r in records)
        click.echo("\nRepro (one command per record):\n" + "\n".join(lines))
