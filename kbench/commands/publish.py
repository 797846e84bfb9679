"""``kbench publish RESULTS_DIR... -o SITE_DIR``: the history of every run as a static site."""
from __future__ import annotations

from pathlib import Path

import click


def _compare_latest(keyword: str | None):
    """The summary page's table: two commits' runs (re-runs of one commit pooled) judged exactly as
    ``kbench compare a.json,b.json c.json`` judges them, the control rule included (other backends of the same
    runs that moved alike are the machine: ``machine-wide``, never "slower" or "faster")."""
    from kbench.compare import CHANGED, Change, both_skipped, compare_runs, counts, machine_mismatch, pool_runs
    from kbench.results import load_result
    from kbench.selection import Keyword
    from kbench.tables import compare_table

    kw = Keyword(keyword)

    def render(prev, last) -> str:
        import html

        sides = [[load_result(r.path) for r in runs] for runs in (prev, last)]
        for d in sides[0] + sides[1]:
            d["records"] = [r for r in d["records"] if kw.matches(r["backend"], r["case_id"])]
        base, new = (pool_runs(side) for side in sides)
        pairs = [p for p in compare_runs(base, new) if not both_skipped(p)]
        n = counts(pairs)
        line = ", ".join(f"{k} {c}" for c, k in n.items() if k)
        warn = machine_mismatch(base, new)
        shown = [p for p in pairs if p.change in CHANGED + (Change.MACHINE, Change.AMBIGUOUS)]
        out = f"<p>{len(pairs)} pair{'s' * (len(pairs) != 1)}: {html.escape(line)}</p>"
        if n[Change.MACHINE]:
            out += (f"<p><b>machine-wide</b>: {n[Change.MACHINE]} pairs moved as every backend of the runs did: the "
                    "machine (or what every backend shares), not one backend's code (the control rule of kbench "
                    "compare).</p>")
        if warn:
            out += f"<p><b>different machines</b> ({html.escape('; '.join(warn))}): ratios compare machines.</p>"
        return out + (compare_table(shown, "html") if shown else "<p>nothing changed beyond the noise.</p>")

    return render


@click.command("publish")
@click.argument("results_dirs", nargs=-1, required=True)
@click.option("-o", "--output", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Directory of the site (created; pages in it are replaced).")
@click.option("--repo", type=click.Path(file_okay=False, path_type=Path),
              help="Git repository whose commit dates order the runs (default: the one holding RESULTS_DIR).")
@click.option("--mix-machines", is_flag=True,
              help="One history of all machines, points coloured by machine (default: one per machine).")
@click.option("--lineages", type=click.Path(file_okay=False, path_type=Path),
              help="An evolve workspace: draw its lineages too (version on the x axis).")
@click.option("--results-url", metavar="URL",
              help="Where RESULTS_DIR is served (e.g. the raw files of the repository); default: relative links.")
@click.option("--commit-url", metavar="TEMPLATE",
              help="Link of a commit, with {commit}: e.g. https://github.com/ORG/REPO/commit/{commit}.")
@click.option("--cache", type=click.Path(dir_okay=False, path_type=Path),
              help="File of result files already read (default: one per RESULTS_DIRs in ~/.cache/kbench).")
@click.option("--no-cache", is_flag=True, help="Read every result file again.")
@click.option("-j", "--jobs", type=click.IntRange(1, 256), help="Processes reading result files (default: CPUs).")
@click.option("-k", "keyword", metavar="EXPR", help="Only records whose backend/case match EXPR.")
def publish_command(results_dirs, output, repo, mix_machines, lineages, results_url, commit_url, cache, no_cache,
                    jobs, keyword):
    """Write a static site of the history of the result files under RESULTS_DIR.

    Per machine, one chart per (case, backend): the median time of every run with its 95% confidence band,
    runs ordered by commit date, environment changes (driver, library versions) marked, steps shaded;
    filters by op, backend, dtype, head_dim, causal. Also a summary of the latest run against the previous
    one, every step found, and evolve lineages with --lineages. Opens from the file system; see docs/history.md.
    """
    from kbench.errors import BadInput
    from kbench.history.lineages import load_lineages
    from kbench.history.site import Links, write_site

    if commit_url and "{commit}" not in commit_url:
        raise BadInput(f"--commit-url has no {{commit}}: {commit_url!r}", where="--commit-url",
                       fix="e.g. https://github.com/ORG/REPO/commit/{commit}")
    from kbench.commands import read_histories
    from kbench.outputs import check_output_dir

    check_output_dir(output, option="-o")  # before reading every result file

    runs, hists = read_histories(results_dirs, repo=repo, mix_machines=mix_machines, keyword=keyword, cache=cache,
                                 no_cache=no_cache, jobs=jobs)
    lins = load_lineages(lineages) if lineages else []
    links = Links(output, results_url, Path(results_dirs[0]) if results_url else None, commit_url)
    counts = write_site(output, hists, lins, links, _compare_latest(keyword))
    click.echo(f"{output / 'index.html'}: {len(runs)} runs, {len(hists)} histories, {counts['charts']} charts, "
               f"{counts['steps']} steps, {len(lins)} lineages")
