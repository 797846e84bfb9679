"""Seed of an OpenEvolve search: attention on the CPU with NumPy, one query row at a time.

A kbench kernel file (docs/backends.md, "Kernel files"): kbench runs it as an untrusted backend in a
sandboxed worker and judges it (evaluator.py). Correct on every attention case (MHA, GQA, causal with
bottom-right alignment, ragged lengths); slow on purpose: the search has room to find better.
OpenEvolve edits only what lies between the EVOLVE-BLOCK markers.
"""
import numpy as np

SUBSTRATE = "numpy"
OP = "attention"


# EVOLVE-BLOCK-START
def attention(q, k, v, out, *, causal, scale):
    batch, sq, hq, _ = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    group = hq // hkv
    shift = sk - sq  # causal: query row i sees key j when j <= i + shift
    for b in range(batch):
        for h in range(hq):
            keys = k[b, :, h // group].astype(np.float32)
            values = v[b, :, h // group].astype(np.float32)
            for i in range(sq):
                seen = min(sk, i + shift + 1) if causal else sk
                if seen <= 0:
                    out[b, i, h] = 0.0
                    continue
                s = keys[:seen] @ q[b, i, h].astype(np.float32) * np.float32(scale)
                p = np.exp(s - s.max())
                out[b, i, h] = (p / p.sum()) @ values[:seen]
# EVOLVE-BLOCK-END
