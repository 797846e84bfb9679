"""Crash: allocate far more memory than the machine has."""
import numpy as np

from kbench.builtin.numpy_backends import attention_numpy as _honest

def attention(q, k, v, out, *, causal, scale):
    hog = np.ones((1 << 34,), dtype=np.float64)  # 128 GiB
    out[...] = hog[: out.size].reshape(out.shape)
