"""Planted bug (kbench fuzz, held-out shapes): Q K^T over head_dim in chunks of 64 once head_dim exceeds 64,
the remainder chunk skipped. Exact for head_dim up to 64 and for multiples of 64 (the suite's 32 and 64; 128),
wrong for 80, 96, 160, 192."""
import numpy as np

NAME = "planted-head-dim-past-suite"
CHUNK = 64


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
    sq, sk, hq, d = q.shape[1], k.shape[1], q.shape[2], q.shape[3]
    group = hq // k.shape[2]
    used = d if d <= CHUNK else (d // CHUNK) * CHUNK   # the bug: the remainder chunk past 64 skipped
    s = np.where(_visible(sq, sk, causal), _scores(q[..., :used], k[..., :used], scale, group), -np.inf)
    out[...] = _softmax_v(s, v, group)
