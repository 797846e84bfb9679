"""Exploit (class 7): call the library attention it competes with through a computed name.

The static check refuses ``getattr(module, <computed>)``; at run time the torch dispatcher names the
operator however the call is spelled.
"""
import numpy as np
import torch
import torch.nn.functional as F

_NAME = "scaled_dot_" + "product_attention"


def attention(q, k, v, out, *, causal, scale):
    fn = getattr(F, _NAME)
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a.astype(np.float32))).transpose(1, 2)
    group = q.shape[2] // k.shape[2]
    kk, vv = (t(x).repeat_interleave(group, dim=1) for x in (k, v))
    res = fn(t(q), kk, vv, is_causal=causal, scale=scale)
    out[...] = res.transpose(1, 2).numpy().astype(out.dtype)
