"""The attention op's float64 reference on the GPU, for large cases (hook ``kbench_float64_reference``).

A 16k-token head_dim-128 case needs about 17 GFLOP of float64 for 128 checked rows: 3-18 s on the host,
milliseconds on an H200 (67 TFLOP/s of FP64 tensor-core matmul). The computation is CuPy's (cuBLAS DGEMM
and CuPy element-wise kernels), in float64 from the exact rounded inputs, independent of every backend
under test (none computes in float64). The same function runs on NumPy, which is how it is tested on
a machine without a GPU.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np


def attention_float64(xp: Any, q, k, v, *, causal: bool, scale: float, rows=None, seqlen_q: int | None = None):
    """softmax(q k^T * scale [+ bottom-right causal mask]) v in float64 with array module ``xp``.

    ``q`` holds the query rows listed in ``rows`` (all rows when None); the result has q's shape.
    One kv head at a time (all query heads of its group in one product) bounds the memory to
    ``group x rows x seqlen_kv`` float64 scores.
    """
    b, r, hq, _ = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    group = hq // hkv
    sq = seqlen_q if seqlen_q is not None else r
    out = xp.empty((b, r, hq, v.shape[3]), dtype=xp.float64)
    mask = None
    if causal:
        i = xp.arange(sq) if rows is None else xp.asarray(rows)
        mask = xp.arange(sk)[None, :] <= (i[:, None] + (sk - sq))
    for bi in range(b):
        for h in range(hkv):
            qh = xp.asarray(q[bi, :, h * group:(h + 1) * group, :], dtype=xp.float64).transpose(1, 0, 2)
            kh = xp.asarray(k[bi, :, h, :], dtype=xp.float64)
            vh = xp.asarray(v[bi, :, h, :], dtype=xp.float64)
            s = (qh @ kh.T) * scale
            if mask is not None:
                s = xp.where(mask[None], s, -xp.inf)
            m = s.max(axis=-1, keepdims=True)
            m = xp.where(xp.isfinite(m), m, 0.0)
            p = xp.exp(s - m)
            denom = p.sum(axis=-1, keepdims=True)
            out[bi, :, h * group:(h + 1) * group, :] = ((p @ vh) / xp.where(denom == 0, 1.0, denom)).transpose(1, 0, 2)
    return out


def device_float32(xp: Any, array: np.ndarray):
    """A host input (bf16/fp16/fp32) as an ``xp`` float32 array, exactly (every value is representable).

    The bytes travel as they are (half the traffic of a float32 copy for 16-bit inputs) and are widened
    on the device: fp16 by a cast, bfloat16 by moving its 16 bits into the top of a 32-bit word (a
    bfloat16 is the upper half of the float32 with the same value), which needs no host work at all.
    """
    host = np.ascontiguousarray(array)
    if host.dtype.name == "bfloat16":  # ml_dtypes' bfloat16: its bits, widened
        bits = xp.asarray(host.view(np.uint16)).astype(xp.uint32)
        return xp.left_shift(bits, 16).view(xp.float32)
    return xp.asarray(host).astype(xp.float32)


def gpu_reference(case, inputs: Mapping[str, np.ndarray], rows) -> np.ndarray | None:
    """The float64 reference on the CUDA device through CuPy, or None when no GPU is usable."""
    from kbench_cuda import runtime

    if runtime.unavailable_reason() is not None:
        return None
    cp = runtime.cupy()
    with cp.cuda.Device(runtime.device_index()):
        q = inputs["q"] if rows is None else inputs["q"][:, rows]
        k, v = (device_float32(cp, inputs[n]) for n in ("k", "v"))
        out = attention_float64(cp, device_float32(cp, q), k, v, causal=case["causal"],
                                scale=1.0 / float(case["head_dim"]) ** 0.5, rows=rows, seqlen_q=case["seqlen_q"])
        host = cp.asnumpy(out)
        del k, v, out
        cp.get_default_memory_pool().free_all_blocks()
    return host
