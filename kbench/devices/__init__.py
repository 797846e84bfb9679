"""Devices: where arrays live and how time is read. The timed loop is the same for every device.

A device gives the worker's call runner (:mod:`kbench.worker.calls`) what it needs to run a batch of calls
without the host in between: inputs generated in place where they live (:meth:`Device.generate`, the
counter-based generator of :mod:`kbench.ops.inputs`), output buffers poisoned in place, a cache flush
queued before each sample, a :class:`SampleClock` whose marks cost nothing until the batch ends, and
checks of outputs where they live (:meth:`Device.nonfinite`, :meth:`Device.same_content`).
"""
from __future__ import annotations

import hashlib
import time
from abc import ABC, abstractmethod
from typing import Any, Callable

import numpy as np

from kbench.enums import DType


class SampleClock:
    """The clock of one batch: ``start(i)``/``stop(i)`` around call ``i``; ``seconds()`` after the batch.

    The host clock (``perf_counter_ns``, the system's CLOCK_MONOTONIC, the same in every process) reads
    each mark at once; each sample's marks are also its stamps, which the judge checks against its own
    clock. A device clock (CUDA events) records marks in the device's order and reads them after the
    batch's one synchronisation: its samples have no host stamps.
    """

    host = True

    def __init__(self, calls: int) -> None:
        self.marks = [[0, 0] for _ in range(calls)]

    def start(self, i: int) -> None:
        self.marks[i][0] = time.perf_counter_ns()

    def stop(self, i: int) -> None:
        self.marks[i][1] = time.perf_counter_ns()

    def seconds(self) -> list[float]:
        return [(b - a) * 1e-9 for a, b in self.marks]

    def stamps(self) -> list[list[int]] | None:
        return [list(m) for m in self.marks]


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

    # -- the timed loop's needs (kbench.worker.calls) ---------------------------------------------

    #: bytes of input and output buffers one case's timed calls may hold at once on this device
    pool_memory: int = 256 * 2**20
    #: samples are host-clock intervals (each must fit its stamps, checked by the judge); a device that
    #: times with its own events sets False (kbench.judge.accounting)
    host_clock: bool = True
    #: the environment variable that pins a worker process to one device of this kind (``--devices``), or None
    visible_env: str | None = None
    #: whether a worker of this device may run under an address-space limit (RLIMIT_AS)
    limits_address_space: bool = True
    #: whether the judge offers large float64 references to plugins (``kbench_float64_reference``, e.g. CuPy on
    #: the GPU) during a run on this device; a host device keeps them on the host
    offloads_reference: bool = False

    def sandbox_binds(self) -> list[str]:
        """Extra bubblewrap options a sandboxed worker of this device needs (device nodes, driver files)."""
        return []

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        """A new device array of ``shape`` and NumPy ``dtype`` (contents undefined)."""
        return self.from_host(np.zeros(shape, dtype=dtype))

    def generate(self, array: Any, spec: Any, key: tuple[int, int], stream: int) -> None:
        """Fill ``array`` in place with input ``stream`` of the counter-based generator (kbench.ops.inputs).

        The default draws on the host and copies; a device draws where the array lives.
        """
        from kbench.ops.inputs import generate

        self.write(array, generate(spec, key, stream))

    def sample_clock(self, calls: int) -> SampleClock:
        """The clock of a batch of ``calls`` timed calls (host clock: the device is synchronous)."""
        return SampleClock(calls)

    def prepare_call(self, fn: Callable[[], Any]) -> Callable[[], Any]:
        """What is timed for the call ``fn``, made outside the sample (a device may capture it into a graph)."""
        return fn

    def is_array(self, value: Any) -> bool:
        """Whether ``value`` is exactly this device's array type (no subclass: a subclass runs its own code
        whenever the harness touches it)."""
        return type(value) is np.ndarray

    def copy(self, array: Any) -> Any:
        """A new device array holding ``array``'s content (the shadow of an output just after its call)."""
        return self.from_host(self.to_host(array))

    def copy_into(self, target: Any, array: Any) -> None:
        """Overwrite ``target`` with ``array``'s content, in place."""
        self.write(target, self.to_host(array))

    def same_content(self, a: Any, b: Any) -> bool:
        """Whether two device arrays hold the same bytes."""
        ha, hb = np.ascontiguousarray(self.to_host(a)), np.ascontiguousarray(self.to_host(b))
        return ha.shape == hb.shape and ha.view(np.uint8).tobytes() == hb.view(np.uint8).tobytes()

    def nonfinite(self, array: Any) -> int:
        """How many elements of a device array are NaN or infinite."""
        host = np.asarray(self.to_host(array))
        wide = host.astype(np.float32) if host.dtype.itemsize < 4 else host
        return int(np.count_nonzero(~np.isfinite(wide)))

    def sustained(self, fn: Callable[[], Any], seconds: float) -> dict[str, Any] | None:
        """Run ``fn`` back to back for at least ``seconds`` and measure energy, power and clocks over it
        (kbench.worker.calls' ``sustain``); None when this device cannot measure energy."""
        return None

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
