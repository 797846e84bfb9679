"""The ``decode_attention`` op: a few new query tokens attend to a long KV cache.

Layout as for ``attention``: q ``(batch, seqlen_q, heads_q, head_dim)``, k and v (the cache)
``(batch, seqlen_kv, heads_kv, head_dim)``. Causal by construction: the ``seqlen_q`` queries are the
last ``seqlen_q`` positions of the sequence, so query row ``i`` sees keys ``j <= seqlen_kv - seqlen_q + i``
(bottom-right alignment, as in FlashAttention and cuDNN; speculative decoding verifies several
tokens this way). With one query token the mask is empty.

Decode reads the whole cache once for a handful of queries: its intensity is about
``2 * seqlen_q * heads_q / heads_kv / itemsize`` FLOP/byte, far below any ridge point, so it is
reported in GB/s and as a fraction of memory bandwidth.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from kbench.ops import Case, CaseError, Op, Param
from kbench.ops.attention import AttentionOp, attention_float64, softmax_scale

MAX_QUERY_TOKENS = 16
_ATTENTION_PARAMS = {p.name: p for p in AttentionOp.parameters}


class DecodeAttentionOp(Op):
    name = "decode_attention"
    description = (f"decode attention: 1..{MAX_QUERY_TOKENS} new query tokens (causal, bottom-right) against a "
                   "KV cache of up to millions of tokens, GQA when heads_q > heads_kv")
    parameters = (
        _ATTENTION_PARAMS["batch"],
        Param("seqlen_q", int, 1, minimum=1, short="sq", help=f"new query tokens, 1..{MAX_QUERY_TOKENS}"),
        *(_ATTENTION_PARAMS[n] for n in ("seqlen_kv", "heads_q", "heads_kv", "head_dim", "dtype")),
    )
    aliases = {"heads": ("heads_q", "heads_kv")}
    default_from = {"heads_kv": "heads_q"}  # MHA unless heads_kv is given
    input_names = ("q", "k", "v")

    def validate(self, params: Mapping[str, Any]) -> None:
        if params["seqlen_q"] > MAX_QUERY_TOKENS:
            raise CaseError(f"seqlen_q={params['seqlen_q']} query tokens: decode takes 1..{MAX_QUERY_TOKENS} "
                            "(use the attention op for prefill)")
        if params["seqlen_kv"] < params["seqlen_q"]:
            raise CaseError(f"seqlen_kv={params['seqlen_kv']} < seqlen_q={params['seqlen_q']}: the cache holds "
                            "the new tokens too")
        if params["heads_q"] % params["heads_kv"]:
            raise CaseError(f"heads_q={params['heads_q']} is not a multiple of heads_kv={params['heads_kv']}")

    def case_id(self, params: Mapping[str, Any]) -> str:
        p = params
        return (f"decode_attention[b={p['batch']},sq={p['seqlen_q']},sk={p['seqlen_kv']},hq={p['heads_q']},"
                f"hkv={p['heads_kv']},d={p['head_dim']},{p['dtype']}]")

    def group_key(self, case: Case) -> str:
        p = case.params
        return f"sq={p['seqlen_q']},hq={p['heads_q']},hkv={p['heads_kv']},d={p['head_dim']},{p['dtype']}"

    def make_inputs(self, case: Case, seed: int) -> dict[str, np.ndarray]:
        p = case.params
        rng = np.random.default_rng(seed)
        dt = case.dtype.numpy
        q_shape = (p["batch"], p["seqlen_q"], p["heads_q"], p["head_dim"])
        kv_shape = (p["batch"], p["seqlen_kv"], p["heads_kv"], p["head_dim"])
        return {"q": rng.standard_normal(q_shape, dtype=np.float32).astype(dt),
                "k": rng.standard_normal(kv_shape, dtype=np.float32).astype(dt),
                "v": rng.standard_normal(kv_shape, dtype=np.float32).astype(dt)}

    def output_shape(self, case: Case) -> tuple[int, ...]:
        p = case.params
        return (p["batch"], p["seqlen_q"], p["heads_q"], p["head_dim"])

    def reference(self, case: Case, inputs: Mapping[str, np.ndarray], rows: np.ndarray | None) -> np.ndarray:
        # at most 16 query rows: always checked whole
        return attention_float64(inputs["q"], inputs["k"], inputs["v"], causal=True, scale=softmax_scale(case))

    def kernel_kwargs(self, case: Case) -> dict[str, Any]:
        return {"scale": softmax_scale(case)}

    def visible_keys(self, case: Case) -> int:
        """Sum over query rows of the keys each sees: sq*sk - sq*(sq-1)/2 (row i sees sk-sq+i+1)."""
        sq, sk = case["seqlen_q"], case["seqlen_kv"]
        return sq * sk - sq * (sq - 1) // 2

    def flops(self, case: Case) -> float:
        """2*d FLOPs per (query row, visible key, head) for Q K^T and 2*d for P V."""
        p = case.params
        return 4.0 * p["batch"] * p["heads_q"] * p["head_dim"] * self.visible_keys(case)

    def min_bytes(self, case: Case) -> float:
        """Q read and O written once, the whole K and V cache read once (heads_kv heads)."""
        p = case.params
        qo = 2 * p["batch"] * p["seqlen_q"] * p["heads_q"] * p["head_dim"]
        kv = 2 * p["batch"] * p["seqlen_kv"] * p["heads_kv"] * p["head_dim"]
        return float((qo + kv) * case.dtype.itemsize)
