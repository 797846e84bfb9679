"""Devices: where arrays live and how time is read. The runner is the same for every device."""
from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from typing import Any, Callable

import numpy as np

from kbench.enums import DType


class Device(ABC):
    """Base of every device.

    A device owns array placement (host <-> device), poisoning of output buffers, synchronisation,
    and the timer of one sample. The adaptive sampling loop is the core's (kbench.timing).
    """

    name: str = ""
    description: str = ""

    def available(self) -> str | None:
        """``None`` when usable here, else the reason it is not (e.g. the runtime's own message)."""
        return None

    @abstractmethod
    def from_host(self, array: np.ndarray) -> Any:
        """Copy a host array to the device (a new buffer)."""

    @abstractmethod
    def to_host(self, array: Any) -> np.ndarray:
        """Copy a device array to a host NumPy array (bf16 as ml_dtypes.bfloat16)."""

    @abstractmethod
    def poisoned(self, shape: tuple[int, ...], dtype: DType) -> Any:
        """A fresh output buffer filled with NaN, so unwritten elements are caught."""

    def write(self, array: Any, host: np.ndarray) -> None:
        """Copy a host array into an existing device buffer, in place (its address does not change)."""
        array[...] = self.from_host(host)

    def repoison(self, array: Any) -> None:
        """Fill an existing output buffer with NaN again, in place (before each timed sample)."""
        array[...] = float("nan")

    def synchronize(self) -> None:
        """Wait until all work queued on the device is done."""

    @abstractmethod
    def time_call(self, fn: Callable[[], Any]) -> float:
        """Run ``fn`` once and return its duration in seconds, the device synchronised at the end."""

    def before_sample(self) -> None:
        """Called outside the timed region before each sample (e.g. flush the L2 cache)."""

    def telemetry(self) -> dict[str, Any]:
        """Clocks, temperature, power, throttle reasons where the device can read them."""
        return {}

    def describe(self) -> dict[str, Any]:
        """Facts about this device for the result file's ``machine`` section."""
        return {"device": self.name}

    def machine_id(self) -> str:
        """Short, filesystem-safe name of this machine for ``results/<machine>/``."""
        return self.name

    def fingerprint(self, array: Any) -> str:
        """Content hash of an array, to check that a backend left its inputs unchanged."""
        host = np.ascontiguousarray(self.to_host(array))
        return hashlib.blake2b(host.view(np.uint8).data, digest_size=16).hexdigest()

    def is_same_memory(self, a: Any, b: Any) -> bool:
        """Whether two device arrays share memory (an output aliasing an input)."""
        return False
