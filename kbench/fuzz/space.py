"""An op's whole parameter space as Hypothesis strategies, drawn for ``kbench fuzz``.

Lengths mix the small (1-16, which is where shrinking ends), the edges of the usual tile sizes (63, 64, 65, ...),
primes and anything up to a bound; a quarter of the cases have **long rows**: a key length past 320 up to
:data:`MAX_LONG` (one off each power of two from 512 to 8,192 a third of the time), with the rest of the case made
small enough to stay within :data:`MAX_WORK` (batch 1, one or two key/value heads, head_dim at most 64, few query
rows); the inputs' **value range** (kbench.ops.inputs.VALUE_RANGES) is drawn too, ``unit`` half the time;
``seqlen_kv`` equals ``seqlen_q`` or is drawn on its own; heads are
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
#: longest prefill sequence drawn (attention, varlen) in a case without long rows, longest KV cache of one (decode)
MAX_LEN = 320
MAX_CACHE = 2048
#: longest key row drawn (a long-row case): past 8,192 keys, the last split of the usual flash-decoding sizes
MAX_LONG = 8193
#: key lengths of long rows drawn a third of the time: one off each power of two (a block or split boundary)
LONG_EDGES = tuple(n for k in range(9, 14) for n in (2 ** k - 1, 2 ** k, 2 ** k + 1))
#: a long-row case draws its head_dim from these (the cost of a long row is kept in its other dimensions)
LONG_HEAD_DIMS_MAX = 64
#: of these many cases, one has long rows
LONG_ODDS = 4
#: multiply-adds of the float64 reference (Q K^T and P V) above which a drawn case is passed over
MAX_WORK = 1.5e7
#: the dtypes of each op that ``kbench fuzz`` draws by default (fp8 only when asked: few backends have it)
DEFAULT_DTYPES = ("fp32", "fp16", "bf16")


def lengths(top: int) -> st.SearchStrategy[int]:
    """A sequence length in [1, top]: small, at a tile edge, prime, or anything."""
    special = sorted({n for n in TILE_EDGES + PRIMES if n <= top}) or [1]
    return st.one_of(st.integers(1, min(16, top)), st.sampled_from(special), st.integers(1, top))


def long_lengths(low: int = MAX_LEN + 1, top: int = MAX_LONG) -> st.SearchStrategy[int]:
    """A long key row: anything up to ``top`` (past ``low`` almost always), or one off a power of two from ``low`` on
    a third of the time. It shrinks towards 1, not ``low``: a failure that needs no long row ends as small as any
    other, one that does at the smallest failing length (1,025 for a reset every 1,024 keys)."""
    edges = [n for n in LONG_EDGES if low <= n <= top]
    # uniform over [1, top] as two small integers (Hypothesis draws a wide integer range with a bias towards small
    # values: st.integers(1, 8193) gives a length past 4,096 18% of the time, this 50%); both shrink towards 0
    # always the same four choices (which kind, two for the uniform length, one for the edge): a shrinker that
    # lowers an earlier parameter never sees the draw grow longer, which it would refuse as "not simpler"
    step = -(-top // 256)

    def pick(t: tuple[int, int, int, int]) -> int:
        kind, hi, lo, edge = t
        return edges[edge] if kind == 2 else min(top, 1 + hi * step + lo)
    return st.tuples(st.integers(0, 2), st.integers(0, 255), st.integers(0, step - 1),
                     st.integers(0, len(edges) - 1)).map(pick)


def _shrunk(hq: int, hkv: int, d: int, dims: tuple[int, ...], per_unit: float, budget: float) -> tuple[int, int, int]:
    """Heads and head_dim of a long-row case made small enough that one query row (``per_unit`` multiply-adds per
    head and channel) fits ``budget``: the head_dim first (down the drawn list), then one head of each kind."""
    smaller = [x for x in dims if x <= d]
    while per_unit * hq * d > budget and len(smaller) > 1:
        smaller.pop()
        d = smaller[-1]
    if per_unit * hq * d > budget:
        hq = hkv = 1
    return hq, hkv, d


def _fit(work_per_row: float, budget: float, top: int) -> int:
    """How many query rows of ``work_per_row`` multiply-adds each fit in ``budget`` (at least 1, at most ``top``)."""
    return int(max(1, min(top, budget // max(work_per_row, 1.0))))


def default_values() -> tuple[str, ...]:
    """The value ranges ``kbench fuzz`` and the held-out shapes draw by default: ``unit`` (first: a failure shrinks
    to it when it can), the named ones, ``std:2`` and ``std:4``. Not a small std: scores of std 1/16 make attention
    nearly the mean of the visible values, which the judge's trivial-predictor rule (an answer 10x closer than that
    mean) cannot tell from a 16-bit kernel's rounding (torch-decode, bf16, ``std:0.25``: 0.00128 against 0.0108)."""
    from kbench.ops.inputs import VALUE_RANGES

    return tuple(VALUE_RANGES) + ("std:2", "std:4")


@dataclass(frozen=True)
class Space:
    """What ``kbench fuzz`` draws for one backend: its op, the dtypes, the features it declares, the head_dims."""

    op: str
    dtypes: tuple[str, ...] = DEFAULT_DTYPES
    features: frozenset[str] = frozenset()
    head_dims: tuple[int, ...] = HEAD_DIMS
    max_work: float = MAX_WORK
    #: value ranges drawn (``unit`` half the time when it is among them); None: :func:`default_values`
    values: tuple[str, ...] | None = None
    #: whether a quarter of the cases have long rows (past :data:`MAX_LEN` keys, up to :data:`MAX_LONG`)
    long_rows: bool = True

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

    def _long(self, draw) -> bool:
        """Whether this case has long rows (a quarter of them where the space has them). Drawn last, after the long
        length, with every other parameter drawn the same either way: the shrinker turns it off and keeps the rest
        whenever the failure does not need a long row."""
        # a byte (which Hypothesis draws uniformly; a draw from 0-3 came out 3 one time in twelve), 0 = short
        return self.long_rows and draw(st.integers(0, 255)) >= 256 - 256 // LONG_ODDS

    def _long_dim(self, d: int) -> int:
        """The head_dim of a long-row case drawn with ``d``: the largest long-row head_dim not above it."""
        dims = self._long_head_dims()
        return max([x for x in dims if x <= d] or dims[:1])

    def _long_head_dims(self) -> tuple[int, ...]:
        return tuple(d for d in self.head_dims if d <= LONG_HEAD_DIMS_MAX) or self.head_dims[:1]

    def _values(self, draw, params: dict[str, Any]) -> None:
        """A value range for the case (kept out of its parameters when ``unit``: its id stays today's); a backward
        case only the gentle ones (scores no larger than unit inputs': a saturated softmax has gradients near zero,
        below the judge's absolute noise floor for unit-scale inputs)."""
        from kbench.ops.inputs import value_range

        values = default_values() if self.values is None else self.values
        if params.get("mode", "fwd") != "fwd":
            values = tuple(v for v in values if value_range(v).gentle)
        if not values or params.get("dtype") == "fp8_e4m3":
            return
        unit = "unit" in values
        others = [v for v in values if v != "unit"]
        if not others:
            return
        # both always drawn, from a list of the same length whatever the mode (a fixed number of choices: see
        # long_lengths), the gentle ones first
        ranged = draw(st.booleans()) or not unit
        pick = draw(st.integers(0, 255))
        if ranged:
            params["values"] = others[pick % len(others)]

    def _attention(self) -> st.SearchStrategy[dict[str, Any]]:
        features = self.features

        @st.composite
        def draw_case(draw) -> dict[str, Any]:
            sq = draw(lengths(MAX_LEN))
            sk = draw(lengths(MAX_LEN)) if draw(st.booleans()) else sq   # shrinks towards seqlen_q == seqlen_kv
            hq, hkv = draw(self._heads())
            d = draw(st.sampled_from(self.head_dims))
            batch = draw(st.integers(1, 3))
            params = {"batch": batch, "seqlen_q": sq, "seqlen_kv": sk, "heads_q": hq,
                      "heads_kv": hkv, "head_dim": d,
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
            self._values(draw, params)
            long_kv = draw(long_lengths())
            if self._long(draw):   # one long key row: the rest of the case as small as its cost needs
                factor = 3.0 if params.get("mode", "fwd") != "fwd" else 1.0
                hkv = min(hkv, 2)
                hq, hkv, d = _shrunk(hkv * (hq // params["heads_kv"]), hkv, self._long_dim(d), self._long_head_dims(),
                                     2.0 * factor * long_kv, self.max_work)
                params.update({"batch": 1, "seqlen_kv": long_kv, "heads_q": hq, "heads_kv": hkv, "head_dim": d,
                               "seqlen_q": min(sq, _fit(2.0 * factor * hq * long_kv * d, self.max_work, MAX_LEN))})
            return params
        return draw_case()

    def _decode(self) -> st.SearchStrategy[dict[str, Any]]:
        from kbench.ops.decode import MAX_QUERY_TOKENS

        features = self.features

        @st.composite
        def draw_case(draw) -> dict[str, Any]:
            sq = draw(st.one_of(st.just(1), st.integers(1, MAX_QUERY_TOKENS)))
            sk, batch = draw(lengths(MAX_CACHE)), draw(st.integers(1, 3))
            hq, hkv = draw(self._heads())
            d = draw(st.sampled_from(self.head_dims))
            params = {"batch": batch, "seqlen_q": sq, "seqlen_kv": max(sq, sk), "heads_q": hq, "heads_kv": hkv,
                      "head_dim": d, "dtype": draw(st.sampled_from(self.dtypes))}
            if "paged" in features and draw(st.booleans()):
                params["page_size"] = draw(st.one_of(st.integers(1, 8), st.sampled_from([16, 32, 64, 128])))
            self._values(draw, params)
            long_kv = draw(long_lengths(MAX_CACHE + 1))
            if self._long(draw):   # a cache past 2,048 keys: one sequence, one or two kv heads, head_dim <= 64
                hkv = min(hkv, 2)
                hq, hkv, d = _shrunk(hkv * (hq // params["heads_kv"]), hkv, self._long_dim(d), self._long_head_dims(),
                                     2.0 * long_kv, self.max_work)
                sq = min(sq, _fit(2.0 * hq * long_kv * d, self.max_work, sq))
                params.update({"batch": 1, "seqlen_q": sq, "seqlen_kv": long_kv, "heads_q": hq, "heads_kv": hkv,
                               "head_dim": d})
            return params
        return draw_case()

    def _varlen(self) -> st.SearchStrategy[dict[str, Any]]:
        @st.composite
        def draw_case(draw) -> dict[str, Any]:
            batch = draw(st.integers(1, 4))
            q = draw(st.lists(lengths(MAX_LEN // 2), min_size=batch, max_size=batch))
            hq, hkv = draw(self._heads())
            d = draw(st.sampled_from(self.head_dims))
            params = {"seqlens_q": q, "heads_q": hq, "heads_kv": hkv, "head_dim": d, "causal": draw(st.booleans()),
                      "dtype": draw(st.sampled_from(self.dtypes))}
            if draw(st.booleans()):   # shrinks towards key lengths equal to the query lengths
                params["seqlens_kv"] = draw(st.lists(lengths(MAX_LEN // 2), min_size=batch, max_size=batch))
            self._values(draw, params)
            long_kv, at = draw(long_lengths()), draw(st.integers(0, batch - 1))
            if self._long(draw):   # one sequence of long key rows, the others' queries few, the heads small
                kv = list(params.get("seqlens_kv") or q)
                kv[at] = long_kv
                q = [min(n, 16) for n in q]
                hkv = min(hkv, 2)
                hq, hkv, d = _shrunk(hkv * (hq // params["heads_kv"]), hkv, self._long_dim(d), self._long_head_dims(),
                                     2.0 * sum(kv), self.max_work)
                rest = self.max_work / (2.0 * hq * d) - sum(a * b for i, (a, b) in enumerate(zip(q, kv)) if i != at)
                q[at] = min(q[at], _fit(kv[at], rest, MAX_LEN // 2))
                params.update({"seqlens_q": q, "seqlens_kv": kv, "heads_q": hq, "heads_kv": hkv, "head_dim": d})
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
