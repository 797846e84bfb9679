"""Default plugin: NumPy packed ragged (varlen) attention on the CPU, sequence by sequence."""
from __future__ import annotations

import numpy as np

import kbench
from kbench.backends import Backend, Tunable
from kbench.ops import Case
from kbench.ops.attention import softmax_scale


def varlen_numpy(q, k, v, cu_seqlens_q, cu_seqlens_kv, out, *, causal: bool, scale: float,
                 block_q: int = 256) -> None:
    """Walk the sequences the offsets name (read at call time, as a GPU kernel reads them).

    Per sequence and KV head, the query heads sharing that KV head and ``block_q`` query tokens form
    one (group * block_q, d) matrix whose scores against the keys it can see are one 2-D GEMM
    (BLAS on contiguous operands), then a softmax and a second GEMM with V. Keys in the causal
    future of the whole block are never multiplied. Compute in float32.
    """
    cu_q, cu_kv = cu_seqlens_q.tolist(), cu_seqlens_kv.tolist()
    hq, d = q.shape[1], q.shape[2]
    hkv = k.shape[1]
    g = hq // hkv
    scale32 = np.float32(scale)
    for i in range(len(cu_q) - 1):
        sq, sk = cu_q[i + 1] - cu_q[i], cu_kv[i + 1] - cu_kv[i]
        if sq == 0 or sk == 0:  # an empty sequence (legal in the varlen API): no query, or nothing to see
            out[cu_q[i]:cu_q[i + 1]] = 0
            continue
        offset = sk - sq  # bottom-right alignment: row t sees keys j <= t + offset
        # (hkv, g, sq, d) and (hkv, sk, d), float32, contiguous per head
        qs = np.ascontiguousarray((q[cu_q[i]:cu_q[i + 1]].astype(np.float32) * scale32)
                                  .reshape(sq, hkv, g, d).transpose(1, 2, 0, 3))
        ks = np.ascontiguousarray(k[cu_kv[i]:cu_kv[i + 1]].astype(np.float32).transpose(1, 0, 2))
        vs = np.ascontiguousarray(v[cu_kv[i]:cu_kv[i + 1]].astype(np.float32).transpose(1, 0, 2))
        o = np.zeros((hkv, g, sq, v.shape[2]), dtype=np.float32)
        for t0 in range(0, sq, block_q):
            t1 = min(t0 + block_q, sq)
            end = min(sk, t1 + offset) if causal else sk  # keys any row of the block can see
            if end <= 0:
                continue  # every row sees no key: output 0
            visible = None
            if causal and end > t0 + offset + 1:  # the block straddles the diagonal
                visible = np.arange(end)[None, :] <= (np.arange(t0, t1) + offset)[:, None]   # (bq, end)
            for h in range(hkv):
                s = qs[h, :, t0:t1].reshape(g * (t1 - t0), d) @ ks[h, :end].T             # (g*bq, end)
                s = s.reshape(g, t1 - t0, end)
                if visible is not None:
                    s = np.where(visible, s, np.float32(-np.inf))
                m = s.max(axis=-1, keepdims=True)
                m = np.where(np.isfinite(m), m, np.float32(0))
                p = np.exp(s - m)
                denom = p.sum(axis=-1, keepdims=True)
                pv = p.reshape(g * (t1 - t0), end) @ vs[h, :end]
                o[h, :, t0:t1] = pv.reshape(g, t1 - t0, -1) / np.where(denom == 0, np.float32(1), denom)
        out[cu_q[i]:cu_q[i + 1]] = o.transpose(2, 0, 1, 3).reshape(sq, hq, v.shape[2])


class NumpyVarlen(Backend):
    name = "numpy-varlen"
    op = "attention_varlen"
    device = "cpu"
    description = ("NumPy over packed sequences: per sequence, KV head and block of query tokens, scores for "
                   "the visible keys as 2-D GEMMs, float32")
    tunables = {"block_q": Tunable(256, (32, 64, 128, 256, 512, 1024, 2048), "query tokens per block")}

    def prepare(self, case: Case):
        causal, scale = case["causal"], softmax_scale(case)
        block = self.setting("block_q")

        def run(q, k, v, cu_seqlens_q, cu_seqlens_kv, out):
            varlen_numpy(q, k, v, cu_seqlens_q, cu_seqlens_kv, out, causal=causal, scale=scale, block_q=block)
        return run

    def info(self):
        return {"numpy": np.__version__}  # the base class adds every tunable's value


@kbench.hookimpl
def kbench_register_backends(registry):
    registry.add_backend(NumpyVarlen())
