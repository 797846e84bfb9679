"""The Triton backward in Triton's interpreter on the CPU: gradients against float64 autograd.

All checks run in ONE subprocess (interpret_bwd_worker.py) with TRITON_INTERPRET=1, as
test_interpreter.py does for the forward. fp32 and fp16 (the interpreter's bf16 is wrong: triton issue
11584; bf16 runs in test_gpu.py).
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).parent))
from interpret_bwd_worker import CASES, KBENCH_CASES, SHIPPED_CASES  # noqa: E402
from interpret_worker import run_in_interpreter  # noqa: E402

WORKER = Path(__file__).with_name("interpret_bwd_worker.py")
OUTPUTS = ("out", "dq", "dk", "dv")


#: its module-scoped runs are made once: every test of the module in one xdist worker (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("triton-backward")


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict:
    return run_in_interpreter(WORKER, tmp_path_factory.mktemp("interp-bwd") / "results.json")


def _within(result: dict, errors: dict, where: str) -> None:
    assert "error" not in result, f"{where}: {result.get('error')}"
    for name in OUTPUTS:
        assert errors[name] <= result["bound"], f"{where}: {name}: rel L2 {errors[name]:.3g} > {result['bound']}"


@pytest.mark.parametrize("case", [*CASES, *SHIPPED_CASES])
def test_gradients_match_float64_autograd(interpreted, case):
    result = interpreted[f"grad/{case}"]
    _within(result, result.get("rel_l2", {}), case)


@pytest.mark.parametrize("mode", ["bwd", "fwd_bwd"])
def test_training_kernel_on_harness_arrays(interpreted, mode):
    # forward() then backward() (out copied from what the forward saved), and the whole call
    result = interpreted["training-kernel/gqa-causal-fp16"]
    _within(result, result.get("rel_l2", {}).get(mode, {}), mode)


@pytest.mark.parametrize("case", ["gqa-causal-sq<sk-ragged-fp32", "mqa-causal-sq>sk-ragged-fp32"])
def test_causal_passes_never_read_blocks_in_the_future(interpreted, case):
    # NaN in the blocks each pass must skip: reading them at all would poison the checked block
    result = interpreted[f"loop-bounds/{case}"]
    assert "error" not in result, result.get("error")
    for check, err in result.items():
        assert err < 1e-5, f"{case}: {check}: rel L2 {err} (inf: NaN read from a skipped block)"


@pytest.mark.parametrize("mode", ["bwd", "fwd_bwd"])
@pytest.mark.parametrize("case", list(KBENCH_CASES))
def test_backend_passes_kbench_gradient_checks(interpreted, mode, case):
    # kbench's own path: poisoned out/dq/dk/dv, two seeds, the op's float64 gradient reference
    result = interpreted[f"kbench/{mode}/{case}"]
    assert result["status"] == "passed", f"{mode}/{case}: {result['status']}: {result['reason']}"
    assert set(result["outputs"]) == set(OUTPUTS)
    for name, err in result["outputs"].items():
        assert err["rel_l2"] <= err["bound"], (name, err)


def test_kernel_file_backward_through_the_triton_substrate(interpreted):
    assert interpreted["kernel-file/break-dk=0"]["status"] == "passed", interpreted["kernel-file/break-dk=0"]
    broken = interpreted["kernel-file/break-dk=1"]
    assert broken["status"] == "failed" and broken["reason"].startswith("dk:"), broken


def test_backend_declares_the_backward_and_the_others_do_not(kbench_pm):
    backends = kbench_pm.registry.backends
    assert backends["triton"].features == {"bwd", "fwd_bwd"}
    assert backends["triton-autotune"].features == backends["triton-hopper"].features == frozenset()
