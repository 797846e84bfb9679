"""``-k EXPR``: pytest-style keyword expressions over a record's backend name and case id."""
from __future__ import annotations

import re

from kbench.errors import BadInput

_TOKEN = re.compile(r"\(|\)|[^\s()]+")
_OPS = {"and", "or", "not"}


class Keyword:
    """``-k "d=128 and not causal"``: each word is a case-insensitive substring test."""

    def __init__(self, expr: str | None) -> None:
        self.expr = (expr or "").strip()
        self.words: list[str] = []
        parts: list[str] = []
        for tok in _TOKEN.findall(self.expr):
            if tok in _OPS or tok in "()":
                parts.append(tok)
            else:
                parts.append(f"_w[{len(self.words)}]")
                self.words.append(tok.lower())
        self.code = " ".join(parts)
        if self.expr:
            try:
                compile(self.code, "<-k>", "eval")
                self._eval([False] * len(self.words))
            except SyntaxError:
                raise BadInput(f"cannot parse -k expression {self.expr!r}", where="-k",
                               fix='use words joined by and/or/not with parentheses, e.g. -k "d=128 and not causal"'
                               ) from None

    def _eval(self, flags: list[bool]) -> bool:
        return bool(eval(self.code, {"__builtins__": {}}, {"_w": flags}))  # noqa: S307 - only our tokens

    def matches(self, *names: str) -> bool:
        if not self.expr:
            return True
        text = " ".join(names).lower()
        # "causal" must not match inside "noncausal": test whole comma/bracket-separated fields first
        fields = set(re.split(r"[\s\[\],]+", text))
        return self._eval([w in fields or (w not in _FIELD_WORDS and w in text) for w in self.words])


#: words that are whole fields of case ids and would otherwise match inside longer words
_FIELD_WORDS = {"causal"}
