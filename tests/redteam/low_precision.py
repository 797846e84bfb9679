"""Exploit: compute an fp32 case in fp16 (faster on real hardware, beyond the fp32 tolerance)."""
import numpy as np

from kbench.builtin.numpy_backends import attention_numpy as _honest

def attention(q, k, v, out, *, causal, scale):
    tmp = np.empty(out.shape, dtype=np.float32)
    _honest(q.astype(np.float16), k.astype(np.float16), v.astype(np.float16), tmp, causal=causal, scale=scale)
    out[...] = tmp.astype(np.float16).astype(out.dtype)
