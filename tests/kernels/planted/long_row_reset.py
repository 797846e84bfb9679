"""Planted bug (kbench fuzz, long rows): an online softmax over key blocks of 128 whose running max, sum and
accumulator are reset every 1,024 keys (a block counter that wraps), so a row past 1,024 keys keeps only its last
1,024-key stretch. Exact up to 1,024 keys: every power-of-two suite of short rows passes."""
import numpy as np

NAME = "planted-long-row-reset"
BLOCK_N, RESET = 128, 1024


def _scores(q, k, scale, group):
    """(b, hq, sq, sk) float32 scores, kv heads repeated for their query heads."""
    kf = np.repeat(k.astype(np.float32), group, axis=2)
    return np.einsum("bqhd,bkhd->bhqk", q.astype(np.float32), kf) * np.float32(scale)


def _visible(sq, sk, causal):
    if not causal:
        return np.ones((sq, sk), dtype=bool)
    return np.arange(sk)[None, :] <= np.arange(sq)[:, None] + (sk - sq)


def _softmax_v(s, v, group):
    """Exact softmax(s) V with the row max subtracted; rows that see nothing give 0."""
    m = s.max(-1, keepdims=True)
    p = np.exp(s - np.where(np.isfinite(m), m, 0))
    l = p.sum(-1, keepdims=True)
    vf = np.repeat(v.astype(np.float32), group, axis=2)
    return np.einsum("bhqk,bkhd->bqhd", p / np.where(l == 0, 1, l), vf)


def attention(q, k, v, out, *, causal, scale):
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    group = hq // hkv
    s_all = _scores(q, k, scale, group)
    s_all = np.where(_visible(sq, sk, causal), s_all, -np.inf)
    vf = np.repeat(v.astype(np.float32), group, axis=2)
    m = np.full((b, hq, sq, 1), -np.inf, dtype=np.float32)
    l = np.zeros((b, hq, sq, 1), dtype=np.float32)
    acc = np.zeros((b, hq, sq, d), dtype=np.float32)
    for start in range(0, sk, BLOCK_N):
        if start and start % RESET == 0:   # the bug: the running state starts over
            m[...], l[...], acc[...] = -np.inf, 0, 0
        s = s_all[..., start:start + BLOCK_N]
        new_m = np.maximum(m, s.max(-1, keepdims=True))
        safe = np.where(np.isfinite(new_m), new_m, 0)
        p = np.exp(s - safe)
        alpha = np.exp(np.where(np.isfinite(m), m - safe, -np.inf))
        l = l * alpha + p.sum(-1, keepdims=True)
        acc = acc * alpha + np.einsum("bhqk,bkhd->bhqd", p, vf[:, start:start + BLOCK_N])
        m = new_m
    out[...] = (acc / np.where(l == 0, 1, l)).transpose(0, 2, 1, 3)
