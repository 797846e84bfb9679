"""Planted bug (kbench fuzz, long rows): split-K with at most two splits of 2,048 keys, as if the launch grid
were sized for 4,096 keys: every key past 4,096 is never read. Exact up to 4,096 keys."""
import numpy as np

NAME = "planted-split-4k-dropped"
MAX_KEYS = 4096


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
    s = np.where(_visible(sq, sk, causal), _scores(q, k, scale, group), -np.inf)
    out[...] = _softmax_v(s[..., :MAX_KEYS], v[:, :MAX_KEYS], group)   # the bug: keys past 4,096 dropped
