"""Backward of kbench's Triton attention kernel (FlashAttention-2 algorithm), deterministic, no atomics.

Written from the FlashAttention-2 paper (Dao 2023, section 3.1.2 and Algorithm 2), with dQ moved to its
own pass. With S = scale * Q K^T, P = softmax(S) (row-wise, masked) and O = P V, the gradients are

    dV = P^T dO,   dP = dO V^T,   dS = P * (dP - delta),   delta_i = rowsum(dO_i * O_i),
    dQ = scale * dS K,   dK = scale * dS^T Q.

Nothing of size seqlen_q x seqlen_kv is stored: P is recomputed block by block from Q, K and the
log-sum-exp per query row that the forward saved (``attention_fwd_kernel(STORE_LSE=True)``, log2 domain,
so ``P = exp2(qk_scale * q.k - lse)``). Three kernels:

1. ``bwd_preprocess_kernel``: delta = rowsum(dO * O) in fp32, one program per (query block, batch*head).
2. ``bwd_dkdv_kernel``: one program per (key block, batch*kv head). It keeps its K and V tiles and two
   fp32 accumulators and walks, for each query head of its kv head's group (GQA: the sum over the
   group happens in these registers, no second reduction pass), the query blocks that see the key
   block: recompute P, then dV += P^T dO, dP = dO V^T, dS = P * (dP - delta), dK += dS^T Q.
3. ``bwd_dq_kernel``: one program per (query block, batch*query head), walking the key blocks it sees:
   recompute P and dS, dQ += dS K. Every element of dQ, dK and dV is written by exactly one program
   with a fixed summation order: the backward is deterministic (run to run, bit for bit), at the cost
   of computing P and dP twice (once per pass) instead of accumulating dQ with atomics.

Masks follow the forward: bottom-right causal alignment (query i sees key j iff
j <= i + seqlen_kv - seqlen_q), key blocks wholly in a block's causal future are never visited (loop
bounds), and blocks every row fully sees run without a mask. Query rows past seqlen_q load lse = +inf
(P = 0) and dO = 0; keys past seqlen_kv are masked in the dQ pass and never stored by the dK/dV pass
(each key column's gradients depend on that column only). A query row that sees no key has lse = +inf
(stored by the forward), so its P row, dQ row and contributions are 0.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl

from kbench.api import TrainingKernel, as_torch
from kbench_triton.seeds import triton_attention_seed as fwd
from kbench_triton.seeds.triton_attention_seed import key_bounds

#: Tiles of the two backward kernels per head_dim, for 16-bit inputs. The dK/dV kernel holds K, V and two
#: fp32 accumulators of BLOCK_N x head_dim for its whole life, so its query tiles are short (32 rows);
#: the dQ kernel holds Q, dO and one accumulator of BLOCK_M x head_dim. Chosen by compiling for sm_90
#: (``kbench triton-aot --kernel triton-bwd``, docs/triton.md: the ones that do not spill) and not yet
#: timed on a GPU.
BWD_CONFIGS = {
    64: {"dkdv": dict(BLOCK_M=32, BLOCK_N=128, num_warps=8, num_stages=2),
         "dq": dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=2)},
    128: {"dkdv": dict(BLOCK_M=16, BLOCK_N=128, num_warps=8, num_stages=2),
          "dq": dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=2)},
    256: {"dkdv": dict(BLOCK_M=32, BLOCK_N=32, num_warps=8, num_stages=1),
          "dq": dict(BLOCK_M=64, BLOCK_N=32, num_warps=8, num_stages=2)},
}
BWD_CONFIGS[16] = BWD_CONFIGS[32] = BWD_CONFIGS[64]
#: fp32 inputs (3xTF32 products keep a high and a low part of every tile): small tiles everywhere
#: (no spills at head_dim 64 on sm_90; wider heads spill, as the forward's fp32 does: a correctness aid)
BWD_FP32_CONFIG = {"dkdv": dict(BLOCK_M=32, BLOCK_N=32, num_warps=8, num_stages=1),
                   "dq": dict(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=1)}
PREPROCESS_BLOCK_M = 64


def bwd_config(head_dim: int, dtype: str) -> dict[str, dict]:
    """The tiles of the dK/dV and dQ kernels for a shape (``dtype``: kbench's name, e.g. "bf16")."""
    if dtype == "fp32" or head_dim not in BWD_CONFIGS:
        return {k: dict(v) for k, v in BWD_FP32_CONFIG.items()}
    return {k: dict(v) for k, v in BWD_CONFIGS[head_dim].items()}


@triton.jit
def bwd_preprocess_kernel(O, DO, Delta, stride_ob, stride_os, stride_oh, stride_dob, stride_dos, stride_doh,
                          seqlen_q, heads_q, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    """Grid (cdiv(seqlen_q, BLOCK_M), batch * heads_q): Delta[b, h, i] = sum_d dO[b, i, h, d] * O[b, i, h, d]."""
    pid_bh = tl.program_id(1)
    b = (pid_bh // heads_q).to(tl.int64)
    h = (pid_bh % heads_q).to(tl.int64)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < seqlen_q
    o = tl.load(O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_os + offs_d[None, :],
                mask=row_ok[:, None], other=0.0).to(tl.float32)
    do = tl.load(DO + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_dos + offs_d[None, :],
                 mask=row_ok[:, None], other=0.0).to(tl.float32)
    tl.store(Delta + pid_bh.to(tl.int64) * seqlen_q + offs_m, tl.sum(o * do, 1), mask=row_ok)


@triton.jit
def _dkdv_block(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qs, stride_dos, start_m, offs_n,
                offs_d, seqlen_q, diagonal, qk_scale,
                MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr,
                DOT_PRECISION: tl.constexpr):
    """Fold query block ``start_m`` into the key block's (dK, dV) accumulators (dK still unscaled)."""
    offs_m = start_m + tl.arange(0, BLOCK_M)
    if MASKED:
        row_ok = offs_m < seqlen_q
        q = tl.load(q_base + offs_m[:, None] * stride_qs + offs_d[None, :], mask=row_ok[:, None], other=0.0)
        do = tl.load(do_base + offs_m[:, None] * stride_dos + offs_d[None, :], mask=row_ok[:, None], other=0.0)
        # rows past seqlen_q: lse = +inf gives P = 0
        lse = tl.load(lse_base + offs_m, mask=row_ok, other=float("inf"))
        delta = tl.load(delta_base + offs_m, mask=row_ok, other=0.0)
    else:
        q = tl.load(q_base + offs_m[:, None] * stride_qs + offs_d[None, :])
        do = tl.load(do_base + offs_m[:, None] * stride_dos + offs_d[None, :])
        lse = tl.load(lse_base + offs_m)
        delta = tl.load(delta_base + offs_m)
    # transposed block: rows are keys, columns queries, so P^T dO and dS^T Q need no transposes of P
    qk_t = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION)
    p_t = tl.math.exp2(qk_t * qk_scale - lse[None, :])
    if MASKED and CAUSAL:
        p_t = tl.where(offs_n[:, None] <= offs_m[None, :] + diagonal, p_t, 0.0)
    dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=DOT_PRECISION)
    dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
    ds_t = p_t * (dp_t - delta[None, :])
    dk = tl.dot(ds_t.to(q.dtype), q, dk, input_precision=DOT_PRECISION)
    return dk, dv


@triton.jit
def bwd_dkdv_kernel(Q, K, V, DO, DK, DV, LSE, Delta,
                    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                    stride_vb, stride_vs, stride_vh, stride_dob, stride_dos, stride_doh,
                    stride_dkb, stride_dks, stride_dkh, stride_dvb, stride_dvs, stride_dvh,
                    seqlen_q, seqlen_kv, heads_q, group, sm_scale, qk_scale,
                    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Grid (cdiv(seqlen_kv, BLOCK_N), batch * heads_kv): dK, dV of one key block of one kv head, summed
    over the ``group`` query heads that read it."""
    pid_n = tl.program_id(0)
    heads_kv = heads_q // group
    pid_bh = tl.program_id(1)
    b = (pid_bh // heads_kv).to(tl.int64)
    kv_h = (pid_bh % heads_kv).to(tl.int64)

    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    col_ok = offs_n < seqlen_kv
    k = tl.load(K + b * stride_kb + kv_h * stride_kh + offs_n[:, None] * stride_ks + offs_d[None, :],
                mask=col_ok[:, None], other=0.0)
    v = tl.load(V + b * stride_vb + kv_h * stride_vh + offs_n[:, None] * stride_vs + offs_d[None, :],
                mask=col_ok[:, None], other=0.0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)

    diagonal = seqlen_kv - seqlen_q
    if CAUSAL:
        # query i sees key j iff i >= j - diagonal: blocks before the block's first key's first viewer
        # are skipped; from the first row that sees its last key on, every row sees the whole block
        lo = (tl.maximum(start_n - diagonal, 0) // BLOCK_M) * BLOCK_M
        full_lo = tl.cdiv(tl.maximum(start_n + BLOCK_N - 1 - diagonal, 0), BLOCK_M) * BLOCK_M
    else:
        lo = 0
        full_lo = 0
    full_hi = (seqlen_q // BLOCK_M) * BLOCK_M   # blocks before it have no row past seqlen_q
    diag_hi = tl.minimum(full_lo, seqlen_q)
    tail_lo = tl.maximum(full_lo, full_hi)

    for j in range(0, group):
        h = kv_h * group + j
        q_base = Q + b * stride_qb + h * stride_qh
        do_base = DO + b * stride_dob + h * stride_doh
        lse_base = LSE + (b * heads_q + h) * seqlen_q
        delta_base = Delta + (b * heads_q + h) * seqlen_q
        for start_m in range(lo, diag_hi, BLOCK_M):       # the causal diagonal: masked
            dk, dv = _dkdv_block(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qs, stride_dos,
                                 start_m, offs_n, offs_d, seqlen_q, diagonal, qk_scale,
                                 MASKED=True, CAUSAL=CAUSAL, BLOCK_M=BLOCK_M, DOT_PRECISION=DOT_PRECISION)
        for start_m in range(full_lo, full_hi, BLOCK_M):  # fully visible, in bounds: no mask
            dk, dv = _dkdv_block(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qs, stride_dos,
                                 start_m, offs_n, offs_d, seqlen_q, diagonal, qk_scale,
                                 MASKED=False, CAUSAL=CAUSAL, BLOCK_M=BLOCK_M, DOT_PRECISION=DOT_PRECISION)
        for start_m in range(tail_lo, seqlen_q, BLOCK_M):  # the ragged last query block: masked
            dk, dv = _dkdv_block(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qs, stride_dos,
                                 start_m, offs_n, offs_d, seqlen_q, diagonal, qk_scale,
                                 MASKED=True, CAUSAL=CAUSAL, BLOCK_M=BLOCK_M, DOT_PRECISION=DOT_PRECISION)

    dk = dk * sm_scale
    tl.store(DK + b * stride_dkb + kv_h * stride_dkh + offs_n[:, None] * stride_dks + offs_d[None, :],
             dk.to(DK.dtype.element_ty), mask=col_ok[:, None])
    tl.store(DV + b * stride_dvb + kv_h * stride_dvh + offs_n[:, None] * stride_dvs + offs_d[None, :],
             dv.to(DV.dtype.element_ty), mask=col_ok[:, None])


@triton.jit
def _dq_block(dq, q, do, lse, delta, k_base, v_base, stride_ks, stride_vs, start_n, offs_m, offs_d, seqlen_kv,
              diagonal, qk_scale,
              MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Fold key block ``start_n`` into the query block's dQ accumulator (unscaled)."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    if MASKED:
        col_ok = offs_n < seqlen_kv
        k = tl.load(k_base + offs_n[:, None] * stride_ks + offs_d[None, :], mask=col_ok[:, None], other=0.0)
        v = tl.load(v_base + offs_n[:, None] * stride_vs + offs_d[None, :], mask=col_ok[:, None], other=0.0)
    else:
        k = tl.load(k_base + offs_n[:, None] * stride_ks + offs_d[None, :])
        v = tl.load(v_base + offs_n[:, None] * stride_vs + offs_d[None, :])
    qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
    p = tl.math.exp2(qk * qk_scale - lse[:, None])
    if MASKED:
        visible = col_ok[None, :]
        if CAUSAL:
            visible = visible & (offs_n[None, :] <= offs_m[:, None] + diagonal)
        p = tl.where(visible, p, 0.0)
    dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
    ds = p * (dp - delta[:, None])
    return tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PRECISION)


@triton.jit
def bwd_dq_kernel(Q, K, V, DO, DQ, LSE, Delta,
                  stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                  stride_vb, stride_vs, stride_vh, stride_dob, stride_dos, stride_doh,
                  stride_dqb, stride_dqs, stride_dqh,
                  seqlen_q, seqlen_kv, heads_q, group, sm_scale, qk_scale,
                  HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Grid (cdiv(seqlen_q, BLOCK_M), batch * heads_q): dQ of one query block, the forward's loop order."""
    if CAUSAL:
        pid_m = tl.num_programs(0) - 1 - tl.program_id(0)   # the longest rows first, as the forward
    else:
        pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // heads_q).to(tl.int64)
    h = pid_bh % heads_q
    kv_h = (h // group).to(tl.int64)
    h = h.to(tl.int64)
    k_base = K + b * stride_kb + kv_h * stride_kh
    v_base = V + b * stride_vb + kv_h * stride_vh

    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < seqlen_q
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qs + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)
    do = tl.load(DO + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_dos + offs_d[None, :],
                 mask=row_ok[:, None], other=0.0)
    lse = tl.load(LSE + pid_bh.to(tl.int64) * seqlen_q + offs_m, mask=row_ok, other=float("inf"))
    delta = tl.load(Delta + pid_bh.to(tl.int64) * seqlen_q + offs_m, mask=row_ok, other=0.0)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)

    diagonal = seqlen_kv - seqlen_q
    unmasked_hi, hi = key_bounds(start_m, diagonal, seqlen_kv, BLOCK_M, BLOCK_N, CAUSAL)
    for start_n in range(0, unmasked_hi, BLOCK_N):
        dq = _dq_block(dq, q, do, lse, delta, k_base, v_base, stride_ks, stride_vs, start_n, offs_m, offs_d,
                       seqlen_kv, diagonal, qk_scale,
                       MASKED=False, CAUSAL=CAUSAL, BLOCK_N=BLOCK_N, DOT_PRECISION=DOT_PRECISION)
    for start_n in range(unmasked_hi, hi, BLOCK_N):
        dq = _dq_block(dq, q, do, lse, delta, k_base, v_base, stride_ks, stride_vs, start_n, offs_m, offs_d,
                       seqlen_kv, diagonal, qk_scale,
                       MASKED=True, CAUSAL=CAUSAL, BLOCK_N=BLOCK_N, DOT_PRECISION=DOT_PRECISION)
    dq = dq * sm_scale
    tl.store(DQ + b * stride_dqb + h * stride_dqh + offs_m[:, None] * stride_dqs + offs_d[None, :],
             dq.to(DQ.dtype.element_ty), mask=row_ok[:, None])


def forward(q, k, v, out, *, causal: bool, scale: float, config: dict | None = None):
    """The forward kernel writing ``out`` and returning the log-sum-exp per row (fp32, log2 domain,
    ``(batch, heads_q, seqlen_q)``) that the backward needs."""
    batch, seqlen_q, heads_q, head_dim = q.shape
    dtype = str(q.dtype).split(".")[-1]
    config = config or fwd.config_for(head_dim, causal, "fp32" if dtype == "float32" else "bf16")
    lse = torch.empty((batch, heads_q, seqlen_q), dtype=torch.float32, device=q.device)
    args, constexprs, programs_bh = fwd.launch_args(q, k, v, out, causal=causal, scale=scale, lse=lse)
    grid = (triton.cdiv(seqlen_q, config["BLOCK_M"]), programs_bh)
    fwd.attention_fwd_kernel[grid](*args, **constexprs, BLOCK_M=config["BLOCK_M"], BLOCK_N=config["BLOCK_N"],
                                   num_warps=config["num_warps"], num_stages=config["num_stages"])
    return lse


def backward(q, k, v, out, lse, do, dq, dk, dv, *, causal: bool, scale: float, config: dict | None = None,
             delta=None) -> None:
    """Write the gradients of attention w.r.t. q, k and v into ``dq``, ``dk``, ``dv`` (like q, k, v; for
    GQA dk/dv of a kv head sum over its query heads). ``out`` and ``lse`` are the forward's; ``config``
    maps "dkdv" and "dq" to tiles (default ``bwd_config``); ``delta`` an fp32 scratch like ``lse``."""
    batch, seqlen_q, heads_q, head_dim = q.shape
    seqlen_kv, heads_kv = k.shape[1], k.shape[2]
    if heads_q % heads_kv:
        raise ValueError(f"heads_q={heads_q} is not a multiple of heads_kv={heads_kv}")
    tensors = (("q", q), ("k", k), ("v", v), ("out", out), ("do", do), ("dq", dq), ("dk", dk), ("dv", dv))
    for name, t in tensors:
        if t.stride(3) != 1:
            raise ValueError(f"{name}: the last (head_dim) dimension must be contiguous")
    dtype = str(q.dtype).split(".")[-1]
    config = config or bwd_config(head_dim, "fp32" if dtype == "float32" else dtype)
    precision = fwd.dot_precision(dtype)
    if delta is None:
        delta = torch.empty_like(lse)
    group = heads_q // heads_kv
    bwd_preprocess_kernel[(triton.cdiv(seqlen_q, PREPROCESS_BLOCK_M), batch * heads_q)](
        out, do, delta, *out.stride()[:3], *do.stride()[:3], seqlen_q, heads_q,
        HEAD_DIM=head_dim, BLOCK_M=PREPROCESS_BLOCK_M)
    common = (seqlen_q, seqlen_kv, heads_q, group, scale, scale * fwd.LOG2E)
    c = config["dkdv"]
    bwd_dkdv_kernel[(triton.cdiv(seqlen_kv, c["BLOCK_N"]), batch * heads_kv)](
        q, k, v, do, dk, dv, lse, delta, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3],
        *dk.stride()[:3], *dv.stride()[:3], *common, HEAD_DIM=head_dim, BLOCK_M=c["BLOCK_M"],
        BLOCK_N=c["BLOCK_N"], CAUSAL=bool(causal), DOT_PRECISION=precision, num_warps=c["num_warps"],
        num_stages=c["num_stages"])
    c = config["dq"]
    bwd_dq_kernel[(triton.cdiv(seqlen_q, c["BLOCK_M"]), batch * heads_q)](
        q, k, v, do, dq, lse, delta, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3],
        *dq.stride()[:3], *common, HEAD_DIM=head_dim, BLOCK_M=c["BLOCK_M"], BLOCK_N=c["BLOCK_N"],
        CAUSAL=bool(causal), DOT_PRECISION=precision, num_warps=c["num_warps"], num_stages=c["num_stages"])


class Saved(NamedTuple):
    """What the untimed forward keeps for the backward: its inputs, output, log-sum-exp, delta scratch."""

    q: Any
    k: Any
    v: Any
    out: Any
    lse: Any
    delta: Any


class TritonTraining(TrainingKernel):
    """The ``triton`` backend's kernel for modes bwd and fwd_bwd (kbench.api.TrainingKernel).

    ``forward(q, k, v)`` (untimed in mode bwd) runs the forward kernel saving O and the log-sum-exp;
    ``backward(saved, do, out, dq, dk, dv)`` (timed) copies O into ``out`` and runs the three backward
    kernels. A whole call (mode fwd_bwd) runs the forward straight into ``out``, then the backward.
    Arrays are the harness's (CuPy, or NumPy on the interpreter's ``cpu`` device), seen as torch tensors.
    """

    def __init__(self, *, causal: bool, scale: float, dtype, fwd_config: dict, bwd_config: dict) -> None:
        self.causal, self.scale, self.dtype = causal, scale, dtype
        self.fwd_config, self.bwd_config = fwd_config, bwd_config

    def _views(self, *arrays):
        return [as_torch(a, self.dtype) for a in arrays]

    def _forward(self, q, k, v, out):
        lse = forward(q, k, v, out, causal=self.causal, scale=self.scale, config=self.fwd_config)
        return Saved(q, k, v, out, lse, torch.empty_like(lse))

    def _backward(self, saved: Saved, do, dq, dk, dv) -> None:
        backward(saved.q, saved.k, saved.v, saved.out, saved.lse, do, dq, dk, dv, causal=self.causal,
                 scale=self.scale, config=self.bwd_config, delta=saved.delta)

    def forward(self, q, k, v) -> Saved:
        q, k, v = self._views(q, k, v)
        return self._forward(q, k, v, torch.empty_like(q))

    def backward(self, saved: Saved, do, out, dq, dk, dv) -> None:
        do, out, dq, dk, dv = self._views(do, out, dq, dk, dv)
        out.copy_(saved.out)
        self._backward(saved, do, dq, dk, dv)

    def __call__(self, *, q, k, v, do, out, dq, dk, dv) -> None:
        q, k, v, do, out, dq, dk, dv = self._views(q, k, v, do, out, dq, dk, dv)
        self._backward(self._forward(q, k, v, out), do, dq, dk, dv)
