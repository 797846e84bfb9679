"""An op's whole parameter space as Hypothesis strategies, drawn for ``kbench fuzz``.

Lengths mix the small (1-16, which is where shrinking ends), the edges of the usual tile sizes (63, 64, 65, ...),
primes and anything up to a bound; ``seqlen_kv`` equals ``seqlen_q`` or is drawn on its own; heads are
``heads_kv`` times a group of 1-4 (MHA, GQA, MQA); head_dim from a list (``--head-dim``); causal; window,
softcap and the backward (mode ``bwd``/``fwd_bwd``) where the backend declares the feature; the dtypes asked
for. Every strategy shrinks towards the smallest case of its kind (batch 1, length 1, one head, the first head_dim
and dtype, no mask, the forward), so a failure found anywhere ends as small as the bug allows. A case whose float64 reference would cost more than
:data:`MAX_WORK` multiply-adds is not drawn (the checks stay a few tens of milliseconds each).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from hypothesis import strategies as st

#: lengths around the tile sizes kernels use (a tail block, a block exactly full, one more)
TILE_EDGES = (15, 16, 17, 31, 32, 33, 47, 48, 63, 64, 65, 96, 127, 128, 129, 191, 192, 255, 256, 257)
PRIMES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 37, 41, 53, 61, 67, 71, 97, 101, 113, 131, 149, 193, 211, 251, 257)
#: head_dims drawn unless ``--head-dim`` says otherwise (ascending: a failure shrinks to the smallest that fails)
HEAD_DIMS = (8, 16, 24, 32, 40, 48, 64, 80, 96, 128, 160, 192, 256)
#: longest prefill sequence drawn (attention, varlen), longest KV cache (decode)
MAX_LEN = 320
MAX_CACHE = 2048
#: multiply-adds of the float64 reference (Q K^T and P V) above which a drawn case is passed over
MAX_WORK = 1.5e7
#: the dtypes of each op that ``kbench fuzz`` draws by default (fp8 only when asked: few backends have it)
DEFAULT_DTYPES = ("fp32", "fp16", "bf16")


def lengths(top: int) -> st.SearchStrategy[int]:
    """A sequence length in [1, top]: small, at a tile edge, prime, or anything."""
    special = sorted({n for n in TILE_EDGES + PRIMES if n <= top})
    return st.one_of(st.integers(1, min(16, top)), st.sampled_from(special), st.integers(1, top))


@dataclass(frozen=True)
class Space:
    """What ``kbench fuzz`` draws for one backend: its op, the dtypes, the features it declares, the head_dims."""

    op: str
    dtypes: tuple[str, ...] = DEFAULT_DTYPES
    features: frozenset[str] = frozenset()
    head_dims: tuple[int, ...] = HEAD_DIMS
    max_work: float = MAX_WORK

    def strategy(self) -> st.SearchStrategy[dict[str, Any]]:
        """Raw case parameters (as a suite's grid entry holds them) of this space."""
        make = {"attention": self._attention, "decode_attention": self._decode,
                "attention_varlen": self._varlen}.get(self.op)
        if make is None:
            raise ValueError(f"kbench fuzz has no parameter space for op {self.op!r}; it knows "
                             f"{', '.join(SPACES)}")
        return make()

    def _heads(self) -> st.SearchStrategy[tuple[int, int]]:
        return st.tuples(st.integers(1, 4), st.integers(1, 4)).map(lambda t: (t[0] * t[1], t[0]))

    def _attention(self) -> st.SearchStrategy[dict[str, Any]]:
        features = self.features

        @st.composite
        def draw_case(draw) -> dict[str, Any]:
            sq = draw(lengths(MAX_LEN))
            sk = draw(lengths(MAX_LEN)) if draw(st.booleans()) else sq   # shrinks towards seqlen_q == seqlen_kv
            hq, hkv = draw(self._heads())
            params = {"batch": draw(st.integers(1, 3)), "seqlen_q": sq, "seqlen_kv": sk, "heads_q": hq,
                      "heads_kv": hkv, "head_dim": draw(st.sampled_from(self.head_dims)),
                      "causal": draw(st.booleans()), "dtype": draw(st.sampled_from(self.dtypes))}
            if "window" in features and draw(st.booleans()):
                params["window"] = [draw(st.integers(-1, 80)), draw(st.integers(-1, 80))]
            if "softcap" in features and draw(st.booleans()):
                params["softcap"] = draw(st.sampled_from([1.0, 5.0, 30.0, 50.0]))
            modes = [m for m in ("bwd", "fwd_bwd") if m in features]
            if modes and draw(st.booleans()):   # the backward where declared (shrinks to the forward)
                params["mode"] = draw(st.sampled_from(modes))
                if params["dtype"] == "fp8_e4m3":
                    params["mode"] = "fwd"
            return params
        return draw_case()

    def _decode(self) -> st.SearchStrategy[dict[str, Any]]:
        from kbench.ops.decode import MAX_QUERY_TOKENS

        features = self.features

        @st.composite
        def draw_case(draw) -> dict[str, Any]:
            sq = draw(st.one_of(st.just(1), st.integers(1, MAX_QUERY_TOKENS)))
            hq, hkv = draw(self._heads())
            params = {"batch": draw(st.integers(1, 3)), "seqlen_q": sq,
                      "seqlen_kv": max(sq, draw(lengths(MAX_CACHE))), "heads_q": hq, "heads_kv": hkv,
                      "head_dim": draw(st.sampled_from(self.head_dims)), "dtype": draw(st.sampled_from(self.dtypes))}
            if "paged" in features and draw(st.booleans()):
                params["page_size"] = draw(st.one_of(st.integers(1, 8), st.sampled_from([16, 32, 64, 128])))
            return params
        return draw_case()

    def _varlen(self) -> st.SearchStrategy[dict[str, Any]]:
        @st.composite
        def draw_case(draw) -> dict[str, Any]:
            batch = draw(st.integers(1, 4))
            q = draw(st.lists(lengths(MAX_LEN // 2), min_size=batch, max_size=batch))
            hq, hkv = draw(self._heads())
            params = {"seqlens_q": q, "heads_q": hq, "heads_kv": hkv,
                      "head_dim": draw(st.sampled_from(self.head_dims)), "causal": draw(st.booleans()),
                      "dtype": draw(st.sampled_from(self.dtypes))}
            if draw(st.booleans()):   # shrinks towards key lengths equal to the query lengths
                params["seqlens_kv"] = draw(st.lists(lengths(MAX_LEN // 2), min_size=batch, max_size=batch))
            return params
        return draw_case()


def reference_work(op: str, params: Mapping[str, Any]) -> float:
    """Multiply-adds of a case's float64 reference (what bounds the cost of checking it), from its parameters."""
    d, hq = params["head_dim"], params["heads_q"]
    if op == "attention_varlen":
        q = _lengths(params["seqlens_q"])
        kv = _lengths(params.get("seqlens_kv") or params["seqlens_q"])
        return 2.0 * hq * d * sum(a * b for a, b in zip(q, kv))
    backward = 3.0 if params.get("mode", "fwd") != "fwd" else 1.0   # dq, dk, dv besides the forward
    return 2.0 * backward * params.get("batch", 1) * hq * params["seqlen_q"] * params["seqlen_kv"] * d


def _lengths(value: Any) -> list[int]:
    return [int(x) for x in (value.split(",") if isinstance(value, str) else value)]


def size_key(params: Mapping[str, Any]) -> tuple:
    """Orders failing cases smallest first: reference work, then the sum of the numeric parameters."""
    op = "attention_varlen" if "seqlens_q" in params else "attention"
    numbers = [v for v in params.values() if isinstance(v, int) and not isinstance(v, bool)]
    numbers += [n for key in ("seqlens_q", "seqlens_kv") if params.get(key) for n in _lengths(params[key])]
    return (reference_work(op, params), sum(numbers), sum(bool(v) for v in params.values() if isinstance(v, bool)))


#: the ops that have a space here
SPACES = ("attention", "decode_attention", "attention_varlen")
