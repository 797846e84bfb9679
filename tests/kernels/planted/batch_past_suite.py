"""Planted bug (kbench fuzz, held-out shapes): the batch loop unrolled for at most two sequences (the suite's
largest batch); the rows of a third sequence and after are left as they were (zeros). Exact for batch 1 and 2."""
import numpy as np

NAME = "planted-batch-past-suite"
MAX_BATCH = 2


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
    out[...] = 0
    for bi in range(min(q.shape[0], MAX_BATCH)):   # the bug: batch entries past the second never computed
        s = np.where(_visible(sq, sk, causal), _scores(q[bi:bi + 1], k[bi:bi + 1], scale, group), -np.inf)
        out[bi:bi + 1] = _softmax_v(s, v[bi:bi + 1], group)
