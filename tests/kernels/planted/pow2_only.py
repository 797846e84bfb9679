"""Planted bug (kbench fuzz, shapes): exact only when seqlen_kv is a power of two.

The softmax partials of the keys are merged by a pairwise tree (``merge(left half, right half)``), and each
level splits ``n`` keys into two halves of ``n // 2``: an odd count loses its last key at that level.
"""
import numpy as np

NAME = "planted-pow2-only"


def _tree(s, v, lo, n):
    """(max, sum of exp, weighted values) of keys [lo, lo + n) by halving: the bug drops the odd key."""
    if n == 1:
        m = s[..., lo:lo + 1]
        seen = np.isfinite(m).astype(s.dtype)            # a masked key weighs nothing
        return m, seen, v[..., lo, :] * seen
    half = n // 2
    m1, l1, a1 = _tree(s, v, lo, half)
    m2, l2, a2 = _tree(s, v, lo + half, half)         # should be n - half keys from lo + half
    m = np.maximum(m1, m2)
    safe = np.where(np.isfinite(m), m, 0)
    w1 = np.where(np.isfinite(m1), np.exp(m1 - safe), 0)
    w2 = np.where(np.isfinite(m2), np.exp(m2 - safe), 0)
    return m, l1 * w1 + l2 * w2, a1 * w1 + a2 * w2


def attention(q, k, v, out, *, causal, scale):
    sq, sk = q.shape[1], k.shape[1]
    group = q.shape[2] // k.shape[2]
    kk = np.repeat(k.astype(np.float32), group, axis=2)
    vv = np.repeat(v.astype(np.float32), group, axis=2).transpose(0, 2, 1, 3)[:, :, None]   # b h 1 k d
    s = np.einsum("bqhd,bkhd->bhqk", q.astype(np.float32), kk) * np.float32(scale)
    if causal:
        s = np.where(np.arange(sk)[None, :] <= np.arange(sq)[:, None] + (sk - sq), s, -np.inf)
    _, l, acc = _tree(s, np.broadcast_to(vv, (*s.shape[:3], sk, vv.shape[-1])), 0, sk)
    out[...] = (acc / np.where(l == 0, 1, l)).transpose(0, 2, 1, 3)
