"""Exploit: call the library being beaten (PyTorch SDPA) instead of a kernel of one's own."""
import numpy as np


def attention(q, k, v, out, *, causal, scale):
    import torch
    import torch.nn.functional as F

    t = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).transpose(1, 2)
    group = q.shape[2] // k.shape[2]
    kk, vv = t(np.repeat(k, group, axis=2)), t(np.repeat(v, group, axis=2))
    res = F.scaled_dot_product_attention(t(q), kk, vv, scale=scale,
                                         is_causal=causal and q.shape[1] == k.shape[1])
    out[...] = res.transpose(1, 2).numpy()
