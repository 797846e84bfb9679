"""Held-out shapes: cases near a suite's that the kernel's author (an operator, an evolver) never sees.

A candidate tuned on a suite can be exact there and wrong anywhere else (a tail block dropped when the key
length is not a multiple of the tile, a causal mask aligned top-left, GQA heads mapped with the wrong index).
Everything that scores a kernel also checks it on :data:`HELD_OUT_CASES` shapes drawn from a secret of its own
near the suite's cases (:func:`held_out_cases`): each a suite case with its lengths moved to nearby values that
are neither powers of two nor multiples of 16, ``seqlen_q`` and ``seqlen_kv`` drawn apart, the key/value heads
regrouped (GQA where the query heads allow it) and the batch at most the suite's; dtype, head_dim, mask, mode,
window and softcap stay the suite case's, so the kernel is asked nothing its suite did not already ask of it.
Each is checked for correctness only (:class:`kbench.fuzz.checker.Checker`: the judge and sandbox of
``kbench run``, no timing, one worker for them all). The shapes are never written anywhere the operator reads:
a failure says what went wrong, not on which shape, unless ``show`` is set.
"""
from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

from kbench.ops import Case, CaseError

#: held-out shapes checked per evaluation by default (docs/fuzz.md, "Held-out shapes": what they cost)
HELD_OUT_CASES = 3


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


def _heads(hq: int, rng: np.random.Generator) -> int:
    """heads_kv for ``hq`` query heads: a real grouping (1 < heads_kv < heads_q) two times in three, else any
    divisor (MHA, MQA)."""
    divisors = [d for d in range(1, hq + 1) if hq % d == 0]
    grouped = [d for d in divisors if 1 < d < hq]
    if grouped and rng.random() < 2 / 3:
        return int(rng.choice(grouped))
    return int(rng.choice(divisors))


def _near(op, case: Case, rng: np.random.Generator) -> dict[str, Any]:
    """The raw parameters of a case near ``case`` (see the module's doc)."""
    p = dict(case.params)
    if op.name == "attention_varlen":
        q_lens, kv_lens = op.lengths(case)
        q = [near_length(n, rng) for n in q_lens]
        kv = [near_length(n, rng) for n in kv_lens]
        return {"seqlens_q": q, "seqlens_kv": kv, "heads_q": p["heads_q"], "heads_kv": _heads(p["heads_q"], rng),
                "head_dim": p["head_dim"], "causal": p["causal"], "dtype": p["dtype"]}
    p["batch"] = int(rng.integers(1, p["batch"] + 1))
    p["heads_kv"] = _heads(p["heads_q"], rng)
    if op.name == "decode_attention":
        p["seqlen_q"] = int(rng.integers(1, p["seqlen_q"] + 1))
        p["seqlen_kv"] = max(p["seqlen_q"], near_length(p["seqlen_kv"], rng))
        return p
    p["seqlen_q"] = near_length(p["seqlen_q"], rng)
    p["seqlen_kv"] = near_length(p["seqlen_kv"], rng)
    if p["seqlen_q"] == p["seqlen_kv"]:
        p["seqlen_kv"] = near_length(p["seqlen_kv"], rng)
    return p


def held_out_cases(op, cases: Sequence[Case], secret: bytes, n: int = HELD_OUT_CASES) -> list[Case]:
    """``n`` cases near ``cases`` (a suite's), drawn from ``secret``; each from another suite case where there
    are enough (shuffled), each one the op accepts (a perturbation it refuses is drawn again)."""
    if n <= 0 or not cases:
        return []
    rng = _rng(secret, op.name)
    order = [cases[int(i)] for i in rng.permutation(len(cases))]
    out: list[Case] = []
    seen: set[str] = set()
    for i in range(n * 8):
        if len(out) == n:
            break
        try:
            case = op.make_case(_near(op, order[i % len(order)], rng))
        except CaseError:
            continue
        if case.id not in seen and case.id not in {c.id for c in cases}:
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

    n = HELD_OUT_CASES if n is None else n
    if suite is not None:
        from kbench.run.runner import integrity_settings

        plan = suite.plan(device, pm.registry.op(suite.op))
        cases = plan.cases if cases is None else cases
        check = plan.check if check is None else check
        integrity = integrity_settings(suite) if integrity is None else integrity
    backends = list(backends)
    if not backends or not cases or n <= 0:
        return {}
    secret = secret if secret is not None else secrets.token_bytes(32)
    op = pm.registry.op(cases[0].op)
    chosen = held_out_cases(op, cases, secret, n)
    inputs = hmac.new(secret, b"kbench held-out inputs", hashlib.sha256).digest()
    from dataclasses import replace

    from kbench.suite import CheckSettings

    check = replace(check or CheckSettings(), seeds=1)   # one trial per shape: a shape's bug shows on any input
    out: dict[str, HeldOut] = {}
    with Checker(pm, op.name, device, secret=inputs, check=check, integrity=integrity,
                 allow_unsandboxed=allow_unsandboxed, case_timeout=case_timeout or CASE_TIMEOUT) as checker:
        for backend in backends:
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
