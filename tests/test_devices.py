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
