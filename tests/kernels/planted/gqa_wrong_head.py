"""Planted bug (kbench fuzz, shapes): grouped-query heads mapped with the wrong index, query head h reading
key/value head ``h % heads_kv`` instead of ``h // (heads_q // heads_kv)``. Exact for MHA (heads_kv == heads_q)
and MQA (heads_kv == 1), wrong for every real grouping in between."""
import numpy as np

NAME = "planted-gqa-wrong-head"


def attention(q, k, v, out, *, causal, scale):
    sq, sk, hq, hkv = q.shape[1], k.shape[1], q.shape[2], k.shape[2]
    index = np.arange(hq) % hkv          # the bug: should be np.arange(hq) // (hq // hkv)
    kk = k.astype(np.float32)[:, :, index]
    vv = v.astype(np.float32)[:, :, index]
    s = np.einsum("bqhd,bkhd->bhqk", q.astype(np.float32), kk) * np.float32(scale)
    if causal:
        s = np.where(np.arange(sk)[None, :] <= np.arange(sq)[:, None] + (sk - sq), s, -np.inf)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - np.where(np.isfinite(m), m, 0))
    l = p.sum(-1, keepdims=True)
    out[...] = np.einsum("bhqk,bkhd->bqhd", p / np.where(l == 0, 1, l), vv)
