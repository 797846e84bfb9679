"""Plugin discovery and the plugin manager.

Order: the core's default plugins, then entry points in group ``kbench``, then modules named by
``-p MODULE`` or ``KBENCH_PLUGINS`` (comma separated). ``KBENCH_DISABLE_PLUGINS`` (comma separated)
blocks plugins by entry-point name or module name.
"""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Iterable

import pluggy

from kbench import hookspecs
from kbench.errors import PluginError
from kbench.registry import Registry

#: Built-in plugins, registered through the same hooks as any third-party plugin.
DEFAULT_PLUGINS: tuple[str, ...] = (
    "kbench.builtin.ops",
    "kbench.builtin.cpu",
    "kbench.builtin.numpy_backends",
    "kbench.builtin.numpy_decode",
    "kbench.builtin.hardware",
    "kbench.builtin.commands",
)

ENTRY_POINT_GROUP = "kbench"

REGISTRATION_HOOKS = (
    "kbench_register_ops",
    "kbench_register_devices",
    "kbench_register_kernel_substrates",
    "kbench_register_backends",
    "kbench_register_hardware",
)


@dataclass(frozen=True)
class PluginInfo:
    name: str        # registered name (entry-point name or module name)
    module: str      # module path
    source: str      # "default", "entry point <dist>", "-p", "KBENCH_PLUGINS"


def _split_env(var: str) -> list[str]:
    return [p.strip() for p in os.environ.get(var, "").split(",") if p.strip()]


class PluginManager:
    """A pluggy manager plus the registry built from the registration hooks."""

    def __init__(self, extra: Iterable[str] = (), *, load_entry_points: bool = True,
                 defaults: Iterable[str] = DEFAULT_PLUGINS) -> None:
        self.pm = pluggy.PluginManager("kbench")
        self.pm.add_hookspecs(hookspecs)
        self.infos: list[PluginInfo] = []
        self.disabled = set(_split_env("KBENCH_DISABLE_PLUGINS"))
        for mod in defaults:
            self._register_module(mod, mod, "default")
        if load_entry_points:
            for ep in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
                dist = getattr(ep, "dist", None)
                where = f"entry point of {dist.name}" if dist is not None else "entry point"
                self._register(ep.name, ep.value, where, ep.load)
        for mod in list(extra) + _split_env("KBENCH_PLUGINS"):
            self._register_module(mod, mod, "-p/KBENCH_PLUGINS")
        self.pm.hook.kbench_add_hookspecs.call_historic(kwargs={"pluginmanager": self.pm})
        try:
            self.pm.check_pending()
        except pluggy.PluginValidationError as exc:
            name = self.pm.get_name(exc.plugin) or repr(exc.plugin)
            raise PluginError(f"plugin {name!r} implements a hook that kbench does not define: {exc}",
                              fix="check the hook name against kbench.hookspecs (e.g. kbench_register_backends); a plugin "
                                  "that defines hooks of its own adds their specs in kbench_add_hookspecs(pluginmanager)"
                              ) from exc
        self.registry = Registry(manager=self)
        for hook in REGISTRATION_HOOKS:
            self.call_each(hook, registry=self.registry)

    # -- loading -------------------------------------------------------------------------------

    def _register_module(self, name: str, module: str, source: str) -> None:
        self._register(name, module, source, lambda: importlib.import_module(module))

    def _register(self, name: str, module: str, source: str, load) -> None:
        if name in self.disabled or module in self.disabled:
            return
        if self.pm.has_plugin(name):
            return  # the same module named twice (e.g. -p and KBENCH_PLUGINS) is registered once
        try:
            plugin = load()
        except Exception as exc:  # noqa: BLE001 - any import failure is reported, naming the plugin
            raise PluginError(
                f"plugin {name!r} ({module}, from {source}) failed to import: {type(exc).__name__}: {exc}",
                fix=f"fix or uninstall the plugin, or skip it with KBENCH_DISABLE_PLUGINS={name}") from exc
        if self.pm.is_registered(plugin):
            return
        try:
            self.pm.register(plugin, name=name)
        except pluggy.PluginValidationError as exc:
            raise PluginError(f"plugin {name!r} ({module}) does not match the kbench hook specs: {exc}",
                              fix="compare its hook names and arguments with kbench.hookspecs") from exc
        self.infos.append(PluginInfo(name, module, source))

    # -- calling -------------------------------------------------------------------------------

    def call_each(self, hook: str, **kwargs: Any) -> None:
        """Call every implementation of ``hook`` in registration order, noting which plugin runs.

        Registration goes through here, not through pluggy's caller, so that the registry can
        attribute every name to its plugin and the error for a duplicate names both.
        """
        caller = getattr(self.pm.hook, hook)
        for impl in reversed(caller.get_hookimpls()):  # pluggy keeps LIFO order; we want FIFO
            self.registry.current_plugin = impl.plugin_name
            args = {k: v for k, v in kwargs.items() if k in impl.argnames}
            try:
                impl.function(**args)
            except PluginError:
                raise
            except Exception as exc:  # noqa: BLE001
                raise PluginError(f"plugin {impl.plugin_name!r} raised in {hook}: {type(exc).__name__}: {exc}",
                                  fix=f"fix the plugin or skip it with KBENCH_DISABLE_PLUGINS={impl.plugin_name}"
                                  ) from exc
        self.registry.current_plugin = "<unknown>"

    @property
    def hook(self):
        return self.pm.hook

    def environment(self) -> dict[str, Any]:
        env: dict[str, Any] = {}
        for part in self.pm.hook.kbench_environment():
            if isinstance(part, dict):
                env.update(part)
        return env

    def detect_hardware(self, device):
        return self.pm.hook.kbench_detect_hardware(device=device, registry=self.registry)


_cached: dict[tuple, PluginManager] = {}


def get_plugin_manager(extra: Iterable[str] = (), *, fresh: bool = False) -> PluginManager:
    """The process-wide plugin manager for this set of extra plugins and environment."""
    key = (tuple(extra), os.environ.get("KBENCH_PLUGINS", ""), os.environ.get("KBENCH_DISABLE_PLUGINS", ""))
    if fresh or key not in _cached:
        _cached[key] = PluginManager(extra)
    return _cached[key]
