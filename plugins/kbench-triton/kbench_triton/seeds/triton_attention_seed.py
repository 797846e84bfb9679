"""Fused attention forward in Triton (FlashAttention-2 algorithm), the seed genome of the evolve plugin.

This file is the one source of kbench's own Triton kernel: the ``triton`` backend imports it, and
``kbench run SUITE -b .../triton_attention_seed.py`` runs it as a kernel file (substrate ``triton``).

Algorithm (Dao, "FlashAttention-2", 2023, section 3.1): one program per (query block, batch*head).
The program keeps its query block in registers and walks the key/value blocks left to right with an
online softmax: a running row maximum ``m``, a running denominator ``l`` and an unnormalised fp32
accumulator, rescaled by ``2^(m_old - m_new)`` whenever the maximum grows; the division by ``l``
happens once, at the end. Scores live in the log2 domain: the softmax scale is multiplied by log2(e)
once, so the exponential is a bare ``exp2``.

Conventions (kbench's ``attention`` op): layout (batch, seqlen, heads, head_dim), last dimension
contiguous; causal masking aligned bottom-right (query ``i`` sees key ``j`` iff
``j <= i + seqlen_kv - seqlen_q``); a query row that sees no key outputs 0; GQA/MQA reads kv head
``h // (heads_q // heads_kv)`` in place (K and V are never repeated in memory).

Masks cost instructions, so the key loop runs in two phases: key blocks that every row of the query
block fully sees run without masks; the remaining blocks (the diagonal under causal, the ragged tail of
the keys) run with masks. Key blocks entirely in the causal future are never visited (loop bound).
"""
from __future__ import annotations

from types import MappingProxyType

import triton
import triton.language as tl

SUBSTRATE = "triton"
OP = "attention"

#: The kernel's knobs: the one place the ``triton`` backend, the AOT check and the evolve plugin's
#: ``mutate`` operator read them from. None of them changes the result (up to rounding order).
#: The defaults fit every supported head dim (up to 256) on sm_80, sm_90 and sm_100 for 16-bit inputs.
TUNABLES = {
    "BLOCK_M": {"default": 64, "choices": [64, 128], "help": "query rows per program"},
    "BLOCK_N": {"default": 64, "choices": [32, 64, 128], "help": "key rows per step of the inner loop"},
    "num_warps": {"default": 4, "choices": [4, 8], "help": "warps per program"},
    "num_stages": {"default": 2, "choices": [1, 2, 3, 4], "help": "software-pipelining depth of K/V loads"},
}

#: The configuration per shape, used by the ``triton`` backend: (head_dim, causal) -> settings.
#: Wider heads need smaller tiles (shared memory holds num_stages copies of a K and a V tile).
CONFIGS = MappingProxyType({
    (64, False): MappingProxyType({"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3}),
    (64, True): MappingProxyType({"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3}),
    (128, False): MappingProxyType({"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3}),
    (128, True): MappingProxyType({"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3}),
    (256, False): MappingProxyType({"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 8, "num_stages": 2}),
    (256, True): MappingProxyType({"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 8, "num_stages": 2}),
})

#: fp32 inputs (a correctness aid, not a speed target) take twice the shared memory per tile
FP32_CONFIG = MappingProxyType({"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1})

#: Candidates for ``triton.autotune`` (backend ``triton-autotune``), per head_dim; the autotuner
#: keys its choice on (seqlen_q, seqlen_kv, head_dim, causal, dtype). Read-only like every table here:
#: run as a kernel file, the module may keep no mutable state (integrity.forbid_module_state).
AUTOTUNE_CONFIGS = MappingProxyType({
    64: tuple(MappingProxyType(dict(BLOCK_M=m, BLOCK_N=n, num_warps=w, num_stages=s))
              for m, n, w, s in [(128, 64, 4, 3), (128, 128, 8, 3), (64, 64, 4, 4), (128, 32, 4, 4)]),
    128: tuple(MappingProxyType(dict(BLOCK_M=m, BLOCK_N=n, num_warps=w, num_stages=s))
               for m, n, w, s in [(128, 64, 8, 3), (128, 128, 8, 2), (128, 32, 8, 4), (64, 64, 4, 3)]),
    256: tuple(MappingProxyType(dict(BLOCK_M=m, BLOCK_N=n, num_warps=w, num_stages=s))
               for m, n, w, s in [(64, 64, 8, 2), (64, 32, 4, 2), (128, 32, 8, 2), (64, 64, 4, 1)]),
})

HEAD_DIMS = (16, 32, 64, 128, 256)
LOG2E = 1.4426950408889634


def supports(params) -> str | None:
    """Why this kernel cannot run a case of the ``attention`` op, or None."""
    d = params["head_dim"]
    if d not in HEAD_DIMS:
        return f"head_dim {d} not supported (Triton tiles need a power of two: {', '.join(map(str, HEAD_DIMS))})"
    return None


def config_for(head_dim: int, causal: bool, dtype: str = "bf16") -> dict:
    """The tuned configuration for a shape; the tunables' defaults for shapes not in ``CONFIGS``."""
    if dtype == "fp32":
        return dict(FP32_CONFIG)
    return dict(CONFIGS.get((head_dim, bool(causal)), {k: t["default"] for k, t in TUNABLES.items()}))


@triton.jit
def _attend_block(acc, l_i, m_i, q, k_base, v_base, stride_ks, stride_vs, start_n, offs_m, offs_n, offs_d,
                  seqlen_kv, diagonal, qk_scale,
                  MASKED: tl.constexpr, CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One step of the online softmax: fold key/value block ``start_n`` into (acc, l, m)."""
    cols = start_n + offs_n
    if MASKED:
        col_ok = cols < seqlen_kv
        k = tl.load(k_base + cols[:, None] * stride_ks + offs_d[None, :], mask=col_ok[:, None], other=0.0)
        v = tl.load(v_base + cols[:, None] * stride_vs + offs_d[None, :], mask=col_ok[:, None], other=0.0)
    else:
        k = tl.load(k_base + cols[:, None] * stride_ks + offs_d[None, :])
        v = tl.load(v_base + cols[:, None] * stride_vs + offs_d[None, :])
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
    if MASKED:
        visible = col_ok[None, :]
        if CAUSAL:
            visible = visible & (cols[None, :] <= offs_m[:, None] + diagonal)
        s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    if MASKED:
        # a row that has seen no key yet keeps m = -inf; subtract 0 so that exp2 gives 0, not NaN
        m_new_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_new_safe = m_new
    p = tl.math.exp2(s - m_new_safe[:, None])
    alpha = tl.math.exp2(m_i - m_new_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
    return acc, l_i, m_new


@triton.jit
def key_bounds(start_m, diagonal, seqlen_kv, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """The key range of the query block at ``start_m``: blocks before ``unmasked_hi`` need no mask,
    blocks from there to ``hi`` do (the causal diagonal, the ragged tail); keys from ``hi`` on are never
    visited. Returns (unmasked_hi, hi); the backward's dQ pass walks the same range."""
    if CAUSAL:
        # keys past the block's last row's diagonal are never visited; keys up to its first row's
        # diagonal are visible to every row of the block and need no mask
        hi = tl.maximum(tl.minimum(seqlen_kv, start_m + BLOCK_M + diagonal), 0)
        unmasked_hi = tl.minimum(tl.maximum(start_m + diagonal + 1, 0), seqlen_kv)
    else:
        hi = seqlen_kv
        unmasked_hi = seqlen_kv
    return (unmasked_hi // BLOCK_N) * BLOCK_N, hi


@triton.jit
def attention_fwd_kernel(Q, K, V, O, LSE,
                         stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                         stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh,
                         seqlen_q, seqlen_kv, heads_q, group, qk_scale,
                         HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr, STORE_LSE: tl.constexpr = False):
    """Grid (cdiv(seqlen_q, BLOCK_M), batch * heads_q); ``qk_scale`` = softmax scale * log2(e).

    With ``STORE_LSE`` the program also writes each row's log-sum-exp of the scaled scores, in the log2
    domain (``m + log2(l)``), into ``LSE`` (fp32, ``(batch, heads_q, seqlen_q)`` contiguous): what the
    backward (``kbench_triton/backward.py``) needs to recompute P. A row that sees no key stores +inf,
    so that ``exp2(s - lse)`` is 0 for it in the backward. Without it ``LSE`` is never touched."""
    if CAUSAL:
        # the last query blocks see the most keys: start them first so the tail of the grid is short
        pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    else:
        pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // heads_q).to(tl.int64)
    h = pid_bh % heads_q
    kv_h = (h // group).to(tl.int64)
    h = h.to(tl.int64)
    q_base = Q + b * stride_qb + h * stride_qh
    k_base = K + b * stride_kb + kv_h * stride_kh
    v_base = V + b * stride_vb + kv_h * stride_vh
    o_base = O + b * stride_ob + h * stride_oh

    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < seqlen_q
    q = tl.load(q_base + offs_m[:, None] * stride_qs + offs_d[None, :], mask=row_ok[:, None], other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)

    # bottom-right causal alignment: row i sees keys j <= i + diagonal
    diagonal = seqlen_kv - seqlen_q
    unmasked_hi, hi = key_bounds(start_m, diagonal, seqlen_kv, BLOCK_M, BLOCK_N, CAUSAL)

    for start_n in range(0, unmasked_hi, BLOCK_N):
        acc, l_i, m_i = _attend_block(acc, l_i, m_i, q, k_base, v_base, stride_ks, stride_vs, start_n,
                                      offs_m, offs_n, offs_d, seqlen_kv, diagonal, qk_scale,
                                      MASKED=False, CAUSAL=CAUSAL, DOT_PRECISION=DOT_PRECISION)
    for start_n in range(unmasked_hi, hi, BLOCK_N):
        acc, l_i, m_i = _attend_block(acc, l_i, m_i, q, k_base, v_base, stride_ks, stride_vs, start_n,
                                      offs_m, offs_n, offs_d, seqlen_kv, diagonal, qk_scale,
                                      MASKED=True, CAUSAL=CAUSAL, DOT_PRECISION=DOT_PRECISION)

    # rows that saw no key have l = 0 and acc = 0: output 0
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(o_base + offs_m[:, None] * stride_os + offs_d[None, :], out.to(O.dtype.element_ty),
             mask=row_ok[:, None])
    if STORE_LSE:
        lse = tl.where(l_i == 0.0, float("inf"), m_i + tl.math.log2(tl.where(l_i == 0.0, 1.0, l_i)))
        tl.store(LSE + pid_bh.to(tl.int64) * seqlen_q + offs_m, lse, mask=row_ok)


def dot_precision(dtype_name: str) -> str:
    """fp32 inputs use 3xTF32 products (about fp32 accuracy, on tensor cores): plain TF32 would miss
    kbench's fp32 tolerance, and exact "ieee" products compile and run far slower (scalar FMAs)."""
    return "tf32x3" if dtype_name == "float32" else "tf32"


def launch_args(q, k, v, out, *, causal: bool, scale: float, lse=None):
    """Positional arguments and shape constexprs of ``attention_fwd_kernel``, and the grid's second axis;
    with ``lse`` (fp32 ``(batch, heads_q, seqlen_q)``, contiguous) the kernel also stores the log-sum-exp."""
    batch, seqlen_q, heads_q, head_dim = q.shape
    seqlen_kv, heads_kv = k.shape[1], k.shape[2]
    if heads_q % heads_kv:
        raise ValueError(f"heads_q={heads_q} is not a multiple of heads_kv={heads_kv}")
    for name, t in (("q", q), ("k", k), ("v", v), ("out", out)):
        if t.stride(3) != 1:
            raise ValueError(f"{name}: the last (head_dim) dimension must be contiguous")
    args = (q, k, v, out, out if lse is None else lse, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
            *out.stride()[:3], seqlen_q, seqlen_kv, heads_q, heads_q // heads_kv, scale * LOG2E)
    constexprs = dict(HEAD_DIM=head_dim, CAUSAL=bool(causal), DOT_PRECISION=dot_precision(str(q.dtype).split(".")[-1]),
                      STORE_LSE=lse is not None)
    return args, constexprs, batch * heads_q


def attention(q, k, v, out, *, causal: bool, scale: float, BLOCK_M: int = 64, BLOCK_N: int = 64,
              num_warps: int = 4, num_stages: int = 2) -> None:
    """Write softmax(q k^T * scale [+ causal mask]) v into ``out`` (torch tensors on one device)."""
    args, constexprs, programs_bh = launch_args(q, k, v, out, causal=causal, scale=scale)
    grid = (triton.cdiv(q.shape[1], BLOCK_M), programs_bh)
    attention_fwd_kernel[grid](*args, **constexprs, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
                               num_warps=num_warps, num_stages=num_stages)
