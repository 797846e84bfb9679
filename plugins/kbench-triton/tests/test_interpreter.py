"""The kernel's answers, in Triton's interpreter on the CPU, against kbench's float64 reference.

All checks run in ONE subprocess (interpret_worker.py) with TRITON_INTERPRET=1: the variable must be
set before triton is imported, and it must not leak into this pytest process.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).parent))
from interpret_worker import CASES, HOPPER_CASES, run_in_interpreter  # noqa: E402

WORKER = Path(__file__).with_name("interpret_worker.py")
CHECKS = [f"backend/{n}" for n in CASES] + ["backend-table/gqa-causal", "kernel-file/mqa-causal-sq>sk-ragged-fp32",
                                            "kernel-file/mha-causal-d128-fp16"] + \
    [f"hopper-ws{ws}/{n}" for ws in (1, 0) for n in HOPPER_CASES] + ["hopper-kernel-file/gqa-full-sq>sk-ragged-fp16"]


#: its module-scoped runs are made once: every test of the module in one xdist worker (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("triton-interpreter")


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict:
    return run_in_interpreter(WORKER, tmp_path_factory.mktemp("interp") / "results.json")


def test_interpreter_setting_does_not_leak():
    assert os.environ.get("TRITON_INTERPRET") in (None, "", "0")


@pytest.mark.parametrize("check", CHECKS)
def test_matches_float64_reference(interpreted, check):
    result = interpreted[check]
    assert result["status"] == "passed", f"{check}: {result['status']}: {result['reason']}"
    assert result["rel_l2"] <= result["bound"]


@pytest.mark.parametrize("shape", ["sq=64,sk=64", "sq=48,sk=64", "sq=64,sk=40"])
def test_causal_never_reads_key_blocks_in_the_future(interpreted, shape):
    # V after the first query block's diagonal is NaN: reading it at all would poison rows 0..15
    result = interpreted["loop-bounds"][shape]
    assert result["finite"], f"{shape}: the first query block read a key block wholly in its causal future"
    assert result["rel_l2"] < 1e-5
