"""Attention with numpy.einsum: one backend of the ``attention`` op on the ``cpu`` device."""
from __future__ import annotations

import numpy as np

from kbench.api import Backend, Case, Tunable, softmax_scale


class EinsumAttention(Backend):
    name = "example-einsum"
    op = "attention"
    device = "cpu"
    description = "NumPy einsum, float32 compute (example plugin)"
    # knobs that change speed, never the result: set from a suite or `-b 'example-einsum[chunk_q=16]'`
    tunables = {"chunk_q": Tunable(0, (0, 8, 16, 32, 64), "query rows per einsum (0: all at once)")}

    def available(self) -> str | None:
        # return a reason string when something this backend needs is missing; None means usable
        return None

    def supports(self, case: Case) -> str | None:
        # say *why* a case is not supported; the harness records it as skipped with this reason
        if case["heads_q"] != case["heads_kv"]:
            return "GQA (heads_q != heads_kv) is not implemented by this example"
        return None

    def prepare(self, case: Case):
        # everything that should not be timed happens here; the returned function is what kbench times
        scale = np.float32(softmax_scale(case))
        sq, sk = case["seqlen_q"], case["seqlen_kv"]
        chunk = self.setting("chunk_q") or sq  # settings are read here, from the (possibly configured) backend
        mask = None
        if case["causal"]:
            # bottom-right alignment, as kbench's attention op defines it
            mask = np.arange(sk)[None, :] <= np.arange(sq)[:, None] + (sk - sq)

        def run(q, k, v, out):
            k32, v32 = k.astype(np.float32), v.astype(np.float32)
            for q0 in range(0, sq, chunk):
                q1 = min(q0 + chunk, sq)
                s = np.einsum("bqhd,bkhd->bhqk", q[:, q0:q1].astype(np.float32), k32) * scale
                if mask is not None:
                    s = np.where(mask[q0:q1], s, np.float32(-np.inf))
                m = s.max(axis=-1, keepdims=True)
                p = np.exp(s - np.where(np.isfinite(m), m, 0))
                l = p.sum(axis=-1, keepdims=True)
                out[:, q0:q1] = np.einsum("bhqk,bkhd->bqhd", p / np.where(l == 0, 1, l), v32)
        return run

    def info(self) -> dict:
        return {"numpy": np.__version__}  # kbench adds the tunables' values
