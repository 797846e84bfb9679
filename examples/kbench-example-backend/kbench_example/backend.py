"""Attention with numpy.einsum: one backend of the ``attention`` op on the ``cpu`` device."""
from __future__ import annotations

import numpy as np

from kbench.backends import Backend
from kbench.ops.attention import softmax_scale


class EinsumAttention(Backend):
    name = "example-einsum"
    op = "attention"
    device = "cpu"
    description = "NumPy einsum, float32 compute (example plugin)"

    def available(self):
        # return a reason string when something this backend needs is missing; None means usable
        return None

    def supports(self, case):
        # say *why* a case is not supported; the harness records it as skipped with this reason
        if case["heads_q"] != case["heads_kv"]:
            return "GQA (heads_q != heads_kv) is not implemented by this example"
        return None

    def prepare(self, case):
        # everything that should not be timed happens here; the returned function is what kbench times
        scale = np.float32(softmax_scale(case))
        sq, sk = case["seqlen_q"], case["seqlen_kv"]
        mask = None
        if case["causal"]:
            # bottom-right alignment, as kbench's attention op defines it
            mask = np.arange(sk)[None, :] <= np.arange(sq)[:, None] + (sk - sq)

        def run(q, k, v, out):
            s = np.einsum("bqhd,bkhd->bhqk", q.astype(np.float32), k.astype(np.float32)) * scale
            if mask is not None:
                s = np.where(mask, s, np.float32(-np.inf))
            m = s.max(axis=-1, keepdims=True)
            p = np.exp(s - np.where(np.isfinite(m), m, 0))
            l = p.sum(axis=-1, keepdims=True)
            out[...] = np.einsum("bhqk,bkhd->bqhd", p / np.where(l == 0, 1, l), v.astype(np.float32))
        return run

    def info(self):
        return {"numpy": np.__version__}
