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


class ClockSampler:
    """A thread reading SM clock, clock-event reasons and power every ``interval`` seconds while a sustained
    loop runs (NVML reads cost tens of microseconds: on the host, beside the GPU's work, never inside it)."""

    def __init__(self, telemetry: Telemetry, interval: float = 0.02) -> None:
        import threading

        self.telemetry, self.interval = telemetry, interval
        self.readings: list[tuple[float, int | None, int | None, float | None]] = []   # (t, sm MHz, mask, W)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kbench-nvml-sampler", daemon=True)

    def _run(self) -> None:
        import time

        while not self._stop.is_set():
            quick = self.telemetry.quick()
            sm, mask = quick if quick is not None else (None, None)
            self.readings.append((time.perf_counter(), sm, mask, self.telemetry.power_w()))
            self._stop.wait(self.interval)

    def __enter__(self) -> ClockSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=2)

    def summary(self) -> dict[str, Any]:
        clocks = [sm for _, sm, _, _ in self.readings if sm is not None]
        masks = [m for _, _, m, _ in self.readings if m is not None]
        out: dict[str, Any] = {"clock_readings": len(self.readings)}
        if clocks:
            ordered = sorted(clocks)
            out.update(sm_clock_mhz_min=ordered[0], sm_clock_mhz_median=ordered[len(ordered) // 2],
                       sm_clock_mhz_max=ordered[-1])
        if masks:
            union = 0
            for m in masks:
                union |= m
            out["clock_event_reasons_seen"] = decode_reasons(union)
            out["throttled_fraction"] = sum(bool(m & THROTTLE_MASK) for m in masks) / len(masks)
        return out


def sustained_summary(start_mj: int | None, end_mj: int | None, seconds: float, calls: int,
                      power_readings: list[float], idle_w: float | None, limit_w: float | None) -> dict[str, Any]:
    """Energy of a sustained loop of ``calls`` back-to-back calls lasting ``seconds`` (between two device
    synchronisations), from NVML's energy counter read at both ends.

    ``joules_per_call`` = energy / calls and ``average_w`` = energy / seconds: the loop is all kernel (no
    flush, no new inputs, no host work in between), so these are the kernel's. Without a counter that moved,
    the mean of the power readings taken during the loop stands in (``source`` says which). A power below the
    board's idle power or above its power limit cannot be the kernel's: ``flag`` says so.
    """
    out: dict[str, Any] = {"calls": calls, "seconds": seconds, "idle_w": idle_w, "power_limit_w": limit_w}
    if calls <= 0 or seconds <= 0:
        return {**out, "source": "none"}
    if start_mj is not None and end_mj is not None and end_mj > start_mj:
        energy = (end_mj - start_mj) / 1000.0
        out.update(source="nvml energy counter", energy_j=energy, average_w=energy / seconds)
    elif power_readings:
        out.update(source="nvml power readings", average_w=sum(power_readings) / len(power_readings))
    else:
        return {**out, "source": "none"}
    out["joules_per_call"] = out["average_w"] * seconds / calls
    if idle_w is not None and out["average_w"] < 0.9 * idle_w:
        out["flag"] = f"average power {out['average_w']:.0f} W is below the idle power {idle_w:.0f} W"
    elif limit_w is not None and out["average_w"] > 1.1 * limit_w:
        out["flag"] = f"average power {out['average_w']:.0f} W is above the power limit {limit_w:.0f} W"
    return out


def tflops_per_watt(tflops: float | None, energy: dict[str, Any] | None) -> float | None:
    """TFLOP/s per watt of a record: its attained TFLOP/s over the measurement's average power."""
    watts = (energy or {}).get("average_w")
    if not tflops or not watts:
        return None
    return tflops / watts
