"""Default plugin: the datasheet profiles (kbench/data/hardware.yaml), the CPU profile built from this
machine's description, and the calibrated roofs attached to whatever detection answers."""
from __future__ import annotations

import os
from pathlib import Path

import kbench
from kbench.hardware import HardwareProfile, builtin_profiles


def _size(text: str) -> int | None:
    """'32768K' -> bytes (sysfs cache sizes)."""
    text = text.strip().upper()
    scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
    try:
        return int(text.rstrip("KMG")) * scale
    except ValueError:
        return None


def last_level_cache(cpu_dir: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int | None:
    """Size of the highest-level data/unified cache of cpu0, from sysfs (Linux); None elsewhere."""
    best: tuple[int, int] | None = None
    for index in sorted(cpu_dir.glob("index*")):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip()
            size = _size((index / "size").read_text())
        except (OSError, ValueError):
            continue
        if kind != "Instruction" and size and (best is None or level > best[0]):
            best = (level, size)
    return None if best is None else best[1]


def memory_total(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def cpu_profile(device) -> HardwareProfile:
    """The CPU as this machine describes itself. No peak rates: vendors publish none per SKU that we could
    trust for a VM slice, so the roofs come from `kbench calibrate`."""
    info = device.describe()
    return HardwareProfile(
        name="cpu", title=f"{info.get('cpu', 'CPU')} ({info.get('cores', '?')} cores)", kind="cpu",
        peak_flops={}, bandwidth=None, capacity=memory_total(), l2_bytes=last_level_cache(),
        source="this machine's description (/proc/cpuinfo, /proc/meminfo, sysfs caches); "
               "no peak figures until `kbench calibrate` measures them",
        notes="l2_bytes holds the last-level cache size", extra={"threads": info.get("threads", {})})


@kbench.hookimpl
def kbench_register_hardware(registry):
    from kbench.devices.cpu import CPUDevice

    for profile in builtin_profiles():
        registry.add_hardware(profile)
    registry.add_hardware(cpu_profile(CPUDevice()))


@kbench.hookimpl(trylast=True)
def kbench_detect_hardware(device, registry):
    if device.name == "cpu":
        return cpu_profile(device)
    return None


@kbench.hookimpl(wrapper=True, specname="kbench_detect_hardware")
def kbench_detect_hardware_calibrated(device, registry):
    """Wraps every plugin's detection: attach this machine's calibration (if stored) to the answer."""
    from kbench.calibrate import with_calibration

    profile = yield
    return with_calibration(profile, device)
