"""The CPU device: NumPy arrays and ``time.perf_counter_ns``."""
from __future__ import annotations

import os
import platform
import re
import time
from typing import Any, Callable

import numpy as np

from kbench.devices import Device
from kbench.enums import DType


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def blas_threads() -> dict[str, Any]:
    """Thread counts the BLAS and OpenMP runtimes use, which decide CPU timings."""
    keys = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_CORETYPE", "KBENCH_TORCH_THREADS")
    return {k: os.environ[k] for k in keys if k in os.environ}


class CPUDevice(Device):
    name = "cpu"
    description = "host memory, NumPy arrays, perf_counter_ns"

    def from_host(self, array: np.ndarray) -> np.ndarray:
        return np.array(array, copy=True)

    def write(self, array: np.ndarray, host: np.ndarray) -> None:
        np.copyto(array, host)

    def to_host(self, array: Any) -> np.ndarray:
        return np.asarray(array)

    def poisoned(self, shape: tuple[int, ...], dtype: DType) -> np.ndarray:
        return np.full(shape, np.nan, dtype=dtype.numpy)

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        return np.empty(shape, dtype=dtype)

    def generate(self, array: np.ndarray, spec, key: tuple[int, int], stream: int) -> None:
        from kbench.ops.inputs import generate

        generate(spec, key, stream, out=array)  # in place: the array's address never changes

    def copy(self, array: np.ndarray) -> np.ndarray:
        return np.array(array, copy=True)

    def copy_into(self, target: np.ndarray, array: np.ndarray) -> None:
        np.copyto(target, array)

    def same_content(self, a: np.ndarray, b: np.ndarray) -> bool:
        return a.shape == b.shape and a.dtype == b.dtype and \
            np.array_equal(np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8))

    def time_call(self, fn: Callable[[], Any]) -> float:
        start = time.perf_counter_ns()
        fn()
        return (time.perf_counter_ns() - start) * 1e-9

    def describe(self) -> dict[str, Any]:
        return {"device": self.name, "cpu": cpu_model(), "cores": cpu_count(),
                "platform": platform.platform(), "threads": blas_threads()}

    def machine_id(self) -> str:
        slug = re.sub(r"[^a-z0-9]+", "-", cpu_model().lower()).strip("-")
        slug = re.sub(r"-?(processor|cpu|with-radeon-graphics)-?", "-", slug).strip("-")
        return f"cpu-{slug[:40]}-{cpu_count()}c"

    def is_same_memory(self, a: Any, b: Any) -> bool:
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and np.shares_memory(a, b)
