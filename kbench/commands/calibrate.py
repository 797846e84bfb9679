"""``kbench calibrate``: measure attainable matmul FLOP/s per dtype and copy bandwidth on this device."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import click

from kbench.options import Finite

from kbench.tables import render


@click.command("calibrate")
@click.option("--device", default="auto", show_default=True, help="cpu, cuda, or auto (accelerator if usable).")
@click.option("--size", "matmul_size", type=click.IntRange(min=16, max=2**20), help="n of the n x n x n GEMM (cpu 2048, gpu 8192).")
@click.option("--copy-mb", type=Finite(min=1, max=2**20), help="Size of the copied buffer in MiB (cpu 256, gpu 2048).")
@click.option("--dtype", "dtypes", multiple=True, metavar="DTYPE", help="Only these matmul dtypes (repeatable).")
@click.option("--max-time", type=Finite(min=0.05, max=86400), help="Seconds of sampling per measurement (default 3).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Calibration file (default results/<machine>/calibration.json, where later runs look).")
@click.pass_obj
def calibrate_command(pm, device, matmul_size, copy_mb, dtypes, max_time, output):
    """Measure this device's matmul rates and memory bandwidth and store them as its measured roof.

    From then on `kbench run` on this machine reports, per record, the fraction of the measured roof
    next to the fraction of the datasheet roof (when a datasheet profile matches the device).
    """
    from kbench.calibrate import calibrate, calibration_path, default_settings, save_calibration
    from kbench.outputs import check_output_file, output_error
    from kbench.run.runner import pick_device

    dev = pm.registry.device(pick_device(pm, device))
    default = calibration_path(dev)
    check_output_file(output or default, option="-o")  # before minutes of measuring
    settings = default_settings(dev)
    if matmul_size:
        settings = replace(settings, matmul_size=matmul_size)
    if copy_mb:
        settings = replace(settings, copy_bytes=int(copy_mb * 2**20))
    if dtypes:
        settings = replace(settings, dtypes=tuple(dtypes))
    if max_time:
        settings = replace(settings, timing=replace(settings.timing, max_time=max_time,
                                                    min_time=min(settings.timing.min_time, max_time)))
    doc = calibrate(dev, settings, on_step=lambda msg: click.echo(f"kbench: measuring {msg}", err=True))
    try:
        path = save_calibration(doc, output or default)
    except OSError as exc:
        raise output_error(output or default, exc, option="-o", kept="the measurement is lost; run again") from None
    datasheet = pm.detect_hardware(dev)  # detection now carries the new measured roofs too
    rows = []
    for m in doc["matmul"]:
        peak = datasheet.peak(m["dtype"]) if datasheet else None
        rows.append([f"matmul {m['dtype']}", f"n={m['n']} {m['storage']}", f"{m['stats']['median'] * 1e3:.3g} ms",
                     f"{100 * m['stats']['rel_spread']:.1f}%", f"{m['flops_per_s'] / 1e12:.4g} TFLOP/s",
                     f"{100 * m['flops_per_s'] / peak:.1f}%" if peak else "", m["note"]])
    c = doc["copy"]
    bw = datasheet.bandwidth if datasheet else None
    rows.append(["copy", f"{c['buffer_bytes'] / 2**20:.0f} MiB", f"{c['stats']['median'] * 1e3:.3g} ms",
                 f"{100 * c['stats']['rel_spread']:.1f}%", f"{c['bytes_per_s'] / 1e9:.4g} GB/s",
                 f"{100 * c['bytes_per_s'] / bw:.1f}%" if bw else "", "bytes read + bytes written"])
    for dtype, why in doc["skipped"].items():
        rows.append([f"matmul {dtype}", "", "", "", "not measured", "", why])
    title = datasheet.title if datasheet else dev.name
    click.echo(f"calibration of {title} ({doc['machine']}):")
    click.echo(render(("measure", "size", "median", "spread", "rate", "of datasheet", "note"), rows, "table"))
    if path == default:
        click.echo(f"\nstored in {path}; later runs on this machine report fractions of this measured roof")
    else:
        click.echo(f"\nstored in {path}; runs read {default}: copy it there to use it as this machine's roof")
