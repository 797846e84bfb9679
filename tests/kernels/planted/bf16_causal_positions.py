"""Planted bug (kbench fuzz, long rows): a causal mask whose query positions ``i + seqlen_kv - seqlen_q`` are
computed in the inputs' dtype; in bf16 (8 bits of mantissa) a position past 256 is rounded, so rows see a key
too many or too few. Exact in fp32 and fp16 and in bf16 up to 256 keys."""
import numpy as np

NAME = "planted-bf16-causal-positions"


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


def _bf16(x):
    """float32 ``x`` rounded to bfloat16 (to nearest, ties to even), as float32."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32)
    bits = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return bits.view(np.float32)


def attention(q, k, v, out, *, causal, scale):
    sq, sk, hq, hkv = q.shape[1], k.shape[1], q.shape[2], k.shape[2]
    group = hq // hkv
    s = _scores(q, k, scale, group)
    if causal:
        pos = (np.arange(sq) + (sk - sq)).astype(np.float32)
        if q.dtype.itemsize == 2 and q.dtype != np.float16:   # bfloat16 inputs: the bug, positions in bf16
            pos = _bf16(pos)
        s = np.where(np.arange(sk)[None, :] <= pos[:, None], s, -np.inf)
    out[...] = _softmax_v(s, v, group)
