"""Default plugin: NumPy attention on the CPU, straightforward and tiled (FlashAttention algorithm)."""
from __future__ import annotations

import numpy as np

import kbench
from kbench.backends import Backend, Tunable
from kbench.ops import Case
from kbench.ops.attention import softmax_scale


def _grouped(q: np.ndarray, k: np.ndarray, v: np.ndarray):
    """float32 views as (b, hkv, group, s, d) for q and (b, hkv, s, d) for k and v."""
    b, sq, hq, d = q.shape
    hkv = k.shape[2]
    qg = q.astype(np.float32, copy=False).reshape(b, sq, hkv, hq // hkv, d).transpose(0, 2, 3, 1, 4)
    kg = k.astype(np.float32, copy=False).transpose(0, 2, 1, 3)
    vg = v.astype(np.float32, copy=False).transpose(0, 2, 1, 3)
    return qg, kg, vg


def _ungroup(o: np.ndarray, out: np.ndarray) -> None:
    """Write (b, hkv, group, sq, d) float32 into out (b, sq, hq, d) in out's dtype."""
    b, hkv, g, sq, d = o.shape
    out[...] = o.transpose(0, 3, 1, 2, 4).reshape(b, sq, hkv * g, d)


def attention_numpy(q, k, v, out, *, causal: bool, scale: float) -> None:
    """Materialise the whole score matrix in float32, mask, softmax, multiply by V."""
    qg, kg, vg = _grouped(q, k, v)
    sq, sk = q.shape[1], k.shape[1]
    s = np.matmul(qg, kg[:, :, None].swapaxes(-1, -2)) * np.float32(scale)
    if causal:
        visible = np.arange(sk)[None, :] <= np.arange(sq)[:, None] + (sk - sq)
        s = np.where(visible, s, np.float32(-np.inf))
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, np.float32(0))
    p = np.exp(s - m)
    denom = p.sum(axis=-1, keepdims=True)
    o = np.matmul(p, vg[:, :, None]) / np.where(denom == 0, np.float32(1), denom)
    _ungroup(o, out)


def attention_numpy_flash(q, k, v, out, *, causal: bool, scale: float, block_q: int = 128,
                          block_k: int = 128) -> None:
    """Tiled attention with an online softmax: never holds more than block_q x block_k scores.

    For each query block, walk the key blocks left to right keeping a running row maximum ``m``,
    a running denominator ``l`` and an unnormalised accumulator; rescale both by exp(m_old - m_new)
    when the maximum grows. Key blocks entirely in the causal future are skipped.
    """
    qg, kg, vg = _grouped(q, k, v)
    b, hkv, g, sq, d = qg.shape
    sk = kg.shape[2]
    offset = sk - sq  # bottom-right alignment: row i sees keys j <= i + offset
    scale32 = np.float32(scale)
    o = np.empty((b, hkv, g, sq, vg.shape[-1]), dtype=np.float32)
    for q0 in range(0, sq, block_q):
        q1 = min(q0 + block_q, sq)
        qb = qg[:, :, :, q0:q1] * scale32
        m = np.full((b, hkv, g, q1 - q0, 1), -np.inf, dtype=np.float32)
        l = np.zeros_like(m)
        acc = np.zeros((b, hkv, g, q1 - q0, vg.shape[-1]), dtype=np.float32)
        k_end = min(sk, q1 - 1 + offset + 1) if causal else sk
        for k0 in range(0, max(k_end, 0), block_k):
            k1 = min(k0 + block_k, sk)
            s = np.matmul(qb, kg[:, :, None, k0:k1].swapaxes(-1, -2))
            if causal and k1 - 1 > q0 + offset:  # block straddles the diagonal
                visible = np.arange(k0, k1)[None, :] <= np.arange(q0, q1)[:, None] + offset
                s = np.where(visible, s, np.float32(-np.inf))
            m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
            m_safe = np.where(np.isfinite(m_new), m_new, np.float32(0))
            p = np.exp(s - m_safe)
            alpha = np.exp(np.where(np.isfinite(m), m, m_safe) - m_safe)
            l = l * alpha + p.sum(axis=-1, keepdims=True)
            acc = acc * alpha + np.matmul(p, vg[:, :, None, k0:k1])
            m = m_new
        o[:, :, :, q0:q1] = acc / np.where(l == 0, np.float32(1), l)
    _ungroup(o, out)


class NumpyAttention(Backend):
    name = "numpy"
    op = "attention"
    device = "cpu"
    description = "NumPy, float32 compute, whole score matrix materialised"

    def supports(self, case: Case) -> str | None:
        p = case.params
        scores = p["batch"] * p["heads_q"] * p["seqlen_q"] * p["seqlen_kv"] * 4
        if scores > 8 * 2**30:
            return f"score matrix needs {scores / 2**30:.1f} GiB of host memory (limit 8 GiB)"
        return None

    def prepare(self, case: Case):
        causal, scale = case["causal"], softmax_scale(case)

        def run(q, k, v, out):
            attention_numpy(q, k, v, out, causal=causal, scale=scale)
        return run

    def info(self):
        return {"numpy": np.__version__}


class NumpyFlashAttention(Backend):
    name = "numpy-flash"
    op = "attention"
    device = "cpu"
    description = "NumPy, tiled online softmax (FlashAttention algorithm), float32 compute"
    tunables = {
        "block_q": Tunable(128, (16, 32, 64, 128, 256, 512, 1024), "query rows per tile"),
        "block_k": Tunable(128, (16, 32, 64, 128, 256, 512, 1024), "key rows per tile"),
    }

    def prepare(self, case: Case):
        causal, scale = case["causal"], softmax_scale(case)
        bq, bk = self.setting("block_q"), self.setting("block_k")

        def run(q, k, v, out):
            attention_numpy_flash(q, k, v, out, causal=causal, scale=scale, block_q=bq, block_k=bk)
        return run

    def info(self):
        return {"numpy": np.__version__}  # the base class adds every tunable's value


@kbench.hookimpl
def kbench_register_backends(registry):
    registry.add_backend(NumpyAttention())
    registry.add_backend(NumpyFlashAttention())
