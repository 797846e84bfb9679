"""Fused attention forward for Hopper (sm_90) in Triton: TMA tensor descriptors and warp specialisation.

The second seed genome of the evolve plugin and the kernel of the ``triton-hopper`` backend. Same
algorithm and conventions as ``triton_attention_seed.py`` (FlashAttention-2 forward, online softmax in
the log2 domain, bottom-right causal alignment, GQA in place, rows that see no key output 0, two-phase
key loop: unmasked blocks first, then the diagonal/ragged ones), with what Triton offers on Hopper:

- **Tensor descriptors** (``tl.make_tensor_descriptor``): each program describes its (batch, head)
  slice of Q, K, V and O as a 2-D ``[seqlen, HEAD_DIM]`` tensor; loads and the store of O go through the
  Tensor Memory Accelerator (``cp.async.bulk.tensor`` in the PTX), which fills shared memory
  asynchronously and zero-fills rows past ``seqlen`` (and clips stores there), so the kernel needs no
  load masks. The descriptors are built on the device (128 bytes of global scratch each, from the
  allocator ``triton.set_allocator`` installs), so their base can be the program's own slice.
- **Warp specialisation** (``tl.range(..., warp_specialize=True)``, tunable ``WARP_SPECIALIZE``): Triton
  splits the key loop into producer warps that issue the TMA loads and consumer warpgroups that run the
  two ``wgmma`` products and the softmax, handing tiles over through ``mbarrier``-guarded shared-memory
  stages, and moves registers from producers to consumers (``setmaxnreg``). With ``num_warps=4`` and 128-row
  blocks each of the two consumer warpgroups gets 64 rows; the row indices are built without the block's
  base so that Triton's row split shifts them once (see ``_fold_block``). Triton versions that cannot
  specialise this loop for sm_90 still pipeline it (``num_stages``): ``kbench triton-aot --emit-ptx``
  states per configuration which of TMA, wgmma and setmaxnreg the PTX contains and how the rows were split.

Requirements of TMA: 16-byte aligned bases and row strides (kbench's contiguous layouts satisfy them
for head_dim >= 8 in 16-bit types) and a contiguous head_dim.
"""
from __future__ import annotations

from types import MappingProxyType

import triton
import triton.language as tl

SUBSTRATE = "triton"
OP = "attention"

#: The kernel's knobs (read by the backend, the AOT check and the evolve plugin's ``mutate``); the
#: defaults fit every supported head dim (up to 256) in sm_90's 227 KiB of shared memory. Warp specialisation
#: only pays with 128-row blocks: with 64 rows Triton cannot split them between its two consumer
#: warpgroups and both compute the whole tile (docs/triton.md), hence the default 0.
TUNABLES = {
    "BLOCK_M": {"default": 64, "choices": [64, 128], "help": "query rows per program"},
    "BLOCK_N": {"default": 64, "choices": [64, 128], "help": "key rows per TMA load and inner-loop step"},
    "num_warps": {"default": 4, "choices": [4, 8], "help": "warps per program (consumer warpgroups x 4)"},
    "num_stages": {"default": 2, "choices": [2, 3, 4], "help": "shared-memory stages of the K/V ring"},
    "WARP_SPECIALIZE": {"default": 0, "choices": [0, 1], "help": "producer/consumer warp specialisation"},
}


def _config(m: int, n: int, warps: int, stages: int, ws: int) -> MappingProxyType:
    return MappingProxyType({"BLOCK_M": m, "BLOCK_N": n, "num_warps": warps, "num_stages": stages,
                             "WARP_SPECIALIZE": ws})


#: (head_dim, causal) -> configuration launched by the ``triton-hopper`` backend, chosen from the sm_90
#: compile data (docs/triton.md, "Choosing the configurations": Triton 3.6, registers, spills, shared memory,
#: how the warp specialisation split the rows) and the H200's two runs (docs/gpu.md):
#: - 128 (full and causal): warp-specialised 128/128, two consumers of 64 rows, 168 registers at entry, no
#:   spills, 192 KiB (563 TFLOP/s non-causal at 16k tokens on the H200); the two-loop path with 4 warps
#:   spills 1.5 KB there (220 TFLOP/s measured).
#: - 64: the two-loop path 128/128 with 4 warps (255 registers, no spill; 406 / 368 TFLOP/s full / causal on
#:   the H200 against 340 non-causal warp-specialised, before its masks and exponent were simplified:
#:   scripts/gpu-check's tuning stage measures both again).
#: - 256: the two-loop path 64/64 with 8 warps (169 registers, no spill, 161 KiB): 64-row blocks give warp
#:   specialisation two consumers doing the same products, and 128-row ones need 262 KiB with two stages.
#: - 16, 32: warp-specialised 128/128 (no spill; the two-loop path spills 36 B at 32). Not measured.
CONFIGS = MappingProxyType({
    **{(d, causal): _config(128, 128, 4, 2, 1) for d in (16, 32, 128) for causal in (False, True)},
    **{(64, causal): _config(128, 128, 4, 2, 0) for causal in (False, True)},
    **{(256, causal): _config(64, 64, 8, 2, 0) for causal in (False, True)},
})

HEAD_DIMS = (16, 32, 64, 128, 256)
LOG2E = 1.4426950408889634


def supports(params) -> str | None:
    """Why this kernel cannot run a case of the ``attention`` op, or None."""
    d = params["head_dim"]
    if d not in HEAD_DIMS:
        return f"head_dim {d} not supported (TMA tiles need a power of two: {', '.join(map(str, HEAD_DIMS))})"
    if params["dtype"] not in ("bf16", "fp16"):
        return "the Hopper kernel takes bf16/fp16 (wgmma on 16-bit inputs); fp32 runs on the `triton` backend"
    return None


def config_for(head_dim: int, causal: bool, dtype: str = "bf16") -> dict:
    """The configuration for a shape; the tunables' defaults for shapes not in ``CONFIGS``."""
    return dict(CONFIGS.get((head_dim, bool(causal)), {k: t["default"] for k, t in TUNABLES.items()}))


@triton.jit
def _fold_block(acc, l_i, m_i, q, k_desc, v_desc, start_n, rows, offs_n, seqlen_kv, last_key, qk_scale,
                MASK: tl.constexpr):
    """One online-softmax step over the key/value tile at ``start_n`` (TMA loads: zero past seqlen_kv).

    ``MASK``: 0 none (every key of the tile is visible to every row), 1 keys past ``seqlen_kv``, 2 causal.
    ``rows`` are the query rows' indices inside the block (0..BLOCK_M-1) and ``last_key`` the last key
    the block's first row sees, so row ``r`` sees tile column ``c`` iff ``c <= r + last_key - start_n``:
    one compare per score against a per-row bound. Under the causal mask every row the kernel stores
    (``start_m + r < seqlen_q``) sees only keys below ``seqlen_kv``, so no second mask is needed; the
    padding rows past ``seqlen_q`` may read TMA's zero-filled keys and are never stored.

    The block's base ``start_m`` is kept out of the row tensor on purpose: Triton's warp specialisation
    (3.6 and 3.9) splits the block's rows between two consumer warpgroups and, for the second, adds the
    half's offset both to ``tl.arange`` and to every sliced use of the value it took as the TMA
    coordinate (``start_m``), so ``start_m + tl.arange(0, BLOCK_M)`` is shifted twice there and the causal
    mask lets those rows see BLOCK_M / 2 keys of their future (docs/triton.md)."""
    k = k_desc.load([start_n, 0])
    v = v_desc.load([start_n, 0])
    qk = tl.dot(q, tl.trans(k))
    if MASK == 1:
        qk = tl.where((offs_n < seqlen_kv - start_n)[None, :], qk, float("-inf"))
    elif MASK == 2:
        qk = tl.where(offs_n[None, :] <= (rows + (last_key - start_n))[:, None], qk, float("-inf"))
    # the running maximum is kept scaled (qk_scale > 0), so that the exponent is one FMA per score
    m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
    if MASK != 0:
        # a row that has seen no key yet keeps m = -inf: subtract 0 so that exp2 gives 0, not NaN
        m_new_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_new_safe = m_new
    p = tl.math.exp2(qk * qk_scale - m_new_safe[:, None])
    alpha = tl.math.exp2(m_i - m_new_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return acc, l_i, m_new


@triton.jit
def attention_hopper_kernel(Q, K, V, O,
                            stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                            stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh,
                            seqlen_q, seqlen_kv, heads_q, group, qk_scale,
                            HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                            CAUSAL: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, EVEN_KV: tl.constexpr):
    """Grid (cdiv(seqlen_q, BLOCK_M), batch * heads_q); ``qk_scale`` = softmax scale * log2(e);
    ``EVEN_KV``: ``seqlen_kv`` is a multiple of ``BLOCK_N`` (no ragged key tile)."""
    if CAUSAL:
        pid_m = tl.num_programs(0) - 1 - tl.program_id(0)  # longest rows first: a short tail
    else:
        pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // heads_q).to(tl.int64)
    h = pid_bh % heads_q
    kv_h = (h // group).to(tl.int64)
    h = h.to(tl.int64)
    # one 2-D [seqlen, HEAD_DIM] view per (batch, head): TMA zero-fills and clips rows past seqlen
    q_desc = tl.make_tensor_descriptor(Q + b * stride_qb + h * stride_qh, shape=[seqlen_q, HEAD_DIM],
                                       strides=[stride_qs, 1], block_shape=[BLOCK_M, HEAD_DIM])
    k_desc = tl.make_tensor_descriptor(K + b * stride_kb + kv_h * stride_kh, shape=[seqlen_kv, HEAD_DIM],
                                       strides=[stride_ks, 1], block_shape=[BLOCK_N, HEAD_DIM])
    v_desc = tl.make_tensor_descriptor(V + b * stride_vb + kv_h * stride_vh, shape=[seqlen_kv, HEAD_DIM],
                                       strides=[stride_vs, 1], block_shape=[BLOCK_N, HEAD_DIM])
    o_desc = tl.make_tensor_descriptor(O + b * stride_ob + h * stride_oh, shape=[seqlen_q, HEAD_DIM],
                                       strides=[stride_os, 1], block_shape=[BLOCK_M, HEAD_DIM])

    start_m = pid_m * BLOCK_M
    rows = tl.arange(0, BLOCK_M)  # inside the block, never offset by start_m: see _fold_block
    offs_n = tl.arange(0, BLOCK_N)
    q = q_desc.load([start_m, 0])
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)

    diagonal = seqlen_kv - seqlen_q  # bottom-right causal: row i sees keys j <= i + diagonal
    last_key = start_m + diagonal  # the last key the block's first row sees
    if CAUSAL:
        hi = tl.maximum(tl.minimum(seqlen_kv, start_m + BLOCK_M + diagonal), 0)
        unmasked_hi = tl.minimum(tl.maximum(last_key + 1, 0), seqlen_kv)
        MASK: tl.constexpr = 2
    else:
        hi = seqlen_kv
        unmasked_hi = seqlen_kv
        MASK: tl.constexpr = 0 if EVEN_KV else 1
    unmasked_hi = (unmasked_hi // BLOCK_N) * BLOCK_N

    if WARP_SPECIALIZE:
        # Triton specialises one loop per kernel on sm_90 (a second loop after it fails to compile):
        # one loop over every visible block; under causal the mask is applied on each (a compare and a
        # select per score), without it only when the key length is ragged
        for start_n in tl.range(0, hi, BLOCK_N, warp_specialize=True):
            acc, l_i, m_i = _fold_block(acc, l_i, m_i, q, k_desc, v_desc, start_n, rows, offs_n, seqlen_kv,
                                        last_key, qk_scale, MASK=MASK)
    else:
        for start_n in tl.range(0, unmasked_hi, BLOCK_N):
            acc, l_i, m_i = _fold_block(acc, l_i, m_i, q, k_desc, v_desc, start_n, rows, offs_n, seqlen_kv,
                                        last_key, qk_scale, MASK=0)
        for start_n in tl.range(unmasked_hi, hi, BLOCK_N):
            acc, l_i, m_i = _fold_block(acc, l_i, m_i, q, k_desc, v_desc, start_n, rows, offs_n, seqlen_kv,
                                        last_key, qk_scale, MASK=2 if CAUSAL else 1)

    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    o_desc.store([start_m, 0], out.to(O.dtype.element_ty))


def _scratch(size: int, alignment: int, stream):
    """Global scratch for the device-side tensor descriptors (Triton asks through ``set_allocator``)."""
    import torch

    return torch.empty(size, dtype=torch.int8, device="cuda")


def launch_args(q, k, v, out, *, causal: bool, scale: float):
    """Positional arguments and shape constexprs of ``attention_hopper_kernel``, and the grid's second axis."""
    batch, seqlen_q, heads_q, head_dim = q.shape
    seqlen_kv, heads_kv = k.shape[1], k.shape[2]
    if heads_q % heads_kv:
        raise ValueError(f"heads_q={heads_q} is not a multiple of heads_kv={heads_kv}")
    for name, t in (("q", q), ("k", k), ("v", v), ("out", out)):
        if t.stride(3) != 1:
            raise ValueError(f"{name}: the last (head_dim) dimension must be contiguous")
        if (t.stride(1) * t.element_size()) % 16:
            raise ValueError(f"{name}: TMA needs a row stride that is a multiple of 16 bytes")
    args = (q, k, v, out, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3],
            seqlen_q, seqlen_kv, heads_q, heads_q // heads_kv, scale * LOG2E)
    return args, dict(HEAD_DIM=head_dim, CAUSAL=bool(causal)), batch * heads_q


def attention(q, k, v, out, *, causal: bool, scale: float, BLOCK_M: int = 64, BLOCK_N: int = 64,
              num_warps: int = 4, num_stages: int = 2, WARP_SPECIALIZE: int = 0) -> None:
    """Write softmax(q k^T * scale [+ causal mask]) v into ``out`` (torch tensors on one device)."""
    args, constexprs, programs_bh = launch_args(q, k, v, out, causal=causal, scale=scale)
    if q.is_cuda:
        triton.set_allocator(_scratch)
    grid = (triton.cdiv(q.shape[1], BLOCK_M), programs_bh)
    attention_hopper_kernel[grid](*args, **constexprs, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
                                  WARP_SPECIALIZE=bool(WARP_SPECIALIZE), EVEN_KV=k.shape[1] % BLOCK_N == 0,
                                  num_warps=num_warps, num_stages=num_stages)
