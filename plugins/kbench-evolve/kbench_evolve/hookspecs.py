"""Hooks of the kbench-evolve plugin (added to kbench's pluggy manager by this plugin).

Implement them with ``@kbench.hookimpl`` in any kbench plugin (entry point group ``kbench``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from kbench_evolve.operators import OperatorRegistry

hookspec = pluggy.HookspecMarker("kbench")


# ---------------------------------------------------------------------------------------------
# Variation operators: called when `kbench evolve` first needs the list of operators.
# ---------------------------------------------------------------------------------------------

@hookspec
def kbench_evolve_register_operators(registry: OperatorRegistry) -> None:
    """Register variation operators with ``registry.add(OperatorClass)``.

    An operator class has a unique ``name``, a one-line ``description`` and a method
    ``vary(ctx: kbench_evolve.engine.VariationContext) -> str`` that proposes candidates through
    ``ctx.submit(source, rationale=...)`` until one is committed or its step budget runs out, and
    returns a one-line summary. Duplicate names are refused naming both plugins.
    """
