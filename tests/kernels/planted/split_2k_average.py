"""Planted bug (kbench fuzz, long rows): split-K over keys in splits of 2,048, the splits' partial outputs
combined by a plain average instead of weighting each by its share of the softmax sum (flash-decoding's
combine). One split (up to 2,048 keys) is exact: every power-of-two suite of short rows passes."""
import numpy as np

NAME = "planted-split-2k-average"
SPLIT = 2048


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
    s_all = np.where(_visible(sq, sk, causal), _scores(q, k, scale, group), -np.inf)
    parts, seen = [], []
    for start in range(0, sk, SPLIT):
        s = s_all[..., start:start + SPLIT]
        parts.append(_softmax_v(s, v[:, start:start + SPLIT], group))
        seen.append(np.isfinite(s).any(-1).transpose(0, 2, 1)[..., None])   # (b, sq, hq, 1)
    total = np.sum([p * w for p, w in zip(parts, seen)], axis=0)
    count = np.sum(seen, axis=0)
    out[...] = total / np.where(count == 0, 1, count)   # the bug: a plain average of the splits
