"""Planted bug (kbench fuzz, shapes): Q K^T summed over head_dim in chunks of 32, the remainder chunk
skipped, so head_dim % 32 != 0 loses part of every score (head_dim < 32 loses all of it). Exact on 32, 64, 128."""
import numpy as np

NAME = "planted-head-dim-chunks"
CHUNK = 32


def attention(q, k, v, out, *, causal, scale):
    sq, sk, d = q.shape[1], k.shape[1], q.shape[3]
    group = q.shape[2] // k.shape[2]
    qf = q.astype(np.float32)
    kk = np.repeat(k.astype(np.float32), group, axis=2)
    vv = np.repeat(v.astype(np.float32), group, axis=2)
    s = np.zeros((q.shape[0], q.shape[2], sq, sk), dtype=np.float32)
    for c in range(0, d - d % CHUNK, CHUNK):                # the bug: the last d % 32 columns are never summed
        s += np.einsum("bqhd,bkhd->bhqk", qf[..., c:c + CHUNK], kk[..., c:c + CHUNK])
    s *= np.float32(scale)
    if causal:
        s = np.where(np.arange(sk)[None, :] <= np.arange(sq)[:, None] + (sk - sq), s, -np.inf)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - np.where(np.isfinite(m), m, 0))
    l = p.sum(-1, keepdims=True)
    out[...] = np.einsum("bhqk,bkhd->bqhd", p / np.where(l == 0, 1, l), vv)
