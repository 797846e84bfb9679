"""Entry point of the kbench-cuda plugin (group `kbench`). Imports nothing heavy at import time.

Provides the ``cuda`` device, the ``cupy`` backend, the ``cupy`` kernel-file substrate, GPU
detection (device name -> hardware profile), the attention op's float64 reference of large cases on
the GPU, and CuPy/CUDA versions for the result files.
"""
from __future__ import annotations

import kbench
from kbench.api import Substrate
from kbench_cuda import runtime
from kbench_cuda.cupy_backend import CupyAttention
from kbench_cuda.device import CudaDevice


class CupySubstrate(Substrate):
    """Kernel files with ``SUBSTRATE = "cupy"`` receive CuPy arrays (bf16 as uint16 bit patterns)."""

    name = "cupy"
    device = "cuda"

    def available(self) -> str | None:
        return runtime.unavailable_reason()

    def adapt(self, fn, case, kwargs):
        return runtime.oom_as_memory_error(super().adapt(fn, case, kwargs))


@kbench.hookimpl
def kbench_register_devices(registry):
    registry.add_device(CudaDevice())


@kbench.hookimpl
def kbench_register_backends(registry):
    registry.add_backend(CupyAttention())


@kbench.hookimpl
def kbench_register_kernel_substrates(registry):
    registry.add_substrate(CupySubstrate())


def gpu_profile(device, registry):
    """The registered profile matching the GPU's name, else one built from its properties (no peaks)."""
    from kbench.api import HardwareProfile

    props = device.properties()
    name = props["name"]
    try:
        from kbench.api import match_profile
    except ImportError:  # an older core: match the profiles' `match` substrings here
        match_profile = _match_profile
    found = match_profile(registry, name)
    if found is not None:
        return found
    return HardwareProfile(
        name=f"cuda:{runtime.slug(name)}", title=name, kind="gpu", peak_flops={}, bandwidth=None,
        capacity=float(props.get("totalGlobalMem") or 0) or None, l2_bytes=float(props.get("l2CacheSize") or 0) or None,
        source="CUDA device properties; no datasheet profile matches this GPU's name (add one, or `kbench calibrate`)")


def _match_profile(registry, device_name):
    name = device_name.lower()
    hits = [(len(m), p) for p in registry.hardware.values() for m in getattr(p, "match", ()) if m and m.lower() in name]
    return max(hits, key=lambda h: h[0])[1] if hits else None


@kbench.hookimpl
def kbench_detect_hardware(device, registry):
    if device.name != "cuda" or device.available():
        return None
    return gpu_profile(device, registry)


@kbench.hookimpl
def kbench_float64_reference(op, case, inputs, rows):
    if op != "attention":
        return None
    from kbench_cuda.reference import gpu_reference

    return gpu_reference(case, inputs, rows)


@kbench.hookimpl
def kbench_environment():
    return runtime.versions()
