"""Planted bug (kbench fuzz, value ranges): a softmax without the row max subtracted, its probabilities P kept
in fp16 (16-bit inputs) before P V. With unit-variance inputs the scores stay within about +-5 and exp never
overflows, so every suite of today's inputs passes; scores past 11 (fp16 P) or 88 (float32) make exp(s) inf, and
the output NaN."""
import numpy as np

NAME = "planted-no-max-fp16"


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
    s = _scores(q, k, scale, group)
    with np.errstate(over="ignore", invalid="ignore"):
        p = np.exp(s)   # the bug: no max subtracted (float32 exp overflows past 88)
        if q.dtype.itemsize == 2:   # 16-bit inputs: P kept in fp16 (overflows past 11)
            p = p.astype(np.float16).astype(np.float32)
        p = np.where(_visible(q.shape[1], k.shape[1], causal), p, 0)
        l = p.sum(-1, keepdims=True)
        vf = np.repeat(v.astype(np.float32), group, axis=2)
        out[...] = np.einsum("bhqk,bkhd->bqhd", p / np.where(l == 0, 1, l), vf)
