"""Backends: one implementation of one op on one device. A backend never times itself."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from kbench.ops import Case

#: What ``Backend.prepare`` returns: called as ``fn(**inputs, out=out)``; it either writes the
#: result into ``out`` (a poisoned buffer of the output's shape and dtype) and returns None, or
#: returns a fresh array holding the result.
Kernel = Callable[..., Any]


@dataclass(frozen=True)
class Tunable:
    """A knob of a kernel that does not change its result (block size, warps, stages)."""

    default: Any
    choices: tuple = ()
    help: str = ""


class Backend(ABC):
    """Base of every backend.

    ``available()`` and ``supports(case)`` return ``None`` for yes and a reason string for no;
    they must not raise (a raise is recorded as an error). ``prepare(case)`` does everything that
    should stay out of the timing (compilation, handles, plans) and returns the kernel to time.
    """

    name: str = ""
    op: str = "attention"
    device: str = "cpu"
    description: str = ""
    #: untrusted backends (evolved or third-party kernels) run only in isolated workers
    trusted: bool = True
    tunables: Mapping[str, Tunable] = {}
    #: source file of the kernel, when there is one (for static integrity checks and lineage)
    source_path: str | None = None

    def available(self) -> str | None:
        return None

    def supports(self, case: Case) -> str | None:
        return None

    @abstractmethod
    def prepare(self, case: Case) -> Kernel:
        """Return the callable to check and time for ``case``."""

    def info(self) -> dict[str, Any]:
        """Versions and settings recorded with each of this backend's records."""
        return {}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} ({self.op} on {self.device})>"
