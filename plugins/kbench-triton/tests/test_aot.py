"""Ahead-of-time compilation for CUDA targets on this CPU-only machine: the kernel builds for Hopper.

The default run compiles the tuned configuration of every (head_dim, mask) for sm_90 and a few
more; the sweeps over every shipped configuration, architecture and dtype are marked ``slow`` (CI runs
them), every tunable combination for sm_90 ``nightly``.
"""
from __future__ import annotations

import json

import pytest

pytest.importorskip("triton")

from kbench_triton import aot  # noqa: E402
from kbench_triton.backends import kernel_module  # noqa: E402


def _assert_launchable(report: aot.CompileReport) -> None:
    assert report.status == "ok", f"{report}"
    assert report.registers is not None and 0 < report.registers <= 255, report
    assert report.spill_stores is not None and report.stack is not None, report
    assert 0 < report.shared <= aot.SMEM_LIMIT[report.arch], report


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_tuned_config_builds_for_sm90(head_dim, causal):
    config = kernel_module().config_for(head_dim, causal, "bf16")
    _assert_launchable(aot.compile_one(aot.Target(90, head_dim, "bf16", causal), config))


def test_fp32_config_builds_for_sm80():
    # fp32 products run as 3xTF32 on tensor cores; head_dim 256 (20 s to compile) is in the slow sweep
    _assert_launchable(aot.compile_one(aot.Target(80, 64, "fp32", True), kernel_module().config_for(64, True, "fp32")))


def test_shared_memory_grows_with_the_pipeline_depth():
    one, three = (aot.compile_one(aot.Target(90, 64, "fp16", False),
                                  dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=s)) for s in (1, 3))
    assert one.status == three.status == "ok"
    assert three.shared > one.shared


def test_over_the_limit_is_reported_not_launched():
    # four stages of 128x128 bf16 K and V tiles: 256 KiB, over sm_80's 163 KiB
    report = aot.compile_one(aot.Target(80, 128, "bf16", False),
                             dict(BLOCK_M=64, BLOCK_N=128, num_warps=4, num_stages=4))
    assert report.status == "too-much-smem" and report.shared > aot.SMEM_LIMIT[80], report
    assert aot.failures([report], every_config=False) == [report]
    assert aot.failures([report], every_config=True) == []


def test_compile_error_is_reported():
    # tl.arange needs a power of two: head_dim 96 cannot compile
    report = aot.compile_one(aot.Target(90, 96, "bf16", False), dict(BLOCK_M=64, BLOCK_N=64, num_warps=4,
                                                                     num_stages=2))
    assert report.status == "error" and "power of 2" in report.message.lower().replace("two", "2"), report
    assert aot.failures([report], every_config=True) == [report]


def test_supported_archs_include_hopper():
    assert 90 in aot.supported_archs()


def test_command_prints_json_and_exits_0():
    from click.testing import CliRunner

    from kbench_triton.cli import triton_aot

    result = CliRunner().invoke(triton_aot, ["--arch", "80", "--head-dim", "64,128", "--mask", "causal", "--dtype",
                                             "fp16", "--configs", "tuned", "--kernel", "triton", "--format", "json"])
    assert result.exit_code == 0, result.output
    reports = json.loads(result.output)
    assert [(r["arch"], r["head_dim"], r["dtype"], r["causal"]) for r in reports] == [(80, 64, "fp16", True),
                                                                                      (80, 128, "fp16", True)]
    assert all(r["status"] == "ok" and r["registers"] for r in reports)


def test_command_refuses_an_unknown_arch():
    from click.testing import CliRunner

    from kbench_triton.cli import triton_aot

    result = CliRunner().invoke(triton_aot, ["--arch", "75"])
    assert result.exit_code == 2 and "sm_75" in result.output


@pytest.mark.slow
@pytest.mark.parametrize("arch", aot.ARCHS)
def test_every_shipped_config_builds(arch):
    if arch not in aot.supported_archs():
        pytest.skip(f"this Triton cannot target sm_{arch}")
    jobs = list(aot.plan([arch], [64, 128, 256], ["bf16", "fp16", "fp32"], [False, True], configs="shipped"))
    for report in aot.sweep(jobs):
        _assert_launchable(report)


@pytest.mark.nightly
def test_every_tunable_combination_compiles_for_sm90():
    jobs = list(aot.plan([90], [64, 128, 256], ["bf16"], [False, True], configs="every"))
    reports = aot.sweep(jobs)
    assert not aot.failures(reports, every_config=True), [r for r in reports if r.status == "error"]


@pytest.mark.parametrize("head_dim", [64, 128])
def test_hopper_kernel_uses_tma_wgmma_and_setmaxnreg_and_splits_the_rows_once_on_sm90(head_dim, tmp_path):
    # the warp-specialised path with a causal mask: two consumer warpgroups of 64 rows each, and no TMA
    # coordinate of theirs reused as the base of a shifted row index (the data partition's double shift)
    config = {**aot._kernel_module("triton-hopper").config_for(head_dim, True, "bf16"), "WARP_SPECIALIZE": 1,
              "BLOCK_M": 128}
    target = aot.Target(90, head_dim, "bf16", True, "triton-hopper")
    report = aot.compile_one(target, config, emit_ptx=tmp_path)
    _assert_launchable(report)
    assert (report.tma, report.wgmma, report.warp_specialize, report.warp_specialized, report.setmaxnreg) == \
        (True, True, True, True, True), report
    assert report.ws_consumer_rows == [64, 64] and not report.ws_duplicated, report
    assert report.ws_double_shift == [] and aot.failures([report], every_config=False) == []
    ptx = (tmp_path / aot.ptx_file_name(target, config)).read_text()
    assert "cp.async.bulk.tensor" in ptx and "wgmma.mma_async" in ptx and "setmaxnreg" in ptx


def test_a_row_index_built_on_the_tma_coordinate_is_flagged_as_shifted_twice():
    # the pattern the Hopper kernel had (offs_m = start_m + tl.arange) in a minimal warp-specialised loop
    import sys
    from pathlib import Path

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sys.path.insert(0, str(Path(__file__).parent))
    from ws_shifted_rows_kernel import shifted_rows_kernel

    sig = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "O": "*bf16", "seqlen": "i32", "qk_scale": "fp32",
           "HEAD_DIM": "constexpr", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr"}
    compiled = triton.compile(ASTSource(shifted_rows_kernel, sig, dict(HEAD_DIM=64, BLOCK_M=128, BLOCK_N=64),
                                        attrs={(i,): [["tt.divisibility", 16]] for i in range(5)}),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 2})
    ws = aot.analyse_warp_specialization(compiled.asm["ttgir"])
    assert ws.consumer_rows == (64, 64)
    assert len(ws.double_shift) == 1 and "shifted TMA coordinate" in ws.double_shift[0], ws
    report = aot.CompileReport(90, 64, "bf16", True, 128, 64, 4, 2, kernel="triton-hopper",
                               ws_double_shift=list(ws.double_shift))
    assert aot.failures([report], every_config=True) == [report]


def test_64_row_blocks_give_both_consumers_the_whole_tile():
    # too few rows to split between two warpgroups: Triton keeps two consumers that do the same products
    report = aot.compile_one(aot.Target(90, 64, "bf16", True, "triton-hopper"),
                             dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2, WARP_SPECIALIZE=1))
    assert report.status == "ok" and report.warp_specialized and report.ws_consumer_rows == [64, 64], report
    assert report.ws_duplicated and "dup" in aot.table_rows([report])[1][0][9]


def test_fa2_kernel_uses_no_tma_and_hopper_kernel_without_ws_no_setmaxnreg():
    fa2 = aot.compile_one(aot.Target(90, 64, "bf16", False), kernel_module().config_for(64, False, "bf16"))
    assert fa2.status == "ok" and (fa2.tma, fa2.wgmma, fa2.setmaxnreg) == (False, True, False), fa2
    config = {**aot._kernel_module("triton-hopper").config_for(64, False, "bf16"), "WARP_SPECIALIZE": 0}
    plain = aot.compile_one(aot.Target(90, 64, "bf16", False, "triton-hopper"), config)
    assert plain.status == "ok" and plain.tma and not plain.warp_specialized and not plain.setmaxnreg, plain


def test_plan_skips_the_hopper_kernel_below_sm90_and_for_fp32():
    jobs = list(aot.plan([80, 90], [64], ["bf16", "fp32"], [False], configs="tuned",
                         kernels=["triton", "triton-hopper"]))
    hopper = [t for t, _ in jobs if t.kernel == "triton-hopper"]
    assert [(t.arch, t.dtype) for t in hopper] == [(90, "bf16")]
    assert len([t for t, _ in jobs if t.kernel == "triton"]) == 4


def test_command_emits_ptx_and_reports_features(tmp_path):
    from click.testing import CliRunner

    from kbench_triton.cli import triton_aot

    result = CliRunner().invoke(triton_aot, ["--arch", "90", "--head-dim", "128", "--mask", "full", "--configs",
                                             "tuned", "--emit-ptx", str(tmp_path), "--format", "json"])
    assert result.exit_code == 0, result.output
    reports = {r["kernel"]: r for r in json.loads(result.output)}
    assert set(reports) == {"triton", "triton-hopper", "triton-bwd-dkdv", "triton-bwd-dq"}
    assert reports["triton-hopper"]["tma"] and not reports["triton"]["tma"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        aot.ptx_file_name(aot.Target(90, 128, "bf16", False, k), aot.configs_for("tuned", 128, False, "bf16", k)[0])
        for k in reports)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_backward_kernels_build_for_sm90_without_spills(dtype):
    # the dK/dV and dQ kernels with the tiles the backend launches (backward.bwd_config), causal and not
    jobs = list(aot.plan([90], [64, 128, 256] if dtype != "fp32" else [64], [dtype], [False, True],
                         configs="tuned", kernels=aot.BACKWARD))
    assert len(jobs) == (12 if dtype != "fp32" else 4)
    for report in aot.sweep(jobs):
        _assert_launchable(report)
        assert report.spill_stores == 0, report
        # dK/dV at head_dim 256 has 32-key tiles, too short for a warpgroup's 64-row wgmma (mma.sync instead)
        short_tiles = report.kernel == "triton-bwd-dkdv" and report.head_dim == 256
        if dtype == "bf16":
            assert report.wgmma != short_tiles, report


@pytest.mark.nightly
def test_every_hopper_tunable_combination_compiles_for_sm90():
    jobs = list(aot.plan([90], [64, 128, 256], ["bf16"], [False, True], configs="every", kernels=["triton-hopper"]))
    reports = aot.sweep(jobs)
    assert not aot.failures(reports, every_config=True), [r for r in reports if r.status == "error"]


def test_a_second_sweep_of_the_same_jobs_comes_from_the_cache(tmp_path, monkeypatch):
    """Reports are kept by a hash of the kernel's source, the target, the configuration and the toolchain."""
    monkeypatch.setenv(aot.CACHE_ENV, str(tmp_path))
    jobs = list(aot.plan([90], [64], ["bf16"], [False], configs="tuned"))[:1]
    first = aot.sweep(jobs)
    compiled = []
    monkeypatch.setattr(aot, "compile_one", lambda *a, **k: compiled.append(a) or first[0])
    second = aot.sweep(jobs)
    assert compiled == [] and second[0].cached and not first[0].cached
    assert {**second[0].as_dict(), "cached": False} == first[0].as_dict()
    other = [(jobs[0][0], {**jobs[0][1], "num_stages": jobs[0][1]["num_stages"] + 1})]
    aot.sweep(other)  # another configuration is another key: compiled
    assert len(compiled) == 1
    monkeypatch.setenv(aot.CACHE_ENV, "")  # an empty value turns the cache off
    aot.sweep(jobs)
    assert len(compiled) == 2
