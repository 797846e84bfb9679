"""The ``cuda`` device: CuPy arrays, CUDA-event timing, L2 flush before each sample, NVML telemetry.

bf16 lives on the GPU as ``uint16`` CuPy arrays holding the bfloat16 bit patterns (CuPy has no
bfloat16 type): :meth:`CudaDevice.from_host` stores an ``ml_dtypes.bfloat16`` array's bits,
:meth:`CudaDevice.to_host` views ``uint16`` results as ``ml_dtypes.bfloat16`` again, and
``kbench.api.as_torch`` views them as ``torch.bfloat16`` without a copy. No op of kbench
has genuine uint16 data, so the convention is unambiguous.

Timing of one sample (``before_sample`` then ``time_call``), in stream order:

1. ``before_sample``: the host reads the SM clock and the clock-event reasons through NVML (a sample
   taken under a throttling reason is flagged in the record's telemetry);
2. ``time_call``: a buffer of ``max(2 x L2, 256 MiB)`` is overwritten on the GPU, asynchronously,
   before the start event: it evicts the inputs from L2 (a cold-cache measurement, like nvbench)
   and keeps the GPU busy while the host enqueues the kernel, so Python launch overhead is hidden
   rather than timed. It is queued here rather than in ``before_sample`` because the harness may
   synchronise in between (re-poisoning outputs), which would let the GPU idle before the start;
3. a start event, the kernel, an end event; the host waits for the end event, notes whether other
   streams still have work (``pending_work``, which the integrity guard reads), then waits for the
   whole device so that nothing spills into the next sample.

CUDA graphs (``set_cuda_graph(True)``, or ``KBENCH_CUDA_GRAPH=1``): the call is captured into a graph on a
side stream (CuPy's and torch's current stream during the capture, relaxed mode), outside the timed
region, and the graph is launched between the events: the host's launch overhead (Python, torch
dispatch, several small kernels) leaves the measurement, which is what a launch-bound small case
wants. A call that cannot be captured (a library launching on the legacy stream, a synchronisation)
is timed as usual; the record's telemetry says ``cuda_graph: {"captured": n, "not_captured": m, "why": ...}``.
"""
from __future__ import annotations

import os
import time
from contextlib import ExitStack
from functools import lru_cache
from typing import Any, Callable

import numpy as np

from kbench.api import DType, Device
from kbench_cuda import runtime
from kbench_cuda.nvml import SampleLog, Telemetry, energy_summary

#: how long an event on an idle GPU may take to complete before the device counts as busy
BUSY_GRACE_S = 200e-6
#: the smallest flush buffer, so the flush also covers the host's launch overhead (see module doc)
MIN_FLUSH_BYTES = 256 * 2**20


def _bf16() -> np.dtype:
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


@lru_cache(maxsize=None)
def _fingerprint_mixer():
    """Each 32-bit word mixed with its position (splitmix64 finaliser); the sum of all is the hash."""
    cp = runtime.cupy()
    return cp.ElementwiseKernel(
        "uint32 x", "uint64 y",
        """
        unsigned long long v = ((unsigned long long)x << 32) ^ ((unsigned long long)(i + 1) * 0x9E3779B97F4A7C15ull);
        v ^= v >> 30; v *= 0xBF58476D1CE4E5B9ull;
        v ^= v >> 27; v *= 0x94D049BB133111EBull;
        v ^= v >> 31;
        y = v;
        """,
        "kbench_fingerprint_mix")


def memory_span(array: Any) -> tuple[int, int] | None:
    """[first, last) byte addresses a device array (CuPy, torch CUDA tensor, any CUDA array interface) may touch."""
    if hasattr(array, "data_ptr") and hasattr(array, "element_size") and getattr(array, "is_cuda", False):
        # torch tensors: bf16 ones refuse the CUDA array interface
        ptr, shape, itemsize = int(array.data_ptr()), tuple(array.shape), int(array.element_size())
        strides = [s * itemsize for s in array.stride()]
    else:
        try:
            cai = array.__cuda_array_interface__
        except Exception:  # noqa: BLE001 - not a device array
            return None
        ptr, shape = int(cai["data"][0]), tuple(cai["shape"])
        itemsize = np.dtype(cai["typestr"]).itemsize
        strides = cai.get("strides")
        if strides is None:  # C-contiguous
            strides, acc = [], itemsize
            for n in reversed(shape):
                strides.insert(0, acc)
                acc *= n
    if any(n == 0 for n in shape):
        return ptr, ptr
    lo = ptr + sum(min(0, (n - 1) * s) for n, s in zip(shape, strides))
    hi = ptr + sum(max(0, (n - 1) * s) for n, s in zip(shape, strides)) + itemsize
    return lo, hi


def _as_cupy(cp, array: Any):
    """A CuPy view of another device array (a torch CUDA tensor returned by a kernel; bf16 as uint16)."""
    if str(getattr(array, "dtype", "")) == "torch.bfloat16":
        import torch

        return cp.from_dlpack(array.view(torch.int16)).view(cp.uint16)
    if hasattr(array, "__dlpack__"):
        return cp.from_dlpack(array)
    return cp.asarray(array)


def _torch_if_loaded():
    """torch, when something already imported it (a torch-based backend); never imported here."""
    import sys

    return sys.modules.get("torch")


class GraphLog:
    """How the timed calls of a case were launched when CUDA graphs are on."""

    def __init__(self) -> None:
        self.captured = 0
        self.not_captured = 0
        self.why: str | None = None

    def failed(self, reason: str) -> None:
        self.not_captured += 1
        self.why = self.why or reason[:300]

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"captured": self.captured, "not_captured": self.not_captured}
        if self.why:
            out["why"] = self.why
        self.captured, self.not_captured, self.why = 0, 0, None
        return out


class CudaDevice(Device):
    name = "cuda"
    description = "CuPy arrays on one CUDA GPU; CUDA events; L2 flushed before each sample; NVML telemetry"
    #: ``kbench calibrate``: a GEMM large enough to fill the SMs, a copy far larger than the L2
    calibration_matmul_size = 8192
    calibration_copy_bytes = 2 * 2**30

    def __init__(self, index: int | None = None) -> None:
        self._index = index
        self._flush = None
        self._flush_count = 0
        self._events = None
        self._telemetry: Telemetry | None = None
        self._log = SampleLog()
        self._pending = False
        self._energy_start: tuple[int | None, float] | None = None
        self._energy_end: tuple[int | None, float] | None = None
        self._kernel_s = 0.0
        self._calls = 0
        self._power_w: list[float] = []
        self._cuda_graph: bool | None = None  # None: KBENCH_CUDA_GRAPH decides, read at each call
        self._graph_log = GraphLog()

    # -- calibration (kbench calibrate) ----------------------------------------------------------

    def calibration_matmuls(self) -> tuple:
        """cuBLAS GEMMs through CuPy; CuPy has no bfloat16, so torch (when installed) runs the bf16 one."""
        from kbench.api import MatmulSpec

        return (MatmulSpec("fp64", "float64", "xp"),
                MatmulSpec("fp32", "float32", "xp", note="CuPy default compute type (no TF32)"),
                MatmulSpec("fp16", "float16", "xp", note="cuBLAS GEMM, fp32 accumulation (tensor cores)"),
                MatmulSpec("bf16", "bfloat16", "torch", note="torch.matmul, bf16 tensor cores"))

    def matmul_operands(self, spec, n: int, rng: np.random.Generator) -> Callable[[], Any]:
        """The timed call of a ``torch`` GEMM of the plan on this device (random operands, output reused)."""
        if spec.library != "torch":
            raise RuntimeError(f"no {spec.library} GEMM on the cuda device")
        try:
            import torch
        except ImportError:
            raise RuntimeError("torch is not installed (CuPy has no bfloat16)") from None
        dt = getattr(torch, spec.storage)
        where = f"cuda:{self.index}"
        a, b = (torch.randn(n, n, dtype=dt, device=where) for _ in range(2))
        c = torch.empty(n, n, dtype=dt, device=where)
        return lambda: torch.matmul(a, b, out=c)

    # -- identity and availability -------------------------------------------------------------

    @property
    def index(self) -> int:
        return runtime.device_index() if self._index is None else self._index

    def available(self) -> str | None:
        return runtime.unavailable_reason(self.index)

    def _cp(self):
        cp = runtime.cupy()
        cp.cuda.Device(self.index).use()
        return cp

    def properties(self) -> dict[str, Any]:
        return runtime.properties(self.index)

    def telemetry_source(self) -> Telemetry:
        if self._telemetry is None:
            self._telemetry = Telemetry(self.properties().get("pci_bus_id"), self.index)
        return self._telemetry

    # -- arrays ----------------------------------------------------------------------------------

    def from_host(self, array: np.ndarray) -> Any:
        cp = self._cp()
        array = np.asarray(array)
        if array.dtype == _bf16():
            array = array.view(np.uint16)
        elif array.dtype.name == "float8_e4m3fn":  # fp8 inputs as their bytes (CuPy has no float8)
            array = array.view(np.uint8)
        return cp.array(array, copy=True)

    def to_host(self, array: Any) -> np.ndarray:
        if isinstance(array, np.ndarray):
            return array
        cp = self._cp()
        if not isinstance(array, cp.ndarray):
            array = _as_cupy(cp, array)
        host = cp.asnumpy(array)
        if host.dtype == np.uint16:  # the bf16 storage convention (module doc)
            host = host.view(_bf16())
        return host

    def poisoned(self, shape: tuple[int, ...], dtype: DType) -> Any:
        cp = self._cp()
        dtype = DType(dtype)
        if dtype is DType.BF16:
            return cp.full(shape, runtime.BF16_NAN_BITS, dtype=cp.uint16)
        return cp.full(shape, cp.nan, dtype=dtype.numpy)

    def repoison(self, array: Any) -> None:
        cp = self._cp()
        if isinstance(array, cp.ndarray) and array.dtype == cp.uint16:  # bf16 is held as its bit pattern
            array.fill(runtime.BF16_NAN_BITS)
        else:
            super().repoison(array)

    def fingerprint(self, array: Any) -> str:
        """A content hash computed on the GPU: host hashing of 16k-token inputs would dominate a run."""
        cp = self._cp()
        if not isinstance(array, cp.ndarray):
            return super().fingerprint(array)
        a = cp.ascontiguousarray(array)
        raw = a.reshape(-1).view(cp.uint8)
        if raw.size % 4:
            raw = cp.concatenate([raw, cp.zeros(4 - raw.size % 4, dtype=cp.uint8)])
        mixed = _fingerprint_mixer()(raw.view(cp.uint32))
        total = int(mixed.sum(dtype=cp.uint64)) if mixed.size else 0  # wraps modulo 2**64
        return f"{a.dtype}{tuple(a.shape)}:{total:016x}"

    def is_same_memory(self, a: Any, b: Any) -> bool:
        sa, sb = memory_span(a), memory_span(b)
        if sa is None or sb is None:
            return False
        return sa[0] < sb[1] and sb[0] < sa[1]

    # -- timing ----------------------------------------------------------------------------------

    def synchronize(self) -> None:
        self._cp().cuda.Device(self.index).synchronize()

    def flush_bytes(self) -> int:
        l2 = int(self.properties().get("l2CacheSize") or 0)
        return max(2 * l2, MIN_FLUSH_BYTES)

    def before_sample(self) -> None:
        # host-only work (NVML reads) belongs here; the flush is queued by time_call itself
        source = self.telemetry_source()
        if self._log.before is None:
            self._log.before = source.read()
        self._log.add(source.quick())
        if self._energy_start is None:  # the case's first sample opens its energy window
            self._energy_start = (source.energy_mj(), time.perf_counter())
            self._kernel_s, self._calls, self._power_w = 0.0, 0, []
        power = source.power_w()
        if power is not None:
            self._power_w.append(power)

    def _flush_l2(self, cp) -> None:
        """Overwrite a buffer larger than L2, asynchronously (see the module doc for why here)."""
        if self._flush is None:
            self._flush = cp.empty(self.flush_bytes(), dtype=cp.uint8)
        self._flush_count += 1
        self._flush.fill(self._flush_count & 0x7F)

    def set_cuda_graph(self, enabled: bool) -> None:
        """Time each call as a launch of a CUDA graph captured from it (module doc); the suite's
        ``timing: {cuda_graph: true}`` reaches the device through here."""
        self._cuda_graph = bool(enabled)

    @property
    def cuda_graph(self) -> bool:
        if self._cuda_graph is not None:
            return self._cuda_graph
        return os.environ.get("KBENCH_CUDA_GRAPH", "0").strip().lower() not in ("", "0", "false", "no")

    def _capture(self, cp, fn: Callable[[], Any]):
        """A CUDA graph of ``fn``'s work, captured on a side stream; None (and the reason logged) if it cannot be."""
        stream = cp.cuda.Stream(non_blocking=True)
        graph = None
        try:
            with ExitStack() as stack:
                stack.enter_context(stream)
                torch = _torch_if_loaded()
                if torch is not None:  # torch-launched kernels (Triton, SDPA) go to torch's current stream
                    stack.enter_context(torch.cuda.stream(torch.cuda.ExternalStream(stream.ptr)))
                stream.begin_capture(mode=cp.cuda.runtime.streamCaptureModeRelaxed)
                try:
                    fn()
                finally:
                    graph = stream.end_capture()
            graph.upload(stream)
            stream.synchronize()
            return graph
        except Exception as exc:  # noqa: BLE001 - not capturable: timed without a graph, and said so
            self._graph_log.failed(f"{type(exc).__name__}: {exc}")
            return None

    def time_call(self, fn: Callable[[], Any]) -> float:
        cp = self._cp()
        if self._events is None:
            self._events = (cp.cuda.Event(), cp.cuda.Event())
        start, end = self._events
        graph = self._capture(cp, fn) if self.cuda_graph else None
        self._flush_l2(cp)  # queued before the start event: outside the timed region
        start.record()
        if graph is not None:
            graph.launch(stream=cp.cuda.Stream.null)
            self._graph_log.captured += 1
        else:
            fn()
        end.record()
        end.synchronize()
        self._pending = self._device_busy(cp)
        cp.cuda.Device(self.index).synchronize()
        seconds = cp.cuda.get_elapsed_time(start, end) * 1e-3
        if self._energy_start is not None:  # closes the energy window at the last sample's end
            self._energy_end = (self.telemetry_source().energy_mj(), time.perf_counter())
            self._kernel_s += seconds
            self._calls += 1
        return seconds

    def _device_busy(self, cp) -> bool:
        """Whether work queued on other (blocking) streams is still running after the end event.

        An event recorded on the legacy default stream completes only when every blocking stream has
        drained; an idle GPU completes it within microseconds, so it gets 200 us before the answer.
        """
        probe = cp.cuda.Event(disable_timing=True)
        probe.record(cp.cuda.Stream.null)
        deadline = time.perf_counter() + BUSY_GRACE_S
        while not probe.done and time.perf_counter() < deadline:
            pass
        return not probe.done

    def pending_work(self) -> bool:
        """Whether the last timed call left work running on the device (the integrity guard asks)."""
        return self._pending

    def telemetry(self) -> dict[str, Any]:
        """NVML readings after the case, the one before its first sample, and per-sample flags."""
        if self.available():
            return {}
        source = self.telemetry_source()
        after = source.read()
        before = self._log.before
        out = {"after": after, **self._log.summary()}
        if before is not None:
            out["before"] = before
        out["energy"] = self._energy()
        if self.cuda_graph:
            out["cuda_graph"] = self._graph_log.summary()
        if out.get("throttled_samples"):
            out["throttled"] = True
        return out

    def _energy(self) -> dict[str, Any]:
        """The case's energy (``kbench_cuda.nvml.energy_summary``), and a fresh window for the next case."""
        start, end = self._energy_start, self._energy_end
        self._energy_start = self._energy_end = None
        if start is None or end is None:
            return {"source": "none", "calls": 0}
        return energy_summary(start[0], start[1], end[0], end[1], self._kernel_s, self._calls, self._power_w)

    # -- description -----------------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        info: dict[str, Any] = {"device": self.name, "index": self.index}
        reason = self.available()
        if reason:
            info["unavailable"] = reason
            return info
        p = self.properties()
        info.update({
            "gpu": p["name"],
            "compute_capability": f"{p.get('major')}.{p.get('minor')}",
            "sm_count": p.get("multiProcessorCount"),
            "memory_bytes": p.get("totalGlobalMem"),
            "l2_bytes": p.get("l2CacheSize"),
            "pci_bus_id": p.get("pci_bus_id"),
            "flush_bytes": self.flush_bytes(),
            **runtime.versions(),
            **self.telemetry_source().describe(),
        })
        return info

    def machine_id(self) -> str:
        if self.available():
            return "cuda-unavailable"
        return f"gpu-{runtime.slug(self.properties()['name'])}"
