"""``kbench triton-aot``: compile kbench's Triton attention kernels for CUDA targets without a GPU."""
from __future__ import annotations

import json
from concurrent.futures import ProcessPoolExecutor

import click

from kbench.api import render_table as render


def _compile_job(job):
    from kbench_triton import aot

    target, config, emit_ptx = job
    return aot.compile_one(target, config, emit_ptx)


def _split_ints(ctx, param, value):
    try:
        return tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise click.BadParameter(f"{value!r}: give comma-separated integers, like 64,128") from None


@click.command("triton-aot")
@click.option("--arch", default="90", show_default=True, callback=_split_ints,
              help="Compute capabilities, comma-separated (80, 90, 100).")
@click.option("--head-dim", "head_dims", default="64,128,256", show_default=True, callback=_split_ints)
@click.option("--dtype", "dtypes", default="bf16", show_default=True, help="Comma-separated: bf16,fp16,fp32.")
@click.option("--mask", type=click.Choice(["both", "causal", "full"]), default="both", show_default=True)
@click.option("--configs", "which", type=click.Choice(["tuned", "shipped", "every"]), default="shipped",
              show_default=True,
              help="tuned: the per-shape CONFIGS entry; shipped: also the autotune candidates and the kernel "
                   "file's defaults; every: every combination of the seed's TUNABLES choices.")
@click.option("--kernel", "kernels", type=click.Choice(["all", "triton", "triton-hopper", "triton-bwd"]),
              default="all", show_default=True,
              help="Which kernel: the FlashAttention-2 forward (triton), the Hopper forward (triton-hopper, sm_90+, "
                   "16-bit types), the triton backend's backward (triton-bwd: its dK/dV and dQ kernels), or all.")
@click.option("--emit-ptx", type=click.Path(file_okay=False), default=None,
              help="Write the PTX of every compiled configuration into this directory.")
@click.option("-j", "--jobs", default=1, show_default=True, help="Compile in this many processes.")
@click.option("--format", "fmt", type=click.Choice(["table", "markdown", "json"]), default="table",
              show_default=True)
def triton_aot(arch, head_dims, dtypes, mask, which, kernels, emit_ptx, jobs, fmt):
    """Compile kbench's Triton attention kernels for CUDA targets (no GPU needed).

    Prints registers, spills, stack and shared memory per configuration, and whether its PTX uses TMA
    (cp.async.bulk.tensor), wgmma and setmaxnreg, and whether the key loop was warp-specialised. Exit 1
    when a configuration fails to compile, or when one the backends launch needs more shared memory
    than the target has.
    """
    from kbench_triton import aot

    unknown = sorted(set(arch) - set(aot.supported_archs()))
    if unknown:
        raise click.BadParameter(f"this Triton cannot target sm_{unknown[0]}; it supports "
                                 f"{', '.join(f'sm_{a}' for a in aot.supported_archs())}", param_hint="--arch")
    dtype_list = [d.strip() for d in dtypes.split(",") if d.strip()]
    bad = [d for d in dtype_list if d not in aot.DTYPES]
    if bad:
        raise click.BadParameter(f"{bad[0]!r}: use {', '.join(aot.DTYPES)}", param_hint="--dtype")
    causals = {"both": (False, True), "causal": (True,), "full": (False,)}[mask]
    kernel_names = {"all": list(aot.KERNELS), "triton-bwd": list(aot.BACKWARD)}.get(kernels, [kernels])
    jobs_list = [(target, config, emit_ptx) for target, config in
                 aot.plan(arch, head_dims, dtype_list, causals, configs=which, kernels=kernel_names)]
    if not jobs_list:
        raise click.BadParameter(f"nothing to compile: {kernels} does not target sm_{arch} with {dtypes}",
                                 param_hint="--kernel")
    if jobs > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            reports = list(pool.map(_compile_job, jobs_list))
    else:
        reports = [aot.compile_one(*job) for job in jobs_list]
    if fmt == "json":
        click.echo(json.dumps([r.as_dict() for r in reports], indent=1))
    else:
        click.echo(render(*aot.table_rows(reports), fmt))
        too_big = sum(r.status == "too-much-smem" for r in reports)
        click.echo(f"\n{len(reports)} configurations: {sum(r.status == 'ok' for r in reports)} ok, "
                   f"{sum(r.status == 'error' for r in reports)} compile errors, {too_big} over the shared-memory "
                   f"limit; {sum(r.seconds for r in reports):.0f} s of compilation")
        if emit_ptx:
            click.echo(f"PTX of every compiled configuration in {emit_ptx}/")
    if aot.failures(reports, every_config=which == "every"):
        raise SystemExit(1)
