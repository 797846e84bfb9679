"""NVML telemetry: clocks, temperature, power, energy and clock-event (throttle) reasons of one GPU.

``pynvml`` (package nvidia-ml-py) is imported on first use. A missing library or driver makes
:class:`Telemetry` report ``{"nvml": "unavailable: <reason>"}`` instead of raising.
"""
from __future__ import annotations

from typing import Any

# Clock-event reason bits (nvml.h, nvmlClocksEventReason*). Named here so that a pynvml without
# the newer names still decodes them; the values are part of NVML's stable ABI.
REASON_BITS: dict[str, int] = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}

#: reasons that lower the clocks below what the workload asked for: a sample taken under one is flagged.
#: gpu_idle, applications_clocks_setting, sync_boost and display_clock_setting are not throttling.
THROTTLING = ("sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
THROTTLE_MASK = sum(REASON_BITS[n] for n in THROTTLING)


def decode_reasons(mask: int) -> list[str]:
    """Names of the clock-event reason bits set in ``mask`` (unknown bits as hex)."""
    names = [name for name, bit in REASON_BITS.items() if mask & bit]
    unknown = mask & ~sum(REASON_BITS.values())
    if unknown:
        names.append(hex(unknown))
    return names


class Telemetry:
    """NVML readings of the GPU at ``pci_bus_id`` (or NVML index ``index`` when the bus id is unknown)."""

    def __init__(self, pci_bus_id: str | None, index: int = 0) -> None:
        self.pci_bus_id = pci_bus_id
        self.index = index
        self._handle = None
        self._nvml = None
        self.reason: str | None = None
        self._started = False

    def _start(self) -> None:
        if self._started:
            return
        self._started = True
        try:
            import pynvml

            pynvml.nvmlInit()
            if self.pci_bus_id:
                self._handle = pynvml.nvmlDeviceGetHandleByPciBusId(self.pci_bus_id)
            else:
                self._handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
            self._nvml = pynvml
        except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, driver not loaded, ...
            self.reason = f"{type(exc).__name__}: {exc}"

    @property
    def available(self) -> bool:
        self._start()
        return self._nvml is not None

    def _reasons_mask(self) -> int:
        nv = self._nvml
        getter = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            nv.nvmlDeviceGetCurrentClocksThrottleReasons
        return int(getter(self._handle))

    def quick(self) -> tuple[int, int] | None:
        """(SM clock in MHz, clock-event reason mask): cheap enough to read before every sample."""
        if not self.available:
            return None
        try:
            sm = int(self._nvml.nvmlDeviceGetClockInfo(self._handle, self._nvml.NVML_CLOCK_SM))
            return sm, self._reasons_mask()
        except Exception:  # noqa: BLE001 - a failed read is a missing reading, not a failed run
            return None

    def energy_mj(self) -> int | None:
        """NVML's total energy counter (millijoules since the driver loaded; Volta and newer), or None."""
        if not self.available:
            return None
        try:
            return int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))
        except Exception:  # noqa: BLE001 - NVMLError_NotSupported on boards without the counter
            return None

    def power_w(self) -> float | None:
        """The board's power draw now (NVML's averaged reading), in watts, or None."""
        if not self.available:
            return None
        try:
            return self._nvml.nvmlDeviceGetPowerUsage(self._handle) / 1000.0
        except Exception:  # noqa: BLE001
            return None

    def read(self) -> dict[str, Any]:
        """Clocks, temperature, power and clock-event reasons now."""
        if not self.available:
            return {"nvml": f"unavailable: {self.reason}"}
        nv, h = self._nvml, self._handle
        out: dict[str, Any] = {}
        readers = {
            "sm_clock_mhz": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
            "mem_clock_mhz": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
            "sm_clock_max_mhz": lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM),
            "temperature_c": lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
            "power_w": lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "power_limit_w": lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0,
        }
        for key, fn in readers.items():
            try:
                out[key] = fn()
            except Exception:  # noqa: BLE001 - some readings are not supported on every board
                out[key] = None
        try:
            mask = self._reasons_mask()
            out["clock_event_reasons"] = decode_reasons(mask)
            out["throttled"] = bool(mask & THROTTLE_MASK)
        except Exception:  # noqa: BLE001
            out["clock_event_reasons"] = None
        return out

    def describe(self) -> dict[str, Any]:
        if not self.available:
            return {"nvml": f"unavailable: {self.reason}"}
        try:
            return {"driver": _text(self._nvml.nvmlSystemGetDriverVersion()),
                    "nvml_name": _text(self._nvml.nvmlDeviceGetName(self._handle))}
        except Exception as exc:  # noqa: BLE001
            return {"nvml": f"error: {exc}"}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class SampleLog:
    """Per-case record of the NVML reading taken before each timed sample.

    The device appends one entry per sample (outside the timed region); ``summary()`` gives the
    clock range and the indices of samples taken while a throttling reason was active, and starts
    a new case.
    """

    def __init__(self) -> None:
        self.entries: list[tuple[int, int] | None] = []
        self.before: dict[str, Any] | None = None

    def add(self, reading: tuple[int, int] | None) -> None:
        self.entries.append(reading)

    def summary(self) -> dict[str, Any]:
        seen = [e for e in self.entries if e is not None]
        out: dict[str, Any] = {"samples_read": len(seen)}
        if seen:
            clocks = [c for c, _ in seen]
            out["sm_clock_mhz_min"] = min(clocks)
            out["sm_clock_mhz_max"] = max(clocks)
            flagged = [i for i, e in enumerate(self.entries) if e is not None and e[1] & THROTTLE_MASK]
            out["throttled_samples"] = flagged
            union = 0
            for _, mask in seen:
                union |= mask
            out["clock_event_reasons_seen"] = decode_reasons(union)
        self.entries = []
        self.before = None
        return out


def energy_summary(start_mj: int | None, start_s: float, end_mj: int | None, end_s: float, kernel_s: float,
                   calls: int, power_w: list[float] | None = None) -> dict[str, Any]:
    """Energy of the timed samples of one case, from NVML's energy counter read before the first and after
    the last sample (``*_mj``, ``*_s`` from ``time.perf_counter``), the summed kernel time and the calls.

    ``average_w`` is the window's energy over its length: the window holds the kernels, the L2 flushes
    before them and the host's work between samples, so it is the board's power during the measurement,
    not during the kernel alone. ``joules_per_call`` charges each call that power for the kernel's own time
    (``average_w x kernel_s / calls``). Without the counter (or with a window shorter than the counter's
    update period, when it did not move) the power readings taken before each sample stand in:
    ``source`` says which.
    """
    window = end_s - start_s
    out: dict[str, Any] = {"calls": calls, "kernel_s": kernel_s, "window_s": window}
    if calls <= 0 or window <= 0:
        return {**out, "source": "none"}
    average = None
    if start_mj is not None and end_mj is not None and end_mj > start_mj:
        out["energy_j"] = (end_mj - start_mj) / 1000.0
        average, out["source"] = out["energy_j"] / window, "nvml energy counter"
    else:
        readings = [w for w in (power_w or []) if w is not None]
        if readings:
            average, out["source"] = sum(readings) / len(readings), "nvml power readings"
    if average is None:
        return {**out, "source": "none"}
    out["average_w"] = average
    out["joules_per_call"] = average * kernel_s / calls
    out["kernel_fraction"] = kernel_s / window
    return out


def tflops_per_watt(tflops: float | None, energy: dict[str, Any] | None) -> float | None:
    """TFLOP/s per watt of a record: its attained TFLOP/s over the measurement's average power."""
    watts = (energy or {}).get("average_w")
    if not tflops or not watts:
        return None
    return tflops / watts
