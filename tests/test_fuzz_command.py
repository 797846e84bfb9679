"""``kbench fuzz``: kernels with planted bugs that a power-of-two suite passes are caught and shrunk."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kbench.cli import cli
from kbench.plugins import get_plugin_manager
from kbench.suite import load_suite

PLANTED = Path(__file__).parent / "kernels" / "planted"
POW2_SUITE = PLANTED / "pow2.yaml"

#: kernel file -> (the smallest failing case, parameter by parameter, in the fuzzer's space): a shrunk case may be
#: at most twice as large in every one of these (the shrinker's promise)
SMALLEST = {
    "tail_dropped.py": {"batch": 1, "seqlen_q": 1, "seqlen_kv": 1, "heads_q": 1, "heads_kv": 1, "head_dim": 8},
    "causal_topleft.py": {"batch": 1, "seqlen_q": 1, "seqlen_kv": 2, "heads_q": 1, "heads_kv": 1, "head_dim": 8},
    "gqa_wrong_head.py": {"batch": 1, "seqlen_q": 1, "seqlen_kv": 1, "heads_q": 4, "heads_kv": 2, "head_dim": 8},
    "pow2_only.py": {"batch": 1, "seqlen_q": 1, "seqlen_kv": 3, "heads_q": 1, "heads_kv": 1, "head_dim": 8},
    "head_dim_chunks.py": {"batch": 1, "seqlen_q": 1, "seqlen_kv": 2, "heads_q": 1, "heads_kv": 1, "head_dim": 8},
}


def fuzz(tmp_path, *args):
    out = tmp_path / "report.json"
    res = CliRunner().invoke(cli, ["fuzz", *args, "-o", str(out)], catch_exceptions=False)
    return res, (json.loads(out.read_text()) if out.exists() else None)


def assert_caught(tmp_path, kernel: str, budget: int = 90) -> dict:
    res, report = fuzz(tmp_path, "-b", str(PLANTED / kernel), "--budget", str(budget), "--seed", "7")
    assert res.exit_code == 1, res.output
    (entry,) = report["backends"]
    failure = entry["failure"]
    assert failure is not None and entry["elapsed_seconds"] <= budget + 5
    for name, smallest in SMALLEST[kernel].items():
        assert failure["case"][name] <= 2 * smallest, (name, failure["case"])
    # the repro suite holds that case alone, and is a suite `kbench run` reads
    suite = load_suite(entry["suite"])
    (case,) = suite.plan("cpu", get_plugin_manager().registry.op("attention")).cases
    assert case.id == failure["case_id"]
    assert entry["repro"] == f"kbench run {entry['suite']} -b {PLANTED / kernel}"
    assert f"minimal case: {failure['case_id']}" in res.output and "repro:" in res.output
    return entry


def test_pow2_only_kernel_caught_and_shrunk(tmp_path):
    """Default tier: the kernel exact only on power-of-two key lengths is caught in a few seconds, shrunk to a
    length of 3 or 5 (the smallest that is not a power of two is 3)."""
    from hypothesis.configuration import storage_directory

    before = storage_directory(intent_to_write=False).home_directory
    entry = assert_caught(tmp_path, "pow2_only.py", budget=40)
    assert entry["failure"]["case"]["seqlen_kv"] in (3, 5, 6)
    assert entry["failure"]["status"] == "failed" and "relative L2" in entry["failure"]["reason"]
    assert storage_directory(intent_to_write=False).home_directory == before   # the session's Hypothesis home


@pytest.mark.slow
@pytest.mark.parametrize("kernel", sorted(SMALLEST))
def test_planted_bug_caught_within_90s(tmp_path, kernel):
    assert_caught(tmp_path, kernel)


@pytest.mark.slow
def test_planted_kernels_pass_the_power_of_two_suite():
    """What makes them planted: every one is exact on the usual shapes (checked through the same judge)."""
    from kbench.fuzz.checker import Checker
    from kbench.kernelfile import KernelFileRef

    pm = get_plugin_manager()
    cases = load_suite(POW2_SUITE).plan("cpu", pm.registry.op("attention")).cases
    with Checker(pm, "attention", "cpu") as checker:
        for kernel in sorted(p.name for p in PLANTED.glob("*.py")):   # the whole corpus, all fifteen
            backend = KernelFileRef(PLANTED / kernel, pm.registry)
            bad = {c.id: r["reason"] for c in cases if (r := checker.check(backend, c))["status"] != "passed"}
            assert not bad, (kernel, bad)


@pytest.mark.slow
@pytest.mark.parametrize("kernel, low, high", [("long_row_reset.py", 1025, 2050), ("split_4k_dropped.py", 4097, 8193)])
def test_a_long_row_bug_is_caught_and_shrunk_towards_its_smallest_failing_length(tmp_path, kernel, low, high):
    res, report = fuzz(tmp_path, "-b", str(PLANTED / kernel), "--budget", "90", "--seed", "7")
    assert res.exit_code == 1, res.output
    failure = report["backends"][0]["failure"]
    assert low <= failure["case"]["seqlen_kv"] <= high and failure["case"]["batch"] == 1, failure["case"]


@pytest.mark.slow
def test_one_worker_for_the_whole_fuzz_and_the_seed_repeats(tmp_path):
    """Every check of a fuzz, failing ones included, goes to the same worker; the same seed gives the same case."""
    from kbench.fuzz.checker import Checker
    from kbench.fuzz.engine import fuzz as run_fuzz, fuzz_secret
    from kbench.fuzz.space import Space
    from kbench.kernelfile import KernelFileRef

    pm = get_plugin_manager()
    backend = KernelFileRef(PLANTED / "causal_topleft.py", pm.registry)
    found, pids = [], set()
    for _ in range(2):
        with Checker(pm, "attention", "cpu", secret=fuzz_secret(3)) as checker:
            seen = []
            result = run_fuzz(backend, checker, Space("attention", ("fp32",)), budget=60, seed=3,
                              on_case=lambda cid, rec: seen.append(rec))
        found.append(result.failure.case_id)
        assert result.failure.failing_checks >= 1 and sum(r["status"] == "failed" for r in seen) >= 1
        assert {r["worker"]["starts"] for r in seen} == {1}
        pids.add(len({r["worker"]["pid"] for r in seen}))
    assert found[0] == found[1] and pids == {1}


def test_clean_backend_exits_0_saying_how_many(tmp_path):
    """As a command of its own: exit 0, the count, and no ``.hypothesis`` directory left where it ran (Hypothesis's
    files go to the user's cache)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-c", "from kbench.cli import main; main()", "fuzz", "-b", "numpy", "--budget", "3", "--seed", "1",
                           "--dtype", "fp32", "-o", "report.json"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (entry,) = json.loads((tmp_path / "report.json").read_text())["backends"]
    assert entry["failure"] is None and entry["checked"] >= 1
    assert f"no failure; {entry['checked']} cases checked" in proc.stdout
    # whether Hypothesis writes anything at all (a cache of constants) depends on its version: what is checked is
    # that nothing lands where the command ran, and that whatever was written is under the user's cache
    left = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()} - {"report.json"}
    assert not (tmp_path / ".hypothesis").exists()
    assert all(name.startswith("cache/kbench/hypothesis/") for name in left), left


def test_hypothesis_home_is_the_user_cache_while_fuzzing_and_restored_after(tmp_path, monkeypatch):
    """Where Hypothesis would write during a fuzz (whatever its version writes): ``$XDG_CACHE_HOME/kbench/hypothesis``,
    the session's own home put back after."""
    from hypothesis.configuration import storage_directory

    from kbench.fuzz.engine import _hypothesis_home

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    before = storage_directory(intent_to_write=False).home_directory
    with _hypothesis_home():
        home = storage_directory(intent_to_write=False).home_directory
    assert Path(home) == tmp_path / "xdg" / "kbench" / "hypothesis"
    assert storage_directory(intent_to_write=False).home_directory == before


@pytest.mark.parametrize("args, message", [
    (["-b", "no-such-backend"], "matches no backend"),
    (["-b", "numpy-decode", "--op", "attention"], "matches no backend of op 'attention'"),
    (["-b", "numpy-varlen", "--dtype", "fp8_e4m3"], "takes none of the dtypes"),
    (["-b", str(PLANTED / "pow2_only.py"), "--op", "decode_attention"], "implements op 'attention'"),
    (["-b", "missing_kernel.py"], "kernel file not found"),
])
def test_bad_input_exit_2(tmp_path, args, message):
    res, _ = fuzz(tmp_path, *args, "--budget", "2")
    assert res.exit_code == 2 and message in res.output, res.output


def test_the_space_draws_what_the_backend_declares_and_only_that():
    from hypothesis import find, given, settings

    from kbench.fuzz.space import Space

    ops = get_plugin_manager().registry
    full = Space("attention", ("fp32", "bf16"), frozenset({"bwd", "window", "softcap"}))
    assert find(full.strategy(), lambda p: p.get("mode") == "bwd")["mode"] == "bwd"
    assert find(full.strategy(), lambda p: "window" in p and "softcap" in p)
    smallest = find(full.strategy(), lambda p: True)   # where shrinking ends
    assert smallest == {"batch": 1, "seqlen_q": 1, "seqlen_kv": 1, "heads_q": 1, "heads_kv": 1, "head_dim": 8,
                        "causal": False, "dtype": "fp32"}
    paged = Space("decode_attention", ("fp16",), frozenset({"paged"}))
    assert find(paged.strategy(), lambda p: p.get("page_size", 0) > 0)

    @settings(max_examples=50, database=None, deadline=None)
    @given(Space("attention", ("fp32",)).strategy(), Space("decode_attention", ("fp32",)).strategy(),
           Space("attention_varlen", ("fp16",)).strategy())
    def plain(a, d, v):
        assert not {"mode", "window", "softcap"} & set(a) and "page_size" not in d
        for op, params in (("attention", a), ("decode_attention", d), ("attention_varlen", v)):
            case = ops.op(op).make_case(params)   # every draw is a case the op accepts
            assert op != "attention" or case["heads_q"] % case["heads_kv"] == 0
    plain()


@pytest.mark.parametrize("op, params", [
    ("attention_varlen", {"seqlens_q": [3, 5], "seqlens_kv": [7, 2], "heads_q": 2, "heads_kv": 1, "head_dim": 8,
                          "causal": True, "dtype": "fp16"}),
    ("attention", {"batch": 1, "seqlen_q": 3, "seqlen_kv": 5, "heads_q": 2, "heads_kv": 1, "head_dim": 8,
                   "causal": False, "dtype": "fp32", "window": [2, -1], "softcap": 5.0, "mode": "bwd"}),
    ("decode_attention", {"batch": 2, "seqlen_q": 1, "seqlen_kv": 9, "heads_q": 2, "heads_kv": 2, "head_dim": 8,
                          "dtype": "fp32", "page_size": 3}),
])
def test_the_repro_suite_holds_exactly_the_failing_case(tmp_path, op, params):
    """List-valued parameters (varlen lengths, a window) are one case's values in the suite, not grid axes."""
    from kbench.fuzz.engine import Failure, FuzzResult, write_repro

    result = FuzzResult("k", "k.py", op, "cpu", 5, 1.0, ("fp32",))
    result.failure = Failure(params, "?", "failed", "relative L2 ...")
    path = write_repro(result, tmp_path)
    op_ = get_plugin_manager().registry.op(op)
    (case,) = load_suite(path).plan("cpu", op_).cases
    assert case.id == op_.make_case(params).id and result.repro == f"kbench run {path} -b k.py"


def test_a_harness_that_cannot_check_is_exit_2_not_a_kernel_failure(tmp_path, monkeypatch):
    from kbench.testing import sandbox_unavailable

    sandbox_unavailable(monkeypatch)
    res, report = fuzz(tmp_path, "-b", str(PLANTED / "tail_dropped.py"), "--budget", "20", "--seed", "1")
    assert res.exit_code == 2 and "the harness could not check planted-tail-dropped" in res.output, res.output
    assert "simulated" in res.output and report is None and not list(tmp_path.glob("fuzz-*.yaml"))
