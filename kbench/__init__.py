"""kbench: a plugin-based benchmarking harness for attention kernels."""
from __future__ import annotations

import pluggy

__version__ = "0.1.0"

#: Marker for hook implementations in plugins: ``@kbench.hookimpl``.
hookimpl = pluggy.HookimplMarker("kbench")

__all__ = ["hookimpl", "__version__"]
