"""``kbench fuzz -b BACKEND``: cases nobody chose, checked against the float64 reference, a failure shrunk."""
from __future__ import annotations

import json
import secrets
import sys
from pathlib import Path

import click

from kbench.options import Finite

from kbench.enums import DType


def _is_kernel_file(pattern: str) -> bool:
    return pattern.endswith(".py") or Path(pattern).is_file()


@click.command("fuzz")
@click.option("-b", "--backend", "backends", multiple=True, required=True, metavar="BACKEND_OR_KERNEL_FILE",
              help="A registered backend (numpy, torch-sdpa[threads=1], ...) or a kernel file; repeatable.")
@click.option("--op", type=click.Choice(["attention", "attention_varlen", "decode_attention"]), default=None,
              help="The op whose space is drawn (default: the backend's; a backend of another op is bad input).")
@click.option("--budget", type=Finite(min=1, max=86400), default=60.0, show_default=True, metavar="SECONDS",
              help="Wall time for each backend's search and shrink.")
@click.option("--seed", type=click.IntRange(min=0, max=2**63 - 1), default=None,
              help="Seed of the cases drawn and of their inputs (default: a random one, printed).")
@click.option("--dtype", "dtypes", multiple=True, type=click.Choice([d.value for d in DType]),
              help="dtypes drawn (repeatable; default fp32, fp16, bf16 where the op takes them).")
@click.option("--head-dim", "head_dims", multiple=True, type=click.IntRange(min=1, max=1024),
              help="head_dims drawn (repeatable; default 8 to 256, the usual and the odd).")
@click.option("--values", "values", multiple=True, metavar="NAME",
              help="Value ranges of the inputs drawn (repeatable; default all of them, unit half the time: unit, "
                   "large_scores, outlier_channels, outlier_tokens, constant_rows, one_hot, std:2, std:4; "
                   "docs/fuzz.md).")
@click.option("--long-rows/--no-long-rows", default=True, show_default=True,
              help="Draw a quarter of the cases with long key rows (up to 8,193 keys).")
@click.option("--device", default=None, help="Device to check on (default: the backend's).")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the report (JSON) here; the repro suites are written beside it (default: beside the "
                   "kernel file, else in the current directory).")
@click.option("--allow-unsandboxed", is_flag=True,
              help="Run kernel files without the OS sandbox where it does not work here.")
@click.pass_obj
def fuzz_command(pm, backends, op, budget, seed, dtypes, head_dims, values, long_rows, device, fmt, output,
                 allow_unsandboxed):
    """Search an op's whole parameter space for a case the backend gets wrong.

    Cases are drawn (Hypothesis, derandomised by --seed) across batch, equal and unequal sequence lengths (odd,
    prime, around the tile sizes), heads (MHA, GQA, MQA), head_dim, causal (window and softcap where the
    backend declares them) and dtypes; each is checked against the float64 reference through the judge and
    sandbox of `kbench run` (correctness only: no timing), one worker for the whole search. A failing case is
    shrunk to a small one that still fails and written into a suite file; the output names it with a one-line
    repro (`kbench run SUITE -b BACKEND`). Exit 1 when a backend failed, 0 when none did within the budget,
    2 on bad input or when the harness could not check.
    """
    from kbench.fuzz.checker import Checker
    from kbench.fuzz.engine import fuzz, fuzz_secret, write_repro
    from kbench.fuzz.space import Space

    from dataclasses import replace

    if output is not None:  # before the search: a path that cannot take the report is refused up front
        from kbench.outputs import check_output_file

        check_output_file(output, option="-o")
    seed = secrets.randbelow(2**31) if seed is None else seed
    targets = [_resolve(pm, arg, op) for arg in backends]
    chosen_values = _values(values)
    results = []
    for arg, backend in targets:
        space = replace(_space(pm, backend, dtypes, head_dims), values=chosen_values, long_rows=long_rows)
        where = device or backend.device
        if fmt == "table":
            click.echo(f"kbench fuzz: {backend.name} ({backend.op} on {where}), seed {seed}, budget {budget:g} s",
                       err=True)
        with Checker(pm, backend.op, where, secret=fuzz_secret(seed), allow_unsandboxed=allow_unsandboxed,
                     case_timeout=_case_timeout(budget)) as checker:
            result = fuzz(backend, checker, space, budget=budget, seed=seed, backend_arg=arg)
        if result.failure is not None:
            write_repro(result, _repro_dir(output, arg))
        results.append(result)
        if fmt == "table":
            click.echo(_describe(result))
    report = {"seed": seed, "budget_seconds": budget, "backends": [r.to_json() for r in results]}
    if output is not None:
        _write_report(output, report, printed=fmt == "json")
    if fmt == "json":
        click.echo(json.dumps(report, indent=1))
    sys.exit(1 if any(r.failure for r in results) else 0)


def _case_timeout(budget: float) -> float:
    """Seconds one check may take: half the budget, at most the checker's default (a hang found with --budget 12
    ends within the budget, not after the default 60 s), at least 1."""
    from kbench.fuzz.checker import CASE_TIMEOUT

    return max(1.0, min(CASE_TIMEOUT, budget / 2))


def _write_report(output: Path, report: dict, *, printed: bool) -> None:
    """Write the report to ``output``; when that fails (disk full, the path changed since the check), the search's
    results are kept: printed on stdout, then an exit 2 naming the path."""
    from kbench.errors import OutputError
    from kbench.outputs import atomic_write, output_error

    text = json.dumps(report, indent=1)
    try:
        atomic_write(output, lambda fh: fh.write(text + "\n"))
    except (OSError, OutputError) as exc:
        if not printed:
            click.echo(text)
        kept = "the report is printed on stdout instead"
        if isinstance(exc, OSError):
            raise output_error(output, exc, option="-o", kept=kept) from None
        raise OutputError(f"{exc.message}; {kept}", file=exc.file, where="-o", fix=exc.fix) from None


def _resolve(pm, arg: str, op: str | None):
    """(argument, Backend) of one -b; bad input names the argument and the fix."""
    from kbench.errors import BadInput

    reg = pm.registry
    if _is_kernel_file(arg):
        from kbench.kernelfile import KernelFileRef

        backend = KernelFileRef(arg, reg)
        if op is not None and backend.op != op:
            raise BadInput(f"the kernel implements op {backend.op!r}, not {op!r}", file=arg, where="--op",
                           fix=f"drop --op or use --op {backend.op}")
    else:
        ops = [op] if op else sorted({b.op for b in reg.backends.values()})
        found = [b for name in ops for b in reg.select_backends(name, [arg])] if _matches_any(reg, arg, ops) else []
        if len(found) != 1:
            known = sorted(b.name for b in reg.backends.values() if op is None or b.op == op)
            what = "matches no backend" if not found else f"matches {len(found)} backends ({', '.join(b.name for b in found)})"
            raise BadInput(f"-b {arg!r} {what}" + (f" of op {op!r}" if op else ""), where="-b",
                           fix=f"give one backend name or a kernel file path; known: {', '.join(known)}")
        backend = found[0]
    why = backend.available()
    if why:
        raise BadInput(f"{backend.name} is not available here: {why}", where="-b",
                       fix="fuzz a backend of this machine's devices (`kbench list` says which)")
    return arg, backend


def _matches_any(reg, arg: str, ops: list[str]) -> bool:
    from fnmatch import fnmatch

    from kbench.selection import BackendPattern

    name = BackendPattern.parse(arg).pattern
    return any(fnmatch(b.name, name) for b in reg.backends.values() if b.op in ops)


def _space(pm, backend, dtypes, head_dims):
    """The space drawn for ``backend``: its op, the dtypes its op takes (of those asked), its declared features."""
    from kbench.errors import BadInput
    from kbench.fuzz.space import DEFAULT_DTYPES, HEAD_DIMS, Space

    op = pm.registry.op(backend.op)
    allowed = next((p.choices for p in op.parameters if p.name == "dtype"), ())
    if backend.op == "decode_attention":
        allowed = tuple(d for d in allowed if d != DType.FP8_E4M3.value)
    wanted = tuple(dtypes) or DEFAULT_DTYPES
    chosen = tuple(d for d in wanted if d in allowed)
    if not chosen:
        raise BadInput(f"op {backend.op!r} takes none of the dtypes {', '.join(wanted)}", where="--dtype",
                       fix=f"use one of: {', '.join(allowed)}")
    return Space(backend.op, chosen, _features(backend), tuple(sorted(set(head_dims))) or HEAD_DIMS)


def _values(values) -> tuple[str, ...] | None:
    """The value ranges asked for (None: the default draw); an unknown one is bad input naming the option."""
    if not values:
        return None
    from kbench.errors import BadInput
    from kbench.ops.inputs import value_range

    out = []
    for name in values:
        try:
            out.append(value_range(name).name)
        except ValueError as exc:
            raise BadInput(str(exc), where="--values", fix="name one of the value ranges of docs/fuzz.md") from None
    return tuple(dict.fromkeys(out))


def _features(backend) -> frozenset[str]:
    """What the backend implements beyond a forward: a registry backend's ``features``; a kernel file's
    ``FEATURES`` literal (read from its text, never run)."""
    source = getattr(backend, "source_text", None)
    if source is None:
        return frozenset(getattr(backend, "features", ()) or ())
    from kbench.source import literal_globals

    try:
        value = literal_globals(source, ("FEATURES",)).get("FEATURES") or ()
    except Exception:  # noqa: BLE001 - a FEATURES that is not a literal: the worker will refuse the file
        return frozenset()
    return frozenset(str(f) for f in value) if isinstance(value, (list, tuple, set, frozenset)) else frozenset()


def _repro_dir(output: Path | None, arg: str) -> Path:
    if output is not None:
        return output.parent
    if _is_kernel_file(arg):
        return Path(arg).parent
    return Path.cwd()


def _describe(result) -> str:
    """The table format's lines for one backend."""
    head = f"{result.backend}: "
    counts = (f"{result.checked} cases checked in {result.elapsed:.1f} s"
              + (f", {result.skipped} skipped (not taken by the backend)" if result.skipped else ""))
    if result.failure is None:
        return head + f"no failure; {counts} (seed {result.seed})"
    f = result.failure
    err = f" (relative L2 {f.rel_l2:.3g}, bound {f.bound:.3g})" if f.rel_l2 is not None and f.bound else ""
    lines = [head + f"FAILED; {counts} (seed {result.seed})",
             f"  minimal case: {f.case_id}",
             f"  error:        {f.status}: {f.reason[:500]}{err}",
             f"  first found:  {_case_text(f.found)} after {f.found_after:.1f} s; {f.failing_checks} failing "
             f"checks while shrinking",
             f"  suite:        {result.suite_path}",
             f"  repro:        {result.repro}"]
    return "\n".join(lines)


def _case_text(params) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items())
