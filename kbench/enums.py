"""Statuses and dtypes: one enum each, in one place."""
from __future__ import annotations

from enum import Enum

import numpy as np


class Status(str, Enum):
    """Outcome of one (case, backend) record."""

    PASSED = "passed"      # correct and timed
    FAILED = "failed"      # ran, but the answer is wrong or an integrity check tripped
    SKIPPED = "skipped"    # unavailable or unsupported, with the reason
    ERROR = "error"        # raised an exception
    CRASHED = "crashed"    # the worker process died (signal, abort)
    TIMEOUT = "timeout"    # exceeded the per-case time limit

    def __str__(self) -> str:  # so f-strings print "passed", not "Status.PASSED"
        return self.value


class DType(str, Enum):
    """Element types of an op's inputs and outputs."""

    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"
    #: FP8 E4M3 (ml_dtypes.float8_e4m3fn: no infinities, max 448) with a per-tensor scale; ops that take
    #: it say how (attention: descale kwargs, bf16 output; docs/backward.md)
    FP8_E4M3 = "fp8_e4m3"

    def __str__(self) -> str:
        return self.value

    @property
    def numpy(self) -> np.dtype:
        """The host (NumPy) dtype; bf16 comes from ml_dtypes."""
        if self in (DType.BF16, DType.FP8_E4M3):
            import ml_dtypes

            return np.dtype(ml_dtypes.bfloat16 if self is DType.BF16 else ml_dtypes.float8_e4m3fn)
        return np.dtype({DType.FP32: np.float32, DType.FP16: np.float16}[self])

    @property
    def itemsize(self) -> int:
        return {DType.FP32: 4, DType.FP16: 2, DType.BF16: 2, DType.FP8_E4M3: 1}[self]

    @property
    def default_tolerance(self) -> float:
        """Bound on the relative L2 error ``||out - ref|| / ||ref||`` against a float64 reference."""
        return {DType.FP32: 1e-5, DType.FP16: 1e-3, DType.BF16: 1e-2, DType.FP8_E4M3: 5e-2}[self]

    @property
    def torch_name(self) -> str:
        return {DType.FP32: "float32", DType.FP16: "float16", DType.BF16: "bfloat16",
                DType.FP8_E4M3: "float8_e4m3fn"}[self]
