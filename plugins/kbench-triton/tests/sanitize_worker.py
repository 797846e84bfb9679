"""Launches each of kbench's Triton kernels once on a small case, for compute-sanitizer (tests/test_gpu.py).

``compute-sanitizer --tool memcheck|racecheck python sanitize_worker.py`` runs it: the forward of the
``triton`` backend (causal, GQA, ragged lengths, with and without the log-sum-exp), its three backward kernels,
and the Hopper kernel with and without warp specialisation (causal, ragged). Lengths are not multiples of the
tiles, so the masked tails and TMA's clipping run; every output is checked finite so that a kernel that wrote
nothing is noticed too. Prints one line per kernel launched.
"""
from __future__ import annotations

import sys

import torch


def main() -> int:
    from kbench_triton import backward as bwd
    from kbench_triton.seeds import triton_attention_seed as fa2
    from kbench_triton.seeds import triton_hopper_seed as hopper

    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    # GQA 4/2, 200 queries x 333 keys, head_dim 64: every tile shape has a ragged tail
    q = torch.randn(1, 200, 4, 64, device=dev, dtype=dt)
    k, v = (torch.randn(1, 333, 2, 64, device=dev, dtype=dt) for _ in range(2))
    scale = 64 ** -0.5
    out = torch.empty_like(q)
    fa2.attention(q, k, v, out, causal=True, scale=scale, **fa2.config_for(64, True, "bf16"))
    print("triton forward", flush=True)
    lse = bwd.forward(q, k, v, out, causal=True, scale=scale)
    do = torch.randn_like(q)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    bwd.backward(q, k, v, out, lse, do, dq, dk, dv, causal=True, scale=scale)
    print("triton backward: preprocess, dK/dV, dQ", flush=True)
    results = [out, dq, dk, dv]
    if torch.cuda.get_device_capability() >= (9, 0):
        for ws in (1, 0):
            o = torch.empty_like(q)
            hopper.attention(q, k, v, o, causal=True, scale=scale,
                             **{**hopper.config_for(64, True, "bf16"), "WARP_SPECIALIZE": ws})
            results.append(o)
            print(f"triton-hopper forward, warp specialisation {ws}", flush=True)
    torch.cuda.synchronize()
    bad = [i for i, t in enumerate(results) if not torch.isfinite(t.float()).all()]
    print("finite" if not bad else f"NOT FINITE: outputs {bad}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
