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


#: the smallest error that always passes, as an RMS per element in absolute terms, by output dtype: where the
#: reference is (near) zero (a query row that sees one key makes dQ and dK exactly 0; a head_dim-1 decode output
#: can cancel) an honest kernel's output is the rounding noise of its O(1) intermediates (the inputs have
#: variance 1), and ||ref|| is no scale to measure it by. fp32: 8 ulps of 1.0 (the CPU backends' noise there is
#: at most 3e-7, measured); fp16/bf16/fp8 (bf16 output): an eighth of an ulp of 1.0 in the output's dtype, about
#: what a kernel that keeps its intermediates in that dtype leaves. docs/integrity.md ("The error measure").
ABS_FLOOR = {"fp32": 1e-6, "fp16": 2.0 ** -10 / 8, "bf16": 2.0 ** -7 / 8, "fp8_e4m3": 2.0 ** -7 / 8}


def relative_l2(got: np.ndarray, ref: np.ndarray, floor: float = 0.0) -> float:
    """||got - ref|| / max(||ref||, floor); for a zero reference and no floor the absolute norm of ``got`` (so
    zeros pass only zeros). ``floor`` is a norm (:func:`error_floor`), so a reference near zero is not a scale."""
    diff = float(np.linalg.norm((got - ref).ravel()))
    norm = max(float(np.linalg.norm(ref.ravel())), floor)
    return diff / norm if norm > 0 else diff


def error_floor(dtype: str, size: int, bound: float, accumulation: int = 1) -> float:
    """The denominator floor of :func:`relative_l2` for ``size`` elements of output dtype ``dtype`` judged against
    ``bound``: an error of ``ABS_FLOOR[dtype] * sqrt(accumulation)`` RMS per element scores exactly ``bound``. So an
    output passes when ``||got - ref|| <= max(bound * ||ref||, sqrt(size * accumulation) * ABS_FLOOR[dtype])``.
    ``accumulation``: the terms of rounding noise one element sums (``Op.output_accumulation``; a gradient summed
    over 1,000 query rows carries ~sqrt(1000) times one term's noise where its reference is zero)."""
    if bound <= 0 or size <= 0:
        return 0.0
    return float(np.sqrt(size * max(1, accumulation))) * ABS_FLOOR.get(dtype, ABS_FLOOR["fp32"]) / bound


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


def trivial_errors(ref: np.ndarray, uniform: np.ndarray | None = None, floor: float = 0.0) -> dict[str, float]:
    """Errors of answers that need no attention at all: zeros, a constant, uniform weights over visible keys."""
    errors = {"zeros": relative_l2(np.zeros_like(ref), ref, floor),
              "a constant (the reference's mean)": relative_l2(np.full_like(ref, ref.mean()), ref, floor)}
    if uniform is not None:
        # q = 0 makes every score equal: the reference is then the mean of the visible values per row
        errors["the mean of the visible values"] = relative_l2(uniform, ref, floor)
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
           rng: np.random.Generator, *, max_rows: int | None = None, uniform: bool = True,
           rows: Any = "pick") -> tuple[float, int | None, dict[str, dict[str, float]]]:
    """Judge every output (copies taken from the arena), each against its own bound.

    ``inputs`` are the case's inputs as the judge regenerates them (kbench.ops.inputs.RegeneratedInputs).
    Raises CheckFailed naming the output that fails (its ``rows`` attribute: the rows it was judged on);
    returns (the worst error relative to its bound's scale, rows checked, {name: {"rel_l2", "bound"}}).
    ``rows``: judge these rows (None: all) instead of picking new ones (a re-check of the same rows). The reference is
    computed on one BLAS thread (``one_blas_thread``) and offered to plugins only where the device says so
    (``offloads_reference``).
    """
    offload = REFERENCE_OFFLOAD.set(bool(getattr(ctx.device, "offloads_reference", False)))
    try:
        with one_blas_thread():
            return _verify(ctx, case, inputs, outputs, what, rng, max_rows, uniform, rows)
    finally:
        REFERENCE_OFFLOAD.reset(offload)


def _verify(ctx, case, inputs, outputs, what, rng, max_rows, uniform, rows="pick"):
    op = ctx.op
    finite_or_fail(outputs, what)
    if isinstance(rows, str):
        rows = op.sample_rows(case, max_rows or ctx.check.max_rows, rng)  # picked now: the outputs already exist
    try:
        return _judge_rows(ctx, case, inputs, outputs, what, rows, uniform)
    except CheckFailed as exc:
        exc.rows = rows
        raise


def _judge_rows(ctx, case, inputs, outputs, what, rows, uniform):
    op = ctx.op
    refs = op.reference_outputs(case, inputs, rows)
    uniforms = op.uniform_outputs(case, inputs, rows) if uniform else {}
    rows_checked = op.rows_checked(rows)
    dtype = str(op.output_dtype(case))
    several = len(outputs) > 1
    report: dict[str, dict[str, float]] = {}
    for name, output in outputs.items():
        ref = refs[name]
        if ref.size == 0:  # the op's sample leaves this output out of this check (docs/backward.md)
            continue
        got = op.select_output(case, name, output, rows).astype(np.float64)
        bound = tolerance(ctx, case, name)
        terms = int(op.output_accumulation(case, name))
        err = relative_l2(got, ref, error_floor(dtype, ref.size, bound, terms))
        report[name] = {"rel_l2": err, "bound": bound}
        prefix = f"{name}: " if several else ""
        detail: dict[str, Any] = {"rel_l2": err, "bound": bound, "rows_checked": rows_checked}
        if several:
            detail["output"] = name
        if not err <= bound:
            raise CheckFailed(f"{prefix}relative L2 error {err:.3g} exceeds the {case.dtype} bound {bound:g} on "
                              f"{what}", detail)
        # the trivial predictors are judged by the op's own bound (a suite may loosen the tolerance, never this):
        # one that is itself within it is a right answer for these inputs (window [0, 0]: every row sees one
        # key, its output is the mean of the values it sees; a reference near zero: zeros), so it proves nothing
        own = float(op.output_tolerance(case, name))
        own_floor = error_floor(dtype, ref.size, own, terms)
        err_own = relative_l2(got, ref, own_floor)
        if got.size and float(np.ptp(got)) == 0.0 and err_own > own:
            raise CheckFailed(f"{prefix}output is constant ({float(got.ravel()[0]):g} everywhere) while the "
                              f"reference varies, on {what}")
        trivial = {k: v for k, v in trivial_errors(ref, uniforms.get(name), own_floor).items() if v > own}
        if not trivial:
            continue
        best_name, best = min(trivial.items(), key=lambda kv: kv[1])
        if err_own * TRIVIAL_MARGIN > best:
            raise CheckFailed(f"{prefix}output is not much closer to the reference than {best_name} (relative L2 "
                              f"{err_own:.3g} vs {best:.3g}; an answer must be {TRIVIAL_MARGIN:g}x closer than every "
                              f"trivial predictor, whatever the tolerance) on {what}", {**detail, "trivial": trivial})
    worst = max(report, key=lambda n: report[n]["rel_l2"] / report[n]["bound"] if report[n]["bound"] else 0.0)
    return report[worst]["rel_l2"], rows_checked, report
