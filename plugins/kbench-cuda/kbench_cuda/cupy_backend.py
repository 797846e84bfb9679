"""The ``cupy`` backend: attention as cuBLAS batched matmuls and a softmax, float32 compute.

The plain, unfused baseline on the GPU (what a first implementation looks like): S = Q K^T in
float32 through cuBLAS, bottom-right causal mask, row softmax, O = P V, rounded to the case dtype.
Score matrices are materialised for a chunk of KV heads at a time, kept under a memory budget.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any

from kbench.api import Backend, Case, DType, softmax_scale
from kbench_cuda import runtime

#: bytes of float32 score-sized temporaries one chunk may hold (scores, probabilities, mask result)
CHUNK_BUDGET = 4 * 2**30


@lru_cache(maxsize=None)
def _kernels():
    """bf16 <-> float32 conversions on uint16 storage (compiled by NVRTC on first use)."""
    cp = runtime.cupy()
    widen = cp.ElementwiseKernel("uint16 x", "float32 y", "y = __uint_as_float(((unsigned int)x) << 16)",
                                 "kbench_bf16_to_f32")
    narrow = cp.ElementwiseKernel(
        "float32 x", "uint16 y",
        """
        unsigned int u = __float_as_uint(x);
        if ((u & 0x7fffffffu) > 0x7f800000u) {
            y = 0x7FC0;                                  // NaN stays a quiet NaN
        } else {
            u += 0x7FFFu + ((u >> 16) & 1u);             // round to nearest, ties to even
            y = (unsigned short)(u >> 16);
        }
        """,
        "kbench_f32_to_bf16")
    return widen, narrow


def to_float32(x, dtype: DType):
    """A float32 copy (or the array itself when already float32) of a device array of ``dtype``."""
    cp = runtime.cupy()
    if dtype is DType.BF16:
        return _kernels()[0](x)
    return x.astype(cp.float32, copy=False)


def store(src32, dst, dtype: DType) -> None:
    """Write float32 ``src32`` into ``dst`` (a view of the output) rounded to ``dtype``."""
    if dtype is DType.BF16:
        _kernels()[1](src32, dst)
    else:
        dst[...] = src32


def heads_per_chunk(case: Case) -> int:
    p = case.params
    group = p["heads_q"] // p["heads_kv"]
    per_kv_head = 3 * group * p["seqlen_q"] * p["seqlen_kv"] * 4
    return max(1, min(p["heads_kv"], CHUNK_BUDGET // per_kv_head))


class CupyAttention(Backend):
    name = "cupy"
    op = "attention"
    device = "cuda"
    description = "CuPy: cuBLAS batched matmuls + softmax, float32 compute, scores materialised per KV-head chunk"

    def available(self) -> str | None:
        return runtime.unavailable_reason()

    def supports(self, case: Case) -> str | None:
        p = case.params
        group = p["heads_q"] // p["heads_kv"]
        one = 3 * group * p["seqlen_q"] * p["seqlen_kv"] * 4
        if one > 4 * CHUNK_BUDGET:
            return (f"one KV head's score matrices need {one / 2**30:.1f} GiB "
                    f"(limit {4 * CHUNK_BUDGET / 2**30:.0f} GiB): this backend materialises scores")
        return None

    def prepare(self, case: Case):
        cp = runtime.cupy()
        p = case.params
        b, sq, sk, d = p["batch"], p["seqlen_q"], p["seqlen_kv"], p["head_dim"]
        hkv, group = p["heads_kv"], p["heads_q"] // p["heads_kv"]
        dtype, scale = case.dtype, softmax_scale(case)
        per = heads_per_chunk(case)
        visible = None
        if case["causal"]:  # bottom-right: row i sees keys j <= i + sk - sq; built once, outside timing
            visible = cp.arange(sk)[None, :] <= cp.arange(sq)[:, None] + (sk - sq)
        if dtype is DType.BF16:
            _kernels()  # compile the conversions now, not in the first timed call
        neg_inf = cp.float32(-cp.inf)

        def run(q, k, v, out):
            for bi in range(b):
                for h0 in range(0, hkv, per):
                    h1 = min(h0 + per, hkv)
                    n = h1 - h0
                    qs = slice(h0 * group, h1 * group)
                    # (sq, n*group, d) -> (n, group*sq, d): rows of one KV head's query heads stacked
                    qf = to_float32(q[bi, :, qs, :], dtype).transpose(1, 0, 2).reshape(n, group * sq, d)
                    kf = to_float32(k[bi, :, h0:h1, :], dtype).transpose(1, 0, 2)
                    vf = to_float32(v[bi, :, h0:h1, :], dtype).transpose(1, 0, 2)
                    s = cp.matmul(qf, kf.transpose(0, 2, 1))
                    s *= cp.float32(scale)
                    if visible is not None:
                        s = cp.where(visible, s.reshape(n, group, sq, sk), neg_inf).reshape(n, group * sq, sk)
                    m = s.max(axis=-1, keepdims=True)
                    m = cp.where(cp.isfinite(m), m, cp.float32(0))
                    s -= m
                    cp.exp(s, out=s)
                    denom = s.sum(axis=-1, keepdims=True)
                    o = cp.matmul(s, vf)
                    o /= cp.where(denom == 0, cp.float32(1), denom)  # rows that see no key give 0
                    store(o.reshape(n * group, sq, d).transpose(1, 0, 2), out[bi, :, qs, :], dtype)
        return runtime.oom_as_memory_error(run)

    def info(self) -> dict[str, Any]:
        import os

        return {"compute": "float32", "tf32": os.environ.get("CUPY_TF32", "0") == "1", **runtime.versions()}
