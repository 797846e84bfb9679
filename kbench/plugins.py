"""Plugin discovery and the plugin manager.

Order: the core's default plugins, then entry points in group ``kbench`` (by entry-point name),
then modules named by ``-p MODULE`` or ``KBENCH_PLUGINS`` (comma separated). Registration hooks run
in that order, so a duplicate name is blamed on the later plugin. ``KBENCH_DISABLE_PLUGINS`` (comma
separated) blocks plugins by entry-point name or module name.

Mistakes that would otherwise pass in silence are reported: a plugin module without any
``@kbench.hookimpl`` (a :class:`PluginWarning`), and entry points in a group that looks like a typo
of ``kbench`` (a warning, and listed by :func:`plugin_report`).
"""
from __future__ import annotations

import difflib
import importlib
import inspect
import os
import re
import warnings
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
    "kbench.builtin.numpy_varlen",
    "kbench.builtin.hardware",
    "kbench.builtin.commands",
    "kbench.run.executors",
)

#: the default plugins a worker loads: what runs a kernel, never the run side's (commands, executors)
WORKER_DEFAULT_PLUGINS: tuple[str, ...] = tuple(m for m in DEFAULT_PLUGINS if m not in (
    "kbench.builtin.hardware", "kbench.builtin.commands", "kbench.run.executors"))

ENTRY_POINT_GROUP = "kbench"


class PluginWarning(UserWarning):
    """A plugin that loads but will not do what its author meant (no hooks, a mistyped group)."""

#: the registration hooks a worker calls (kbench.worker.main)
WORKER_HOOKS = ("kbench_register_ops", "kbench_register_devices", "kbench_register_kernel_substrates",
                "kbench_register_backends")

REGISTRATION_HOOKS = (
    "kbench_register_ops",
    "kbench_register_devices",
    "kbench_register_kernel_substrates",
    "kbench_register_backends",
    "kbench_register_hardware",
    "kbench_register_executors",
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
                 defaults: Iterable[str] = DEFAULT_PLUGINS, hooks: Iterable[str] = REGISTRATION_HOOKS) -> None:
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
        for hook in hooks:
            self.call_each(hook, registry=self.registry)
        if load_entry_points:
            for ep in misplaced_entry_points():
                warnings.warn(f"entry point {ep.name} = {ep.value} ({ep.where}) is in group {ep.group!r}, which "
                              f"kbench does not read: it is not loaded (the group is {ENTRY_POINT_GROUP!r})",
                              PluginWarning, stacklevel=2)

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
        if not self.pm.get_hookcallers(plugin):
            warnings.warn(no_hooks_message(name, module, plugin), PluginWarning, stacklevel=3)

    # -- calling -------------------------------------------------------------------------------

    def call_each(self, hook: str, **kwargs: Any) -> None:
        """Call every implementation of ``hook`` in registration order, noting which plugin runs.

        Registration goes through here, not through pluggy's caller, so that the registry can
        attribute every name to its plugin and the error for a duplicate names both.
        """
        caller = getattr(self.pm.hook, hook)
        for impl in registration_order(caller.get_hookimpls()):
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
        """What every plugin's ``kbench_environment`` adds; a hook that raises (or returns a non-dict) is
        recorded under ``plugin_errors`` with the plugin's name, and the run goes on without its part."""
        env: dict[str, Any] = {}
        errors: dict[str, str] = {}
        for impl in reversed(self.pm.hook.kbench_environment.get_hookimpls()):  # pluggy's call order
            try:
                part = impl.function()
            except Exception as exc:  # noqa: BLE001 - a plugin's bug must not end the run
                errors[impl.plugin_name] = f"kbench_environment raised {type(exc).__name__}: {exc}"
                continue
            if isinstance(part, dict):
                env.update(part)
            elif part is not None:
                errors[impl.plugin_name] = f"kbench_environment returned {type(part).__name__}, not a dict"
        if errors:
            env["plugin_errors"] = errors
        return env

    def detect_hardware(self, device):
        return self.pm.hook.kbench_detect_hardware(device=device, registry=self.registry)


def registration_order(impls: list) -> list:
    """Hook implementations in the documented order: registration order (first registered first),
    ``tryfirst`` ones before and ``trylast`` ones after.

    ``get_hookimpls()`` lists them as pluggy stores them: trylast, then the others, then tryfirst,
    each group in registration order (pluggy *calls* that list from the end, LIFO).
    """
    plain = [i for i in impls if not i.tryfirst and not i.trylast and not i.hookwrapper]
    return ([i for i in impls if i.tryfirst and not i.hookwrapper] + plain
            + [i for i in impls if i.trylast and not i.hookwrapper])


def no_hooks_message(name: str, module: str, plugin: Any) -> str:
    """What to say about a plugin module that implements no hook, naming the likely cause."""
    unmarked = sorted(n for n, fn in inspect.getmembers(plugin, callable) if n.startswith("kbench_"))
    if unmarked:
        return (f"plugin {name!r} ({module}) implements no kbench hook: {', '.join(unmarked)} "
                f"{'is' if len(unmarked) == 1 else 'are'} not decorated with @kbench.hookimpl, so kbench ignores "
                f"{'it' if len(unmarked) == 1 else 'them'}")
    return (f"plugin {name!r} ({module}) implements no kbench hook: it registers nothing (does the entry point "
            f"name the module holding the @kbench.hookimpl functions, e.g. your_package.plugin?)")


@dataclass(frozen=True)
class FoundEntryPoint:
    group: str
    name: str
    value: str
    where: str       # "distribution NAME VERSION"


def _normalised(group: str) -> str:
    return re.sub(r"[\s_.\-]+", "", group.lower())


def looks_like_kbench_group(group: str) -> bool:
    """``kbench.plugins``, ``kbench-plugins``, ``Kbench``, ``kbnech``: a typo of the group ``kbench``.

    A plugin's own sub-groups (``kbench_evolve.operators``) are not: they name more than a plugin list.
    """
    if group == ENTRY_POINT_GROUP:
        return False
    norm = _normalised(group)
    if norm in ("kbench", "kbenchplugin", "kbenchplugins", "kbenchbackends", "kbenchbackend"):
        return True
    return difflib.SequenceMatcher(None, group.lower(), ENTRY_POINT_GROUP).ratio() >= 0.8


def misplaced_entry_points() -> list[FoundEntryPoint]:
    """Entry points of every installed distribution whose group looks like a typo of ``kbench``."""
    found = set()
    for dist in metadata.distributions():
        for ep in dist.entry_points:
            if looks_like_kbench_group(ep.group):
                found.add(FoundEntryPoint(ep.group, ep.name, ep.value, f"distribution {dist.name} {dist.version}"))
    return sorted(found, key=lambda e: (e.group, e.name, e.where))


def plugin_report(pm: PluginManager) -> dict[str, Any]:
    """What was found where, for ``kbench list --plugins``.

    ``plugins``: each loaded plugin in registration order with where it came from, the hooks it
    implements and what it registered; ``misplaced``: entry points in a group that looks like a typo
    of ``kbench`` (not loaded); ``disabled``: the names in ``KBENCH_DISABLE_PLUGINS``.
    """
    plugins = []
    for info in pm.infos:
        plugin = pm.pm.get_plugin(info.name)
        hooks = sorted({caller.name for caller in pm.pm.get_hookcallers(plugin) or []})
        registered = {kind: sorted(name for (k, name), owner in pm.registry.owners.items()
                                   if k == kind and owner == info.name)
                      for kind in ("op", "device", "substrate", "backend", "hardware", "executor")}
        plugins.append({"name": info.name, "module": info.module, "source": info.source, "hooks": hooks,
                        "registered": {k: v for k, v in registered.items() if v}})
    return {"group": ENTRY_POINT_GROUP, "plugins": plugins,
            "misplaced": [vars(ep) for ep in misplaced_entry_points()], "disabled": sorted(pm.disabled)}


def show_plugin_warnings_plainly() -> None:
    """Print kbench's plugin and registration warnings as ``kbench: warning: ...`` (no source line).

    Python's default format shows the ``warnings.warn`` line of kbench's own code, which says nothing
    to a plugin author; other warnings keep the default format. The CLI calls this once at start.
    """
    from kbench.registry import RegistrationWarning

    default = warnings.showwarning
    if getattr(default, "_kbench_plain", False):
        return

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, (PluginWarning, RegistrationWarning)):
            import sys

            print(f"kbench: warning: {message}", file=file or sys.stderr)
            return
        default(message, category, filename, lineno, file, line)
    show._kbench_plain = True  # type: ignore[attr-defined]
    warnings.showwarning = show


def format_plugin_report(report: dict[str, Any], fmt: str = "table") -> str:
    """:func:`plugin_report` as ``kbench list --plugins`` prints it (``fmt``: table, markdown or json)."""
    if fmt == "json":
        import json

        return json.dumps(report, indent=1)
    from kbench.tables import render

    rows = [(p["name"], p["module"], p["source"], ", ".join(p["hooks"]) or "(none)",
             "; ".join(f"{kind}: {', '.join(names)}" for kind, names in p["registered"].items()))
            for p in report["plugins"]]
    lines = [render(("plugin", "module", "found in", "hooks", "registered"), rows, fmt)]
    for ep in report["misplaced"]:
        lines.append(f"NOT LOADED: entry point {ep['name']} = {ep['value']} ({ep['where']}) is in group "
                     f"{ep['group']!r}; kbench reads group {report['group']!r}")
    if report["disabled"]:
        lines.append(f"disabled by KBENCH_DISABLE_PLUGINS: {', '.join(report['disabled'])}")
    return "\n".join(lines)


_cached: dict[tuple, PluginManager] = {}


def get_plugin_manager(extra: Iterable[str] = (), *, fresh: bool = False, worker: bool = False) -> PluginManager:
    """The process-wide plugin manager for this set of extra plugins and environment.

    ``worker``: only what a worker runs (ops, devices, substrates, backends): no hardware profiles, no
    executors, so a worker never imports the run side (kbench.run).
    """
    key = (tuple(extra), os.environ.get("KBENCH_PLUGINS", ""), os.environ.get("KBENCH_DISABLE_PLUGINS", ""), worker)
    if fresh or key not in _cached:
        _cached[key] = (PluginManager(extra, hooks=WORKER_HOOKS, defaults=WORKER_DEFAULT_PLUGINS) if worker
                        else PluginManager(extra))
    return _cached[key]
