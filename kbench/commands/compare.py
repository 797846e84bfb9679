"""``kbench compare BASE NEW`` (two runs) and ``kbench compare RESULT --baseline BACKEND`` (speedups)."""
from __future__ import annotations

import sys
from collections import Counter

import click

from kbench.options import Finite

from kbench.compare import CHANGED, SORTS
from kbench.tables import FORMATS


#: a --baseline table has a row per case and a column per backend; beyond this many cells per record it is
#: mostly empty (backends that ran on different cases), and its size would grow with the square of the file
MAX_CELLS_PER_RECORD = 8
MAX_CELLS = 20_000


def check_baseline_table(data, baseline: str, *, file: str, dense: bool) -> None:
    """Refuse, before any statistics, a --baseline that is not in the file (naming a few that are) and a table
    whose cases x backends would be mostly empty: its text would grow with the square of the records."""
    from kbench.errors import BadInput
    from kbench.record import as_records

    records = as_records(data["records"])
    backends = list(dict.fromkeys(r.backend for r in records))
    if baseline not in backends:
        shown = ", ".join(b if len(b) <= 60 else b[:57] + "..." for b in backends[:12])
        more = f" and {len(backends) - 12:,} more" if len(backends) > 12 else ""
        raise BadInput(f"backend {baseline[:200]!r} is not in this result", file=file, where="--baseline",
                       fix=f"use one of: {shown}{more}")
    cells = len({r.case_id for r in records}) * len(backends)
    if dense and cells > max(MAX_CELLS, MAX_CELLS_PER_RECORD * len(records)):
        raise BadInput(f"the table would have {cells:,} cells for {len(records):,} records: the backends ran on "
                       "different cases, so most of it would be empty", file=file, where="--baseline",
                       fix="narrow it with -k to cases the backends share, or use --format json (one entry per pair)")


def load_sides(results, keyword: str | None, allow_different_machines: bool) -> list[list[dict]]:
    """Each RESULTS argument's runs (comma-joined files are pooled later), keeping the records ``-k`` matches;
    an incomplete run is a warning, a run from another machine than its side's first is refused (unless allowed)."""
    from kbench.commands import keep_matching
    from kbench.compare import check_same_machine, machine_mismatch
    from kbench.results import load_result
    from kbench.selection import Keyword

    kw = Keyword(keyword)
    sides = [[load_result(path) for path in arg.split(",")] for arg in results]
    for arg, runs in zip(results, sides):
        for path, d in zip(arg.split(","), runs):
            d["records"] = keep_matching(kw, d["records"], file=path)
            if not d["complete"]:
                click.echo(f"kbench: warning: {path} is incomplete "
                           f"({d.get('interrupted') or 'still running or killed'})", err=True)
            if machine_mismatch(runs[0], d) and not allow_different_machines:
                check_same_machine(runs[0], d, base_file=arg.split(",")[0], new_file=path)
    return sides


def baseline_speedups(pm, results, data, baseline: str, settings, fmt: str) -> None:
    """``--baseline``: every backend of one result against BACKEND, per case and per group."""
    from kbench.compare import group_key_for, speedup_vs_baseline
    from kbench.errors import BadInput
    from kbench.tables import speedup_summary, speedup_table

    if len(data) != 1:
        raise BadInput(f"--baseline compares the backends of one result; got {len(data)} files",
                       where="RESULTS", fix="give one result file with --baseline, or two files without it")
    check_baseline_table(data[0], baseline, file=results[0], dense=fmt != "json")
    table = speedup_vs_baseline(data[0], baseline, group_key_for(pm.registry), settings, file=results[0])
    text = fmt in ("table", "markdown")
    if text:
        click.echo(f"speedup over {baseline} ({results[0]}); '?' = within the noise, '(n=a/b)' = too few "
                   "samples (of the backend / of the baseline) to tell\n")
    click.echo(speedup_table(table, fmt))
    if text:
        click.echo("\n" + "\n".join(speedup_summary(table)))


def pair_runs(results, data, settings, *, allow_different_suites: bool, allow_different_machines: bool):
    """BASE and NEW judged pair by pair; bad input when they are of different suites or machines (unless
    allowed) or share no (case, backend)."""
    from kbench.compare import check_same_machine, compare_runs, machine_mismatch
    from kbench.errors import BadInput

    if len(data) != 2:
        raise BadInput(f"compare takes BASE and NEW (two result files), got {len(data)}", where="RESULTS",
                       fix="kbench compare BASE.json NEW.json, or kbench compare RESULT.json --baseline BACKEND")
    base, new = data
    if base["suite"]["name"] != new["suite"]["name"] and not allow_different_suites:
        raise BadInput(f"the two results are of different suites: {base['suite']['name']!r} ({results[0]}) and "
                       f"{new['suite']['name']!r} ({results[1]})", where="RESULTS",
                       fix="compare two runs of one suite, or add --allow-different-suites to compare their "
                           "common cases")
    if machine_mismatch(base, new) and not allow_different_machines:
        check_same_machine(base, new, base_file=results[0], new_file=results[1])
    pairs = compare_runs(base, new, settings)
    if not any(p.base is not None and p.new is not None for p in pairs):  # a table of "x" rows compares nothing
        only = Counter("base" if p.new is None else "new" for p in pairs)
        raise BadInput(f"the two results have no (case, backend) in common ({only['base']} records only in "
                       f"{results[0]}, {only['new']} only in {results[1]}): there is nothing to compare",
                       where="RESULTS", fix="compare two runs of one suite and backend selection, or narrow both "
                                            "with -k to what they share")
    return pairs


def print_pairs(results, sides, data, pairs, settings, *, only_changed: bool, sort: str, fmt: str) -> None:
    """The pairs as a table (backends skipped in both runs as one line each, a summary line) or CSV/JSON."""
    from kbench.compare import Change, both_skipped, counts, geomean, machine_mismatch, sort_pairs
    from kbench.run.rounds import rounds_of
    from kbench.tables import compare_table

    text = fmt in ("table", "markdown")
    shown = [p for p in pairs if p.change in CHANGED] if only_changed else pairs
    skipped_both: dict[str, set[str]] = {}
    if text:  # a backend skipped in both runs (no GPU here) is one line at the end, not a row per case
        for p in (p for p in shown if both_skipped(p)):
            skipped_both.setdefault(p.backend, set()).add(p.new.reason or "")
        shown = [p for p in shown if not both_skipped(p)]
        for side, arg, runs in (("before", results[0], sides[0]), ("after: ", results[1], sides[1])):
            pooled = f", {len(runs)} runs pooled" if len(runs) > 1 else ""
            rounds = rounds_of(runs[0])
            pooled += f", {rounds} rounds" if rounds > 1 else ""
            click.echo(f"{side} {arg} ({runs[0]['machine']['id']}, {runs[0]['created']}{pooled})")
        from kbench.threads import busy, loads

        for arg, runs in zip(results, sides):
            for d in runs:
                if busy(d):
                    worst = max(v["load1"] for v in loads(d))
                    click.echo(f"WARNING: {arg} was measured on a busy machine (load average up to {worst:.2f} on "
                               f"{d['machine'].get('cores', '?')} cores): its times are slower and noisier than "
                               "an idle run's, and a verdict against another moment means less; time both in one "
                               "run: kbench ab (docs/compare.md)")
        why = machine_mismatch(*data)
        if why:
            click.echo(f"WARNING: different machines ({'; '.join(why)}): ratios compare machines, not code")
        from kbench.history.runs import measuring_method_of

        methods = [measuring_method_of(runs[0]) for runs in sides]
        if methods[0] != methods[1]:
            click.echo(f"WARNING: different measuring methods ({methods[0]} before, {methods[1]} after: kbench "
                       "changed how it times between the runs): ratios compare the rulers as well as the code; "
                       "see docs/history.md")
        click.echo(f"ratio = after / before (median time); n = samples before/after; factor {settings.factor:g}, "
                   f"alpha {settings.alpha:g}, run-to-run scatter {100 * settings.run_noise:g}%\n")
    if shown or not text:
        click.echo(compare_table(sort_pairs(shown, sort), fmt))
    if text:
        summary = ", ".join(f"{k} {c}" for c, k in counts(pairs).items() if k)
        ratios = geomean(p.test.ratio for p in pairs if p.test)
        if skipped_both:
            click.echo("\nskipped in both runs:\n" + "\n".join(f"  {b}: {'; '.join(sorted(r))}"
                                                             for b, r in sorted(skipped_both.items())))
        click.echo(f"\n{len(pairs)} pair{'s' * (len(pairs) != 1)}: {summary}"
                   + (f"; geomean time ratio {ratios:.3f}" if ratios else ""))
        machine = [p for p in pairs if p.change is Change.MACHINE]
        if machine:
            click.echo(f"machine-wide: {len(machine)} pair{'s' * (len(machine) != 1)} moved as every backend of the "
                       "runs did: the machine (or what every backend shares: kbench, the libraries), not one "
                       "backend's code; never a regression for --fail-on-regression")
        undecided_note(results, sides, data, pairs)
        if any(p.change in (Change.SLOWER, Change.FASTER) for p in pairs) and \
                any(len(runs) == 1 and rounds_of(runs[0]) == 1 for runs in sides):
            click.echo("note: a side is one run measured in one round: a slow moment of the machine can cover every "
                       "sample of a small record. For a gate, time old and new in one run: `kbench ab SUITE OLD NEW "
                       "--fail-on-regression` (docs/compare.md, \"The gate on a busy machine\"); else make both runs "
                       "with `kbench run --rounds 3` (5 on a busy machine) or pool runs (a1.json,a2.json).")


def undecided_note(results, sides, data, pairs) -> None:
    """When pairs beyond the factor stayed ambiguous (or machine-wide) and a side was measured on a busy machine or
    in one round, two files cannot settle it: say so, with the ``kbench ab`` command that can."""
    from kbench.ab import ab_command_for
    from kbench.compare import Change
    from kbench.run.rounds import rounds_of
    from kbench.threads import busy

    open_pairs = [p for p in pairs if p.change in (Change.AMBIGUOUS, Change.MACHINE) and p.test is not None]
    if not open_pairs:
        return
    loaded = any(busy(d) for runs in sides for d in runs)
    one_round = any(len(runs) == 1 and rounds_of(runs[0]) == 1 for runs in sides)
    if not (loaded or one_round):
        return
    backends = list(dict.fromkeys(p.backend for p in open_pairs))
    suite = (data[1].get("suite") or {}).get("path")
    commits = [str((d.get("environment") or {}).get("git_commit") or "").removesuffix("-dirty") for d in data]
    files = {}
    for p in open_pairs:
        info = p.new.backend_info if p.new is not None else None
        path = info.get("kernel_file") if isinstance(info, dict) else None
        if isinstance(path, str) and path:
            files[p.backend] = path
    why = "measured on a busy machine" if loaded else "each measured in one round at its own moment"
    click.echo(f"cannot decide {len(open_pairs)} pair{'s' * (len(open_pairs) != 1)} ({', '.join(backends[:4])}"
               f"{' ...' if len(backends) > 4 else ''}) from two runs {why}: time old and new in one run instead, "
               "rounds interleaved at random:")
    for backend in backends[:3]:
        if backend in files and commits[0]:
            click.echo("  " + ab_command_for(suite, f"{commits[0][:12]}:{files[backend]}", files[backend]))
        else:
            click.echo("  " + ab_command_for(suite, "OLD", "NEW")
                       + f"   (OLD/NEW: {backend} as it was and as it is: a kernel file, REV:kernel.py, or a backend"
                         " setting)")
            break


def fail_on_regressions(pairs) -> None:
    """``--fail-on-regression``: exit 1 naming, per backend, the pairs slower or newly failing."""
    from kbench.compare import Change, is_regression

    if is_regression(pairs):
        bad = [p for p in pairs if p.change in (Change.SLOWER, Change.FAILING)]
        per_backend = Counter(f"{p.backend} {p.change}" for p in bad)
        click.echo(f"kbench: regression in {len(bad)} pair{'s' * (len(bad) != 1)}: "
                   + ", ".join(f"{k} x{n}" for k, n in per_backend.items()), err=True)
        sys.exit(1)


@click.command("compare")
@click.argument("results", nargs=-1, required=True)
@click.option("--baseline", metavar="BACKEND",
              help="With one RESULT: speedup of every backend over BACKEND per case, geomean per group.")
@click.option("--factor", type=Finite(min=1.0, max=1000.0), default=1.05, show_default=True,
              help="A time ratio within [1/FACTOR, FACTOR] counts as the same.")
@click.option("--alpha", type=Finite(min=0.0, max=1.0, min_open=True, max_open=True), default=0.01, show_default=True,
              help="Significance level of the Mann-Whitney U test and of the test against run-to-run variation.")
@click.option("--run-noise", default="3%", show_default=True,
              help="How much a record's median varies from one run of the same code to the next (process, memory "
                   "layout, clock): a change must be significant against it too. Lower it on a quiet machine.")
@click.option("--only-changed", is_flag=True, help="Show only slower, faster, newly failing and fixed pairs.")
@click.option("--sort", "sort", type=click.Choice(SORTS), default="run", show_default=True,
              help="Row order: as in the runs, by name, by time ratio (worst first), or by kind of change.")
@click.option("--fail-on-regression", is_flag=True,
              help="Exit 1 when a pair is slower or newly failing (for CI).")
@click.option("--allow-different-machines", is_flag=True,
              help="Compare results from different machines or hardware profiles anyway.")
@click.option("--allow-different-suites", is_flag=True,
              help="Compare results of two different suites anyway (only their common cases are compared).")
@click.option("-k", "keyword", metavar="EXPR", help="Only records whose backend/case match EXPR.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True)
@click.pass_obj
def compare_command(pm, results, baseline, factor, alpha, run_noise, only_changed, sort, fail_on_regression,
                    allow_different_machines, allow_different_suites, keyword, fmt):
    """Compare two result files (BASE NEW), or the backends of one RESULT against --baseline.

    BASE or NEW may be several runs joined by commas (a.json,b.json): their samples are pooled, so
    run-to-run variation counts as noise.

    \b
    Marks (as asv): + slower, - faster, m machine-wide (every backend of the
    runs moved alike), ~ ambiguous (beyond the factor but not
    significant, within the variation between runs, inside the noise, the
    fastest samples did not move, or the records measured beside it moved
    alike), ! newly failing, * fixed, x incomparable. A pair is slower/faster
    only when the ratio of medians is beyond --factor, the Mann-Whitney U test
    and a bootstrap CI of the ratio agree it is significant, it is significant
    against --run-noise too, it exceeds the record's spread (or the fastest
    samples moved alike), the minimum moved beyond the variation between runs,
    and the other backends measured beside it did not. See docs/compare.md.

    Exit status: 0, or 1 with --fail-on-regression when a pair is slower or newly
    failing; 2 on bad input (including results from different machines or of different suites, and a -k
    that matches nothing).
    """
    from kbench.commands.regressions import parse_threshold
    from kbench.compare import Settings, pool_runs

    settings = Settings(factor=factor, alpha=alpha, run_noise=parse_threshold(run_noise, option="--run-noise",
                                                                             upper=1.0))
    sides = load_sides(results, keyword, allow_different_machines)
    data = [pool_runs(runs) for runs in sides]
    if baseline is not None:
        baseline_speedups(pm, results, data, baseline, settings, fmt)
        return
    pairs = pair_runs(results, data, settings, allow_different_suites=allow_different_suites,
                      allow_different_machines=allow_different_machines)
    print_pairs(results, sides, data, pairs, settings, only_changed=only_changed, sort=sort, fmt=fmt)
    if fail_on_regression:
        fail_on_regressions(pairs)
