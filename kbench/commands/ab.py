"""``kbench ab SUITE OLD NEW``: old and new code timed in one run, rounds interleaved at random, judged as pairs."""
from __future__ import annotations

import sys
from pathlib import Path

import click

from kbench.tables import FORMATS


def parse_ratio(text: str, *, option: str) -> float:
    """``5%``, ``0.05`` or ``1.05``: NEW this much slower than OLD, as a time ratio (1.05)."""
    from kbench.errors import BadInput

    raw = str(text).strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        value = float("nan")
    if raw.endswith("%") or 0 <= value < 1:
        value = 1 + value
    if not 1 <= value < 100:
        raise BadInput(f"bad {option.lstrip('-')} {text!r}", where=option,
                       fix="a slowdown as a percentage (5%) or a time ratio (1.05)")
    return value


def _fmt_ratio(iv) -> tuple[str, str]:
    if iv is None:
        return "", ""
    return f"{iv.ratio:.3f}", f"{iv.low:.3f}-{iv.high:.3f}"


def print_verdict(run, verdict, fmt: str) -> None:
    """Per case, per group and over all cases: the paired ratio NEW/OLD, its interval and the verdict."""
    import json

    from kbench.ab import MARKS
    from kbench.compare import median_of
    from kbench.tables import fmt_time, render

    if fmt == "json":
        click.echo(json.dumps({**verdict.to_json(), "output": str(run.output), "seed": run.seed,
                               "old": run.old.to_json(), "new": run.new.to_json()}, indent=1))
        return
    if fmt == "csv":
        click.echo(render(["kind", "name", "verdict", "ratio", "ci_low", "ci_high", "old_median_s", "new_median_s",
                           "rounds"],
                          [["case", c.case_id, c.verdict, *(
                              (c.interval.ratio, c.interval.low, c.interval.high) if c.interval else ("", "", "")),
                            median_of(c.old), median_of(c.new), len(c.logs)] for c in verdict.cases]
                          + [["group", g.group, g.verdict, *(
                              (g.interval.ratio, g.interval.low, g.interval.high) if g.interval else ("", "", "")),
                              "", "", g.interval.n if g.interval else ""]
                             for g in verdict.groups + ([verdict.overall] if verdict.overall else [])], "csv"))
        return
    conf = f"{100 * verdict.confidence:g}%"
    click.echo(f"old: {run.old.origin} as {run.old.backend.name}\nnew: {run.new.origin} as {run.new.backend.name}\n"
               f"ratio = new / old time: per round the ratio of the fastest samples, the median over the rounds; "
               f"CI: {conf} sign-test interval over the rounds; threshold {verdict.threshold:g}\n")
    rows = []
    for c in verdict.cases:
        ratio, ci = _fmt_ratio(c.interval)
        rows.append([MARKS[c.verdict], c.case_id, fmt_time(median_of(c.old)), fmt_time(median_of(c.new)), ratio, ci,
                     len(c.logs) or "", c.verdict + (f": {c.note}" if c.note else "")])
    click.echo(render(["", "case", "old", "new", "ratio", "CI", "rounds", "verdict"], rows, fmt))
    groups = verdict.groups + ([verdict.overall] if verdict.overall else [])
    if groups:
        click.echo("\n" + render(["", "group", "cases", "geomean ratio", "CI", "verdict"],
                                 [[MARKS[g.verdict], g.group, g.cases, *_fmt_ratio(g.interval), g.verdict]
                                  for g in groups], fmt))
    from collections import Counter

    n = Counter(c.verdict for c in verdict.cases)
    click.echo(f"\n{len(verdict.cases)} case{'s' * (len(verdict.cases) != 1)}: "
               + ", ".join(f"{k} {v}" for k, v in n.items()) + f"; result in {run.output}")
    if n.get("undecided"):
        click.echo("undecided: the interval holds both 'same' and 'slower' (or 'faster'); more rounds "
                   "(--rounds 20) narrow it")


@click.command("ab")
@click.argument("suite", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("old")
@click.argument("new")
@click.option("--rounds", type=click.IntRange(min=2, max=64), default=None, metavar="N",
              help="Rounds, each one paired ratio per case (default 10: the 95% interval then leaves out the highest and the lowest round).")
@click.option("--fail-on-regression", "fail_threshold", is_flag=False, flag_value="5%", default=None,
              metavar="[THRESHOLD]",
              help="Exit 1 when NEW is slower than OLD beyond THRESHOLD (default 5%) with confidence, on a case, a "
                   "group or all cases, or fails where OLD passed (for CI).")
@click.option("--threshold", default=None, metavar="RATIO",
              help="The slowdown that counts (5% or 1.05; default 5%, or --fail-on-regression's).")
@click.option("--confidence", type=float, default=0.95, show_default=True,
              help="Of each interval (over the rounds).")
@click.option("--threads", "threads", metavar="N", default=None,
              help="BLAS/OpenMP/torch threads per worker (default 1; see kbench run --threads).")
@click.option("-k", "keyword", metavar="EXPR", help="Only cases matching EXPR.")
@click.option("--device", default="auto", show_default=True, help="cpu, cuda, or auto.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Result file (default results/<machine>/<suite>-ab-<time>.json).")
@click.option("--force", is_flag=True, help="Overwrite the -o file if it exists.")
@click.option("--isolate/--no-isolate", default=True, show_default=True,
              help="Trusted backends in a worker process (--no-isolate: in this process).")
@click.option("--case-timeout", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="Seconds one round of one (backend, case) may take.")
@click.option("--allow-unsandboxed", is_flag=True, help="Run kernel files without the OS sandbox where it does "
                                                        "not work (recorded in the result; docs/sandbox.md).")
@click.option("--seed", type=int, default=None, help="Seed of the random order (default: drawn; recorded).")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True)
@click.pass_obj
def ab_command(pm, suite, old, new, rounds, fail_threshold, threshold, confidence, threads, keyword, device, output,
               force, isolate, case_timeout, allow_unsandboxed, seed, fmt):
    """Time OLD and NEW in one run of SUITE and judge NEW against OLD pair by pair: the gate for a busy machine.

    OLD and NEW are each a backend (numpy-flash, or one setting of it: 'numpy-flash[block_q=64]'), a kernel file
    (kernel.py), or a kernel file at a git revision (HEAD~1:kernel.py, main:kernels/k.py: checked out into a
    scratch git worktree). Both are measured in the same run, on the same inputs, in --rounds rounds; in every
    round the two sides of a case run back to back in a random order, so a slow moment of the machine falls on
    both or, at random, on either. The verdict per case is the median over the rounds of the time ratio new/old
    of each round's fastest samples, with a sign-test interval over the rounds; per group and over all cases the
    same over each round's geometric mean of its cases.

    \b
    Marks: + slower (the whole interval above the threshold), - faster,
    ' ' same (inside [1/threshold, threshold]), ? undecided (more rounds
    narrow it), ! failing where OLD passed, * fixed, x incomparable.

    Exit status: 0; 1 with --fail-on-regression when a case, group or all cases are slower beyond the threshold
    with confidence, or a case fails that OLD passed; 2 on bad input. See docs/compare.md, "The gate on a busy machine".
    """
    from kbench.ab import DEFAULT_ROUNDS, DEFAULT_THRESHOLD, judge, run_ab
    from kbench.compare import group_key_for
    from kbench.suite import load_suite
    from kbench.threads import apply_threads, load_line, load_state, parse_threads, restore_threads

    limit = parse_ratio(threshold, option="--threshold") if threshold is not None else \
        parse_ratio(fail_threshold, option="--fail-on-regression") if fail_threshold is not None else DEFAULT_THRESHOLD
    the_suite = load_suite(suite)
    setting = apply_threads(None if threads is None else parse_threads(threads), in_process=not isolate)
    try:
        before = load_state()
        click.echo(f"kbench ab: {the_suite.name}, {rounds or DEFAULT_ROUNDS} rounds; {load_line(before, paired=True)}; "
                   f"{setting.text}", err=True)
        run = run_ab(pm, the_suite, old, new, rounds=rounds or DEFAULT_ROUNDS, device=device, keyword=keyword,
                     output=output, force=force, isolate=isolate, case_timeout=case_timeout,
                     allow_unsandboxed=allow_unsandboxed, seed=seed)
        from kbench.threads import stamp_result

        stamp_result(run.output, setting, before, load_state())
    finally:
        restore_threads()
    verdict = judge(run.records, run.old.backend.name, run.new.backend.name, group_key_for(pm.registry),
                    threshold=limit, confidence=confidence)
    print_verdict(run, verdict, fmt)
    if fail_threshold is not None and verdict.regressed:
        click.echo(f"kbench: NEW is slower than OLD beyond {limit:g} with {100 * confidence:g}% confidence: "
                   + ", ".join(verdict.regressed[:6]) + (" ..." if len(verdict.regressed) > 6 else ""), err=True)
        sys.exit(1)
