"""Where a measured record sits on the roofline of its hardware profile: attained rates, the binding roof
and the fraction of it reached, for the datasheet roofs and the ones ``kbench calibrate`` measured.

The judge adds this to every passed record (``metrics``), so a record says both how far a kernel is from
the vendor's peak and how far from what this machine actually reaches.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kbench.hardware import HardwareProfile


def _roof(peak: float | None, bw: float | None, flops: float, nbytes: float, seconds: float,
          basis: str) -> dict[str, Any] | None:
    """Binding roof and fractions for one set of figures (datasheet or measured)."""
    roofs = {}
    if peak:
        roofs["compute"] = peak
    if bw and nbytes:
        roofs["bandwidth"] = bw * flops / nbytes
    if not roofs:
        return None
    bound = min(roofs, key=roofs.get)
    attained = flops / seconds
    out: dict[str, Any] = {"basis": basis, "bound": bound, "roof_tflops": roofs[bound] / 1e12,
                           "fraction": attained / roofs[bound] if roofs[bound] else None}
    if peak:
        out["compute_fraction"] = attained / peak
        out["peak_tflops"] = peak / 1e12
    if bw:
        out["bandwidth_fraction"] = nbytes / seconds / bw
        out["bandwidth_gbps"] = bw / 1e9
    return out


#: on a device without a datasheet, a rate above this multiple of the calibrated GEMM rate is impossible
CALIBRATED_ROOF_MARGIN = 3.0


def roofline_point(profile: HardwareProfile | None, dtype: str, flops: float, nbytes: float,
                   seconds: float) -> dict[str, Any]:
    """Attained rates, the binding roof and the fraction of it reached, for both sets of roofs.

    Flat keys (``bound``, ``roof_fraction``, ``compute_fraction``, ``bandwidth_fraction``) describe
    the datasheet roof when the profile has one, else the measured roof (``roof_basis`` says
    which); ``datasheet`` and ``measured`` hold each set in full, and ``measured_roof_fraction``
    / ``datasheet_roof_fraction`` are there for tables.

    A fraction above 1 of a datasheet roof is physically impossible: the measurement or the
    kernel is wrong (work skipped, cached, or done outside the timed region) and is flagged. A
    measured roof never flags: it is what one GEMM and one copy reached under the load of the
    calibration run, and cache-resident data legitimately beats the DRAM copy rate, so a fraction
    above 1 of it is information, not an integrity failure.
    """
    out: dict[str, Any] = {
        "flops": flops,
        "bytes": nbytes,
        "intensity": flops / nbytes if nbytes else None,
        "tflops": flops / seconds / 1e12 if seconds > 0 else None,
        "gbps": nbytes / seconds / 1e9 if seconds > 0 else None,
    }
    if profile is None or seconds <= 0:
        return out
    sheet = _roof(profile.peak(dtype), profile.bandwidth, flops, nbytes, seconds, "datasheet")
    meas = _roof(profile.measured_peak(dtype), profile.measured_bandwidth, flops, nbytes, seconds, "measured")
    primary = sheet or meas
    if primary is None:
        return out
    out.update({"hardware": profile.name, "roof_basis": primary["basis"], "bound": primary["bound"],
                "roof_tflops": primary["roof_tflops"], "roof_fraction": primary["fraction"]})
    for key in ("compute_fraction", "bandwidth_fraction"):
        if key in primary:
            out[key] = primary[key]
    impossible = False
    if sheet is not None:
        out["datasheet"] = sheet
        out["datasheet_roof_fraction"] = sheet["fraction"]
        impossible = sheet["fraction"] > 1.0
    if meas is not None:
        out["measured"] = meas
        out["measured_roof_fraction"] = meas["fraction"]
        out["measured_bound"] = meas["bound"]
        if sheet is None and meas.get("compute_fraction") is not None:
            # no datasheet (a CPU): the calibrated GEMM rate is the roof, with a margin for the load the
            # calibration may have run under; its bandwidth roof never flags (caches beat the DRAM copy rate)
            out["impossible_margin"] = CALIBRATED_ROOF_MARGIN
            impossible = meas["compute_fraction"] > CALIBRATED_ROOF_MARGIN
            if impossible:
                out["impossible_reason"] = (f"{out['tflops']:.3g} TFLOP/s is {meas['compute_fraction']:.2f}x the "
                                            f"calibrated compute roof of {profile.name} (more than "
                                            f"{CALIBRATED_ROOF_MARGIN:g}x)")
    if impossible and "impossible_reason" not in out:
        out["impossible_reason"] = (f"{out['tflops']:.3g} TFLOP/s is {out['roof_fraction']:.2f}x the {out['bound']} "
                                    f"roof of {profile.name}")
    out["impossible"] = impossible
    return out
