"""The ``attention_varlen`` op: prefill attention over a packed batch of sequences of different lengths.

Layout of FlashAttention's varlen API (``flash_attn_varlen_func``) and of cuDNN's ragged tensors:
the sequences are packed one after another along the token axis, q ``(total_q, heads_q, head_dim)``,
k and v ``(total_kv, heads_kv, head_dim)``, and two int32 inputs ``cu_seqlens_q`` and
``cu_seqlens_kv`` of ``batch + 1`` cumulative offsets (``cu[0] = 0``, sequence ``i`` is the tokens
``cu[i]:cu[i+1]``). The output is ``(total_q, heads_q, head_dim)``. Tokens attend only within their
own sequence; causal masking is bottom-right aligned per sequence, as in the ``attention`` op.

The lengths are part of the case, never of the per-call input seed: every call of a case has the
same layout, only the contents change. They are given either as explicit lists (``seqlens_q:
[512, 1024, 3000]``, or the text ``"512,1024,3000"``, which is how the case stores them) or sampled
from a seeded distribution (``seqlen_dist``, ``seqlen_mean``, ``seqlen_min``, ``seqlen_max``,
``seqlen_seed``). See docs/varlen.md.
"""
from __future__ import annotations

import hashlib
import math
from functools import lru_cache
from typing import Any, Mapping

import numpy as np

from kbench.ops import Case, CaseError, Op, Param
from kbench.ops.inputs import InputSpec, structural, unit_variance, values_of, with_values
from kbench.ops.attention import AttentionOp, attention_float64, plugin_reference, softmax_scale

#: shape parameter of the lognormal distribution (of log-length); its mean is set from ``seqlen_mean``
LOGNORMAL_SIGMA = 1.0
DISTRIBUTIONS = ("uniform", "lognormal")
#: an explicit length list this long or shorter is written out in the case id
INLINE_LENGTHS = 4

_DENSE = AttentionOp()


def parse_lengths(text: Any, name: str) -> tuple[int, ...]:
    """``"512,1024"`` (or a list of ints) -> (512, 1024); CaseError naming ``name`` on anything else."""
    if isinstance(text, (list, tuple)):
        items = list(text)
    else:
        items = [t.strip() for t in str(text).split(",")] if str(text).strip() else []
    out = []
    for item in items:
        try:
            n = int(item)
        except (TypeError, ValueError):
            n = None
        if n is None or isinstance(item, bool) or isinstance(item, float) or str(item).strip() != str(n):
            raise CaseError(f"{name!r} must be a list of positive integers like [512, 1024, 3000]; "
                            f"{item!r} is not an integer")
        if n < 1:
            raise CaseError(f"{name!r}: every sequence needs at least one token, got {n}")
        out.append(n)
    return tuple(out)


def sample_lengths(dist: str, batch: int, mean: int, low: int, high: int, seed: int) -> tuple[int, ...]:
    """``batch`` lengths from a seeded distribution, clipped to [low, high].

    uniform: integers uniform on [low, high]. lognormal: round(exp(N(mu, sigma^2))) with sigma =
    LOGNORMAL_SIGMA and mu = ln(mean) - sigma^2/2, so that the mean before clipping is ``mean``.
    """
    rng = np.random.default_rng(seed)
    if dist == "uniform":
        lens = rng.integers(low, high, size=batch, endpoint=True)
    else:
        mu = math.log(mean) - LOGNORMAL_SIGMA ** 2 / 2
        lens = np.rint(rng.lognormal(mu, LOGNORMAL_SIGMA, size=batch))
    return tuple(int(n) for n in np.clip(lens, low, high))


def cumulative(lengths: tuple[int, ...]) -> np.ndarray:
    """int32 offsets (batch + 1,): 0, l0, l0 + l1, ..."""
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def visible_pairs(sq: int, sk: int, causal: bool) -> int:
    """(query, key) pairs of one sequence that the mask lets through (bottom-right causal).

    Row i sees min(sk, max(0, i + sk - sq + 1)) keys: sk >= sq gives sq*sk - sq*(sq-1)/2, sk < sq
    gives 1 + 2 + ... + sk (the first sq - sk rows see nothing).
    """
    if not causal:
        return sq * sk
    return sq * sk - sq * (sq - 1) // 2 if sk >= sq else sk * (sk + 1) // 2


def _describe(lengths: tuple[int, ...]) -> str:
    """Short, stable text for an explicit length list: the list itself, or totals and a hash."""
    if len(lengths) <= INLINE_LENGTHS:
        return "/".join(map(str, lengths))
    digest = hashlib.sha256(",".join(map(str, lengths)).encode()).hexdigest()[:8]
    return f"tot{sum(lengths)}/max{max(lengths)}/{digest}"


class VarlenAttentionOp(Op):
    name = "attention_varlen"
    description = ("packed ragged prefill attention (FlashAttention varlen layout): sequences of different "
                   "lengths in one batch, cu_seqlens offsets, per-sequence (causal) attention, GQA")
    parameters = (
        Param("batch", int, 1, minimum=1, short="b", help="sequences; taken from seqlens_q when that is given"),
        Param("seqlens_q", str, "", help="explicit query lengths: [512, 1024] or \"512,1024\"; "
                                         "empty = sample them from seqlen_dist"),
        Param("seqlens_kv", str, "", help="explicit key/value lengths (default: seqlens_q)"),
        Param("seqlen_dist", str, "uniform", choices=DISTRIBUTIONS, help="distribution the lengths are drawn from"),
        Param("seqlen_mean", int, 0, minimum=0, help="lognormal: mean length (before clipping)"),
        Param("seqlen_min", int, 1, minimum=1, help="shortest sampled length"),
        Param("seqlen_max", int, 0, minimum=0, help="longest sampled length"),
        Param("seqlen_seed", int, 0, minimum=0, help="seed of the sampled lengths (the layout, not the contents)"),
        Param("heads_q", int, minimum=1, short="hq", help="query heads, a multiple of heads_kv"),
        Param("heads_kv", int, minimum=1, short="hkv", help="key/value heads (GQA/MQA when fewer than heads_q)"),
        Param("head_dim", int, minimum=1, short="d", help="head dimension"),
        Param("causal", bool, False, short="causal", help="causal mask within each sequence, aligned bottom-right"),
        Param("dtype", str, "fp32", choices=("fp32", "fp16", "bf16"), help="element type"),
    )
    aliases = {"heads": ("heads_q", "heads_kv")}
    list_params = frozenset({"seqlens_q", "seqlens_kv"})  # in a suite, [512, 1024] is one case's lengths
    default_from = {"heads_kv": "heads_q"}  # MHA unless heads_kv is given
    input_names = ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_kv")
    takes_values = True

    # -- parameters and cases ------------------------------------------------------------------

    def make_case(self, raw: Mapping[str, Any]) -> Case:
        raw = dict(raw)
        for key in self.list_params:  # a list (a suite's, Python's) is kept as its canonical text "512,1024"
            if isinstance(raw.get(key), (list, tuple)):
                raw[key] = ",".join(map(str, parse_lengths(raw[key], key)))
        if raw.get("seqlens_q") and "batch" not in raw:
            raw["batch"] = len(parse_lengths(raw["seqlens_q"], "seqlens_q"))
        return super().make_case(raw)

    def validate(self, params: Mapping[str, Any]) -> None:
        p = params
        if p["heads_q"] % p["heads_kv"]:
            raise CaseError(f"heads_q={p['heads_q']} is not a multiple of heads_kv={p['heads_kv']}")
        lens_q = parse_lengths(p["seqlens_q"], "seqlens_q")
        lens_kv = parse_lengths(p["seqlens_kv"], "seqlens_kv")
        if lens_q:
            sampled = [n for n in ("seqlen_dist", "seqlen_mean", "seqlen_min", "seqlen_max", "seqlen_seed")
                       if p[n] != self._default(n)]
            if sampled:
                raise CaseError(f"explicit seqlens_q and {', '.join(sampled)} both given: the lengths are either "
                                "listed or sampled; drop one")
            if len(lens_q) != p["batch"]:
                raise CaseError(f"batch={p['batch']} but seqlens_q lists {len(lens_q)} lengths")
            if lens_kv and len(lens_kv) != len(lens_q):
                raise CaseError(f"seqlens_kv lists {len(lens_kv)} lengths, seqlens_q {len(lens_q)}: one per sequence")
            return
        if lens_kv:
            raise CaseError("seqlens_kv given without seqlens_q: list the query lengths too (or neither, to sample)")
        if p["seqlen_max"] < 1:
            raise CaseError("give the lengths: seqlens_q: [512, 1024, ...], or seqlen_max (and seqlen_mean for "
                            "seqlen_dist: lognormal) to sample them")
        if p["seqlen_min"] > p["seqlen_max"]:
            raise CaseError(f"seqlen_min={p['seqlen_min']} > seqlen_max={p['seqlen_max']}")
        if p["seqlen_dist"] == "lognormal":
            if not p["seqlen_min"] <= p["seqlen_mean"] <= p["seqlen_max"]:
                raise CaseError(f"seqlen_dist: lognormal needs seqlen_mean in [seqlen_min, seqlen_max] = "
                                f"[{p['seqlen_min']}, {p['seqlen_max']}], got {p['seqlen_mean']}")
        elif p["seqlen_mean"]:
            raise CaseError("seqlen_dist: uniform draws from [seqlen_min, seqlen_max]; seqlen_mean is for lognormal")

    def _default(self, name: str) -> Any:
        return next(p.default for p in self.parameters if p.name == name)

    def case_id(self, params: Mapping[str, Any]) -> str:
        p = params
        q, kv = self._lengths(p)
        if p["seqlens_q"]:
            lens = f"sq={_describe(q)}" + (f",sk={_describe(kv)}" if kv != q else "")
        else:
            low = f"/min{p['seqlen_min']}" if p["seqlen_min"] != 1 else ""
            mean = f"/mean{p['seqlen_mean']}" if p["seqlen_dist"] == "lognormal" else ""
            lens = f"sq={p['seqlen_dist']}{mean}{low}/max{p['seqlen_max']}/seed{p['seqlen_seed']}/tot{sum(q)}"
        mask = "causal" if p["causal"] else "noncausal"
        return (f"attention_varlen[b={p['batch']},{lens},hq={p['heads_q']},hkv={p['heads_kv']},d={p['head_dim']},"
                f"{mask},{p['dtype']}]")

    def group_key(self, case: Case) -> str:
        p = case.params
        values = f",values={p['values']}" if "values" in p else ""   # a value range is a group of its own
        return (f"d={p['head_dim']},{'causal' if p['causal'] else 'noncausal'},"
                f"hq={p['heads_q']},hkv={p['heads_kv']},{p['dtype']}{values}")

    # -- the layout ----------------------------------------------------------------------------

    @staticmethod
    def _lengths(p: Mapping[str, Any]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return _lengths(p["seqlens_q"], p["seqlens_kv"], p["seqlen_dist"], p["batch"], p["seqlen_mean"],
                        p["seqlen_min"], p["seqlen_max"], p["seqlen_seed"])

    def lengths(self, case: Case) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(query lengths, key/value lengths) of the case's sequences."""
        return self._lengths(case.params)

    def cu_seqlens(self, case: Case) -> tuple[np.ndarray, np.ndarray]:
        q, kv = self.lengths(case)
        return cumulative(q), cumulative(kv)

    # -- data and maths ------------------------------------------------------------------------

    def input_specs(self, case: Case) -> dict[str, InputSpec]:
        """Packed q, k, v of mean 0 and variance 1; the offsets follow from the case's lengths (no randomness)."""
        p = case.params
        q_lens, kv_lens = self.lengths(case)
        dt = case.dtype.numpy.name
        cu_q, cu_kv = cumulative(q_lens), cumulative(kv_lens)
        return with_values({"q": unit_variance((sum(q_lens), p["heads_q"], p["head_dim"]), dt),
                            "k": unit_variance((sum(kv_lens), p["heads_kv"], p["head_dim"]), dt),
                            "v": unit_variance((sum(kv_lens), p["heads_kv"], p["head_dim"]), dt),
                            "cu_seqlens_q": structural(cu_q.shape, cu_q.dtype.name, lambda rng: cu_q),
                            "cu_seqlens_kv": structural(cu_kv.shape, cu_kv.dtype.name, lambda rng: cu_kv)},
                           values_of(case), p["head_dim"])

    def output_shape(self, case: Case) -> tuple[int, ...]:
        q_lens, _ = self.lengths(case)
        return (sum(q_lens), case["heads_q"], case["head_dim"])

    def sample_rows(self, case: Case, max_rows: int, rng: np.random.Generator) -> np.ndarray | None:
        """Packed query rows to check: each sequence's first and last rows (where offsets and masks go
        wrong; a random half of the budget of them when there are more), the rest at random."""
        cu, _ = self.cu_seqlens(case)
        total = int(cu[-1])
        if total <= max_rows:
            return None
        edges = np.unique(np.concatenate([cu[:-1], cu[1:] - 1]))
        if len(edges) > max_rows // 2:
            edges = rng.choice(edges, size=max_rows // 2, replace=False)
        rest = np.setdiff1d(np.arange(total), edges)
        middle = rng.choice(rest, size=max_rows - len(edges), replace=False)
        return np.unique(np.concatenate([edges, middle])).astype(np.int64)

    def select(self, case: Case, output: np.ndarray, rows: np.ndarray | None) -> np.ndarray:
        return output if rows is None else output[rows]

    def reference(self, case: Case, inputs: Mapping[str, np.ndarray], rows: np.ndarray | None) -> np.ndarray:
        """Per sequence, dense float64 attention of its rows (a plugin's for large ones, as for ``attention``)."""
        p = case.params
        q_lens, kv_lens = self.lengths(case)
        cu_q, cu_kv = cumulative(q_lens), cumulative(kv_lens)
        wanted = np.arange(int(cu_q[-1])) if rows is None else np.asarray(rows)
        out = np.empty((len(wanted), p["heads_q"], p["head_dim"]), dtype=np.float64)
        seq_of = np.searchsorted(cu_q, wanted, side="right") - 1
        for i in np.unique(seq_of):
            at = np.flatnonzero(seq_of == i)
            local = wanted[at] - cu_q[i]
            whole = len(local) == q_lens[i]
            seq = {"q": inputs["q"][cu_q[i]:cu_q[i + 1]][None],
                   "k": inputs["k"][cu_kv[i]:cu_kv[i + 1]][None], "v": inputs["v"][cu_kv[i]:cu_kv[i + 1]][None]}
            dense = _DENSE.make_case({"seqlen_q": q_lens[i], "seqlen_kv": kv_lens[i], "heads_q": p["heads_q"],
                                      "heads_kv": p["heads_kv"], "head_dim": p["head_dim"], "causal": p["causal"],
                                      "dtype": p["dtype"]})
            ref = plugin_reference(dense, seq, None if whole else local)
            if ref is None:
                ref = attention_float64(seq["q"] if whole else seq["q"][:, local], seq["k"], seq["v"],
                                        causal=p["causal"], scale=softmax_scale(case),
                                        rows=None if whole else local, seqlen_q=q_lens[i])
            out[at] = ref[0]
        return out

    def kernel_kwargs(self, case: Case) -> dict[str, Any]:
        q_lens, kv_lens = self.lengths(case)
        return {"causal": case["causal"], "scale": softmax_scale(case), "max_seqlen_q": max(q_lens),
                "max_seqlen_kv": max(kv_lens)}

    def flops(self, case: Case) -> float:
        """4 * heads_q * head_dim per visible (query, key) pair, summed over the sequences."""
        p = case.params
        pairs = sum(visible_pairs(sq, sk, p["causal"]) for sq, sk in zip(*self.lengths(case)))
        return 4.0 * p["heads_q"] * p["head_dim"] * pairs

    def min_bytes(self, case: Case) -> float:
        """Q read and O written, K and V read, once each; the two offset arrays (int32)."""
        p = case.params
        q_lens, kv_lens = self.lengths(case)
        qo = 2 * sum(q_lens) * p["heads_q"] * p["head_dim"]
        kv = 2 * sum(kv_lens) * p["heads_kv"] * p["head_dim"]
        return float((qo + kv) * case.dtype.itemsize + 2 * (p["batch"] + 1) * 4)


@lru_cache(maxsize=256)
def _lengths(seqlens_q: str, seqlens_kv: str, dist: str, batch: int, mean: int, low: int, high: int,
             seed: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    q = parse_lengths(seqlens_q, "seqlens_q")
    if not q:
        q = sample_lengths(dist, batch, mean, low, high, seed)
    return q, parse_lengths(seqlens_kv, "seqlens_kv") or q
