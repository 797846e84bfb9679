"""A warp-specialised attention loop with the row-index pattern Triton's data partition shifts twice.

``offs_m = start_m + tl.arange(0, BLOCK_M)`` in the causal mask, with ``start_m`` also the TMA coordinate
of Q and O: when Triton splits the 128 rows between two consumer warpgroups, the second one's rows come
out as ``start_m + 64 + (64..127)``. Kept only so that ``tests/test_aot.py`` can show that
``aot.analyse_warp_specialization`` flags it; ``seeds/triton_hopper_seed.py`` avoids the pattern.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def shifted_rows_kernel(Q, K, V, O, seqlen, qk_scale, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    q_desc = tl.make_tensor_descriptor(Q, shape=[seqlen, HEAD_DIM], strides=[HEAD_DIM, 1],
                                       block_shape=[BLOCK_M, HEAD_DIM])
    k_desc = tl.make_tensor_descriptor(K, shape=[seqlen, HEAD_DIM], strides=[HEAD_DIM, 1],
                                       block_shape=[BLOCK_N, HEAD_DIM])
    v_desc = tl.make_tensor_descriptor(V, shape=[seqlen, HEAD_DIM], strides=[HEAD_DIM, 1],
                                       block_shape=[BLOCK_N, HEAD_DIM])
    o_desc = tl.make_tensor_descriptor(O, shape=[seqlen, HEAD_DIM], strides=[HEAD_DIM, 1],
                                       block_shape=[BLOCK_M, HEAD_DIM])
    offs_m = start_m + tl.arange(0, BLOCK_M)
    q = q_desc.load([start_m, 0])
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for start_n in tl.range(0, start_m + BLOCK_M, BLOCK_N, warp_specialize=True):
        k = k_desc.load([start_n, 0])
        v = v_desc.load([start_n, 0])
        s = tl.dot(q, tl.trans(k)) * qk_scale
        s = tl.where((start_n + tl.arange(0, BLOCK_N))[None, :] <= offs_m[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    o_desc.store([start_m, 0], (acc / l_i[:, None]).to(O.dtype.element_ty))
