"""On a CUDA GPU: the kernel through kbench's own execution path (bf16 included), all entry points.

Skipped here (no GPU): scripts/gpu-check and docs/triton.md say how a GPU session runs them.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

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


def test_seed_kernel_file_through_the_triton_substrate(kbench_kernel_file, kbench_case, kbench_check):
    from kbench_triton.backends import SEED_PATH

    backend = kbench_kernel_file(SEED_PATH)
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


CAUSAL_16BIT = [p for p in CASES if p["causal"] and p["dtype"] != "fp32"]


@pytest.mark.parametrize("ws", [1, 0], ids=["warp-specialised", "two-loop"])
@pytest.mark.parametrize("params", CAUSAL_16BIT, ids=[_ids(p) for p in CAUSAL_16BIT])
def test_hopper_kernel_is_right_under_causal_masks_in_both_loop_forms(kbench_pm, kbench_case, kbench_check, params,
                                                                    ws):
    # warp specialisation split the rows of a 128-row block between two consumer warpgroups and shifted the
    # second one's row index twice (docs/triton.md); the kernel keeps the block base out of the row tensor
    from kbench_triton.backends import TritonHopperAttention

    backend = TritonHopperAttention(WARP_SPECIALIZE=ws)
    if backend.available():
        pytest.skip(backend.available())
    rec = kbench_check(backend, kbench_case(**params))
    assert rec["status"] == "passed", rec.get("reason")


#: one causal 16k-token case, checked on every row against a float64 reference (kbench's checks sample rows)
SEQ_16K, HEADS_16K, D_16K = 16384, 4, 128


@pytest.fixture(scope="module")
def causal_16k():
    """bf16 inputs and their float64 causal attention (computed on the GPU in 2048-row chunks, each against the
    keys it sees), as float32 (batch 1, 16384, 4 heads, 128)."""
    import torch

    gen = torch.Generator(device="cuda").manual_seed(16384)
    q, k, v = (torch.randn(1, SEQ_16K, HEADS_16K, D_16K, device="cuda", dtype=torch.bfloat16, generator=gen)
               for _ in range(3))
    ref = torch.empty(SEQ_16K, HEADS_16K, D_16K, device="cuda", dtype=torch.float32)
    scale = D_16K ** -0.5
    rows = 2048
    for h in range(HEADS_16K):
        qh, kh, vh = (t[0, :, h].double() for t in (q, k, v))
        for r0 in range(0, SEQ_16K, rows):
            r1 = r0 + rows
            s = (qh[r0:r1] @ kh[:r1].T) * scale
            future = torch.arange(r1, device="cuda")[None, :] > torch.arange(r0, r1, device="cuda")[:, None]
            s.masked_fill_(future, float("-inf"))
            ref[r0:r1, h] = (torch.softmax(s, dim=1) @ vh[:r1]).float()
    return q, k, v, ref


@pytest.mark.parametrize("kernel", ["triton-hopper", "triton"])
def test_every_row_of_a_causal_16k_case_matches_the_float64_reference(causal_16k, kernel):
    import torch

    from kbench_triton.backends import hopper_module, kernel_module

    if kernel == "triton-hopper" and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the Hopper kernel needs compute capability 9.0")
    q, k, v, ref = causal_16k
    mod = hopper_module() if kernel == "triton-hopper" else kernel_module()
    out = torch.full_like(q, float("nan"))
    mod.attention(q, k, v, out, causal=True, scale=D_16K ** -0.5, **mod.config_for(D_16K, True, "bf16"))
    got = out[0].float()
    err = (got - ref).norm(dim=2) / ref.norm(dim=2)  # (row, head)
    worst = int(err.argmax())
    assert torch.isfinite(got).all(), f"{kernel}: {int((~torch.isfinite(got)).sum())} elements not written/finite"
    assert float(err.max()) <= 1e-2, (f"{kernel}: row {worst // HEADS_16K}, head {worst % HEADS_16K} has relative "
                                      f"L2 error {float(err.max()):.3g} > 0.01; rows over: "
                                      f"{int((err > 1e-2).any(dim=1).sum())} of {SEQ_16K}")
    assert float((got - ref).norm() / ref.norm()) <= 1e-2


SANITIZER_WORKER = Path(__file__).with_name("sanitize_worker.py")
#: compute-sanitizer's messages when it cannot run on this machine (seen under gVisor: docs/gpu.md)
SANITIZER_CANNOT_RUN = ("Device not supported", "Failed to initialize", "LibraryNotLoaded")


def _compute_sanitizer() -> str | None:
    for candidate in (shutil.which("compute-sanitizer"),
                      os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "compute-sanitizer")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


@pytest.mark.parametrize("tool", ["memcheck", "racecheck"])
def test_compute_sanitizer_finds_nothing_in_the_triton_kernels(tool):
    sanitizer = _compute_sanitizer()
    if sanitizer is None:
        pytest.skip("compute-sanitizer is not on PATH nor in $CUDA_HOME/bin")
    proc = subprocess.run([sanitizer, "--tool", tool, "--error-exitcode", "97", sys.executable, str(SANITIZER_WORKER)],
                          capture_output=True, text=True, timeout=420)
    text = proc.stdout + proc.stderr
    cannot = next((m for m in SANITIZER_CANNOT_RUN if m in text), None)
    if cannot and "triton forward" not in text:
        pytest.skip(f"compute-sanitizer cannot run on this machine: {cannot}")
    assert "triton backward" in text, text[-3000:]
    assert proc.returncode == 0 and "ERROR SUMMARY: 0 errors" in text, text[-6000:]


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
