"""On a CUDA GPU: the kernel through kbench's own execution path (bf16 included), all entry points.

Skipped here (no GPU): scripts/gpu-check and docs/triton.md say how a GPU session runs them.
"""
from __future__ import annotations

import pytest

from kbench_triton import runtime

REASON = runtime.unavailable_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(REASON is not None, reason=f"triton backend unavailable: {REASON}")]

CASES = [
    dict(batch=2, seqlen=1000, heads=4, head_dim=64, causal=False, dtype="bf16"),
    dict(batch=1, seqlen=777, heads=4, head_dim=128, causal=True, dtype="bf16"),
    dict(batch=1, seqlen_q=300, seqlen_kv=1000, heads_q=8, heads_kv=2, head_dim=128, causal=True, dtype="bf16"),
    dict(batch=2, seqlen_q=1000, seqlen_kv=300, heads_q=8, heads_kv=1, head_dim=64, causal=True, dtype="bf16"),
    dict(batch=1, seqlen=513, heads=2, head_dim=256, causal=True, dtype="bf16"),
    dict(batch=1, seqlen=500, heads=4, head_dim=128, causal=False, dtype="fp16"),
    dict(batch=1, seqlen_q=200, seqlen_kv=333, heads_q=4, heads_kv=2, head_dim=64, causal=True, dtype="fp32"),
    dict(batch=1, seqlen=256, heads=2, head_dim=256, causal=False, dtype="fp32"),
]


def _ids(p):
    return ",".join(f"{k}={v}" for k, v in p.items())


@pytest.mark.parametrize("params", CASES, ids=[_ids(p) for p in CASES])
def test_triton_backend_passes_kbench_checks(kbench_pm, kbench_case, kbench_check, params):
    rec = kbench_check(kbench_pm.registry.backends["triton"], kbench_case(**params))
    assert rec["status"] == "passed", rec.get("reason")
    assert rec["correctness"]["rel_l2"] <= rec["correctness"]["bound"]


def test_autotuned_backend_passes(kbench_pm, kbench_case, kbench_check):
    rec = kbench_check(kbench_pm.registry.backends["triton-autotune"],
                       kbench_case(batch=1, seqlen=1024, heads=4, head_dim=128, causal=True, dtype="bf16"))
    assert rec["status"] == "passed", rec.get("reason")


def test_seed_kernel_file_through_the_triton_substrate(kbench_pm, kbench_case, kbench_check):
    from kbench.kernelfile import KernelFileBackend
    from kbench_triton.backends import SEED_PATH

    backend = KernelFileBackend(SEED_PATH, kbench_pm.registry)
    rec = kbench_check(backend, kbench_case(seqlen_q=300, seqlen_kv=700, heads_q=8, heads_kv=2, head_dim=64,
                                            causal=True, dtype="bf16"))
    assert rec["status"] == "passed", rec.get("reason")


@pytest.mark.parametrize("params", [p for p in CASES if p["dtype"] != "fp32"], ids=[_ids(p) for p in CASES
                                                                                    if p["dtype"] != "fp32"])
def test_hopper_backend_passes_kbench_checks(kbench_pm, kbench_case, kbench_check, params):
    backend = kbench_pm.registry.backends["triton-hopper"]
    if backend.available():
        pytest.skip(backend.available())
    rec = kbench_check(backend, kbench_case(**params))
    assert rec["status"] == "passed", rec.get("reason")
    assert rec["correctness"]["rel_l2"] <= rec["correctness"]["bound"]


#: few shapes: each (head_dim, causal, dtype) compiles four kernels, inside scripts/gpu-check's test budget
TRAINING_CASES = [
    dict(batch=1, seqlen_q=300, seqlen_kv=1000, heads_q=8, heads_kv=2, head_dim=128, causal=True, dtype="bf16",
         mode="bwd"),
    dict(batch=1, seqlen_q=300, seqlen_kv=1000, heads_q=8, heads_kv=2, head_dim=128, causal=True, dtype="bf16",
         mode="fwd_bwd"),
    dict(batch=2, seqlen=1000, heads=4, head_dim=64, causal=False, dtype="bf16", mode="bwd"),
]


@pytest.mark.parametrize("params", TRAINING_CASES, ids=[_ids(p) for p in TRAINING_CASES])
def test_triton_backward_passes_kbench_gradient_checks(kbench_pm, kbench_case, kbench_check, params):
    rec = kbench_check(kbench_pm.registry.backends["triton"], kbench_case(**params))
    assert rec["status"] == "passed", rec.get("reason")
    for name, err in rec["correctness"]["outputs"].items():
        assert err["rel_l2"] <= err["bound"], (name, err)


def test_triton_backward_is_deterministic():
    # no atomics: two backward passes over the same inputs give the same bits
    import torch

    from kbench_triton import backward as bwd

    torch.manual_seed(0)
    q = torch.randn(2, 1000, 8, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, 1000, 2, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    do, out = torch.randn_like(q), torch.empty_like(q)
    lse = bwd.forward(q, k, v, out, causal=True, scale=128 ** -0.5)
    grads = []
    for _ in range(2):
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        bwd.backward(q, k, v, out, lse, do, dq, dk, dv, causal=True, scale=128 ** -0.5)
        grads.append((dq, dk, dv))
    assert all(torch.equal(a, b) for a, b in zip(*grads))
