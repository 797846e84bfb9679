"""The plugin module named by the entry point: it registers one backend through a kbench hook."""
from __future__ import annotations

import kbench
from kbench_example.backend import EinsumAttention


@kbench.hookimpl
def kbench_register_backends(registry):
    registry.add_backend(EinsumAttention())
