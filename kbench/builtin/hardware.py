"""Default plugin: the CPU hardware profile, built from this machine's description."""
from __future__ import annotations

import kbench
from kbench.hardware import HardwareProfile


def cpu_profile(device) -> HardwareProfile:
    info = device.describe()
    return HardwareProfile(
        name="cpu", title=f"{info.get('cpu', 'CPU')} ({info.get('cores', '?')} cores)", kind="cpu",
        peak_flops={}, bandwidth=None, capacity=None,
        source="this machine's description; no peak figures until `kbench calibrate` measures them")


@kbench.hookimpl(trylast=True)
def kbench_detect_hardware(device, registry):
    if device.name == "cpu":
        return cpu_profile(device)
    return None
