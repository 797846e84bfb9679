"""Default plugin: NumPy attention on the CPU, straightforward and tiled (FlashAttention algorithm)."""
from __future__ import annotations

import numpy as np

import kbench
from kbench.backends import Backend, TrainingKernel, Tunable
from kbench.ops import Case
from kbench.ops.attention import softmax_scale


def _group_q(x: np.ndarray, hkv: int) -> np.ndarray:
    """A query-shaped (b, s, hq, d) array as float32 (b, hkv, group, s, d)."""
    b, sq, hq, d = x.shape
    return x.astype(np.float32, copy=False).reshape(b, sq, hkv, hq // hkv, d).transpose(0, 2, 3, 1, 4)


def _grouped(q: np.ndarray, k: np.ndarray, v: np.ndarray):
    """float32 views as (b, hkv, group, s, d) for q and (b, hkv, s, d) for k and v."""
    qg = _group_q(q, k.shape[2])
    kg = k.astype(np.float32, copy=False).transpose(0, 2, 1, 3)
    vg = v.astype(np.float32, copy=False).transpose(0, 2, 1, 3)
    return qg, kg, vg


def _ungroup(o: np.ndarray, out: np.ndarray) -> None:
    """Write (b, hkv, group, sq, d) float32 into out (b, sq, hq, d) in out's dtype."""
    b, hkv, g, sq, d = o.shape
    out[...] = o.transpose(0, 3, 1, 2, 4).reshape(b, sq, hkv * g, d)


def _visible(rows: np.ndarray, keys: np.ndarray, offset: int, causal: bool, window: tuple[int, int]) -> np.ndarray | None:
    """(rows, keys) mask of the causal/window band (bottom-right aligned, ``offset = sk - sq``), None if all."""
    left, right = window
    if causal:
        right = 0
    if left < 0 and right < 0:
        return None
    pos = rows[:, None] + offset
    mask = np.ones((len(rows), len(keys)), dtype=bool)
    if right >= 0:
        mask &= keys[None, :] <= pos + right
    if left >= 0:
        mask &= keys[None, :] >= pos - left
    return mask


def _scores(qg, kg, scale: float, softcap: float) -> np.ndarray:
    """float32 scale * Q K^T, tanh-capped when ``softcap`` (grouped layouts)."""
    s = np.matmul(qg, kg[:, :, None].swapaxes(-1, -2)) * np.float32(scale)
    return s if not softcap else np.float32(softcap) * np.tanh(s / np.float32(softcap))


def _softmax(s: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    if mask is not None:
        s = np.where(mask, s, np.float32(-np.inf))
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, np.float32(0))
    p = np.exp(s - m)
    denom = p.sum(axis=-1, keepdims=True)
    return p / np.where(denom == 0, np.float32(1), denom)


def attention_numpy(q, k, v, out, *, causal: bool, scale: float, window: tuple[int, int] = (-1, -1),
                    softcap: float = 0.0) -> None:
    """Materialise the whole score matrix in float32, cap, mask, softmax, multiply by V."""
    qg, kg, vg = _grouped(q, k, v)
    sq, sk = q.shape[1], k.shape[1]
    p = _softmax(_scores(qg, kg, scale, softcap), _visible(np.arange(sq), np.arange(sk), sk - sq, causal, window))
    _ungroup(np.matmul(p, vg[:, :, None]), out)


def attention_backward_numpy(q, k, v, do, *, causal: bool, scale: float, window: tuple[int, int] = (-1, -1),
                             softcap: float = 0.0) -> dict[str, np.ndarray]:
    """Forward output and gradients in float32, the whole (b, h, sq, sk) matrix materialised.

    dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(dO * O)) * (1 - tanh^2) under softcap,
    dQ = scale dS K, dK = scale dS^T Q; GQA gradients summed over the query heads of a kv head.
    """
    qg, kg, vg = _grouped(q, k, v)
    dog = _group_q(do, k.shape[2])
    sq, sk = q.shape[1], k.shape[1]
    raw = np.matmul(qg, kg[:, :, None].swapaxes(-1, -2)) * np.float32(scale)
    if softcap:
        t = np.tanh(raw / np.float32(softcap))
        s, slope = np.float32(softcap) * t, np.float32(1) - t * t
    else:
        s, slope = raw, None
    p = _softmax(s, _visible(np.arange(sq), np.arange(sk), sk - sq, causal, window))
    o = np.matmul(p, vg[:, :, None])
    dp = np.matmul(dog, vg[:, :, None].swapaxes(-1, -2))
    ds = p * (dp - (dog * o).sum(axis=-1, keepdims=True))
    if slope is not None:
        ds *= slope
    dq = np.matmul(ds, kg[:, :, None]) * np.float32(scale)
    dk = np.matmul(ds.swapaxes(-1, -2), qg).sum(axis=2) * np.float32(scale)   # (b, hkv, sk, d)
    dv = np.matmul(p.swapaxes(-1, -2), dog).sum(axis=2)
    return {"out": o, "dq": dq, "dk": dk.transpose(0, 2, 1, 3), "dv": dv.transpose(0, 2, 1, 3)}


class NumpyTraining(TrainingKernel):
    """The ``numpy`` backend's backward: forward saves nothing but its inputs (the backward recomputes P)."""

    def __init__(self, **kwargs) -> None:
        self.kwargs = kwargs

    def forward(self, q, k, v):
        return q, k, v

    def backward(self, saved, do, out, dq, dk, dv) -> None:
        q, k, v = saved
        grads = attention_backward_numpy(q, k, v, do, **self.kwargs)
        _ungroup(grads["out"], out)
        _ungroup(grads["dq"], dq)
        dk[...], dv[...] = grads["dk"], grads["dv"]


def attention_numpy_flash(q, k, v, out, *, causal: bool, scale: float, block_q: int = 128,
                          block_k: int = 128, window: tuple[int, int] = (-1, -1), softcap: float = 0.0) -> None:
    """Tiled attention with an online softmax: never holds more than block_q x block_k scores."""
    o, _ = flash_forward(*_grouped(q, k, v), causal=causal, scale=scale, block_q=block_q, block_k=block_k,
                         window=window, softcap=softcap)
    _ungroup(o, out)


def _capped_scores(qb, kb, scale: float, softcap: float):
    """float32 scale * Q K^T of one tile, tanh-capped; and the cap's derivative (None without softcap)."""
    raw = np.matmul(qb, kb.swapaxes(-1, -2)) * np.float32(scale)
    if not softcap:
        return raw, None
    t = np.tanh(raw / np.float32(softcap))
    return np.float32(softcap) * t, np.float32(1) - t * t


def _band_tiles(sq: int, sk: int, block_q: int, block_k: int, causal: bool, window: tuple[int, int]):
    """(q0, q1, k0, k1, mask or None) of every tile with a visible key; mask None when all of it is."""
    offset = sk - sq  # bottom-right alignment: row i sits at key position i + offset
    left, right = window
    right = 0 if causal else right
    for q0 in range(0, sq, block_q):
        q1 = min(q0 + block_q, sq)
        k_end = min(sk, q1 - 1 + offset + right + 1) if right >= 0 else sk
        k_start = max(0, q0 + offset - left) // block_k * block_k if left >= 0 else 0
        for k0 in range(k_start, max(k_end, 0), block_k):
            k1 = min(k0 + block_k, sk)
            visible = _visible(np.arange(q0, q1), np.arange(k0, k1), offset, causal, window)
            if visible is not None and not visible.any():
                continue
            yield q0, q1, k0, k1, None if visible is None or visible.all() else visible


def flash_forward(qg, kg, vg, *, causal: bool, scale: float, block_q: int, block_k: int,
                  window: tuple[int, int] = (-1, -1), softcap: float = 0.0):
    """The FlashAttention forward on grouped float32 views: output and log-sum-exp (b, hkv, g, sq, 1).

    For each query block, walk the key blocks of the causal/window band left to right keeping a running
    row maximum ``m``, a running denominator ``l`` and an unnormalised accumulator; rescale both by
    exp(m_old - m_new) when the maximum grows. A row that sees no key has output 0 and lse +inf.
    """
    b, hkv, g, sq, d = qg.shape
    sk = kg.shape[2]
    m = np.full((b, hkv, g, sq, 1), -np.inf, dtype=np.float32)
    l = np.zeros_like(m)
    acc = np.zeros((b, hkv, g, sq, vg.shape[-1]), dtype=np.float32)
    for q0, q1, k0, k1, visible in _band_tiles(sq, sk, block_q, block_k, causal, window):
        s, _ = _capped_scores(qg[:, :, :, q0:q1], kg[:, :, None, k0:k1], scale, softcap)
        if visible is not None:  # the tile straddles an edge of the band
            s = np.where(visible, s, np.float32(-np.inf))
        m_old = m[:, :, :, q0:q1]
        m_new = np.maximum(m_old, s.max(axis=-1, keepdims=True))
        m_safe = np.where(np.isfinite(m_new), m_new, np.float32(0))
        p = np.exp(s - m_safe)
        alpha = np.exp(np.where(np.isfinite(m_old), m_old, m_safe) - m_safe)
        l[:, :, :, q0:q1] = l[:, :, :, q0:q1] * alpha + p.sum(axis=-1, keepdims=True)
        acc[:, :, :, q0:q1] = acc[:, :, :, q0:q1] * alpha + np.matmul(p, vg[:, :, None, k0:k1])
        m[:, :, :, q0:q1] = m_new
    seen = l > 0
    o = acc / np.where(seen, l, np.float32(1))
    lse = np.where(seen, np.where(np.isfinite(m), m, np.float32(0)) + np.log(np.where(seen, l, 1)), np.inf)
    return o, lse.astype(np.float32)


def flash_backward(qg, kg, vg, dog, o, lse, *, causal: bool, scale: float, block_q: int, block_k: int,
                   window: tuple[int, int] = (-1, -1), softcap: float = 0.0):
    """The FlashAttention-2 backward (Dao 2023, Algorithm 2) on grouped float32 views.

    P is recomputed per tile from the saved log-sum-exp (never stored whole); D = rowsum(dO * O) once;
    per tile: dV += P^T dO, dP = dO V^T, dS = P (dP - D) [* cap'], dQ += scale dS K, dK += scale dS^T Q
    (dK, dV summed over the query heads of a kv head). Returns dq (grouped), dk and dv (b, hkv, sk, d).
    """
    sq, sk = qg.shape[3], kg.shape[2]
    delta = (dog * o).sum(axis=-1, keepdims=True)
    dq = np.zeros_like(qg, dtype=np.float32)
    dk = np.zeros(kg.shape, dtype=np.float32)
    dv = np.zeros(vg.shape, dtype=np.float32)
    for q0, q1, k0, k1, visible in _band_tiles(sq, sk, block_q, block_k, causal, window):
        qb, dob, kb = qg[:, :, :, q0:q1], dog[:, :, :, q0:q1], kg[:, :, None, k0:k1]
        s, slope = _capped_scores(qb, kb, scale, softcap)
        p = np.exp(s - lse[:, :, :, q0:q1])
        if visible is not None:
            p = np.where(visible, p, np.float32(0))
        dv[:, :, k0:k1] += np.matmul(p.swapaxes(-1, -2), dob).sum(axis=2)
        ds = p * (np.matmul(dob, vg[:, :, None, k0:k1].swapaxes(-1, -2)) - delta[:, :, :, q0:q1])
        if slope is not None:
            ds *= slope
        dq[:, :, :, q0:q1] += np.matmul(ds, kb) * np.float32(scale)
        dk[:, :, k0:k1] += np.matmul(ds.swapaxes(-1, -2), qb).sum(axis=2) * np.float32(scale)
    return dq, dk, dv


class FlashTraining(TrainingKernel):
    """numpy-flash's backward: the forward saves O and the log-sum-exp; the backward recomputes P by tiles."""

    def __init__(self, **kwargs) -> None:
        self.kwargs = kwargs

    def forward(self, q, k, v):
        qg, kg, vg = _grouped(q, k, v)
        o, lse = flash_forward(qg, kg, vg, **self.kwargs)
        return qg, kg, vg, o, lse

    def backward(self, saved, do, out, dq, dk, dv) -> None:
        qg, kg, vg, o, lse = saved
        dog = _group_q(do, qg.shape[1])
        gq, gk, gv = flash_backward(qg, kg, vg, dog, o, lse, **self.kwargs)
        _ungroup(o, out)
        _ungroup(gq, dq)
        dk[...], dv[...] = gk.transpose(0, 2, 1, 3), gv.transpose(0, 2, 1, 3)


def _mask_kwargs(case: Case) -> dict:
    """window/softcap keyword arguments of a case (the op's convention: only when set)."""
    kwargs = {}
    if (case["window_left"], case["window_right"]) != (-1, -1):
        kwargs["window"] = (case["window_left"], case["window_right"])
    if case["softcap"]:
        kwargs["softcap"] = float(case["softcap"])
    return kwargs


class NumpyAttention(Backend):
    name = "numpy"
    op = "attention"
    device = "cpu"
    description = "NumPy, float32 compute, whole score matrix materialised; forward and backward"
    features = frozenset({"bwd", "fwd_bwd", "window", "softcap"})

    def supports(self, case: Case) -> str | None:
        p = case.params
        scores = p["batch"] * p["heads_q"] * p["seqlen_q"] * p["seqlen_kv"] * 4
        scores *= 1 if p["mode"] == "fwd" else 5  # the backward holds P, dP, dS and the raw scores too
        if scores > 8 * 2**30:
            return f"score matrix needs {scores / 2**30:.1f} GiB of host memory (limit 8 GiB)"
        return None

    def prepare(self, case: Case):
        kwargs = {"causal": case["causal"], "scale": softmax_scale(case), **_mask_kwargs(case)}
        if case["mode"] != "fwd":
            return NumpyTraining(**kwargs)

        def run(q, k, v, out):
            attention_numpy(q, k, v, out, **kwargs)
        return run

    def info(self):
        return {"numpy": np.__version__}


class NumpyFlashAttention(Backend):
    name = "numpy-flash"
    op = "attention"
    device = "cpu"
    description = ("NumPy, tiled online softmax (FlashAttention algorithm), float32 compute; backward by "
                   "tiles from the saved log-sum-exp (FlashAttention-2)")
    features = frozenset({"bwd", "fwd_bwd", "window", "softcap"})
    tunables = {
        "block_q": Tunable(128, (16, 32, 64, 128, 256, 512, 1024), "query rows per tile"),
        "block_k": Tunable(128, (16, 32, 64, 128, 256, 512, 1024), "key rows per tile"),
    }

    def prepare(self, case: Case):
        kwargs = {"causal": case["causal"], "scale": softmax_scale(case), **_mask_kwargs(case),
                  "block_q": self.setting("block_q"), "block_k": self.setting("block_k")}

        if case["mode"] != "fwd":
            return FlashTraining(**kwargs)

        def run(q, k, v, out):
            attention_numpy_flash(q, k, v, out, **kwargs)
        return run

    def info(self):
        return {"numpy": np.__version__}  # the base class adds every tunable's value


@kbench.hookimpl
def kbench_register_backends(registry):
    registry.add_backend(NumpyAttention())
    registry.add_backend(NumpyFlashAttention())
