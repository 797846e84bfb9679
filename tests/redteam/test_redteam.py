"""The red-team corpus: one kernel file per known exploit, each caught with the right status and reason.

Two runs of one small case: with the default integrity settings (static checks on, so several exploits
are refused before any of their code runs) and with ``static_checks: none`` for the exploits the static
check catches, to show the dynamic checks catch them too. Honest backends must pass in both.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from kbench.plugins import PluginManager
from kbench.runner import RunRequest, plan_run, run_suite
from kbench.suite import suite_from_data

HERE = Path(__file__).parent

SUITE = {
    "name": "redteam",
    "grid": [{"seqlen": 256, "heads": 2, "head_dim": 32, "dtype": "fp32"}],
    "check": {"seeds": 2},
    "timing": {"warmup_time": 0.0, "min_samples": 5, "min_time": 0.0, "max_time": 0.1, "target_rel_se": 1.0,
               "rotate": 2, "case_timeout": 60},
    "integrity": {"memory_limit": "2GiB"},
}

# file -> (status, reason pattern) with the default settings
DEFAULT = {
    "cache_by_identity": ("failed", r"static check.*module-level mutable _CACHE"),
    "cache_by_content": ("failed", r"static check.*mutable default argument"),
    "copy_reference": ("failed", r"static check.*forbidden 'gc.get_objects'"),
    "background_thread": ("failed", r"output changed after the kernel returned|threads still running"),
    "lazy_result": ("failed", r"returned a _Lazy, not a ndarray.*materialised"),
    "timer_patch": ("failed", r"static check.*assignment to 'time.perf_counter_ns'"),
    "harness_patch": ("failed", r"static check.*assignment to 'numpy.linalg.norm'"),
    "input_modified": ("failed", r"input 'q' was modified"),
    "zero_output": ("failed", r"relative L2 error 1 exceeds"),
    "low_precision": ("failed", r"relative L2 error .* exceeds the fp32 bound"),
    "forbidden_call": ("failed", r"static check.*forbidden 'torch.nn.functional.scaled_dot_product_attention'"),
    "segfault": ("crashed", r"SIGSEGV \(segmentation fault\)"),
    "abort": ("crashed", r"SIGABRT"),
    "memory_blowup": ("error", r"out of memory"),
    "honest_numpy": ("passed", None),
}

# the same exploits with static_checks: none -- what the checks at run time say
DYNAMIC = {
    "cache_by_identity": ("failed", r"stale"),
    # every timed call gets new input content: a content cache never hits, gains nothing, and is an
    # honest (slower) kernel -- decided without measuring speed (tests/test_execute.py shows zero hits)
    "cache_by_content": ("passed", None),
    "copy_reference": ("failed", r"audit: refused gc.get_objects"),
    "timer_patch": ("failed", r"harness tampering: time.perf_counter_ns replaced|samples do not add up"),
    "harness_patch": ("failed", r"harness tampering: numpy.linalg.norm replaced|relative L2 error 1 exceeds"),
    "honest_numpy": ("passed", None),
}

HONEST_REGISTRY = ["numpy", "numpy-flash", "torch-sdpa"]


def _run(tmp_path_factory, files, integrity, *, honest=HONEST_REGISTRY, case_timeout=None):
    pm = PluginManager()
    suite = suite_from_data({**SUITE, "integrity": {**SUITE["integrity"], **integrity}})
    honest = [b for b in honest if b in pm.registry.backends]
    out = tmp_path_factory.mktemp("redteam") / "r.json"
    req = RunRequest(suite=suite, device="cpu", backend_patterns=honest, case_timeout=case_timeout,
                     kernel_files=[str(HERE / f"{f}.py") for f in files], output=out)
    writer = run_suite(pm, plan_run(pm, req))
    return {r["backend"]: r for r in writer.records}, honest


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    return _run(tmp_path_factory, DEFAULT, {})


@pytest.fixture(scope="module")
def dynamic_run(tmp_path_factory):
    return _run(tmp_path_factory, DYNAMIC, {"static_checks": "none"}, honest=["numpy"])


def _expect(records, name, status, pattern):
    rec = records[f"file:{name}"]
    assert rec["status"] == status, (rec["status"], rec["reason"])
    if pattern:
        assert re.search(pattern, rec["reason"]), rec["reason"]


@pytest.mark.parametrize("name", sorted(DEFAULT))
def test_exploit_caught_with_default_settings(default_run, name):
    _expect(default_run[0], name, *DEFAULT[name])


@pytest.mark.parametrize("name", sorted(DYNAMIC))
def test_exploit_caught_without_static_checks(dynamic_run, name):
    _expect(dynamic_run[0], name, *DYNAMIC[name])


def test_infinite_loop_times_out_and_the_run_goes_on(tmp_path_factory):
    # its own run with a short timeout (the main runs allow a minute: torch loads slowly on a busy machine)
    records, _ = _run(tmp_path_factory, ["infinite_loop", "honest_numpy"], {}, honest=[], case_timeout=3)
    _expect(records, "infinite_loop", "timeout", r"exceeded the case timeout of 3 s")
    _expect(records, "honest_numpy", "passed", None)


def test_every_corpus_file_has_an_expectation():
    from kbench.integrity import literal_globals

    # classes 6, 8 and 9 (sandbox escapes) have their own test module
    sandbox = literal_globals((HERE / "test_sandbox_escape.py").read_text(), ("SANDBOX_KERNELS",))["SANDBOX_KERNELS"]
    stems = {p.stem for p in HERE.glob("*.py") if not p.stem.startswith("test_")}
    assert stems == set(DEFAULT) | {"infinite_loop"} | set(sandbox)


@pytest.mark.parametrize("run", ["default_run", "dynamic_run"])
def test_honest_registry_backends_never_flagged(request, run):
    records, honest = request.getfixturevalue(run)
    assert "numpy" in honest
    for name in honest:
        rec = records[name]
        assert rec["status"] == "passed", (name, rec["reason"])
        assert "threads" in rec["integrity"]["checks"] and "timed_outputs" in rec["integrity"]["checks"]


def test_crash_records_carry_the_stderr_tail(default_run):
    rec = default_run[0]["file:segfault"]
    # faulthandler in the worker prints the Python stack of the crash
    assert "Fatal Python error: Segmentation fault" in rec["stderr_tail"] and "in attention" in rec["stderr_tail"]
    assert rec["signal"] == "SIGSEGV"
