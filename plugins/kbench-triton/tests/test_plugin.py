"""The plugin's contract: registration, lazy imports, reasons for unavailability, one place for tunables."""
from __future__ import annotations

from pathlib import Path

import pytest

from kbench.testing import imported_by
from kbench_triton.backends import (HOPPER_SEED_PATH, HOPPER_TUNABLE_NAMES, SEED_PATH, TUNABLE_NAMES, TritonAttention,
                                    TritonHopperAttention)


def test_plugin_import_does_not_import_triton_or_torch():
    modules = ["kbench_triton.plugin", "kbench_triton.backends", "kbench_triton.aot", "kbench_triton.cli"]
    assert imported_by(modules, ("triton", "torch")) == []


def test_backends_and_substrate_registered(kbench_pm):
    reg = kbench_pm.registry
    assert reg.backends["triton"].device == "cuda"
    assert reg.backends["triton-autotune"].device == "cuda"
    assert reg.backends["triton-hopper"].source_path == str(HOPPER_SEED_PATH)
    assert reg.substrates["triton"].device == "cuda"
    assert reg.owner("backend", "triton") == reg.owner("substrate", "triton")


def test_unavailable_with_precise_reason_on_this_machine(kbench_pm):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present")
    reason = kbench_pm.registry.backends["triton"].available()
    assert reason and ("without CUDA" in reason or "no CUDA GPU" in reason)
    assert kbench_pm.registry.substrates["triton"].available() == reason


def test_tunables_mirror_the_seed():
    pytest.importorskip("triton")
    from kbench_triton.backends import kernel_module

    seed = kernel_module()
    assert Path(seed.__file__) == SEED_PATH
    assert tuple(seed.TUNABLES) == TUNABLE_NAMES
    # the evolve plugin's mutate operator steps along the choices from the default
    assert all(t["default"] in t["choices"] for t in seed.TUNABLES.values())
    for (head_dim, causal), config in seed.CONFIGS.items():
        assert set(config) == set(TUNABLE_NAMES)
        for name, value in config.items():
            assert value in seed.TUNABLES[name]["choices"], (head_dim, causal, name, value)
    for head_dim, configs in seed.AUTOTUNE_CONFIGS.items():
        for config in configs:
            assert all(config[n] in seed.TUNABLES[n]["choices"] for n in TUNABLE_NAMES), (head_dim, config)


def test_hopper_tunables_mirror_its_seed_and_fit_sm90(kbench_case):
    pytest.importorskip("triton")
    from kbench_triton.backends import hopper_module

    seed = hopper_module()
    assert Path(seed.__file__) == HOPPER_SEED_PATH and tuple(seed.TUNABLES) == HOPPER_TUNABLE_NAMES
    for config in seed.CONFIGS.values():
        assert all(config[n] in seed.TUNABLES[n]["choices"] for n in HOPPER_TUNABLE_NAMES), config
    defaults = {k: t["default"] for k, t in seed.TUNABLES.items()}
    assert all(value == defaults[name] for name, value in _keyword_defaults(seed.attention).items()), \
        "attention()'s keyword defaults must equal TUNABLES' defaults"
    backend = TritonHopperAttention(num_stages=3)
    assert backend.config(kbench_case(seqlen=256, heads=2, head_dim=128))["num_stages"] == 3
    assert "bf16/fp16" in backend.supports(kbench_case(seqlen=64, heads=2, head_dim=64, dtype="fp32"))
    with pytest.raises(TypeError, match="unknown tunable"):
        TritonAttention(WARP_SPECIALIZE=1)


def _keyword_defaults(fn) -> dict:
    import inspect

    return {n: p.default for n, p in inspect.signature(fn).parameters.items()
            if p.kind is p.KEYWORD_ONLY and p.default is not p.empty and n not in ("causal", "scale")}


def test_settings_override_the_shape_table(kbench_case):
    pytest.importorskip("triton")
    case = kbench_case(seqlen=256, heads=4, head_dim=128, causal=True, dtype="bf16")
    assert TritonAttention().config(case)["BLOCK_M"] == 128
    assert TritonAttention(BLOCK_M=64).config(case)["BLOCK_M"] == 64
    assert TritonAttention().config(kbench_case(seqlen=64, heads=2, head_dim=256, dtype="fp32"))["BLOCK_N"] == 32
    with pytest.raises(TypeError, match="unknown tunable"):
        TritonAttention(BLOCK_K=32)


def test_backward_tiles_are_set_per_run_and_leave_the_forward_alone(kbench_pm, kbench_case):
    pytest.importorskip("triton")
    from kbench_triton import backward

    case = kbench_case(batch=1, seqlen=256, heads=4, head_dim=128, causal=True, dtype="bf16", mode="fwd_bwd")
    (tuned,) = kbench_pm.registry.select_backends("attention", ["triton[bwd_dkdv=32/128/8/2]"])
    kernel = tuned.prepare(case)
    assert kernel.bwd_config["dkdv"] == dict(BLOCK_M=32, BLOCK_N=128, num_warps=8, num_stages=2)
    assert kernel.bwd_config["dq"] == backward.bwd_config(128, "bf16")["dq"]
    assert kernel.fwd_config == TritonAttention().config(case)  # the forward's tiles are not touched
    with pytest.raises(ValueError, match="BLOCK_M/BLOCK_N/num_warps/num_stages"):
        TritonAttention(bwd_dq="128/64").prepare(case)


def test_unsupported_head_dim_is_a_reason(kbench_case):
    pytest.importorskip("triton")
    assert "power of two" in TritonAttention().supports(kbench_case(seqlen=64, heads=2, head_dim=96))
    assert TritonAttention().supports(kbench_case(seqlen=64, heads=2, head_dim=128)) is None


def test_seed_is_a_valid_kernel_file(kbench_kernel_file):
    pytest.importorskip("triton")
    from kbench_triton.backends import kernel_module

    backend = kbench_kernel_file(kernel_module().__file__)
    assert backend.substrate.name == "triton" and backend.device == "cuda"
    assert set(backend.tunables) == set(TUNABLE_NAMES)
    assert backend.settings == {n: t.default for n, t in backend.tunables.items()}


@pytest.mark.parametrize("path", [SEED_PATH, HOPPER_SEED_PATH], ids=["triton", "triton-hopper"])
def test_seeds_pass_the_static_checks_of_untrusted_kernel_files(path):
    # the seeds are evolved and run as untrusted kernel files: a mutable module-level table (read as a
    # possible cache) made every such run fail its static checks on the first H200 run
    from kbench.testing import static_violations

    assert static_violations(Path(path).read_text()) == []
