"""Planted bug (kbench fuzz, shapes): the causal mask aligned top-left (key j visible from query row i iff
j <= i) instead of bottom-right (j <= i + seqlen_kv - seqlen_q). Exact whenever seqlen_q == seqlen_kv."""
import numpy as np

NAME = "planted-causal-topleft"


def attention(q, k, v, out, *, causal, scale):
    sq, sk = q.shape[1], k.shape[1]
    group = q.shape[2] // k.shape[2]
    kk = np.repeat(k.astype(np.float32), group, axis=2)
    vv = np.repeat(v.astype(np.float32), group, axis=2)
    s = np.einsum("bqhd,bkhd->bhqk", q.astype(np.float32), kk) * np.float32(scale)
    if causal:
        s = np.where(np.arange(sk)[None, :] <= np.arange(sq)[:, None], s, -np.inf)   # the bug: no sk - sq offset
    m = s.max(-1, keepdims=True)
    p = np.exp(s - np.where(np.isfinite(m), m, 0))
    l = p.sum(-1, keepdims=True)
    out[...] = np.einsum("bhqk,bkhd->bqhd", p / np.where(l == 0, 1, l), vv)
