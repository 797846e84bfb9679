"""Planted bug (kbench fuzz, held-out shapes): the key/value head of query head ``h`` computed with a shift,
``h >> log2(group)``, as if the group size were a power of two. Exact for groups of 1, 2, 4, 8 (every
power-of-two suite), wrong for 3, 5, 6, 7."""
import numpy as np

NAME = "planted-odd-gqa"


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
    sq, sk, hq, hkv = q.shape[1], k.shape[1], q.shape[2], k.shape[2]
    group = hq // hkv
    index = np.minimum(np.arange(hq) >> (group.bit_length() - 1), hkv - 1)   # the bug: a shift, not a division
    kk, vv = k[:, :, index], v[:, :, index]
    s = np.where(_visible(sq, sk, causal), _scores(q, kk, scale, 1), -np.inf)
    out[...] = _softmax_v(s, vv, 1)
