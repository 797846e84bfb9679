"""What a worker's reply must hold: checked field by field before the judge uses any of it.

A reply is data from the process that runs candidate code. The judge reads nothing from it that this
module has not checked: kinds, field types, lengths and ranges. Anything else is a
:class:`kbench.protocol.ProtocolError`, which fails the record (never the run).
"""
from __future__ import annotations

import math
from typing import Any, Mapping

from kbench.protocol import ProtocolError


class KernelError(Exception):
    """The kernel (or its backend) raised in the worker: the record's status becomes ``error``."""

    def __init__(self, reply: Mapping[str, Any]) -> None:
        super().__init__(str(reply.get("reason", "error")))
        self.reply = reply


def expect(answer: Any, kind: str) -> dict[str, Any]:
    """The payload of a reply of ``kind``; an ``error`` reply raises :class:`KernelError`."""
    if not (isinstance(answer, tuple) and len(answer) == 2 and isinstance(answer[1], dict)):
        raise ProtocolError(f"the worker sent a malformed reply ({type(answer).__name__}) where {kind!r} was "
                            f"expected: forged or corrupted by the kernel")
    got, payload = answer
    if got == "error":
        error = {"reason": _text(payload.get("reason"), "error")}
        for flag in ("unsupported", "memory"):
            if payload.get(flag) is True:
                error[flag] = True
        if isinstance(payload.get("traceback"), str):
            error["traceback"] = payload["traceback"]
        if _is_list_of(payload.get("audit"), str):
            error["audit"] = payload["audit"]
        raise KernelError(error)
    if got != kind:
        raise ProtocolError(f"the worker sent {str(got)[:40]!r} where {kind!r} was expected (a forged message? "
                            f"records are made by the judge, never by the worker)")
    return payload


def _text(value: Any, default: str | None = None) -> str | None:
    return value if isinstance(value, str) else default


def _is_list_of(value: Any, kind: type) -> bool:
    return isinstance(value, list) and all(isinstance(v, kind) and not isinstance(v, bool) for v in value)


def fault(payload: Mapping[str, Any]) -> str | None:
    """The fault a reply reports (a string or nothing), or the audit events refused during it."""
    value = payload.get("fault")
    if value is not None and not isinstance(value, str):
        raise ProtocolError("the worker's fault is not a string")
    audit = payload.get("audit")
    if audit is not None:
        if not _is_list_of(audit, str) or not audit:
            raise ProtocolError("the worker's audit events are malformed")
        count = payload.get("audit_count", len(audit))
        more = count - 1 if isinstance(count, int) and count > 1 else 0
        return audit[0] + (f" (and {more} more refused event{'s' * (more > 1)})" if more else "")
    return value


def samples(payload: Mapping[str, Any], calls: int, kind: str) -> list[float]:
    values = payload.get("samples")
    if not (isinstance(values, list) and len(values) == calls):
        raise ProtocolError(f"the worker's {kind} batch reply does not hold one sample per call")
    out = []
    for i, t in enumerate(values):
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ProtocolError(f"call {i + 1} of a {kind} batch has a malformed sample")
        out.append(float(t))
    return out


def window(payload: Mapping[str, Any], kind: str) -> tuple[int, int]:
    value = payload.get("window")
    if not (_is_list_of(value, int) and len(value) == 2):
        raise ProtocolError(f"the worker's {kind} batch reply has no clock window")
    return value[0], value[1]


def stamps(payload: Mapping[str, Any], calls: int, kind: str) -> list[tuple[int, int]] | None:
    value = payload.get("stamps")
    if value is None:
        return None
    if not (isinstance(value, list) and len(value) == calls and all(_is_list_of(s, int) and len(s) == 2 for s in value)):
        raise ProtocolError(f"the worker's {kind} batch reply has malformed stamps")
    return [(a, b) for a, b in value]


def nonfinite(payload: Mapping[str, Any], calls: int, outputs: int, kind: str) -> list[list[int]]:
    value = payload.get("nonfinite")
    if not (isinstance(value, list) and len(value) == calls):
        raise ProtocolError(f"the worker's {kind} batch reply does not count non-finite elements per call")
    for row in value:
        if not (_is_list_of(row, int) and len(row) in (0, outputs) and all(n >= 0 for n in row)):
            raise ProtocolError(f"the worker's {kind} batch reply has malformed non-finite counts")
    return value


def threads(payload: Mapping[str, Any]) -> tuple[int | None, int | None]:
    value = payload.get("threads")
    if _is_list_of(value, int) and len(value) == 2:
        return value[0], value[1]
    return None, None
