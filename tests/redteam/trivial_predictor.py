"""Exploit (class 10): under a loose suite tolerance, answer with the mean of the visible values per row
(what attention with equal scores gives) instead of computing the scores at all."""
import numpy as np


def attention(q, k, v, out, *, causal, scale):
    sq, sk = q.shape[1], k.shape[1]
    group = q.shape[2] // k.shape[2]
    vv = np.repeat(v.astype(np.float32), group, axis=2)
    if not causal:
        out[...] = np.broadcast_to(vv.mean(axis=1, keepdims=True), out.shape)
        return
    visible = np.arange(sq) + (sk - sq) + 1                      # keys row i may see
    csum = np.cumsum(vv, axis=1)[:, np.clip(visible - 1, 0, sk - 1)]
    out[...] = csum / np.maximum(visible, 1)[None, :, None, None]
