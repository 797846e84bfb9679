"""Verification of outputs in the parent: NaN/Inf, relative L2 on rows picked after the output exists,
trivial predictors. Every verdict on an answer's correctness is made here."""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Iterator, Mapping

import numpy as np
from threadpoolctl import ThreadpoolController  # a declared dependency: a run without it stops at once

from kbench.ops import REFERENCE_OFFLOAD

#: an output must be this many times closer to the reference than every trivial predictor
TRIVIAL_MARGIN = 10.0


class CheckFailed(Exception):
    """A wrong answer or a tripped integrity check: the record's status becomes ``failed``.

    ``args[1]``, when given, is the correctness detail the record keeps (errors, bounds, rows checked).
    """


def relative_l2(got: np.ndarray, ref: np.ndarray) -> float:
    """||got - ref|| / ||ref||; for a zero reference the absolute norm of ``got`` (so zeros pass only zeros)."""
    diff = float(np.linalg.norm((got - ref).ravel()))
    norm = float(np.linalg.norm(ref.ravel()))
    return diff / norm if norm > 0 else diff


def tolerance(ctx, case, name: str = "out") -> float:
    """The bound of output ``name``: the op's, or the suite's ``check.tolerance`` for the dtype.

    A suite's bound replaces the forward output's; every other output's (a gradient's) is scaled by the
    same factor, so one number tightens or loosens them all together.
    """
    op = ctx.op
    own = float(op.output_tolerance(case, name))
    override = ctx.check.tolerance.get(str(case.dtype))
    if override is None:
        return own
    if name == "out":
        return float(override)
    return own * float(override) / float(op.output_tolerance(case, "out"))


def trivial_errors(ref: np.ndarray, uniform: np.ndarray | None = None) -> dict[str, float]:
    """Errors of answers that need no attention at all: zeros, a constant, uniform weights over visible keys."""
    errors = {"zeros": relative_l2(np.zeros_like(ref), ref),
              "a constant (the reference's mean)": relative_l2(np.full_like(ref, ref.mean()), ref)}
    if uniform is not None:
        # q = 0 makes every score equal: the reference is then the mean of the visible values per row
        errors["the mean of the visible values"] = relative_l2(uniform, ref)
    return errors


def finite_or_fail(outputs: Mapping[str, np.ndarray], what: str) -> None:
    """NaN/Inf over every element of every output; the message names the output when there are several."""
    for name, output in outputs.items():
        wide = output.astype(np.float32) if output.dtype.itemsize < 4 else output
        bad = int(np.count_nonzero(~np.isfinite(wide)))
        if bad:
            which = "output" if len(outputs) == 1 else f"{name!r} output"
            raise CheckFailed(f"{bad} of {output.size} {which} elements are NaN/Inf (never written, or overflow) "
                              f"on {what}")


#: numpy's BLAS, as threadpoolctl controls it (found on first use: it is loaded with numpy)
_blas: list[Any] | None = None


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """The parent's BLAS on one thread while a judge of the main thread verifies (threadpoolctl).

    A BLAS's helper threads busy-wait after each call before they sleep (OpenBLAS: 2^28 cycles by default,
    about 0.1 s), so a float64 reference on several threads left the parent spinning on the kernel's cores
    through its next timed batch: on the 2-core development VM the NumPy backends' samples of
    suites/attention.yaml summed 52.4-52.7 s with the reference on two threads and 41.6-45.9 s on one
    (docs/integrity.md, "The parent stays off the kernel's cores"). Only the main thread changes it: the local
    executor judges there, and OpenBLAS ignores a change asked from another thread (0.3.31); judges in an
    executor's slot threads (several devices, Ray) leave the BLAS as it is.
    """
    global _blas
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if _blas is None:
        _blas = ThreadpoolController().select(user_api="blas").lib_controllers
    saved = [(lib, lib.num_threads) for lib in _blas]
    for lib, _ in saved:
        lib.set_num_threads(1)
    try:
        yield
    finally:
        for lib, threads in saved:
            lib.set_num_threads(threads)


def verify(ctx, case, inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray], what: str,
           rng: np.random.Generator, *, max_rows: int | None = None,
           uniform: bool = True) -> tuple[float, int | None, dict[str, dict[str, float]]]:
    """Judge every output (copies taken from the arena), each against its own bound.

    ``inputs`` are the case's inputs as the judge regenerates them (kbench.ops.inputs.RegeneratedInputs).
    Raises CheckFailed naming the output that fails; returns (the worst error relative to its bound's
    scale, rows checked, {name: {"rel_l2", "bound"}}). The reference is computed on one BLAS thread
    (``one_blas_thread``) and offered to plugins only where the device says so (``offloads_reference``).
    """
    offload = REFERENCE_OFFLOAD.set(bool(getattr(ctx.device, "offloads_reference", False)))
    try:
        with one_blas_thread():
            return _verify(ctx, case, inputs, outputs, what, rng, max_rows, uniform)
    finally:
        REFERENCE_OFFLOAD.reset(offload)


def _verify(ctx, case, inputs, outputs, what, rng, max_rows, uniform):
    op = ctx.op
    finite_or_fail(outputs, what)
    rows = op.sample_rows(case, max_rows or ctx.check.max_rows, rng)  # picked now: the outputs already exist
    refs = op.reference_outputs(case, inputs, rows)
    uniforms = op.uniform_outputs(case, inputs, rows) if uniform else {}
    rows_checked = op.rows_checked(rows)
    several = len(outputs) > 1
    report: dict[str, dict[str, float]] = {}
    for name, output in outputs.items():
        ref = refs[name]
        if ref.size == 0:  # the op's sample leaves this output out of this check (docs/backward.md)
            continue
        got = op.select_output(case, name, output, rows).astype(np.float64)
        err = relative_l2(got, ref)
        bound = tolerance(ctx, case, name)
        report[name] = {"rel_l2": err, "bound": bound}
        prefix = f"{name}: " if several else ""
        detail: dict[str, Any] = {"rel_l2": err, "bound": bound, "rows_checked": rows_checked}
        if several:
            detail["output"] = name
        if not err <= bound:
            raise CheckFailed(f"{prefix}relative L2 error {err:.3g} exceeds the {case.dtype} bound {bound:g} on "
                              f"{what}", detail)
        if float(np.ptp(ref)) > 0 and got.size and float(np.ptp(got)) == 0.0:
            raise CheckFailed(f"{prefix}output is constant ({float(got.ravel()[0]):g} everywhere) while the "
                              f"reference varies, on {what}")
        trivial = trivial_errors(ref, uniforms.get(name))
        best_name, best = min(trivial.items(), key=lambda kv: kv[1])
        if best > 0 and err * TRIVIAL_MARGIN > best:
            raise CheckFailed(f"{prefix}output is not much closer to the reference than {best_name} (relative L2 "
                              f"{err:.3g} vs {best:.3g}; an answer must be {TRIVIAL_MARGIN:g}x closer than every "
                              f"trivial predictor, whatever the tolerance) on {what}", {**detail, "trivial": trivial})
    worst = max(report, key=lambda n: report[n]["rel_l2"] / report[n]["bound"] if report[n]["bound"] else 0.0)
    return report[worst]["rel_l2"], rows_checked, report
