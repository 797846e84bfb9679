"""kbench: a plugin-based benchmarking harness for attention kernels.

The stable surface for plugin authors is :mod:`kbench.api`; every name there is also an attribute
of ``kbench`` itself (``kbench.Backend``, ``from kbench import Tunable``), resolved on first use so
that ``import kbench`` stays light.
"""
from __future__ import annotations

import importlib
from typing import Any

import pluggy

__version__ = "0.1.0"

#: Marker for hook implementations in plugins: ``@kbench.hookimpl``.
hookimpl = pluggy.HookimplMarker("kbench")


def __getattr__(name: str) -> Any:
    # the names of kbench.api, re-exported lazily (kbench.api imports its modules on first use);
    # import_module, not `from kbench import api`, which would ask this function for "api" again
    if name.startswith("__"):
        raise AttributeError(name)
    api = importlib.import_module("kbench.api")
    if name == "api":
        return api
    if name in api.SURFACE:
        return getattr(api, name)
    raise AttributeError(f"module 'kbench' has no attribute {name!r}")


def __dir__() -> list[str]:
    api = importlib.import_module("kbench.api")
    return sorted(set(globals()) | set(api.__all__))


__all__ = ["hookimpl", "__version__", "api"]
