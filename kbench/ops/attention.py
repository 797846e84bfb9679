"""The ``attention`` op: forward prefill attention, layout (batch, seqlen, heads, head_dim).

Causal masking is aligned bottom-right when seqlen_q != seqlen_kv: query row ``i`` sees key ``j``
iff ``j <= i + seqlen_kv - seqlen_q`` (FlashAttention >= 2.1, cuDNN). A query row that sees no key
(only possible when seqlen_q > seqlen_kv) has output 0.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from kbench.enums import DType
from kbench.ops import Case, CaseError, Op, Param


#: a reference needing more float64 work than this (multiply-adds of Q K^T and P V over the checked rows)
#: is offered to the ``kbench_float64_reference`` hook (a GPU computes it in well under a second; the host
#: needs 3-18 s for a 16k-token case); smaller ones, the correctness cases, stay on the host
LARGE_REFERENCE_FLOPS = 2e9


def reference_flops(case: Case, rows: np.ndarray | None) -> float:
    """Float64 work of the reference over the checked query rows."""
    p = case.params
    checked = p["seqlen_q"] if rows is None else len(rows)
    return 4.0 * p["batch"] * p["heads_q"] * checked * p["seqlen_kv"] * p["head_dim"]


def plugin_reference(case: Case, inputs: Mapping[str, np.ndarray], rows: np.ndarray | None) -> np.ndarray | None:
    """A plugin's float64 reference of a large case (``kbench_float64_reference``), or None.

    A provider that fails is ignored (the host computes the reference): the reference must not depend
    on an optional accelerator path working.
    """
    if reference_flops(case, rows) < LARGE_REFERENCE_FLOPS:
        return None
    try:
        from kbench.plugins import get_plugin_manager

        out = get_plugin_manager().hook.kbench_float64_reference(op="attention", case=case, inputs=inputs, rows=rows)
    except Exception:  # noqa: BLE001 - fall back to the host reference
        return None
    expected = (case["batch"], case["seqlen_q"] if rows is None else len(rows), case["heads_q"], case["head_dim"])
    if out is None or tuple(np.shape(out)) != expected:
        return None
    return np.asarray(out, dtype=np.float64)


def softmax_scale(case: Case) -> float:
    return 1.0 / math.sqrt(case["head_dim"])


def causal_mask(seqlen_q: int, seqlen_kv: int, rows: np.ndarray | None = None) -> np.ndarray:
    """Boolean (rows, seqlen_kv) mask, True where the key is visible (bottom-right aligned)."""
    i = np.arange(seqlen_q) if rows is None else np.asarray(rows)
    j = np.arange(seqlen_kv)
    return j[None, :] <= (i[:, None] + (seqlen_kv - seqlen_q))


def attention_float64(q: np.ndarray, k: np.ndarray, v: np.ndarray, *, causal: bool,
                      scale: float, rows: np.ndarray | None = None, seqlen_q: int | None = None) -> np.ndarray:
    """Exact attention in float64; ``q`` may hold only the query rows listed in ``rows``."""
    b, r, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    group = hq // hkv
    sq = seqlen_q if seqlen_q is not None else r
    out = np.empty((b, r, hq, v.shape[3]), dtype=np.float64)
    mask = causal_mask(sq, sk, rows) if causal else None
    for bi in range(b):
        for h in range(hkv):
            # (group, r, d) @ (d, sk): all query heads sharing this kv head at once
            qh = q[bi, :, h * group:(h + 1) * group, :].astype(np.float64).transpose(1, 0, 2)
            kh = k[bi, :, h, :].astype(np.float64)
            vh = v[bi, :, h, :].astype(np.float64)
            s = (qh @ kh.T) * scale
            if mask is not None:
                s = np.where(mask[None], s, -np.inf)
            m = s.max(axis=-1, keepdims=True)
            m = np.where(np.isfinite(m), m, 0.0)
            p = np.exp(s - m)
            denom = p.sum(axis=-1, keepdims=True)
            o = (p @ vh) / np.where(denom == 0, 1.0, denom)
            out[bi, :, h * group:(h + 1) * group, :] = o.transpose(1, 0, 2)
    return out


class AttentionOp(Op):
    name = "attention"
    description = "forward prefill attention softmax(Q K^T * scale [+ causal mask]) V, GQA when heads_q > heads_kv"
    parameters = (
        Param("batch", int, 1, minimum=1, short="b"),
        Param("seqlen_q", int, minimum=1, short="sq"),
        Param("seqlen_kv", int, minimum=1, short="sk"),
        Param("heads_q", int, minimum=1, short="hq"),
        Param("heads_kv", int, minimum=1, short="hkv"),
        Param("head_dim", int, minimum=1, short="d"),
        Param("causal", bool, False, short="causal"),
        Param("dtype", str, "fp32", choices=tuple(d.value for d in DType)),
    )
    aliases = {"seqlen": ("seqlen_q", "seqlen_kv"), "heads": ("heads_q", "heads_kv")}
    default_from = {"heads_kv": "heads_q"}  # MHA unless heads_kv is given
    input_names = ("q", "k", "v")

    def validate(self, params: Mapping[str, Any]) -> None:
        if params["heads_q"] % params["heads_kv"]:
            raise CaseError(f"heads_q={params['heads_q']} is not a multiple of heads_kv={params['heads_kv']}")

    def case_id(self, params: Mapping[str, Any]) -> str:
        p = params
        mask = "causal" if p["causal"] else "noncausal"
        return (f"attention[b={p['batch']},sq={p['seqlen_q']},sk={p['seqlen_kv']},hq={p['heads_q']},"
                f"hkv={p['heads_kv']},d={p['head_dim']},{mask},{p['dtype']}]")

    def group_key(self, case: Case) -> str:
        p = case.params
        return (f"d={p['head_dim']},{'causal' if p['causal'] else 'noncausal'},"
                f"hq={p['heads_q']},hkv={p['heads_kv']},{p['dtype']}")

    def make_inputs(self, case: Case, seed: int) -> dict[str, np.ndarray]:
        p = case.params
        rng = np.random.default_rng(seed)
        dt = case.dtype.numpy
        shapes = {"q": (p["batch"], p["seqlen_q"], p["heads_q"], p["head_dim"]),
                  "k": (p["batch"], p["seqlen_kv"], p["heads_kv"], p["head_dim"]),
                  "v": (p["batch"], p["seqlen_kv"], p["heads_kv"], p["head_dim"])}
        return {name: rng.standard_normal(shape, dtype=np.float32).astype(dt) for name, shape in shapes.items()}

    def output_shape(self, case: Case) -> tuple[int, ...]:
        p = case.params
        return (p["batch"], p["seqlen_q"], p["heads_q"], p["head_dim"])

    def sample_rows(self, case: Case, max_rows: int, rng: np.random.Generator) -> np.ndarray | None:
        sq = case["seqlen_q"]
        if sq <= max_rows:
            return None
        # first and last rows always: they are where masks and tails go wrong
        middle = rng.choice(np.arange(1, sq - 1), size=max_rows - 2, replace=False)
        return np.unique(np.concatenate([[0, sq - 1], middle]))

    def select(self, case: Case, output: np.ndarray, rows: np.ndarray | None) -> np.ndarray:
        return output if rows is None else output[:, rows]

    def reference(self, case: Case, inputs: Mapping[str, np.ndarray], rows: np.ndarray | None) -> np.ndarray:
        offloaded = plugin_reference(case, inputs, rows)  # large cases: a plugin's float64 (e.g. on the GPU)
        if offloaded is not None:
            return offloaded
        q = inputs["q"] if rows is None else inputs["q"][:, rows]
        return attention_float64(q, inputs["k"], inputs["v"], causal=case["causal"], scale=softmax_scale(case),
                                 rows=rows, seqlen_q=case["seqlen_q"])

    def kernel_kwargs(self, case: Case) -> dict[str, Any]:
        return {"causal": case["causal"], "scale": softmax_scale(case)}

    def flops(self, case: Case) -> float:
        p = case.params
        b, hq, sq, sk, d = p["batch"], p["heads_q"], p["seqlen_q"], p["seqlen_kv"], p["head_dim"]
        if not p["causal"]:
            return 4.0 * b * hq * sq * sk * d
        avg_sk = (max(0, sk - sq) + sk) / 2
        return b * hq * 2.0 * sq * avg_sk * (d + d)

    def min_bytes(self, case: Case) -> float:
        p = case.params
        size = case.dtype.itemsize
        qo = 2 * p["batch"] * p["seqlen_q"] * p["heads_q"] * p["head_dim"]
        kv = 2 * p["batch"] * p["seqlen_kv"] * p["heads_kv"] * p["head_dim"]
        return float((qo + kv) * size)
