"""kbench-cuda on any machine: light import, honest unavailability, NVML decoding; GPU checks marked."""
from __future__ import annotations


import numpy as np
import pytest

from kbench.api import DType
from kbench.testing import imported_by
from kbench_cuda import nvml, runtime
from kbench_cuda.device import CudaDevice, memory_span

GPU_REASON = runtime.unavailable_reason()
gpu_only = pytest.mark.skipif(GPU_REASON is not None, reason=f"no usable CUDA GPU: {GPU_REASON}")
no_gpu = pytest.mark.skipif(GPU_REASON is None, reason="a CUDA GPU is usable here")


def test_plugin_import_does_not_import_cupy_or_nvml():
    assert imported_by(["kbench_cuda.plugin"], ("cupy", "pynvml", "torch")) == []


def test_plugin_registers_device_backend_substrate(kbench_pm):
    reg = kbench_pm.registry
    assert isinstance(reg.devices["cuda"], CudaDevice)
    assert reg.backends["cupy"].device == "cuda"
    assert reg.substrates["cupy"].device == "cuda"
    assert reg.owner("backend", "cupy") == "cuda"


@no_gpu
def test_unavailable_says_why_in_the_runtimes_words(kbench_pm):
    reason = CudaDevice().available()
    assert reason and (reason.startswith("CUDA runtime: ") or reason.startswith("cupy is not importable"))
    reg = kbench_pm.registry
    # the device, its backend and its substrate give the same reason, and nothing raised
    assert reg.backends["cupy"].available() == reason
    assert reg.substrates["cupy"].available() == reason
    assert kbench_pm.detect_hardware(reg.devices["cuda"]) is None
    assert CudaDevice().machine_id() == "cuda-unavailable"
    assert CudaDevice().describe()["unavailable"] == reason


def test_device_index_from_environment(monkeypatch):
    monkeypatch.setenv(runtime.DEVICE_ENV, "3")
    assert runtime.device_index() == 3 and CudaDevice().index == 3
    assert CudaDevice(index=1).index == 1
    monkeypatch.setenv(runtime.DEVICE_ENV, "x")
    assert runtime.device_index() == 0


def test_slug():
    assert runtime.slug("NVIDIA H200") == "nvidia-h200"
    assert runtime.slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"


def test_out_of_memory_becomes_memory_error():
    class OutOfMemoryError(RuntimeError):
        pass

    def kernel(**arrays):
        raise OutOfMemoryError("Out of memory allocating 1,073,741,824 bytes")

    with pytest.raises(MemoryError, match="Out of memory"):
        runtime.oom_as_memory_error(kernel)(q=1)

    def other(**arrays):
        raise ValueError("a bug")

    with pytest.raises(ValueError):
        runtime.oom_as_memory_error(other)(q=1)


class _DeviceArray:
    """An object speaking the CUDA array interface, like a CuPy array or a torch CUDA tensor."""

    def __init__(self, ptr, shape, typestr, strides=None):
        self.__cuda_array_interface__ = {"data": (ptr, False), "shape": shape, "typestr": typestr,
                                         "strides": strides, "version": 3}


def test_memory_spans_and_aliasing():
    base = _DeviceArray(1000, (4, 8), "<f4")
    assert memory_span(base) == (1000, 1000 + 4 * 8 * 4)
    tail = _DeviceArray(1000 + 64, (2, 8), "<f4")             # rows 2..3 of base
    after = _DeviceArray(1000 + 128, (4, 8), "<f4")           # starts where base ends
    column = _DeviceArray(1000 + 4, (4,), "<f4", strides=(32,))  # one column of base
    dev = CudaDevice()
    assert dev.is_same_memory(base, tail) and dev.is_same_memory(column, base)
    assert not dev.is_same_memory(base, after)
    assert not dev.is_same_memory(base, np.zeros(3))          # host arrays have no device span


def test_reason_bits_decode():
    assert nvml.decode_reasons(0) == []
    assert nvml.decode_reasons(0x1 | 0x4) == ["gpu_idle", "sw_power_cap"]
    assert nvml.decode_reasons(0x40 | 0x10000) == ["hw_thermal_slowdown", "0x10000"]
    assert not nvml.THROTTLE_MASK & 0x1        # idle is not throttling
    assert nvml.THROTTLE_MASK & 0x40 and nvml.THROTTLE_MASK & 0x4


def test_clock_sampler_summarises_clocks_and_throttling():
    class Fake:
        readings = iter([(1980, 0x0), (1980, 0x1), (1755, 0x4), None, (1600, 0x40 | 0x4)])

        def quick(self):
            return next(self.readings, None)

        def power_w(self):
            return 500.0

    sampler = nvml.ClockSampler(Fake())
    for _ in range(5):
        quick = sampler.telemetry.quick()
        sm, mask = quick if quick else (None, None)
        sampler.readings.append((0.0, sm, mask, 500.0))
    summary = sampler.summary()
    assert summary["clock_readings"] == 5
    assert (summary["sm_clock_mhz_min"], summary["sm_clock_mhz_median"], summary["sm_clock_mhz_max"]) == (1600, 1980, 1980)
    assert summary["throttled_fraction"] == pytest.approx(2 / 4)
    assert set(summary["clock_event_reasons_seen"]) == {"gpu_idle", "sw_power_cap", "hw_thermal_slowdown"}


def test_clock_sampler_thread_reads_until_stopped():
    import time

    class Fake:
        def quick(self):
            return (1500, 0)

        def power_w(self):
            return 100.0

    with nvml.ClockSampler(Fake(), interval=0.001) as sampler:
        deadline = time.monotonic() + 5
        while len(sampler.readings) < 3 and time.monotonic() < deadline:
            time.sleep(0.005)
    n = len(sampler.readings)
    time.sleep(0.02)
    assert n >= 3 and len(sampler.readings) == n  # stopped with the loop


def test_telemetry_without_nvml_is_a_reason_not_an_error():
    tel = nvml.Telemetry(None, 0)
    if tel.available:
        pytest.skip("NVML is present on this machine")
    assert tel.read()["nvml"].startswith("unavailable: NVMLError")
    assert tel.quick() is None


def test_energy_and_power_without_nvml_are_none():
    tel = nvml.Telemetry(None, 0)
    if tel.available:
        pytest.skip("NVML is present on this machine")
    assert tel.energy_mj() is None and tel.power_w() is None
    assert "NVMLError" in tel.reason  # NVMLError_LibraryNotFound here: the reason names it


def test_sustained_energy_from_the_counter():
    # 600 J over a 2 s loop of 200 calls: 300 W, 3 J per call
    e = nvml.sustained_summary(1_000_000, 1_600_000, 2.0, 200, [700.0], idle_w=70.0, limit_w=700.0)
    assert e["source"] == "nvml energy counter"
    assert e["energy_j"] == pytest.approx(600.0) and e["average_w"] == pytest.approx(300.0)
    assert e["joules_per_call"] == pytest.approx(3.0) and "flag" not in e
    assert nvml.tflops_per_watt(450.0, e) == pytest.approx(1.5)


def test_sustained_energy_falls_back_to_power_readings_then_to_nothing_and_flags_the_impossible():
    e = nvml.sustained_summary(5000, 5000, 1.0, 100, [400.0, 600.0], idle_w=70.0, limit_w=700.0)
    assert e["source"] == "nvml power readings" and e["average_w"] == pytest.approx(500.0)
    assert e["joules_per_call"] == pytest.approx(5.0) and "energy_j" not in e
    nothing = nvml.sustained_summary(None, None, 1.0, 3, [], idle_w=None, limit_w=None)
    assert nothing["source"] == "none" and "joules_per_call" not in nothing
    assert nvml.sustained_summary(1, 2, 1.0, 0, [], idle_w=None, limit_w=None)["source"] == "none"
    assert nvml.tflops_per_watt(450.0, nothing) is None and nvml.tflops_per_watt(None, {"average_w": 3}) is None
    # the board's idle power over a loop of kernels, or more than its limit, is not the kernel's
    low = nvml.sustained_summary(0, 100_000, 1.0, 10, [], idle_w=126.0, limit_w=700.0)
    assert "below the idle power 126 W" in low["flag"]
    high = nvml.sustained_summary(0, 900_000, 1.0, 10, [], idle_w=126.0, limit_w=700.0)
    assert "above the power limit 700 W" in high["flag"]


@pytest.mark.parametrize("value, enabled", [("1", True), ("yes", True), ("0", False), ("", False), ("false", False)])
def test_cuda_graph_setting_from_the_environment_and_the_suite(monkeypatch, value, enabled):
    from kbench_cuda.device import CudaDevice

    monkeypatch.setenv("KBENCH_CUDA_GRAPH", value)
    dev = CudaDevice()
    assert dev.cuda_graph is enabled
    dev.set_cuda_graph(not enabled)  # the suite's setting wins over the environment
    assert dev.cuda_graph is (not enabled)


def test_graph_log_counts_per_case_and_keeps_the_first_reason():
    from kbench_cuda.device import GraphLog

    log = GraphLog()
    log.captured += 5
    log.failed("CUDARuntimeError: cudaErrorStreamCaptureImplicit: operation would make the legacy stream depend "
               "on a capturing blocking stream")
    log.failed("a later reason")
    first = log.summary()
    assert first["captured"] == 5 and first["not_captured"] == 2 and first["why"].startswith("CUDARuntimeError")
    assert log.summary() == {"captured": 0, "not_captured": 0}


# -- on a GPU ---------------------------------------------------------------------------------


@pytest.mark.gpu
@gpu_only
@pytest.mark.parametrize("dtype", list(DType))
def test_round_trip_and_poison(dtype):
    dev = CudaDevice()
    host = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(dtype.numpy)
    back = dev.to_host(dev.from_host(host))
    assert back.dtype == dtype.numpy and np.array_equal(back.view(np.uint8), host.view(np.uint8))
    arr = dev.from_host(host)
    before = dev.fingerprint(arr)
    assert dev.fingerprint(dev.from_host(host)) == before      # content, not address
    arr.reshape(-1)[7] += 1
    assert dev.fingerprint(arr) != before
    poison = dev.to_host(dev.poisoned((5,), dtype))
    assert poison.dtype == dtype.numpy and np.isnan(poison.astype(np.float32)).all()
    written = dev.from_host(np.ones(5, dtype=dtype.numpy))
    dev.repoison(written)  # bf16 is held as uint16: a float NaN assignment would write 0
    again = dev.to_host(written)
    assert again.dtype == dtype.numpy and np.isnan(again.astype(np.float32)).all()


@pytest.mark.gpu
@gpu_only
@pytest.mark.parametrize("params", [
    dict(seqlen=64, heads=4, head_dim=64, dtype="fp32"),
    dict(seqlen_q=37, seqlen_kv=101, heads_q=4, heads_kv=2, head_dim=64, causal=True, dtype="bf16"),
    dict(seqlen_q=101, seqlen_kv=37, heads_q=4, heads_kv=1, head_dim=128, causal=True, dtype="fp16"),
])
def test_cupy_backend_passes(kbench_pm, kbench_case, kbench_check, params):
    rec = kbench_check(kbench_pm.registry.backends["cupy"], kbench_case(**params))
    assert rec["status"] == "passed", rec.get("reason")
    tel = rec["telemetry"]
    assert "after" in tel and "before" in tel
    acc = rec["timing"]["accounting"]
    assert acc["sample_seconds"] <= acc["parent_seconds"]


@pytest.mark.gpu
@gpu_only
def test_gpu_detection_and_timer(kbench_pm):
    dev = kbench_pm.registry.devices["cuda"]
    profile = kbench_pm.detect_hardware(dev)
    assert profile is not None and profile.kind == "gpu"
    assert dev.flush_bytes() >= 2 * int(dev.properties()["l2CacheSize"])
    cp = runtime.cupy()
    x = cp.ones(1 << 24, dtype=cp.float32)
    seconds = dev.time_call(lambda: x.sum())
    assert 0 < seconds < 1


@pytest.mark.gpu
@gpu_only
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_inputs_drawn_on_the_gpu_equal_the_judges(dtype):
    """The generation kernel draws exactly the values the judge regenerates on the host (kbench.ops.inputs)."""
    from kbench.api import generate_input, unit_variance_input

    dev = CudaDevice()
    spec = unit_variance_input((3, 37, 4, 16), dtype)
    on_gpu = dev.empty(spec.shape, spec.table.values().dtype)
    dev.generate(on_gpu, spec, (2**63 + 5, 77), 2)
    host = generate_input(spec, (2**63 + 5, 77), 2)
    assert dev.to_host(on_gpu).view(np.uint8).tobytes() == host.view(np.uint8).tobytes()


@pytest.mark.gpu
@gpu_only
def test_outputs_are_checked_where_they_live():
    cp = runtime.cupy()
    dev = CudaDevice()
    bf16 = dev.poisoned((4, 8), DType.BF16)
    assert dev.nonfinite(bf16) == 32
    bf16.fill(0x3F80)  # 1.0
    assert dev.nonfinite(bf16) == 0
    shadow = dev.empty((4, 8), DType.BF16.numpy)
    dev.copy_into(shadow, bf16)
    assert dev.same_content(shadow, bf16)
    bf16[0, 0] = 0x4000
    assert not dev.same_content(shadow, bf16)
    nan = cp.full((3,), cp.nan, dtype=cp.float32)
    assert dev.same_content(nan, nan.copy())  # compared as bytes: NaN equals itself
    clock = dev.sample_clock(2)
    x = cp.ones(1 << 22, dtype=cp.float32)
    for i in range(2):
        clock.start(i)
        x.sum()
        clock.stop(i)
    dev.synchronize()
    assert all(0 < t < 1 for t in clock.seconds()) and clock.stamps() is None and dev.host_clock is False


class _TensorLike:
    """The attributes of a torch CUDA tensor that memory_span reads (bf16 tensors have no CUDA array interface)."""

    is_cuda = True

    def __init__(self, ptr, shape, stride, itemsize):
        self._ptr, self.shape, self._stride, self._itemsize = ptr, shape, stride, itemsize

    def data_ptr(self):
        return self._ptr

    def stride(self):
        return self._stride

    def element_size(self):
        return self._itemsize


def test_memory_span_of_tensors():
    t = _TensorLike(4096, (2, 3), (3, 1), 2)
    assert memory_span(t) == (4096, 4096 + 12)
    transposed = _TensorLike(4096, (3, 2), (1, 3), 2)
    assert memory_span(transposed) == (4096, 4096 + 12)
    assert CudaDevice().is_same_memory(t, _DeviceArray(4096 + 10, (1,), "<u2"))


def test_cupy_backend_chunks_and_limits(kbench_case):
    from kbench_cuda.cupy_backend import CHUNK_BUDGET, CupyAttention, heads_per_chunk

    small = kbench_case(seqlen=1024, heads=16, head_dim=128, dtype="bf16")
    assert heads_per_chunk(small) == 16                       # 16 x 12 MiB of scores fit one chunk
    long = kbench_case(seqlen=16384, heads=16, head_dim=128, dtype="bf16")
    per = heads_per_chunk(long)                                # 3 GiB of temporaries per KV head
    assert per == 1 and 3 * 16384 * 16384 * 4 * per <= CHUNK_BUDGET
    assert CupyAttention().supports(long) is None
    huge = kbench_case(seqlen=65536, heads_q=8, heads_kv=1, head_dim=64)
    assert "materialises scores" in CupyAttention().supports(huge)


@pytest.mark.gpu
@gpu_only
def test_cupy_backend_timed_as_a_cuda_graph(kbench_pm, kbench_case, kbench_check, monkeypatch):
    monkeypatch.setenv("KBENCH_CUDA_GRAPH", "1")
    rec = kbench_check(kbench_pm.registry.backends["cupy"], kbench_case(seqlen=256, heads=4, head_dim=64,
                                                                       dtype="fp16"))
    assert rec["status"] == "passed", rec.get("reason")
    graphs = rec["telemetry"]["cuda_graph"]
    assert graphs["captured"] + graphs["not_captured"] >= len(rec["timing"]["samples"])
