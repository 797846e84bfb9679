"""Variation operators: the registry handed to ``kbench_evolve_register_operators`` and the base class."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kbench.api import BadInput, PluginError

if TYPE_CHECKING:
    from kbench_evolve.engine import VariationContext


class Operator:
    """Base of variation operators. ``options`` come from the command line (``--model``, ...)."""

    name: str = ""
    description: str = ""
    #: True when the operator calls a language model (then --model / KBENCH_EVOLVE_MODEL is needed)
    uses_llm: bool = False

    def __init__(self, **options: Any) -> None:
        self.options = options

    def vary(self, ctx: VariationContext) -> str:  # pragma: no cover - abstract
        raise NotImplementedError


class OperatorRegistry:
    def __init__(self) -> None:
        self.operators: dict[str, type[Operator]] = {}
        self.owners: dict[str, str] = {}
        self.current_plugin = "<unknown>"

    def add(self, cls: type[Operator]) -> None:
        name = getattr(cls, "name", "")
        if not name:
            raise PluginError(f"plugin {self.current_plugin!r} registered an operator without a name",
                              fix="give the operator class a `name`")
        if name in self.operators:
            raise PluginError(f"duplicate evolve operator {name!r}: registered by plugin {self.owners[name]!r} "
                              f"and again by plugin {self.current_plugin!r}",
                              fix=f"rename one, or disable one plugin with KBENCH_DISABLE_PLUGINS={self.current_plugin}")
        self.operators[name] = cls
        self.owners[name] = self.current_plugin

    def get(self, name: str) -> type[Operator]:
        try:
            return self.operators[name]
        except KeyError:
            raise BadInput(f"unknown evolve operator {name!r}", where="--operator",
                           fix=f"use one of: {', '.join(sorted(self.operators))}") from None


def operator_registry(pm) -> OperatorRegistry:
    """Add this plugin's hookspecs to kbench's manager (once) and collect every plugin's operators."""
    from kbench_evolve import hookspecs

    if not hasattr(pm.pm.hook, "kbench_evolve_register_operators"):
        pm.pm.add_hookspecs(hookspecs)
    cached = getattr(pm, "_kbench_evolve_operators", None)
    if cached is not None:
        return cached
    registry = OperatorRegistry()
    caller = pm.pm.hook.kbench_evolve_register_operators
    for impl in caller.get_hookimpls():  # registration order (pluggy calls them in reverse)
        registry.current_plugin = impl.plugin_name
        impl.function(**{k: v for k, v in {"registry": registry}.items() if k in impl.argnames})
    pm._kbench_evolve_operators = registry
    return registry
