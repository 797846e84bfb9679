"""Test plugin: ``simgpu``, a simulated device whose arrays live on the host but whose samples come as a GPU's do.

Load it with ``-p sim_device_plugin`` (or ``KBENCH_PLUGINS=sim_device_plugin``), ``tests/`` on ``PYTHONPATH``:
the workers load it too. It lives in ``tests/``, not in ``kbench``, because it is a fixture (no user should see
a fake device in ``kbench list``), like ``slow_backend_plugin``; tests/test_sim_device.py uses it.

It mirrors the interface of kbench-cuda's ``CudaDevice`` (plugins/kbench-cuda/kbench_cuda/device.py) where the
judge and the worker's timed loop take a different branch for a GPU, so those branches run in the default CI tier
on a machine without one:

* **a device clock**: ``host_clock = False``; :meth:`SimDevice.sample_clock` hands out pairs of :class:`SimEvent`
  around each call (CUDA events), recorded on the device's own timeline (``CLOCK_MONOTONIC_RAW``, not the host's
  ``perf_counter``), read only after the batch's one synchronisation (reading an event not yet complete raises, as
  ``cudaErrorNotReady`` does), elapsed times through a module function :func:`elapsed_ms` (``cupy.cuda.
  get_elapsed_time``'s place, as patchable as it); samples have no host stamps, so the judge checks the batch's
  sum against its window (kbench.judge.accounting);
* **inputs generated "on the device"**: a table-drawn input is gathered from the value table uploaded once per
  table (:func:`kbench.api.philox_lanes` indices into ``table.bits()``: the GPU kernel's algorithm, not the host's
  arithmetic of ``ValueTable.values_of``); a structural input (``spec.host``) goes through the base class, as on CUDA;
* **a cache flush queued before each sample** (``before_sample``), the "before" telemetry read at a case's first
  sample, "after" at its end;
* **the sustained energy loop** (``sustained``): ``fn`` back to back, a synchronisation every
  :data:`SUSTAIN_SYNC_EVERY` calls, energy from a simulated counter read at both synchronised ends
  (:data:`BUSY_W` while the loop runs), the same keys as kbench-cuda's summary.

What it does not simulate: asynchrony (a call has finished when it returns, as if the host waited for the GPU),
device memory (arrays are ``numpy.ndarray``, so a host array passed where a device array belongs is not caught),
the bf16-as-uint16 storage convention, CUDA graphs and NVML's ~1 s power average. Counts of what ran
(``telemetry()["sim"]``) let a test see that each branch was taken.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

import kbench
from kbench.api import Backend, Device, DType, Substrate, philox_lanes, softmax_scale

#: the device's timeline (bound now: a kernel replacing ``time.clock_gettime_ns`` later does not move it)
_DEVICE_NS = time.clock_gettime_ns
_TIMELINE = time.CLOCK_MONOTONIC_RAW
#: bytes overwritten before each sample (a GPU flushes 2 x L2; a small "L2" keeps the default tier fast)
FLUSH_BYTES = 1 << 20
#: calls between two synchronisations of the sustained loop (kbench-cuda's SUSTAIN_SYNC_EVERY)
SUSTAIN_SYNC_EVERY = 32
#: simulated board power: idle, while the sustained loop runs, the limit
IDLE_W, BUSY_W, LIMIT_W = 60.0, 300.0, 700.0


class NotReady(RuntimeError):
    """An event read before the synchronisation that completes it (CUDA: cudaErrorNotReady)."""


class SimEvent:
    """A CUDA event's stand-in: ``record()`` takes the device's time; complete only once the device synchronised."""

    def __init__(self, device: SimDevice) -> None:
        self.device, self.ns, self.complete = device, None, False

    def record(self) -> None:
        self.ns, self.complete = _DEVICE_NS(_TIMELINE), False
        self.device._pending.append(self)


def elapsed_ms(start: SimEvent, end: SimEvent) -> float:
    """Milliseconds between two completed events (``cupy.cuda.get_elapsed_time``)."""
    if not (start.complete and end.complete) or start.ns is None or end.ns is None:
        raise NotReady("an event was read before the device synchronised (cudaErrorNotReady)")
    return (end.ns - start.ns) * 1e-6


class SimClock:
    """kbench-cuda's EventClock on :class:`SimEvent`: marks in the device's order, read after synchronisation."""

    host = False

    def __init__(self, events: list[tuple[SimEvent, SimEvent]]) -> None:
        self.events = events

    def start(self, i: int) -> None:
        self.events[i][0].record()

    def stop(self, i: int) -> None:
        self.events[i][1].record()

    def seconds(self) -> list[float]:
        return [elapsed_ms(a, b) * 1e-3 for a, b in self.events]

    def stamps(self) -> None:
        return None


class SimDevice(Device):
    name = "simgpu"
    description = "simulated GPU (tests): host arrays, events on its own clock, energy from a simulated counter"
    #: samples are device events, read after the batch's synchronisation (kbench.judge.accounting's device branch)
    host_clock = False
    limits_address_space = True

    def __init__(self) -> None:
        self._pending: list[SimEvent] = []
        self._events: list[tuple[SimEvent, SimEvent]] = []
        self._tables: dict[Any, np.ndarray] = {}
        self._flush: np.ndarray | None = None
        self._before: dict[str, Any] | None = None
        self._energy_mj = 0.0
        self.counts = {"synchronize": 0, "flush": 0, "generated_on_device": 0, "generated_on_host": 0,
                       "events_read": 0, "sustained_calls": 0}

    # -- arrays (on the host) -------------------------------------------------------------------

    def from_host(self, array: np.ndarray) -> np.ndarray:
        return np.array(array, copy=True)

    def to_host(self, array: Any) -> np.ndarray:
        return np.asarray(array)

    def write(self, array: np.ndarray, host: np.ndarray) -> None:
        np.copyto(array, host)

    def poisoned(self, shape: tuple[int, ...], dtype: DType) -> np.ndarray:
        return np.full(shape, np.nan, dtype=DType(dtype).numpy)

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        return np.empty(shape, dtype=dtype)

    def copy(self, array: np.ndarray) -> np.ndarray:
        return np.array(array, copy=True)

    def copy_into(self, target: np.ndarray, array: np.ndarray) -> None:
        np.copyto(target, array)

    def is_same_memory(self, a: Any, b: Any) -> bool:
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and np.shares_memory(a, b)

    # -- inputs, drawn "where they live" --------------------------------------------------------

    def generate(self, array: np.ndarray, spec, key: tuple[int, int], stream: int) -> None:
        if spec.host is not None:  # a small structural input, made on the host (as kbench-cuda does)
            self.counts["generated_on_host"] += 1
            super().generate(array, spec, key, stream)
            return
        if not array.flags.c_contiguous:
            raise ValueError("inputs are generated into C-contiguous arrays")
        table = self._table(spec.table)
        if table.dtype.itemsize != array.dtype.itemsize:
            raise ValueError(f"a table of {table.dtype.itemsize}-byte values for a {array.dtype.itemsize}-byte array")
        out = array.reshape(-1).view(table.dtype)
        chunk = 1 << 18
        for lo in range(0, out.size, chunk):  # the GPU kernel's gather: table[16-bit lane of each element]
            hi = min(out.size, lo + chunk)
            np.take(table, philox_lanes(key, stream, lo, hi), out=out[lo:hi])
        self.counts["generated_on_device"] += 1

    def _table(self, table) -> np.ndarray:
        """The value table "on the device", its bits uploaded once per table."""
        if table not in self._tables:
            self._tables[table] = np.ascontiguousarray(table.bits())
        return self._tables[table]

    # -- the timed loop ------------------------------------------------------------------------

    def synchronize(self) -> None:
        for event in self._pending:
            event.complete = True
        self._pending.clear()
        self.counts["synchronize"] += 1

    def sample_clock(self, calls: int) -> SimClock:
        while len(self._events) < calls:
            self._events.append((SimEvent(self), SimEvent(self)))
        self.counts["events_read"] += calls
        return SimClock(self._events[:calls])

    def before_sample(self) -> None:
        if self._before is None:
            self._before = self._reading()
        if self._flush is None:
            self._flush = np.empty(FLUSH_BYTES, dtype=np.uint8)
        self.counts["flush"] += 1
        self._flush.fill(self.counts["flush"] & 0x7F)

    def time_call(self, fn: Callable[[], Any]) -> float:
        clock = self.sample_clock(1)
        self.before_sample()
        clock.start(0)
        fn()
        clock.stop(0)
        self.synchronize()
        return clock.seconds()[0]

    # -- energy: the sustained loop ------------------------------------------------------------

    def sustained(self, fn: Callable[[], Any], seconds: float) -> dict[str, Any] | None:
        """kbench-cuda's loop: one call outside, then ``fn`` back to back with a synchronisation every
        :data:`SUSTAIN_SYNC_EVERY` calls until ``seconds`` passed; energy from the counter at both ends."""
        fn()
        self.synchronize()
        start_mj, t0 = self._counter(), _DEVICE_NS(_TIMELINE)
        calls = 0
        while True:
            for _ in range(SUSTAIN_SYNC_EVERY):
                fn()
            calls += SUSTAIN_SYNC_EVERY
            self.synchronize()
            self._energy_mj = start_mj + BUSY_W * (_DEVICE_NS(_TIMELINE) - t0) * 1e-6  # W x ms = mJ
            if (_DEVICE_NS(_TIMELINE) - t0) * 1e-9 >= seconds:
                break
        t1, end_mj = _DEVICE_NS(_TIMELINE), self._counter()
        self.counts["sustained_calls"] += calls
        window = (t1 - t0) * 1e-9
        energy = (end_mj - start_mj) / 1000.0
        return {"calls": calls, "seconds": window, "idle_w": IDLE_W, "power_limit_w": LIMIT_W,
                "source": "simulated energy counter", "energy_j": energy, "average_w": energy / window,
                "joules_per_call": energy / calls}

    def _counter(self) -> float:
        return self._energy_mj

    def _reading(self) -> dict[str, Any]:
        return {"power_w": IDLE_W, "sm_clock_mhz": 1980, "temperature_c": 40}

    def telemetry(self) -> dict[str, Any]:
        out: dict[str, Any] = {"after": self._reading(), "sim": dict(self.counts)}  # this case's counts
        self.counts = dict.fromkeys(self.counts, 0)
        if self._before is not None:
            out["before"], self._before = self._before, None
        return out

    def describe(self) -> dict[str, Any]:
        return {"device": self.name, "simulated": True}

    def machine_id(self) -> str:
        return "sim-gpu"


class SimAttention(Backend):
    """Honest float32 attention on the simulated device (a trusted registry backend)."""

    name, op, device = "sim-numpy", "attention", "simgpu"
    description = "NumPy attention on the simulated device"

    def supports(self, case) -> str | None:
        if case["mode"] != "fwd" or case["window_left"] != -1 or case["window_right"] != -1 or case["softcap"]:
            return "plain forward only"
        return None if case.dtype == "fp32" else "fp32 only"

    def prepare(self, case):
        scale, causal = np.float32(softmax_scale(case)), bool(case["causal"])

        def run(q, k, v, out):
            group = q.shape[2] // k.shape[2]
            kk, vv = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
            s = np.einsum("bqhd,bkhd->bhqk", q, kk) * scale
            if causal:
                sq, sk = q.shape[1], k.shape[1]
                s = np.where(np.arange(sk)[None, :] <= np.arange(sq)[:, None] + (sk - sq), s, -np.inf)
            p = np.exp(s - s.max(-1, keepdims=True))
            out[...] = np.einsum("bhqk,bkhd->bqhd", p / p.sum(-1, keepdims=True), vv)
        return run


class SimSubstrate(Substrate):
    """Kernel files with ``SUBSTRATE = "simgpu"`` run on the simulated device (NumPy arrays)."""

    name = "simgpu"
    device = "simgpu"


@kbench.hookimpl
def kbench_register_devices(registry):
    registry.add_device(SimDevice())


@kbench.hookimpl
def kbench_register_backends(registry):
    registry.add_backend(SimAttention())


@kbench.hookimpl
def kbench_register_kernel_substrates(registry):
    registry.add_substrate(SimSubstrate())
