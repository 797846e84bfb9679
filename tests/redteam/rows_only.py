"""Exploit (class 2): verification samples rows above check.max_rows, so compute only the first and last
rows (always checked) and every fourth one in between; leave the rest at zero (NaN would be seen)."""
import numpy as np

from kbench.builtin.numpy_backends import attention_numpy as _honest


def attention(q, k, v, out, *, causal, scale):
    sq, sk = q.shape[1], k.shape[1]
    out[...] = 0
    rows = sorted({0, sq - 1, *range(0, sq, 4)})
    part = np.empty_like(q[:, rows])
    if causal:  # each computed row keeps its own causal window: compute row by row
        for i, r in enumerate(rows):
            _honest(q[:, r:r + 1], k[:, :r + 1 + sk - sq], v[:, :r + 1 + sk - sq], part[:, i:i + 1],
                    causal=False, scale=scale)
    else:
        _honest(q[:, rows], k, v, part, causal=False, scale=scale)
    out[:, rows] = part
