"""Planted bug (kbench fuzz, value ranges): q, k and v clamped to [-4, 4] on the way in, as a kernel whose
quantisation range was fitted to tame activations. Unit-variance inputs never reach 4 (|x| <= 1.73): exact on
every suite of today's inputs, wrong wherever a channel or token is an outlier."""
import numpy as np

NAME = "planted-outlier-clamp"


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
    hq, hkv = q.shape[2], k.shape[2]
    group = hq // hkv
    q, k, v = (np.clip(x.astype(np.float32), -4.0, 4.0) for x in (q, k, v))   # the bug: outliers clipped
    s = np.where(_visible(q.shape[1], k.shape[1], causal), _scores(q, k, scale, group), -np.inf)
    out[...] = _softmax_v(s, v, group)
