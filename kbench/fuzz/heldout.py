"""Held-out shapes: cases over the class a suite stands for that the kernel's author (an operator, an evolver)
never sees.

A candidate tuned on a suite can be exact there and wrong anywhere else (a tail block dropped when the key
length is not a multiple of the tile, a causal mask aligned top-left, GQA heads mapped with the wrong index, a
head_dim or batch past the suite's, outlier values). Everything that scores a kernel also checks it on
:data:`HELD_OUT_CASES` shapes drawn from a secret of its own (:func:`held_out_cases`) over every parameter the
backend declares it supports and the suite does not pin (:func:`domain`): three shapes hold a length that is a
multiple of 16 but not a power of two, an odd length and one longer than the suite's longest; head_dim, GQA
groups (odd ones included), batch, sequence counts, windows, softcap and the inputs' value range move too, each
shape within a cost cap. Each is checked for correctness only (:class:`kbench.fuzz.checker.Checker`: the judge
and sandbox of ``kbench run``, no timing, one worker for them all). The shapes are never written anywhere the
operator reads: a failure says what went wrong, not on which shape, unless ``show`` is set.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from kbench.ops import Case, CaseError

#: held-out shapes checked per evaluation by default (docs/fuzz.md, "Held-out shapes": what they cost)
HELD_OUT_CASES = 3
#: the one switch of the held-out shapes: how many per evaluation where a caller gives no number (0: none)
ENV_HELD_OUT = "KBENCH_EVAL_HELD_OUT"


def held_out_default(n: int | None = None, environ: Mapping[str, str] | None = None) -> int:
    """How many held-out shapes to check: ``n`` when given, else ``$KBENCH_EVAL_HELD_OUT`` when set, else
    :data:`HELD_OUT_CASES`. Read by :func:`check_held_out` and :func:`kbench.evaluators.score_kernel` (so by the
    OpenEvolve and Shinka evaluators however they are built, and by ``kbench evolve``'s evaluator) whenever their
    caller leaves the number out. A value that is not a whole number >= 0 is bad input (exit 2)."""
    if n is not None:
        return int(n)
    raw = (os.environ if environ is None else environ).get(ENV_HELD_OUT)
    if raw is None or not raw.strip():
        return HELD_OUT_CASES
    try:
        value = int(raw.strip())
    except ValueError:
        value = -1
    if value < 0:
        from kbench.errors import BadInput

        raise BadInput(f"{ENV_HELD_OUT}={raw!r} is not a whole number >= 0", where="environment",
                       fix=f"export {ENV_HELD_OUT}=3 (held-out shapes per evaluation; 0 for none)")
    return value


@dataclass
class HeldOut:
    """The verdict of the held-out shapes for one backend."""

    backend: str
    checked: int = 0
    seconds: float = 0.0
    #: the first held-out case that did not pass: (case id, status, reason, rel_l2, bound); None: all passed
    failure: tuple[str, str, str, float | None, float | None] | None = None
    #: why the harness could not check (no sandbox, a worker that would not start): nobody's fault
    infrastructure: str | None = None
    cases: list[str] = field(default_factory=list, repr=False)

    @property
    def passed(self) -> bool:
        return self.failure is None and self.infrastructure is None

    def reason(self, show: bool = False) -> str:
        """Why it failed, for the operator's feedback: the shape only when ``show``."""
        if self.failure is None:
            return ""
        case_id, status, why, rel_l2, bound = self.failure
        where = f"held-out shape {case_id}" if show else "a held-out shape (near the suite's; hidden)"
        if show:
            detail = f"{status}: {why}"
        elif rel_l2 is not None and bound:
            detail = f"{status}: relative L2 error {rel_l2:.3g} exceeds the bound {bound:.3g}"
        else:  # the reason may name the shape (a broadcast error, an index): only its status is told
            detail = f"{status} (the reason names the shape; hidden)"
        return f"wrong on {where}: {detail}"

    def to_json(self, show: bool = False) -> dict[str, Any]:
        out = {"checked": self.checked, "seconds": round(self.seconds, 3), "passed": self.passed,
               "reason": self.reason(show) or None}
        if show:
            out["cases"] = list(self.cases)
        return out


def _rng(secret: bytes, label: str) -> np.random.Generator:
    digest = hmac.new(secret, f"kbench held-out shapes: {label}".encode(), hashlib.sha256).digest()
    return np.random.default_rng(int.from_bytes(digest[:16], "little"))


def near_length(n: int, rng: np.random.Generator) -> int:
    """A length near ``n`` (from about half of it to a little above), neither a power of two nor a multiple of
    16 when ``n`` allows (a tail block, an odd count)."""
    if n <= 2:
        return int(rng.integers(1, 4))
    low, high = max(1, n // 2), max(2, n + n // 8)
    for _ in range(32):
        m = int(rng.integers(low, high + 1))
        if m % 16 and m & (m - 1):
            return m
    return max(1, n - 1) if (n - 1) & (n - 2) else n + 1


#: what each of the held-out shapes' lengths is, in turn (every draw of three has one of each): a multiple of 16
#: that is not a power of two, an odd length, one longer than the suite's longest
LENGTH_KINDS = ("mult16", "odd", "longer")
#: a held-out shape's float64 reference may cost at most this many multiply-adds, or this many times the suite's
#: costliest case's, whichever is more (the longer shape keeps its length and gives up batch, heads, query rows)
HELD_OUT_WORK = 3e7
HELD_OUT_WORK_RATIO = 1.0
#: group sizes (query heads per kv head) drawn: MHA, the usual, and odd ones; the odd-length shape's always odd
GROUPS = (1, 2, 3, 4, 5, 7)
ODD_GROUPS = (3, 5, 7)
#: parameters a suite pins by giving one value by name in every grid entry (a kernel written for causal fp16 only
#: is not asked for the others); shapes are never pinned
PINNABLE = ("causal", "dtype", "mode", "window", "window_left", "window_right", "softcap", "values")


def kind_length(kind: str, n: int, longest: int, rng: np.random.Generator) -> int:
    """A length of ``kind`` (:data:`LENGTH_KINDS`) near ``n``: ``mult16`` a multiple of 16 that is not a power of
    two (from half of ``n`` to a little above, at least 48), ``odd`` an odd one (the same range), ``longer`` one
    from 1.1 to 1.6 times ``longest`` (odd or not)."""
    if kind == "longer":
        return int(rng.integers(longest + max(1, longest // 10), longest + max(2, (longest * 3) // 5) + 1))
    low, high = max(1, n // 2), max(3, n + n // 8)
    if kind == "mult16":
        choices = [m for m in range(max(48, low - low % 16), max(high, 48) + 16, 16) if m & (m - 1)]
        return int(rng.choice(choices))
    m = int(rng.integers(low, high + 1))
    return m if m % 2 else m + 1


def _declared(backend) -> tuple[frozenset[str], tuple[int, ...] | None]:
    """A backend's declared features and head_dims: a registry backend's ``features`` / ``head_dims``; a kernel
    file's ``FEATURES`` / ``HEAD_DIMS`` literals (read from its text, never run). None head_dims: not declared."""
    if backend is None:
        return frozenset(), None
    source = getattr(backend, "source_text", None)
    if source is None:
        dims = getattr(backend, "head_dims", None)
        return frozenset(getattr(backend, "features", ()) or ()), tuple(dims) if dims else None
    from kbench.source import literal_globals

    try:
        found = literal_globals(source, ("FEATURES", "HEAD_DIMS"))
    except Exception:  # noqa: BLE001 - not literals: the worker will say so
        return frozenset(), None
    feats, dims = found.get("FEATURES") or (), found.get("HEAD_DIMS")
    features = frozenset(str(f) for f in feats) if isinstance(feats, (list, tuple, set, frozenset)) else frozenset()
    if isinstance(dims, (list, tuple)) and dims and all(isinstance(d, int) and d > 0 for d in dims):
        return features, tuple(dims)
    return features, None


@dataclass(frozen=True)
class Domain:
    """What the held-out shapes of one suite and backend are drawn over (see :func:`domain`)."""

    pinned: dict[str, Any]
    head_dims: tuple[int, ...]
    suite_head_dims: tuple[int, ...]
    dtypes: tuple[str, ...]
    features: frozenset[str]
    max_batch: int
    max_kv_heads: int
    longest: int
    max_work: float
    max_sequences: int = 1
    max_query_tokens: int = 1


def domain(op, cases: Sequence[Case], backend=None, suite_data: Mapping[str, Any] | None = None) -> Domain:
    """The held-out domain: every parameter the backend declares it supports and the suite does not pin.

    Pinned: a :data:`PINNABLE` parameter with one value in every case and given by name in every grid entry of
    ``suite_data`` (without it, the parameters every case shares among causal, dtype, mode, softcap, window).
    head_dim: among the backend's declared ``HEAD_DIMS``, else the suite's and the usual ones
    (kbench.fuzz.space.HEAD_DIMS) up to twice the suite's largest. Batch up to two above the suite's, kv heads up
    to the suite's (at least 2), lengths past the suite's longest, window and softcap where the backend declares
    them."""
    from kbench.fuzz.space import HEAD_DIMS
    from kbench.ops.inputs import DEFAULT_VALUES

    features, declared = _declared(backend)
    params = [c.params for c in cases]
    named: set[str] | None = None
    if suite_data and isinstance(suite_data.get("grid"), list):
        keys = [set(k.strip() for key in entry for k in key.split(",")) for entry in suite_data["grid"]
                if isinstance(entry, Mapping)]
        named = set.intersection(*keys) if keys else set()
        if "window" in named:
            named |= {"window_left", "window_right"}
        if "inputs" in suite_data:
            named.add("values")
    pinned: dict[str, Any] = {}
    for key in PINNABLE:
        values = {repr(p.get(key, DEFAULT_VALUES if key == "values" else None)) for p in params}
        if len(values) != 1 or key == "window":
            continue
        if named is None and key == "values":
            continue
        if named is None or key in named:
            pinned[key] = params[0].get(key, DEFAULT_VALUES if key == "values" else None)
    suite_dims = tuple(sorted({int(p["head_dim"]) for p in params}))
    if declared:
        dims = tuple(sorted(set(declared)))
    else:
        dims = tuple(sorted(set(suite_dims) | {d for d in HEAD_DIMS if d <= 2 * max(suite_dims)}))
    dtype_param = next((p.choices for p in op.parameters if p.name == "dtype"), ("fp32",))
    dtypes = tuple(d for d in ("fp32", "fp16", "bf16") if d in dtype_param)
    if op.name == "attention_varlen":
        lens = [n for c in cases for ls in op.lengths(c) for n in ls]
        seqs = max(len(op.lengths(c)[0]) for c in cases)
        batch = seqs
    else:
        lens = [int(p[k]) for p in params for k in ("seqlen_q", "seqlen_kv")]
        seqs, batch = 1, max(int(p.get("batch", 1)) for p in params)
    work = max(_work(op, c.params) for c in cases)
    return Domain(pinned=pinned, head_dims=dims, suite_head_dims=suite_dims, dtypes=dtypes, features=features,
                  max_batch=batch + 2, max_kv_heads=max(2, max(int(p["heads_kv"]) for p in params)),
                  longest=max(lens), max_work=max(HELD_OUT_WORK, HELD_OUT_WORK_RATIO * work),
                  max_sequences=seqs + 2,
                  max_query_tokens=max(int(p.get("seqlen_q", 1)) for p in params))


def _work(op, params: Mapping[str, Any]) -> float:
    from kbench.fuzz.space import reference_work

    if op.name == "attention_varlen":
        q, kv = op.lengths(op.make_case(params)) if "seqlens_q" not in params or not params["seqlens_q"] else (
            _ints(params["seqlens_q"]), _ints(params.get("seqlens_kv") or params["seqlens_q"]))
        return 2.0 * params["heads_q"] * params["head_dim"] * sum(a * b for a, b in zip(q, kv))
    return reference_work(op.name, params)


def _ints(value: Any) -> list[int]:
    return [int(x) for x in (value.split(",") if isinstance(value, str) else value)]


def _draw(op, base: Case, dom: Domain, kind: str, rng: np.random.Generator) -> dict[str, Any]:
    """The raw parameters of one held-out shape from the suite case ``base`` (see :func:`domain`)."""
    from kbench.fuzz.space import default_values
    from kbench.ops.inputs import value_range

    p = dict(base.params)
    others = [x for x in dom.head_dims if x not in dom.suite_head_dims] or list(dom.head_dims)
    # past the suite's largest and not a multiple of it: a remainder the suite's tiles never had
    past = [x for x in others if x > max(dom.suite_head_dims) and x % max(dom.suite_head_dims)]
    if kind == "longer" and past:
        d = int(rng.choice(past))
    else:
        d = int(rng.choice(others)) if rng.random() < 2 / 3 else int(rng.choice(dom.head_dims))
    hkv = int(rng.integers(1, dom.max_kv_heads + 1))
    group = int(rng.choice(GROUPS))
    if kind == "odd":   # an odd grouping of two or more kv heads (a group that is not a power of two)
        hkv, group = int(rng.integers(2, dom.max_kv_heads + 1)), int(rng.choice(ODD_GROUPS))
    out: dict[str, Any] = {"heads_q": hkv * group, "heads_kv": hkv, "head_dim": d}
    free = lambda key: key not in dom.pinned   # noqa: E731
    out["dtype"] = str(rng.choice(dom.dtypes)) if free("dtype") else dom.pinned["dtype"]
    if "causal" in p:   # the longer shape causal where free (with seqlen_q != seqlen_kv: the mask's alignment shows)
        out["causal"] = (kind == "longer" or bool(rng.random() < 0.5)) if free("causal") else dom.pinned["causal"]
    if op.name == "attention":
        mode = p.get("mode", "fwd")
        if free("mode"):
            modes = ["fwd"] + [m for m in ("bwd", "fwd_bwd") if m in dom.features]
            mode = str(rng.choice(modes)) if rng.random() < 0.5 else "fwd"
        out["mode"] = mode
        if free("window_left") and "window" in dom.features and rng.random() < 0.5:
            out["window"] = [int(rng.integers(-1, 200)), int(rng.integers(-1, 200))]
        elif not free("window_left"):
            out["window"] = [p["window_left"], p["window_right"]]
        if free("softcap") and "softcap" in dom.features and rng.random() < 0.5:
            out["softcap"] = float(rng.choice([1.0, 5.0, 30.0, 50.0]))
        elif not free("softcap"):
            out["softcap"] = p["softcap"]
    if free("values"):
        names = list(default_values())
        if out.get("mode", "fwd") != "fwd":
            names = [v for v in names if value_range(v).gentle]
            out["values"] = str(rng.choice(names)) if rng.random() < 0.5 else "unit"
        elif kind == "odd":   # one hostile range in every draw: scores far past exp's range
            out["values"] = "large_scores"
        else:
            out["values"] = str(rng.choice(names)) if rng.random() < 0.5 else "unit"
    else:
        out["values"] = dom.pinned["values"]
    if op.name == "attention_varlen":
        q_lens, kv_lens = op.lengths(base)
        count = int(rng.integers(1, dom.max_sequences + 1))
        pick = lambda ls: [ls[int(rng.integers(0, len(ls)))] for _ in range(count)]   # noqa: E731
        q, kv = pick(list(q_lens)), pick(list(kv_lens))
        at = int(rng.integers(0, count))
        q = [kind_length(kind if i == at else str(rng.choice(LENGTH_KINDS[:2])), n, dom.longest, rng)
             for i, n in enumerate(q)]
        kv = [kind_length(kind if i == at else str(rng.choice(LENGTH_KINDS[:2])), n, dom.longest, rng)
              for i, n in enumerate(kv)]
        out.update({"seqlens_q": q, "seqlens_kv": kv})
        return out
    out["batch"] = int(rng.integers(1, dom.max_batch + 1))
    if kind == "mult16":   # a batch past the suite's largest in every draw
        out["batch"] = int(rng.integers(dom.max_batch - 1, dom.max_batch + 1))
    if op.name == "decode_attention":
        from kbench.ops.decode import MAX_QUERY_TOKENS

        out["seqlen_q"] = int(rng.integers(1, min(MAX_QUERY_TOKENS, dom.max_query_tokens + 1) + 1))
        out["seqlen_kv"] = max(out["seqlen_q"], kind_length(kind, int(p["seqlen_kv"]), dom.longest, rng))
        if p.get("page_size"):
            out["page_size"] = p["page_size"]
        out.pop("causal", None)
        return out
    sq = kind_length(kind, int(p["seqlen_q"]), dom.longest, rng)
    sk = kind_length(kind, int(p["seqlen_kv"]), dom.longest, rng)
    if sq == sk:
        sk = kind_length(kind, int(p["seqlen_kv"]), dom.longest, rng)
    if kind == "longer" and rng.random() < 0.5:   # the long row is the keys'; the queries anything near the suite's
        sq = kind_length(str(rng.choice(LENGTH_KINDS[:2])), int(p["seqlen_q"]), dom.longest, rng)
    out.update({"seqlen_q": sq, "seqlen_kv": sk})
    return out


def _capped(op, raw: dict[str, Any], dom: Domain, kind: str = "") -> dict[str, Any]:
    """``raw`` within the domain's cost, never giving up the key lengths nor the shape's role (:func:`_draw`: the
    batch past the suite's, the odd grouping): query rows down to 16 first, then batch, then heads, then the
    remaining query rows."""
    raw = dict(raw)
    floor_batch = dom.max_batch - 1 if kind == "mult16" and "batch" in raw else 1
    for _ in range(96):
        if _work(op, raw) <= dom.max_work:
            return raw
        if op.name == "attention" and raw["seqlen_q"] > 16:
            raw["seqlen_q"] = max(16, raw["seqlen_q"] // 2 | 1)
        elif op.name == "attention_varlen" and max(raw["seqlens_q"]) > 16:
            raw["seqlens_q"] = [max(1, min(n, max(16, n // 2 | 1))) for n in raw["seqlens_q"]]
        elif raw.get("batch", 1) > floor_batch:
            raw["batch"] = floor_batch
        elif kind != "odd" and raw["heads_q"] > 1:
            raw["heads_q"] = raw["heads_q"] // raw["heads_kv"] if raw["heads_kv"] > 1 else 1
            raw["heads_kv"] = 1
        elif kind == "odd" and raw["heads_kv"] > 2:
            raw["heads_q"] = raw["heads_q"] // raw["heads_kv"] * 2
            raw["heads_kv"] = 2
        elif op.name == "attention" and raw["seqlen_q"] > 1:
            raw["seqlen_q"] = max(1, raw["seqlen_q"] // 2 | 1)
        elif op.name == "attention_varlen" and max(raw["seqlens_q"]) > 1:
            raw["seqlens_q"] = [max(1, n // 2 | 1) for n in raw["seqlens_q"]]
        else:
            return raw
    return raw


def held_out_cases(op, cases: Sequence[Case], secret: bytes, n: int = HELD_OUT_CASES, backend=None,
                   suite_data: Mapping[str, Any] | None = None) -> list[Case]:
    """``n`` held-out cases for ``cases`` (a suite's), drawn from ``secret`` over :func:`domain`; shape ``i``'s
    lengths are of kind ``LENGTH_KINDS[i % 3]`` (so three of them hold a multiple of 16 that is not a power of
    two, an odd length and one longer than the suite's longest). Each one the op accepts (a draw it refuses is
    drawn again) and off the suite's grid."""
    if n <= 0 or not cases:
        return []
    rng = _rng(secret, op.name)
    dom = domain(op, cases, backend, suite_data)
    order = [cases[int(i)] for i in rng.permutation(len(cases))]
    out: list[Case] = []
    seen: set[str] = set(c.id for c in cases)
    for i in range(n * 8):
        if len(out) == n:
            break
        kind = LENGTH_KINDS[len(out) % len(LENGTH_KINDS)]
        try:
            case = op.make_case(_capped(op, _draw(op, order[i % len(order)], dom, kind, rng), dom, kind))
        except CaseError:
            continue
        if case.id not in seen:
            seen.add(case.id)
            out.append(case)
    return out


def check_held_out(pm, backends: Iterable[Any], cases: Sequence[Case] | None = None, *, device: str,
                   suite=None, n: int | None = None, secret: bytes | None = None, allow_unsandboxed: bool = False,
                   check=None, integrity=None, case_timeout: float | None = None) -> dict[str, HeldOut]:
    """Each backend checked on ``n`` held-out cases near ``cases`` (the same cases for all of them), for
    correctness only, by one :class:`~kbench.fuzz.checker.Checker` (one worker per untrusted backend).

    ``secret``: the shapes' secret (default: a new one, never written anywhere); the inputs' secret is another,
    derived from it. ``check`` and ``integrity``: the suite's settings (its tolerances, its allowed calls), with
    one correctness trial per shape; ``suite`` (a :class:`kbench.api.Suite`) gives them, and the cases, itself.
    ``n``: default :data:`HELD_OUT_CASES`. A backend stops at its first failing case.
    """
    from kbench.fuzz.checker import CASE_TIMEOUT, Checker, infrastructure, is_bad

    n = held_out_default(n)
    if suite is not None:
        from kbench.run.runner import integrity_settings

        plan = suite.plan(device, pm.registry.op(suite.op))
        cases = plan.cases if cases is None else cases
        check = plan.check if check is None else check
        integrity = integrity_settings(suite) if integrity is None else integrity
    backends = list(backends)
    if n <= 0:   # switched off: a verdict of no shapes per backend (a caller that looks one up finds it)
        return {b.name: HeldOut(b.name) for b in backends}
    if not backends or not cases:
        return {}
    secret = secret if secret is not None else secrets.token_bytes(32)
    op = pm.registry.op(cases[0].op)
    suite_data = getattr(suite, "data", None)
    inputs = hmac.new(secret, b"kbench held-out inputs", hashlib.sha256).digest()
    from dataclasses import replace

    from kbench.suite import CheckSettings

    check = replace(check or CheckSettings(), seeds=1)   # one trial per shape: a shape's bug shows on any input
    out: dict[str, HeldOut] = {}
    with Checker(pm, op.name, device, secret=inputs, check=check, integrity=integrity,
                 allow_unsandboxed=allow_unsandboxed, case_timeout=case_timeout or CASE_TIMEOUT) as checker:
        for backend in backends:
            chosen = held_out_cases(op, cases, secret, n, backend=backend, suite_data=suite_data)
            verdict = HeldOut(backend.name, cases=[c.id for c in chosen])
            start = time.perf_counter()
            for case in chosen:
                record = checker.check(backend, case)
                verdict.checked += 1
                broken = infrastructure(record)
                if broken:
                    verdict.infrastructure = broken
                    break
                if is_bad(record) or record.get("status") == "skipped":
                    c = record.get("correctness") or {}
                    verdict.failure = (case.id, str(record["status"]), str(record.get("reason") or ""),
                                       c.get("rel_l2"), c.get("bound"))
                    break
            verdict.seconds = time.perf_counter() - start
            out[backend.name] = verdict
    return out
