"""Planted bug (kbench fuzz, shapes): key blocks of 64, the tail block dropped when seqlen_kv % 64 != 0.

Blockwise online softmax over keys, as a FlashAttention kernel walks its tiles; the loop bound is
``seqlen_kv // 64`` blocks, so the last ``seqlen_kv % 64`` keys are never read. Exact on 64, 128, 256...
"""
import numpy as np

NAME = "planted-tail-dropped"
BLOCK_N = 64


def attention(q, k, v, out, *, causal, scale):
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    group = hq // hkv
    qf = q.astype(np.float32)
    kf = np.repeat(k.astype(np.float32), group, axis=2)
    vf = np.repeat(v.astype(np.float32), group, axis=2)
    m = np.full((b, hq, sq, 1), -np.inf, dtype=np.float32)
    l = np.zeros((b, hq, sq, 1), dtype=np.float32)
    acc = np.zeros((b, hq, sq, d), dtype=np.float32)
    rows = np.arange(sq)[:, None] + (sk - sq)
    for start in range(0, (sk // BLOCK_N) * BLOCK_N, BLOCK_N):   # the bug: the tail block is never visited
        cols = np.arange(start, start + BLOCK_N)[None, :]
        s = np.einsum("bqhd,bkhd->bhqk", qf, kf[:, start:start + BLOCK_N]) * np.float32(scale)
        if causal:
            s = np.where(cols <= rows, s, -np.inf)
        new_m = np.maximum(m, s.max(-1, keepdims=True))
        safe = np.where(np.isfinite(new_m), new_m, 0)
        p = np.exp(s - safe)
        alpha = np.exp(np.where(np.isfinite(m), m - safe, -np.inf))
        l = l * alpha + p.sum(-1, keepdims=True)
        acc = acc * alpha + np.einsum("bhqk,bkhd->bhqd", p, vf[:, start:start + BLOCK_N])
        m = new_m
    res = acc / np.where(l == 0, 1, l)
    out[...] = res.transpose(0, 2, 1, 3)
