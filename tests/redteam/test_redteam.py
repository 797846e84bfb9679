"""The red-team corpus: one kernel file per known exploit, each caught with the right status and reason.

Two runs of one small case: with the default integrity settings (static checks on, so several exploits
are refused before any of their code runs) and with ``static_checks: none`` for the exploits the static
check catches, to show the dynamic checks catch them too. Honest backends must pass in both.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from kbench.plugins import PluginManager
from kbench.run.runner import RunRequest, plan_run, run_suite
from kbench.suite import suite_from_data

HERE = Path(__file__).parent

SUITE = {
    "name": "redteam",
    "grid": [{"seqlen": 256, "heads": 2, "head_dim": 32, "dtype": "fp32"}],
    # fewer verified rows than the sequence has: the rows are picked after the output exists (class 2)
    "check": {"seeds": 2, "max_rows": 64},
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
    # zeros score 1, or less where the reference is below the error floor (docs/integrity.md): 0.9 here
    "zero_output": ("failed", r"relative L2 error (1|0\.[5-9]\d*) exceeds"),
    "low_precision": ("failed", r"relative L2 error .* exceeds the fp32 bound"),
    "forbidden_call": ("failed", r"static check.*forbidden 'torch.nn.functional.scaled_dot_product_attention'"),
    "segfault": ("crashed", r"SIGSEGV \(segmentation fault\)"),
    "abort": ("crashed", r"SIGABRT"),
    "memory_blowup": ("error", r"out of memory"),
    "honest_numpy": ("passed", None),
    # the attack classes of docs/integrity.md (6, 8 and 9 are in test_sandbox_escape.py)
    "predicted_inputs": ("failed", r"static check.*module-level mutable _STATE"),
    "rows_only": ("failed", r"relative L2 error .* exceeds"),
    "settings_walk": ("failed", r"static check.*forbidden 'gc.get_objects'"),
    "clock_module_patch": ("failed", r"static check.*forbidden 'kbench.devices'"),
    "forged_record": ("failed", r"NaN/Inf|malformed reply|the worker sent|broke the protocol|samples do not add up"),
    "cache_under_ratio": ("failed", r"static check.*module-level mutable _MEMO"),
    "obfuscated_call": ("failed", r"static check.*getattr\(torch.nn.functional, <computed name>\)"),
    # answers computed ahead from other calls' buffers are stale (or, with one call per batch on a busy
    # machine, never computed): wrong when verified, or no gain; tests/test_timed_loop.py shows the property
    "work_shift": (("failed", "passed"), r"timed output wrong|^None$"),
    "deep_reply": ("failed", r"broke the protocol: a reply nested deeper"),
    # the arena is sealed: ftruncate fails with EPERM, the parent reads on, the probe answers honestly
    "arena_truncate": ("passed", None),
    # a self-restoring timer installed with setattr through a parameter, and one-call batches bought
    # with slow correctness calls (refused statically by the policy; caught at run time below without it)
    "timer_restore": ("failed", r"static check.*setattr|harness tampering: time.perf_counter_ns replaced"),
    "slow_check_batches": ("failed", r"static check|samples do not add up"),
    "empty_loop_burner": ("failed", r"static check"),
    # zeros on one call in eight; every timed call's output is checked (a few rows each)
    "sometimes_zeros": ("failed", r"on a timed call|on trial"),
    # the slot's previous answer is let go inside the next call's sample: the finalizer's work is timed (it gains
    # nothing: test_a_finalizer_shift_gains_nothing), or it runs too early and the answer is wrong
    "finalizer_shift": (("failed", "passed"), r"on a timed call|^None$"),
    # a timeit finalizer launders gc.get_objects past the audit hook and sets an instance attribute `batch` on the
    # runner: the runner's instance attributes are checked (and the parent's clock decides the time anyway:
    # benchmarks/underreporting.py runs it without the harness check)
    "laundered_runner_patch": ("failed", r"harness tampering: CallRunner instance attribute 'batch'"),
    # a raw thread finishes the answer after the call: counted among the native threads; and the outputs verified
    # are those copied inside the batch's window, the worker stopped from the reply on
    "late_finisher": ("failed", r"threads still running|output changed after the kernel returned|on a timed call"),
    # wrong on one (row, head) of one call in six: with a handful of timed calls a record may hold none
    # (tests/test_judge_clock.py measures the rate over many records)
    "one_tile_in_six": (("failed", "passed"), r"on a timed call|on trial|^None$"),
}

# the same exploits with static_checks: none -- what the checks at run time say
DYNAMIC = {
    "cache_by_identity": ("failed", r"stale"),
    # every timed call gets new input content: a content cache never hits, gains nothing, and is an
    # honest (slower) kernel -- decided without measuring speed (tests/test_execute.py shows zero hits)
    "cache_by_content": ("passed", None),
    "copy_reference": ("failed", r"audit: refused gc.get_objects"),
    "timer_patch": ("failed", r"harness tampering: time.perf_counter_ns replaced|samples do not add up"),
    "harness_patch": ("failed",
                      r"harness tampering: numpy.linalg.norm replaced|relative L2 error (1|0\.[5-9]\d*) exceeds"),
    "honest_numpy": ("passed", None),
    # class 1: the inputs come from the run's secret, not the case id: the predicted answers are wrong
    "predicted_inputs": ("failed", r"relative L2 error .* exceeds .* on trial 0"),
    # class 2: every element is NaN-checked and the rows are picked after the output exists
    "rows_only": ("failed", r"relative L2 error .* exceeds"),
    # class 3: the audit hook refuses the walk; the judge's settings live in another process anyway
    "settings_walk": ("failed", r"audit: refused gc.get_objects|not much closer to the reference"),
    # class 3: a swapped clock module is a harness change, and its stamps fall outside the parent's window
    "clock_module_patch": ("failed", r"harness tampering: kbench.devices.time replaced|samples do not add up"),
    # class 4: the runner's messages are data: a forged reply has no outputs behind it
    "forged_record": ("failed", r"NaN/Inf|malformed reply|the worker sent|broke the protocol|samples do not add up"),
    # class 5: every timed call has new content, so the cache never hits and gains nothing: an honest
    # (slower) kernel; tests/test_execute.py counts the hits (zero) without measuring any speed
    "cache_under_ratio": ("passed", None),
    # class 7: the dispatcher names the operator however the call was spelled
    "obfuscated_call": ("failed", r"forbidden operator aten\..*scaled_dot_product.* ran inside the kernel"),
    # a later call's inputs do not exist during an earlier call: answers computed ahead are stale
    "work_shift": (("failed", "passed"), r"timed output wrong|^None$"),
    # any bytes on the worker's socket are bounded data: a parser-killing reply is a failed record
    "deep_reply": ("failed", r"broke the protocol: a reply nested deeper"),
    # the arena is sealed: a shrink fails (EPERM), the parent reads on
    "arena_truncate": ("passed", None),
    # every clock read is checked against the timers captured at the worker's start
    "timer_restore": ("failed", r"harness tampering: time.perf_counter_ns replaced, seen before a clock read"),
    # batches sized by the parent's clock, one floor per record: the shaved samples do not add up
    "slow_check_batches": ("failed", r"harness tampering: kbench.worker.main.encode_reply replaced"),
    # no thread of an untrusted kernel outlives its call, so nothing of it runs in the empty loop
    "empty_loop_burner": ("failed", r"left threads still running: a thread it started \('burner'\) is alive after "
                                    r"call 1"),
    "finalizer_shift": (("failed", "passed"), r"on a timed call|^None$"),
    "laundered_runner_patch": ("failed", r"harness tampering: CallRunner instance attribute 'batch'"),
    "late_finisher": ("failed", r"threads still running|output changed after the kernel returned|on a timed call"),
    "one_tile_in_six": (("failed", "passed"), r"on a timed call|on trial|^None$"),
}

# class 10: with a loose tolerance, trivial answers pass the bound but not the trivial-predictor guard
LOOSE = {
    "trivial_predictor": ("failed", r"not much closer to the reference than the mean of the visible values"),
    "zero_output": ("failed", r"not much closer to the reference than zeros|output is constant"),
    "honest_numpy": ("passed", None),
}

HONEST_REGISTRY = ["numpy", "numpy-flash", "torch-sdpa"]

#: honest kernel files outside the corpus: the evolve plugin's seeds (untrusted, like every candidate)
SEEDS = sorted((HERE.parents[1] / "plugins/kbench-evolve/kbench_evolve/seeds").glob("*_seed.py"))


def _run(tmp_path_factory, files, integrity, *, honest=HONEST_REGISTRY, case_timeout=None, tolerance=None,
         seeds=()):
    pm = PluginManager()
    suite = suite_from_data({**SUITE, "integrity": {**SUITE["integrity"], **integrity}})
    honest = [b for b in honest if b in pm.registry.backends]
    seeds = [p for p in seeds if _substrate(p) in pm.registry.substrates]
    out = tmp_path_factory.mktemp("redteam") / "r.json"
    req = RunRequest(suite=suite, device="cpu", backend_patterns=honest, case_timeout=case_timeout,
                     kernel_files=[str(HERE / f"{f}.py") for f in files] + [str(p) for p in seeds], output=out)
    planned = plan_run(pm, req)
    if tolerance:  # looser than a suite may ask (the schema caps it): as a program using the API could
        planned.ctx.check = dataclasses.replace(planned.ctx.check, tolerance=tolerance)
    writer = run_suite(pm, planned)
    return {r["backend"]: r for r in writer.records}, honest + [f"file:{p.stem}" for p in seeds]


def _substrate(path: Path) -> str:
    from kbench.source import literal_globals

    return literal_globals(path.read_text(), ("SUBSTRATE",)).get("SUBSTRATE", "numpy")


#: its module-scoped runs are made once: every test of the module in one xdist worker (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("redteam")


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    return _run(tmp_path_factory, DEFAULT, {}, seeds=SEEDS)


@pytest.fixture(scope="module")
def dynamic_run(tmp_path_factory):
    return _run(tmp_path_factory, DYNAMIC, {"static_checks": "none"}, honest=["numpy"], seeds=SEEDS)


def _expect(records, name, status, pattern):
    rec = records[f"file:{name}"]
    assert rec["status"] in ((status,) if isinstance(status, str) else status), (rec["status"], rec["reason"])
    if pattern:
        assert re.search(pattern, str(rec["reason"])), rec["reason"]


@pytest.fixture(scope="module")
def loose_run(tmp_path_factory):
    return _run(tmp_path_factory, LOOSE, {"static_checks": "none"}, honest=["numpy"], tolerance={"fp32": 5.0})


@pytest.mark.parametrize("name", sorted(LOOSE))
def test_trivial_predictors_caught_under_a_loose_tolerance(loose_run, name):
    _expect(loose_run[0], name, *LOOSE[name])


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
    from kbench.source import literal_globals

    # classes 6, 8 and 9 (sandbox escapes) have their own test module
    sandbox = literal_globals((HERE / "test_sandbox_escape.py").read_text(), ("SANDBOX_KERNELS",))["SANDBOX_KERNELS"]
    stems = {p.stem for p in HERE.glob("*.py") if not p.stem.startswith("test_")}
    assert stems == set(DEFAULT) | set(LOOSE) | {"infinite_loop"} | set(sandbox)


@pytest.mark.parametrize("run", ["default_run", "dynamic_run", "loose_run"])
def test_honest_registry_backends_never_flagged(request, run):
    records, honest = request.getfixturevalue(run)
    assert "numpy" in honest
    if run != "loose_run":  # the numpy seed at least: its substrate is built in
        assert "file:numpy_attention_seed" in honest
    for name in honest:
        rec = records[name]
        assert rec["status"] == "passed", (name, rec["reason"])
        checks = rec["integrity"]["checks"]
        assert {"threads", "timed_outputs", "parent_clock", "trivial_predictors", "secret_inputs"} <= set(checks)


def test_crash_records_carry_the_stderr_tail(default_run):
    rec = default_run[0]["file:segfault"]
    # faulthandler in the worker prints the Python stack of the crash
    assert "Fatal Python error: Segmentation fault" in rec["stderr_tail"] and "in attention" in rec["stderr_tail"]
    assert rec["status"] == "crashed" and "cause" not in rec  # the kernel's doing, not the infrastructure's
    assert rec["signal"] == "SIGSEGV"


def test_a_finalizer_shift_gains_nothing(dynamic_run):
    """On 54db9a9 the finalizer of a slot's previous answer did each call's work after the stop mark: passed at
    0.00-0.61x of an honest kernel. Let go inside the next call's sample, its work is timed: it is no faster than
    the same maths done honestly, the registered ``numpy`` backend whose function the kernel calls (three quarters
    of it, on a shared machine, at worst; ``honest_numpy`` is other maths, einsum, several times slower)."""
    records, _ = dynamic_run
    shifted, honest = records["file:finalizer_shift"], records["numpy"]
    if shifted["status"] == "passed":
        assert shifted["timing"]["samples_kind"] == "parent"
        assert shifted["stats"]["median"] >= 0.75 * honest["stats"]["median"], (shifted["stats"], honest["stats"])
