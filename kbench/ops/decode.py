"""The ``decode_attention`` op: a few new query tokens attend to a long KV cache.

Layout as for ``attention``: q ``(batch, seqlen_q, heads_q, head_dim)``, k and v (the cache)
``(batch, seqlen_kv, heads_kv, head_dim)``. Causal by construction: the ``seqlen_q`` queries are the
last ``seqlen_q`` positions of the sequence, so query row ``i`` sees keys ``j <= seqlen_kv - seqlen_q + i``
(bottom-right alignment, as in FlashAttention and cuDNN; speculative decoding verifies several
tokens this way). With one query token the mask is empty.

Decode reads the whole cache once for a handful of queries: its intensity is about
``2 * seqlen_q * heads_q / heads_kv / itemsize`` FLOP/byte, far below any ridge point, so it is
reported in GB/s and as a fraction of memory bandwidth.

Paged cache (``page_size > 0``, the layout of vLLM's PagedAttention, Kwon et al., SOSP 2023, as
taken by flash-attn's ``flash_attn_with_kvcache(block_table=...)`` and FlashInfer's NHD paged KV):
the inputs are ``q``, ``k_pages`` and ``v_pages`` ``(num_pages, page_size, heads_kv, head_dim)`` and
``block_table`` int32 ``(batch, pages_per_seq)``: token ``t`` of sequence ``b`` is row ``t % page_size``
of page ``block_table[b, t // page_size]``. Every sequence is ``seqlen_kv`` long, so
``pages_per_seq = ceil(seqlen_kv / page_size)`` and the rows past ``seqlen_kv`` in a sequence's last
page are not part of it. The pool holds ``pool_factor`` times the pages the batch uses; the block
table is a seeded permutation of the pool (new for every input set: a kernel cannot key a cache on
it). Pages outside the batch hold negated copies of pages inside it (as large, but wrong), and the
rows past ``seqlen_kv`` random values: a kernel that reads the pool in order, or whole last pages,
gets a wrong answer. Kernels receive ``page_size`` and ``seqlen_kv`` besides ``scale`` (the block table
alone says only ``ceil(seqlen_kv / page_size)``). Bytes count what a kernel must
touch: the batch's pages (whole pages) and the block table, not the pool.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from kbench.ops import Case, CaseError, Op, Param
from kbench.ops.inputs import InputSpec, structural, unit_variance, values_of, with_values
from kbench.ops.attention import AttentionOp, attention_float64, softmax_scale

MAX_QUERY_TOKENS = 16
#: default size of a paged cache's pool, in multiples of the pages the batch uses
POOL_FACTOR = 2
_ATTENTION_PARAMS = {p.name: p for p in AttentionOp.parameters}


class DecodeAttentionOp(Op):
    name = "decode_attention"
    description = (f"decode attention: 1..{MAX_QUERY_TOKENS} new query tokens (causal, bottom-right) against a "
                   "KV cache of up to millions of tokens, GQA when heads_q > heads_kv")
    parameters = (
        _ATTENTION_PARAMS["batch"],
        Param("seqlen_q", int, 1, minimum=1, short="sq", help=f"new query tokens, 1..{MAX_QUERY_TOKENS}"),
        *(_ATTENTION_PARAMS[n] for n in ("seqlen_kv", "heads_q", "heads_kv", "head_dim")),
        Param("dtype", str, "fp32", choices=("fp32", "fp16", "bf16"),
              help="element type (no fp8_e4m3: decode attention has no FP8 KV cache yet)"),
        Param("page_size", int, 0, minimum=0, short="page",
              help="tokens per page of a paged KV cache; 0 = one contiguous cache per sequence"),
        Param("pool_factor", int, POOL_FACTOR, minimum=1, short="pool",
              help="a paged cache's pool holds this many times the pages the batch uses"),
    )
    aliases = {"heads": ("heads_q", "heads_kv")}
    default_from = {"heads_kv": "heads_q"}  # MHA unless heads_kv is given
    input_names = ("q", "k", "v")
    takes_values = True
    #: the inputs of a paged case (``page_size > 0``)
    paged_input_names = ("q", "k_pages", "v_pages", "block_table")

    def validate(self, params: Mapping[str, Any]) -> None:
        if params["seqlen_q"] > MAX_QUERY_TOKENS:
            raise CaseError(f"seqlen_q={params['seqlen_q']} query tokens: decode takes 1..{MAX_QUERY_TOKENS} "
                            "(use the attention op for prefill)")
        if params["seqlen_kv"] < params["seqlen_q"]:
            raise CaseError(f"seqlen_kv={params['seqlen_kv']} < seqlen_q={params['seqlen_q']}: the cache holds "
                            "the new tokens too")
        if params["heads_q"] % params["heads_kv"]:
            raise CaseError(f"heads_q={params['heads_q']} is not a multiple of heads_kv={params['heads_kv']}")
        if not params["page_size"] and params["pool_factor"] != POOL_FACTOR:
            raise CaseError(f"pool_factor={params['pool_factor']} without a paged cache: set page_size > 0 "
                            "(or drop pool_factor)")

    def case_id(self, params: Mapping[str, Any]) -> str:
        p = params
        return (f"decode_attention[b={p['batch']},sq={p['seqlen_q']},sk={p['seqlen_kv']},hq={p['heads_q']},"
                f"hkv={p['heads_kv']},d={p['head_dim']},{p['dtype']}{_paging(p)}]")

    def group_key(self, case: Case) -> str:
        p = case.params
        values = f",values={p['values']}" if "values" in p else ""   # a value range is a group of its own
        return (f"sq={p['seqlen_q']},hq={p['heads_q']},hkv={p['heads_kv']},d={p['head_dim']},{p['dtype']}{_paging(p)}"
                f"{values}")

    def required_features(self, case: Case) -> frozenset[str]:
        return frozenset({"paged"}) if case["page_size"] else frozenset()

    # -- paged layout ----------------------------------------------------------------------------

    @staticmethod
    def pages_per_seq(case: Case) -> int:
        return -(-case["seqlen_kv"] // case["page_size"])

    def num_pages(self, case: Case) -> int:
        """Pages in the pool: ``pool_factor`` times the ``batch * pages_per_seq`` the batch uses."""
        return case["pool_factor"] * case["batch"] * self.pages_per_seq(case)

    def input_specs(self, case: Case) -> dict[str, InputSpec]:
        """q and the cache of mean 0 and variance 1; a paged cache is a pool of ``pool_factor`` times the pages the
        batch uses, its block table a random choice of pool pages (made on the host)."""
        p = case.params
        dt = case.dtype.numpy.name
        q_shape = (p["batch"], p["seqlen_q"], p["heads_q"], p["head_dim"])
        if not p["page_size"]:
            kv_shape = (p["batch"], p["seqlen_kv"], p["heads_kv"], p["head_dim"])
            return with_values({"q": unit_variance(q_shape, dt), "k": unit_variance(kv_shape, dt),
                                "v": unit_variance(kv_shape, dt)}, values_of(case), p["head_dim"])
        used, total = p["batch"] * self.pages_per_seq(case), self.num_pages(case)
        pool = (total, p["page_size"], p["heads_kv"], p["head_dim"])

        def block_table(rng: np.random.Generator) -> np.ndarray:
            return rng.permutation(total)[:used].reshape(p["batch"], -1).astype(np.int32)

        return with_values({"q": unit_variance(q_shape, dt), "k_pages": unit_variance(pool, dt),
                            "v_pages": unit_variance(pool, dt),
                            "block_table": structural((p["batch"], used // p["batch"]), "int32", block_table)},
                           values_of(case), p["head_dim"])

    def gather_pages(self, case: Case, inputs: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """The logical contiguous cache ``(batch, seqlen_kv, heads_kv, head_dim)`` k and v of a paged case."""
        table, sk = inputs["block_table"], case["seqlen_kv"]
        b = table.shape[0]
        return tuple(inputs[n][table].reshape(b, -1, *inputs[n].shape[2:])[:, :sk]
                     for n in ("k_pages", "v_pages"))

    def output_shape(self, case: Case) -> tuple[int, ...]:
        p = case.params
        return (p["batch"], p["seqlen_q"], p["heads_q"], p["head_dim"])

    def reference(self, case: Case, inputs: Mapping[str, np.ndarray], rows: np.ndarray | None) -> np.ndarray:
        # at most 16 query rows: always checked whole
        k, v = self.gather_pages(case, inputs) if case["page_size"] else (inputs["k"], inputs["v"])
        return attention_float64(inputs["q"], k, v, causal=True, scale=softmax_scale(case))

    def kernel_kwargs(self, case: Case) -> dict[str, Any]:
        if case["page_size"]:
            return {"scale": softmax_scale(case), "page_size": case["page_size"], "seqlen_kv": case["seqlen_kv"]}
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
        """Q read and O written once, the whole K and V cache read once (heads_kv heads).

        Paged: the batch's pages, whole (a page is the unit a paged kernel loads), and the block
        table (int32); the rest of the pool is never touched.
        """
        p = case.params
        if not p["page_size"]:
            kv = 2 * p["batch"] * p["seqlen_kv"] * p["heads_kv"] * p["head_dim"] * case.dtype.itemsize
            return float(self._qo_bytes(case) + kv)
        return float(self._paged_bytes(case, p["batch"] * self.pages_per_seq(case)))

    def footprint(self, case: Case) -> float:
        """Resident bytes: for a paged case the whole pool, not just the pages the batch reads."""
        if not case["page_size"]:
            return self.min_bytes(case)
        return float(self._paged_bytes(case, self.num_pages(case)))

    def _qo_bytes(self, case: Case) -> int:
        p = case.params
        return 2 * p["batch"] * p["seqlen_q"] * p["heads_q"] * p["head_dim"] * case.dtype.itemsize

    def _paged_bytes(self, case: Case, pages: int) -> int:
        """Q and O, ``pages`` pages of K and V, and the block table (int32)."""
        p = case.params
        kv = 2 * pages * p["page_size"] * p["heads_kv"] * p["head_dim"] * case.dtype.itemsize
        return self._qo_bytes(case) + kv + 4 * p["batch"] * self.pages_per_seq(case)


def _paging(p: Mapping[str, Any]) -> str:
    """The case-id suffix of a paged cache (empty for a contiguous one: its ids are unchanged)."""
    if not p["page_size"]:
        return ""
    return f",page={p['page_size']}" + (f",pool={p['pool_factor']}" if p["pool_factor"] != POOL_FACTOR else "")
