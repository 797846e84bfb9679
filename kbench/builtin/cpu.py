"""Default plugin: the CPU device and the NumPy kernel-file substrate."""
from __future__ import annotations

import kbench
from kbench.devices.cpu import CPUDevice
from kbench.kernelfile import NumpySubstrate


@kbench.hookimpl
def kbench_register_devices(registry):
    registry.add_device(CPUDevice())


@kbench.hookimpl
def kbench_register_kernel_substrates(registry):
    registry.add_substrate(NumpySubstrate())


@kbench.hookimpl
def kbench_environment():
    import platform

    import numpy

    return {"python": platform.python_version(), "numpy": numpy.__version__}
