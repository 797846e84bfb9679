"""``Unsupported``: a library refused a case. The record is ``skipped`` with the library's own words.

A backend says what it cannot run in ``supports()`` when it can tell from the case alone. Some refusals
come only from the library, at plan time: cuDNN's ``check_support()``/``build_plans()`` find no engine
for a graph, FlashAttention's checks reject a head size or a GPU. A backend turns such a refusal into
``Unsupported`` (in ``prepare`` or in its first call), and the run records a skip with that message,
not an error: the case is outside what the library does, not a failure of the library or of kbench.

Raise it only for a refusal, never for a crash: an out-of-memory or a bug stays an ``error`` record.
"""
from __future__ import annotations


class Unsupported(Exception):
    """A library refused this case; ``str(exc)`` is the reason recorded with the skip."""

    def __init__(self, library: str, message: str) -> None:
        self.library = library
        self.message = " ".join(str(message).split()) or "no message"
        super().__init__(f"{library} does not support this case: {self.message}")

    def __reduce__(self):  # crosses the worker boundary (pickled) with both fields
        return (type(self), (self.library, self.message))
