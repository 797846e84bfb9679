"""What the parent does between a kernel's batches: its float64 reference runs on one BLAS thread (no helper
threads left spinning on the kernel's cores) and, on a CPU run, on the host only."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import kbench.ops.attention as attention
from kbench import plugins
from kbench.judge.context import RunContext
from kbench.judge.verify import CheckFailed, verify
from kbench.testing import TEST_CHECK, TEST_TIMING

threadpoolctl = pytest.importorskip("threadpoolctl")


def numpy_blas_threads() -> list[int]:
    """Threads of the BLAS numpy ships with (the one the float64 reference calls)."""
    return [info["num_threads"] for info in threadpoolctl.threadpool_info()
            if info["user_api"] == "blas" and "numpy" in info["filepath"]]


def test_the_reference_runs_on_one_blas_thread_and_the_kernel_keeps_its_threads(
        kbench_case, kbench_check, fake_backend, monkeypatch):
    if not numpy_blas_threads():
        pytest.skip("numpy's BLAS is not one threadpoolctl can name here (not numpy's bundled OpenBLAS)")
    real = attention.attention_float64
    in_reference, in_kernel = [], []

    def reference(*args, **kwargs):
        in_reference.append(numpy_blas_threads())
        return real(*args, **kwargs)

    def kernel(q, k, v, out, case):
        in_kernel.append(numpy_blas_threads())
        out[...] = real(q, k, v, causal=case["causal"], scale=1 / np.sqrt(case["head_dim"]))

    monkeypatch.setattr(attention, "attention_float64", reference)
    with threadpoolctl.threadpool_limits(2, user_api="blas"):
        rec = kbench_check(fake_backend(kernel), kbench_case(seqlen=32, heads=2, head_dim=16))
        after = numpy_blas_threads()
    assert rec["status"] == "passed", rec.get("reason")
    assert len(in_reference) >= 2 and all(set(t) == {1} for t in in_reference)   # every verification
    assert in_kernel and all(set(t) == {2} for t in in_kernel)                    # every call, in this process
    assert set(after) == {2}


def test_a_cpu_run_keeps_a_large_reference_on_the_host(kbench_pm, kbench_case, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    monkeypatch.setenv("KBENCH_PLUGINS", "reference_probe_plugin")
    monkeypatch.setattr(plugins, "_cached", {})  # this test's plugin manager is not left to later tests
    probe = __import__("reference_probe_plugin")
    probe.CALLS.clear()
    op = kbench_pm.registry.ops["attention"]
    # 64 checked rows of 2048 keys, 8 heads, head_dim 64: 2.7e8 float64 flops, over the offload threshold
    case = kbench_case(seqlen=2048, heads=8, head_dim=64, dtype="fp16")
    assert attention.reference_flops(case, np.arange(64)) >= attention.OFFLOAD_REFERENCE_FLOPS
    inputs = op.make_inputs(case, 0)
    zeros = {"out": np.zeros(op.output_shapes(case)["out"], dtype=np.float16)}
    cpu = kbench_pm.registry.device("cpu")
    ctx = RunContext(op=op, device=cpu, check=TEST_CHECK, timing=TEST_TIMING)
    with pytest.raises(CheckFailed):
        verify(ctx, case, inputs, zeros, "a test output", np.random.default_rng(0))
    assert probe.CALLS == []                     # the host computed it: the probe was never asked
    monkeypatch.setattr(type(cpu), "offloads_reference", True)  # a device whose runs offload (the CUDA one's)
    with pytest.raises(CheckFailed):
        verify(ctx, case, inputs, zeros, "a test output", np.random.default_rng(0))
    assert probe.CALLS == [case.id]
    assert attention.REFERENCE_OFFLOAD.get() is True  # verify left the switch as it found it
    sys.modules.pop("reference_probe_plugin", None)
