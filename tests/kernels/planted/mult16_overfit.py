"""Planted bug (kbench fuzz, held-out shapes): a kernel tuned on power-of-two lengths with a fast path for
multiples of 16 whose key loop stops one tile early. Lengths that are powers of two (the suite's) and those that
are not multiples of 16 (the fallback path) are exact; 48, 80, 96, 144... keys are wrong."""
import numpy as np

NAME = "planted-mult16-overfit"
TILE = 16


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
    s = np.where(_visible(sq, sk, causal), _scores(q, k, scale, group), -np.inf)
    if sk % TILE == 0 and sk & (sk - 1):   # the "fast path": the bug, its last tile never visited
        s, v = s[..., :sk - TILE], v[:, :sk - TILE]
    out[...] = _softmax_v(s, v, group)
