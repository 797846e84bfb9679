"""Integrity checks one by one: static rules, degenerate outputs, threads, late work, timed outputs, tampering."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from kbench.builtin.numpy_backends import attention_numpy
from kbench.judge.policy import IntegritySettings, parse_size, static_check
from kbench.ops.attention import softmax_scale
from kbench.suite import CheckSettings

REDTEAM = Path(__file__).parent / "redteam"


def honest(q, k, v, out, case):
    attention_numpy(q, k, v, out, causal=case["causal"], scale=softmax_scale(case))


def rules(source, **settings):
    return [(v.rule, v.line) for v in static_check(source, IntegritySettings(**settings))]


def test_static_check_finds_forbidden_calls_through_aliases():
    src = ("import torch.nn.functional as F\nfrom flash_attn import flash_attn_func as fa\n"
           "def attention(q, k, v, out):\n    out[...] = F.scaled_dot_product_attention(q, k, v)\n    fa(q)\n")
    found = static_check(src, IntegritySettings())
    assert {(v.rule, v.line) for v in found} >= {("forbidden_calls", 2), ("forbidden_calls", 4), ("forbidden_calls", 5)}
    assert "torch.nn.functional.scaled_dot_product_attention" in str(found)
    # a suite may allow what it wants to compare against
    assert not rules(src.replace("from flash_attn import flash_attn_func as fa\n", "").replace("    fa(q)\n", ""),
                     allowed_calls=("torch.nn.functional.scaled_dot_product_attention",))


def test_static_check_finds_exec_and_module_state():
    src = ("import importlib\nCACHE = {}\nTUNABLES = {'b': {'default': 1}}\nimport functools\n"
           "@functools.lru_cache\ndef f(x, seen=[]):\n    global CACHE\n    return eval(x)\n")
    found = rules(src)
    assert ("forbid_exec", 1) in found and ("forbid_exec", 8) in found       # importlib, eval
    assert ("forbid_module_state", 2) in found                              # CACHE, not TUNABLES
    assert ("forbid_module_state", 3) not in found
    assert {("forbid_module_state", 5), ("forbid_module_state", 6), ("forbid_module_state", 7)} <= set(found)
    assert not rules(src.replace("@functools.lru_cache\n", ""), forbid_exec=False, forbid_module_state=False)


def test_static_check_reads_the_harness_as_forbidden_but_not_the_builtin_kernels():
    assert rules("from kbench.ops.attention import attention_float64\n")[0][0] == "forbidden_calls"
    assert rules("import kbench.judge\n")[0][0] == "forbidden_calls"
    assert not rules("from kbench.builtin.numpy_backends import attention_numpy\n")
    assert not rules((REDTEAM / "honest_numpy.py").read_text())
    assert rules("def f(:\n") == [("syntax", 1)]


def test_settings_from_the_suite():
    s = IntegritySettings.from_mapping({"memory_limit": "1.5GiB", "extra_forbidden_calls": ["numpy.einsum"],
                                        "static_checks": "all"})
    assert s.memory_limit == int(1.5 * 2**30) and "numpy.einsum" in s.forbidden_calls
    assert "*scaled_dot_product_attention*" in s.forbidden_calls and s.static_applies(trusted=True)
    assert not IntegritySettings().static_applies(trusted=True) and IntegritySettings().static_applies(trusted=False)
    assert parse_size("512M") == 512 * 2**20 and parse_size(1000) == 1000 and parse_size(None) is None
    with pytest.raises(ValueError):
        parse_size("lots")


LOOSE = CheckSettings(seeds=2, max_rows=64, tolerance={"fp32": 5.0})  # KernelBench-style loose bound


@pytest.mark.parametrize("fill, reason", [(0.0, "output is constant (0 everywhere)"),
                                          (1e-3, "output is constant (0.001 everywhere)")])
def test_constant_outputs_fail_even_under_a_loose_bound(kbench_case, kbench_check, fake_backend, fill, reason):
    def const(q, k, v, out, case):
        out[...] = fill
    rec = kbench_check(fake_backend(const), kbench_case(), check=LOOSE)
    assert rec["status"] == "failed" and reason in rec["reason"]


def test_output_no_better_than_a_constant_fails(kbench_case, kbench_check, fake_backend):
    def noise(q, k, v, out, case):  # varies, small magnitude, uncorrelated with the answer
        out[...] = np.random.default_rng(0).standard_normal(out.shape) * 0.1
    rec = kbench_check(fake_backend(noise), kbench_case(), check=LOOSE)
    assert rec["status"] == "failed" and "not much closer to the reference than" in rec["reason"]


@pytest.mark.parametrize("predictor", ["mean of the visible values", "zeros"])
def test_trivial_predictors_fail_under_a_loose_bound(kbench_case, kbench_check, fake_backend, predictor):
    """Class 10: a loose tolerance lets trivial answers through; the guard does not."""
    def trivial(q, k, v, out, case):
        if predictor == "zeros":
            out[...] = 0
            out[:, :, :, 0] = 1e-3 * q[:, :, :, 0]  # not constant, so only the trivial-predictor guard can catch it
            return
        honest(np.zeros_like(q), k, v, out, case)  # equal scores: the mean of the visible values per row
    rec = kbench_check(fake_backend(trivial), kbench_case(causal=True), check=LOOSE)
    assert rec["status"] == "failed", rec["reason"]
    assert "not much closer to the reference than" in rec["reason"] and "whatever the tolerance" in rec["reason"]
    assert rec["correctness"]["trivial"]["the mean of the visible values"] > 0


def test_honest_kernel_passes_under_the_loose_bound_too(kbench_case, kbench_check, fake_backend):
    rec = kbench_check(fake_backend(honest), kbench_case(), check=LOOSE)
    assert rec["status"] == "passed", rec["reason"]


def test_thread_per_call_is_caught(kbench_case, kbench_check, fake_backend):
    def spawn(q, k, v, out, case):
        honest(q, k, v, out, case)
        threading.Thread(target=time.sleep, args=(0.5,), daemon=True).start()
    rec = kbench_check(fake_backend(spawn), kbench_case())
    assert rec["status"] == "failed" and "threads still running" in rec["reason"]


def test_wrong_only_when_timed_is_caught(kbench_pm, kbench_case, fake_backend):
    from kbench.judge.context import RunContext
    from kbench.judge.judge import judge
    from kbench.run.pool import LocalChannel
    from kbench.testing import TEST_CHECK, TEST_TIMING
    from kbench.worker.calls import CallRunner

    seen = set()

    def sly(q, k, v, out, case):  # right on a buffer's first call (the checked calls), garbage afterwards
        if out.ctypes.data not in seen:
            seen.add(out.ctypes.data)
            honest(q, k, v, out, case)
        else:
            out[...] = 0.5
    # as an untrusted kernel: its warm-up covers every slot, and a call of every timed batch is verified
    ctx = RunContext(op=kbench_pm.registry.op("attention"), device=kbench_pm.registry.device("cpu"),
                     check=TEST_CHECK, timing=TEST_TIMING)
    backend = fake_backend(sly)
    rec = judge(ctx, LocalChannel(CallRunner(ctx.device, ctx.op), backend), backend.name, kbench_case(),
                trusted=False)
    # the same call run again untimed, in buffers it never saw, is right: an integrity failure, said so
    assert rec["status"] == "failed" and "timed output wrong although the checked calls were right" in rec["reason"]


def test_garbage_after_the_checked_calls_is_wrong_timed_or_not(kbench_case, kbench_check, fake_backend):
    calls = []

    def late(q, k, v, out, case):  # right for the two checked calls, garbage on every call after them
        calls.append(1)
        if len(calls) <= 2:
            honest(q, k, v, out, case)
        else:
            out[...] = 0.5
    rec = kbench_check(fake_backend(late), kbench_case())
    assert rec["status"] == "failed" and "on a timed call" in rec["reason"], rec["reason"]
    assert "the same call checked untimed" in rec["reason"] and "timed or not" in rec["reason"]


def test_unwritten_when_timed_is_caught(kbench_case, kbench_check, fake_backend):
    calls = []

    def every_other(q, k, v, out, case):  # right when checked, then leaves every other timed output unwritten
        calls.append(1)
        if len(calls) <= 2 or len(calls) % 2:
            honest(q, k, v, out, case)
    backend = fake_backend(every_other)
    backend.trusted = False  # judged as an untrusted kernel (in this process, for the test)
    rec = kbench_check(backend, kbench_case())
    # every element of every timed output of an untrusted kernel is checked for NaN, not only the verified ones
    assert rec["status"] == "failed" and "NaN/Inf" in rec["reason"] and "timed" in rec["reason"]


def test_timer_patched_in_process_is_caught(kbench_case, kbench_check, fake_backend, monkeypatch):
    real = time.perf_counter_ns
    monkeypatch.setattr(time, "perf_counter_ns", real)  # restored after the test whatever happens

    def patcher(q, k, v, out, case):
        time.perf_counter_ns = lambda: real() // 1000
        honest(q, k, v, out, case)
    rec = kbench_check(fake_backend(patcher), kbench_case())
    assert rec["status"] == "failed" and "harness tampering: time.perf_counter_ns replaced" in rec["reason"]


def test_honest_records_list_their_checks(kbench_case, kbench_check, fake_backend):
    rec = kbench_check(fake_backend(honest), kbench_case(causal=True))
    assert rec["status"] == "passed"
    checks = set(rec["integrity"]["checks"])
    assert {"secret_inputs", "parent_verifies", "rows_after_output", "nan_every_element", "trivial_predictors",
            "parent_clock", "threads", "timed_outputs", "late_writes"} <= checks
    assert rec["integrity"]["timed_inputs"] == "generated on the device just before each call, from keys of the run's secret"


def test_cpu_roof_flags_rates_beyond_the_calibrated_gemm_rate():
    """No datasheet (a CPU): the calibrated GEMM rate with a margin decides what is impossible."""
    from kbench.hardware import HardwareProfile
    from kbench.roofline.point import CALIBRATED_ROOF_MARGIN, roofline_point

    cpu = HardwareProfile(name="cpu-x", title="CPU", kind="cpu", peak_flops={}, bandwidth=None,
                          capacity=None).with_measured({"fp32": 0.1e12}, 10e9, "test")
    fine = roofline_point(cpu, "fp32", 1e9, 1e6, 1e9 / (0.1e12 * (CALIBRATED_ROOF_MARGIN - 0.5)))
    assert fine["impossible"] is False
    # 1e9 FLOP in 1 ms = 1 TFLOP/s: 10x the calibrated 0.1 TFLOP/s, while caches may beat the copy rate freely
    m = roofline_point(cpu, "fp32", 1e9, 1e6, 1e-3)
    assert m["impossible"] is True and "10.00x the calibrated compute roof of cpu-x" in m["impossible_reason"]


def test_parse_source_parses_one_source_at_a_time():
    """ast.parse from several threads at once can raise SystemError on CPython 3.11 (python/cpython#106905):
    evolve --parallel checked candidates in threads and one screening died of it. parse_source waits its turn."""
    from kbench import source as integrity

    done = []
    with integrity._PARSE_LOCK:
        t = threading.Thread(target=lambda: done.append(integrity.parse_source("x = 1\n")))
        t.start()
        t.join(0.3)
        assert t.is_alive() and not done  # blocked while another parse holds the lock
    t.join(5)
    assert len(done) == 1 and done[0].body[0].targets[0].id == "x"
    with pytest.raises(SyntaxError):
        integrity.parse_source("def (:\n")


def test_every_python_parse_goes_through_parse_source():
    root = Path(__file__).resolve().parents[1]
    raw = []
    for path in [*(root / "kbench").rglob("*.py"), *(root / "plugins").glob("*/kbench_*/**/*.py")]:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if "ast.parse(" in line and not line.lstrip().startswith(("#", '"""')) and "_PARSE_LOCK" not in line:
                raw.append(f"{path.relative_to(root)}:{n}")
    assert [r.split(":")[0] for r in raw] == ["kbench/source.py"], raw  # the one inside parse_source


def test_records_list_only_the_checks_that_ran(kbench_case, kbench_check, fake_backend):
    full = kbench_check(fake_backend(honest), kbench_case())
    assert full["status"] == "passed", full["reason"]
    listed = full["integrity"]["checks"]
    assert {"timed_outputs", "threads", "harness", "secret_inputs", "late_writes"} <= set(listed)
    assert "forbidden_ops" not in listed  # a trusted backend's calls are not watched
    off = IntegritySettings(verify_timed_outputs=False, check_threads=False, check_harness=False)
    rec = kbench_check(fake_backend(honest), kbench_case(), integrity=off)
    assert rec["status"] == "passed", rec["reason"]
    assert not {"timed_outputs", "threads", "harness"} & set(rec["integrity"]["checks"])
    assert set(listed) - set(rec["integrity"]["checks"]) == {"timed_outputs", "threads", "harness"}
    # the roofline check runs only where there is a roof: on a CPU without a calibration there is none
    assert ("roofline" in listed) == ("impossible" in full["metrics"])


def test_verify_timed_outputs_false_skips_the_timed_reference_check(kbench_case, kbench_check, fake_backend):
    """The setting was read but ignored: timed outputs were verified whatever the suite said."""
    def sly():
        calls = []

        def kernel(q, k, v, out, case):  # right for the checked calls, a finite wrong answer afterwards
            calls.append(1)
            honest(q, k, v, out, case)
            if len(calls) > 2:
                out[...] *= 1.5
        return kernel
    case = kbench_case()
    assert kbench_check(fake_backend(sly()), case)["status"] == "failed"
    rec = kbench_check(fake_backend(sly()), case, integrity=IntegritySettings(verify_timed_outputs=False))
    assert rec["status"] == "passed", rec["reason"]
    assert "timed_outputs" not in rec["integrity"]["checks"]


def test_the_harness_reached_through_kbench_api_is_forbidden_too():
    """kbench.api re-exports harness objects under public names: the static check resolves them, so a kernel
    cannot reach the generator, the runner or the reference by importing them from kbench.api."""
    def rules(source):
        return [(v.rule, v.message) for v in static_check(source, IntegritySettings())]

    assert rules("from kbench.api import generate_input\n")[0][0] == "forbidden_calls"
    assert "kbench.ops.inputs.lanes" in rules("import kbench\nkbench.api.philox_lanes(1, 2, 3, 4)\n")[0][1]
    assert "kbench.ops.inputs.RegeneratedInputs" in rules("from kbench import RegeneratedInputs\n")[0][1]
    assert rules("from kbench.api import BadInput, DType\n") == []  # the vocabularies are harmless
    allowed = IntegritySettings.from_mapping({"allowed_calls": ["kbench.ops.attention.softmax_scale"]})
    assert static_check("from kbench.api import softmax_scale\n", allowed) == []
