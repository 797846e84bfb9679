"""flash-attn4 (FlashAttention 4, CuTe DSL) on a machine without it: registration, what is missing and the
install line, refusals per architecture, FA4's spelling of an unbounded window side. On a GPU with the
package installed, scripts/gpu-check measures it (docs/gpu.md)."""
from __future__ import annotations

import sys

import pytest

from kbench.testing import imported_by
from kbench_torch.flash4 import INSTALL, FlashAttention4, cute_installed


def test_registered_and_importing_the_plugin_loads_neither_the_dsl_nor_flash_attn(kbench_pm):
    backend = kbench_pm.registry.backends["flash-attn4"]
    assert isinstance(backend, FlashAttention4) and kbench_pm.registry.owner("backend", "flash-attn4") == "torch"
    assert {"bwd", "fwd_bwd", "window", "softcap"} <= backend.features and "fp8" not in backend.features
    assert imported_by(["kbench_torch.plugin"], ("torch", "cutlass", "flash_attn", "quack")) == []


@pytest.mark.skipif(cute_installed(), reason="flash-attn-4 is installed here")
def test_unavailable_says_what_to_install():
    assert FlashAttention4().available() == f"flash_attn.cute is not installed (FlashAttention 4): {INSTALL}"


def test_a_missing_dependency_is_named_before_anything_is_imported(tmp_path, monkeypatch):
    # a flash_attn/cute package on the path (as the wheel installs it) without the CuTe DSL beside it
    cute = tmp_path / "flash_attn" / "cute"
    cute.mkdir(parents=True)
    (cute / "interface.py").write_text("raise RuntimeError('must not be imported by available()')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "flash_attn" or m.startswith("flash_attn.")]:
        monkeypatch.delitem(sys.modules, name)
    assert cute_installed()
    missing = next(m for m in ("cutlass", "quack", "tvm_ffi", "einops") if not __import__("importlib").util.find_spec(m))
    why = FlashAttention4().available()
    assert why.startswith(f"{missing} is not installed, which FlashAttention 4 needs: pip install "), why


@pytest.fixture
def case(kbench_case):
    def make(**kw):
        params = dict(batch=1, seqlen=256, heads=8, head_dim=128, causal=True, dtype="bf16")
        return kbench_case(**{**params, **kw})
    return make


def test_refusals_follow_the_architecture(case):
    hopper, blackwell = FlashAttention4(capability=(9, 0)), FlashAttention4(capability=(10, 0))
    for d in (64, 128, 256):
        assert hopper.supports(case(head_dim=d)) is None
    assert blackwell.supports(case(head_dim=256)) is None and blackwell.supports(case(head_dim=128)) is None
    assert blackwell.supports(case(head_dim=192)) == "FlashAttention 4 on SM100/SM110 takes head_dim 8-128 or 256 (got 192)"
    assert hopper.supports(case(head_dim=512)) == "FlashAttention 4 on SM90 takes head_dim 8-256 (got 512)"
    assert hopper.supports(case(head_dim=100)) == "FlashAttention 4 needs head_dim a multiple of 8 (got 100)"
    assert hopper.supports(case(dtype="fp32")).startswith("FlashAttention 4 takes fp16/bf16")


def test_an_unbounded_window_side_is_none_for_fa4(case):
    kw = FlashAttention4(capability=(9, 0)).call_kwargs(case(causal=False, window_left=128, window_right=-1))
    assert kw["window_size"] == (128, None) and kw["causal"] is False
    assert "window_size" not in FlashAttention4(capability=(9, 0)).call_kwargs(case())
