"""The CPU device's primitives that every check relies on."""
from __future__ import annotations

import numpy as np
import pytest

from kbench.devices.cpu import CPUDevice
from kbench.enums import DType


@pytest.mark.parametrize("dtype", list(DType))
def test_poison_and_repoison_are_nan_in_every_dtype(dtype):
    dev = CPUDevice()
    out = dev.poisoned((3, 4), dtype)
    assert out.dtype == dtype.numpy and np.isnan(out.astype(np.float32)).all()
    out[...] = 1
    dev.repoison(out)
    assert np.isnan(out.astype(np.float32)).all()


def test_fingerprint_is_by_content_and_aliasing_by_memory():
    dev = CPUDevice()
    a = np.arange(12, dtype=np.float32)
    assert dev.fingerprint(a) == dev.fingerprint(a.copy())
    b = a.copy()
    b[3] += 1
    assert dev.fingerprint(a) != dev.fingerprint(b)
    assert dev.is_same_memory(a, a[2:5]) and not dev.is_same_memory(a, a.copy())


def test_time_call_measures_the_call():
    import time

    dev = CPUDevice()
    assert dev.time_call(lambda: time.sleep(0.02)) >= 0.02


def test_without_a_driver_the_cuda_answer_needs_no_cupy_import():
    """`kbench run` on a CPU machine asked CuPy whether CUDA works (0.6 s of import on every run with the default
    --device auto); without libcuda.so.1 no CUDA call can work, and the answer comes without the import."""
    import ctypes
    import subprocess
    import sys

    try:
        ctypes.CDLL("libcuda.so.1")
        pytest.skip("this machine has an NVIDIA driver: the runtime is asked")
    except OSError:
        pass
    code = ("import sys\nfrom kbench.devices.interop import cuda_unavailable_reason as why\n"
            "print(why())\nprint('cupy' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout.splitlines()
    assert out[0].startswith("CUDA runtime: no NVIDIA driver") and "libcuda.so.1" in out[0]
    assert out[1] == "False"
