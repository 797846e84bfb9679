"""kbench-torch: light import, availability reasons, torch-sdpa on the CPU against the float64 reference,
declared support limits of the CUDA backends; GPU runs marked ``gpu`` and skipped without one."""
from __future__ import annotations


import numpy as np
import pytest
import torch

from kbench.api import causal_mask
from kbench.testing import imported_by
from kbench_torch.common import torch_cuda_unavailable
from kbench_torch.sdpa import TorchSDPA, bottom_right_mask, cuda_backends, mask_kind

CUDA_REASON = torch_cuda_unavailable()
gpu_only = pytest.mark.skipif(CUDA_REASON is not None, reason=f"no CUDA for torch: {CUDA_REASON}")

#: every backend the plugin registers
TORCH_BACKENDS = ("torch-sdpa", "torch-sdpa-flash", "torch-sdpa-efficient", "torch-sdpa-cudnn", "torch-sdpa-math",
              "flash-attn", "flash-attn3", "cudnn")


def test_plugin_import_does_not_import_torch():
    assert imported_by(["kbench_torch.plugin"], ("torch", "cupy", "cudnn", "flash_attn")) == []


def test_every_backend_is_registered_with_a_status(kbench_pm):
    reg = kbench_pm.registry
    for name in TORCH_BACKENDS:
        backend = reg.backends[name]
        assert reg.owner("backend", name) == "torch"
        reason = backend.available()
        assert reason is None or (isinstance(reason, str) and reason)
    assert reg.backends["torch-sdpa"].device == "cpu" and reg.backends["torch-sdpa"].available() is None


@pytest.mark.skipif(torch.version.cuda is not None, reason="torch here is a CUDA build")
def test_cuda_backends_name_the_cpu_only_torch(kbench_pm):
    reg = kbench_pm.registry
    for name in ("torch-sdpa-flash", "torch-sdpa-efficient", "torch-sdpa-cudnn", "torch-sdpa-math"):
        assert reg.backends[name].available() == f"torch {torch.__version__} is a CPU-only build (no CUDA)"


def test_missing_libraries_are_named(kbench_pm):
    reg = kbench_pm.registry
    import importlib.util

    if importlib.util.find_spec("flash_attn") is None:
        assert reg.backends["flash-attn"].available().startswith("flash_attn is not installed (FlashAttention 2)")
    if importlib.util.find_spec("flash_attn_interface") is None:
        assert reg.backends["flash-attn3"].available().startswith("flash_attn_interface is not installed")
    if importlib.util.find_spec("cudnn") is None:
        assert reg.backends["cudnn"].available() == "module cudnn is not installed: pip install nvidia-cudnn-frontend"


@pytest.mark.parametrize("sq,sk", [(5, 5), (3, 7), (7, 3), (1, 9)])
def test_bottom_right_mask_matches_the_op(sq, sk):
    assert np.array_equal(bottom_right_mask(sq, sk).numpy(), causal_mask(sq, sk))


CPU_CASES = {
    "mha": dict(seqlen=48, heads=4, head_dim=32),
    "mha-causal": dict(seqlen=48, heads=4, head_dim=32, causal=True),
    "gqa": dict(seqlen=40, heads_q=8, heads_kv=2, head_dim=32),
    "gqa-causal-wide": dict(seqlen_q=17, seqlen_kv=53, heads_q=4, heads_kv=2, head_dim=32, causal=True),
    "mqa-causal-tall": dict(seqlen_q=53, seqlen_kv=17, heads_q=4, heads_kv=1, head_dim=32, causal=True),
    "causal-wide": dict(seqlen_q=16, seqlen_kv=64, heads=2, head_dim=64, causal=True),
    "fp16": dict(seqlen=32, heads=2, head_dim=64, causal=True, dtype="fp16"),
    "bf16-gqa-wide": dict(seqlen_q=24, seqlen_kv=40, heads_q=4, heads_kv=2, head_dim=64, causal=True, dtype="bf16"),
}


@pytest.mark.parametrize("name", sorted(CPU_CASES))
def test_torch_sdpa_cpu_passes_against_float64(kbench_case, kbench_check, name):
    case = kbench_case(**CPU_CASES[name])
    rec = kbench_check(TorchSDPA(), case)
    assert rec["status"] == "passed", rec.get("reason")
    assert rec["correctness"]["rel_l2"] <= case.dtype.default_tolerance


def test_top_left_causal_would_fail_the_check(kbench_case, kbench_check, fake_backend):
    """The case the mask adaptation exists for: torch's own is_causal (top-left) is wrong here."""
    case = kbench_case(seqlen_q=16, seqlen_kv=64, heads=2, head_dim=32, causal=True)

    def top_left(q, k, v, out, case):
        t = [torch.from_numpy(x).transpose(1, 2) for x in (q, k, v)]
        o = torch.nn.functional.scaled_dot_product_attention(*t, is_causal=True)
        out[...] = o.transpose(1, 2).numpy()

    wrong = kbench_check(fake_backend(top_left), case)
    assert wrong["status"] == "failed" and "relative L2 error" in wrong["reason"]
    assert kbench_check(TorchSDPA(), case)["status"] == "passed"


def test_threads_setting(monkeypatch):
    assert TorchSDPA().settings["threads"] == 1
    monkeypatch.setenv("KBENCH_TORCH_THREADS", "0")
    assert TorchSDPA().settings["threads"] == 0
    assert TorchSDPA(threads=2).settings["threads"] == 2


def test_mask_kind(kbench_case):
    assert mask_kind(kbench_case(seqlen=8, heads=1, head_dim=8)) == "none"
    assert mask_kind(kbench_case(seqlen=8, heads=1, head_dim=8, causal=True)) == "square"
    assert mask_kind(kbench_case(seqlen_q=4, seqlen_kv=8, heads=1, head_dim=8, causal=True)) == "wide"
    assert mask_kind(kbench_case(seqlen_q=8, seqlen_kv=4, heads=1, head_dim=8, causal=True)) == "tall"


def test_cuda_backends_declare_their_limits(kbench_case):
    """Limits that need no GPU to decide: dtypes, head_dim, causal alignment (no probe runs for these)."""
    by = {b.name: b for b in cuda_backends()}
    wide = kbench_case(seqlen_q=64, seqlen_kv=128, heads=2, head_dim=64, causal=True, dtype="bf16")
    assert "bottom-right" in by["torch-sdpa-flash"].supports(wide)
    assert "bottom-right" in by["torch-sdpa-cudnn"].supports(wide)
    fp32 = kbench_case(seqlen=64, heads=2, head_dim=64, dtype="fp32")
    assert by["torch-sdpa-flash"].supports(fp32) == "torch's FLASH_ATTENTION kernel takes fp16/bf16 only"
    big_d = kbench_case(seqlen=64, heads=2, head_dim=512, dtype="bf16")
    assert "head_dim <= 256" in by["torch-sdpa-flash"].supports(big_d)
    huge = kbench_case(batch=4, seqlen=65536, heads=16, head_dim=64, dtype="bf16")
    assert "materialises" in by["torch-sdpa-math"].supports(huge)


def test_flash_and_cudnn_limits(kbench_pm, kbench_case):
    reg = kbench_pm.registry
    fp32 = kbench_case(seqlen=64, heads=2, head_dim=64)
    assert reg.backends["flash-attn"].supports(fp32) == "FlashAttention 2 takes fp16/bf16 only"
    assert reg.backends["cudnn"].supports(fp32) == "cuDNN SDPA takes fp16/bf16 only"
    tall = kbench_case(seqlen_q=128, seqlen_kv=64, heads=2, head_dim=64, causal=True, dtype="bf16")
    assert "seqlen_q > seqlen_kv" in reg.backends["cudnn"].supports(tall)
    assert reg.backends["flash-attn"].supports(tall) is None  # FlashAttention >= 2.1 is bottom-right


# -- on a GPU ---------------------------------------------------------------------------------

GPU_CASES = [
    dict(seqlen=128, heads=4, head_dim=64, dtype="bf16"),
    dict(seqlen=128, heads=4, head_dim=128, causal=True, dtype="fp16"),
    dict(seqlen_q=64, seqlen_kv=192, heads_q=8, heads_kv=2, head_dim=64, causal=True, dtype="bf16"),
    dict(seqlen_q=192, seqlen_kv=64, heads_q=4, heads_kv=4, head_dim=64, causal=True, dtype="bf16"),
    dict(seqlen=96, heads=2, head_dim=64, dtype="fp32"),
]


@pytest.mark.gpu
@gpu_only
@pytest.mark.parametrize("name", ["torch-sdpa-flash", "torch-sdpa-efficient", "torch-sdpa-cudnn", "torch-sdpa-math",
                                  "flash-attn", "flash-attn3", "cudnn"])
@pytest.mark.parametrize("params", GPU_CASES, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
def test_gpu_backend_passes_or_says_why(kbench_pm, kbench_case, kbench_check, name, params):
    backend = kbench_pm.registry.backends[name]
    if backend.available():
        pytest.skip(backend.available())
    rec = kbench_check(backend, kbench_case(**params))
    assert rec["status"] in ("passed", "skipped"), rec.get("reason")
    if rec["status"] == "skipped":
        assert rec["reason"]


def test_probe_reports_torchs_refusal_on_the_cpu():
    """The probe behind the CUDA backends' supports(), run where torch has no such kernel."""
    from kbench_torch.sdpa import probe

    assert probe("MATH", "fp32", 32, 4, 2, "wide", "cpu") is None
    reason = probe("EFFICIENT_ATTENTION", "fp32", 32, 4, 4, "none", "cpu")
    assert reason.startswith("torch refuses SDPBackend.EFFICIENT_ATTENTION for this case: ")


@pytest.mark.parametrize("impl", ["MATH", "FLASH_ATTENTION"])
@pytest.mark.parametrize("sq,sk", [(24, 24), (10, 40), (40, 10)])
def test_forced_implementation_matches_the_reference(impl, sq, sk):
    """sdpa_bhsd, the call every torch backend makes, under sdpa_kernel, with kbench's mask rules."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from kbench.api import attention_float64
    from kbench_torch.sdpa import probe, sdpa_bhsd

    kind = "square" if sq == sk else ("wide" if sq < sk else "tall")
    reason = probe(impl, "fp32", 32, 4, 2, kind, "cpu")
    if reason:
        pytest.skip(reason)
    rng = np.random.default_rng(3)
    q = rng.standard_normal((2, sq, 4, 32)).astype(np.float32)
    k = rng.standard_normal((2, sk, 2, 32)).astype(np.float32)
    v = rng.standard_normal((2, sk, 2, 32)).astype(np.float32)
    mask = bottom_right_mask(sq, sk) if kind in ("wide", "tall") else None
    with sdpa_kernel([getattr(SDPBackend, impl)]):
        o = sdpa_bhsd(*(torch.from_numpy(x).transpose(1, 2) for x in (q, k, v)), kind=kind, scale=0.2, mask=mask)
    ref = attention_float64(q, k, v, causal=True, scale=0.2)
    assert np.allclose(o.transpose(1, 2).numpy(), ref, atol=1e-5)
