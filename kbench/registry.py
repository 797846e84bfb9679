"""The registry handed to registration hooks: ops, devices, backends, substrates, hardware profiles, executors."""
from __future__ import annotations

import difflib
import fnmatch
import importlib
import inspect
import re
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable

from kbench.errors import BadInput, PluginError
from kbench.selection import BackendPattern

if TYPE_CHECKING:
    from kbench.backends import Backend
    from kbench.devices import Device
    from kbench.run.interface import ExecutorFactory
    from kbench.hardware import HardwareProfile
    from kbench.kernelfile import Substrate
    from kbench.ops import Op

#: what plugins register, each with its ``add_<kind>`` method and its table (``registry.<kind>s``,
#: ``registry.hardware``); ``owner(kind, name)`` says which plugin registered a name
KINDS = ("op", "device", "backend", "substrate", "hardware", "executor")

#: what a hardware profile describes (``HardwareProfile.kind``)
HARDWARE_KINDS = ("gpu", "cpu", "accelerator")

#: device names are lowercase words (``cpu``, ``cuda``): ``"CPU"`` is a typo, not a new device
_DEVICE_NAME = re.compile(r"^[a-z][a-z0-9_.-]*$")


class RegistrationWarning(UserWarning):
    """Something a plugin registered that is allowed but probably not what its author meant."""


@dataclass
class Registry:
    """Everything plugins registered, each entry remembering which plugin registered it."""

    ops: dict[str, Op] = field(default_factory=dict)
    devices: dict[str, Device] = field(default_factory=dict)
    backends: dict[str, Backend] = field(default_factory=dict)
    substrates: dict[str, Substrate] = field(default_factory=dict)
    hardware: dict[str, HardwareProfile] = field(default_factory=dict)
    executors: dict[str, ExecutorFactory] = field(default_factory=dict)
    owners: dict[tuple[str, str], str] = field(default_factory=dict)
    #: set by the plugin manager while a plugin's registration hook runs
    current_plugin: str = "<unknown>"
    #: the plugin manager, for hooks called later (detection); set by kbench.plugins
    manager: Any = None

    def _add(self, kind: str, table: dict, name: str, obj: Any) -> None:
        if not isinstance(name, str) or not name:
            raise PluginError(f"plugin {self.current_plugin!r} registered a {kind} without a name",
                              fix=f"give the {kind} a non-empty string `name`")
        if name in table:
            first = self.owners[(kind, name)]
            raise PluginError(
                f"duplicate {kind} name {name!r}: registered by plugin {first!r} and again by plugin "
                f"{self.current_plugin!r}",
                fix=f"rename one of them, or disable one plugin with KBENCH_DISABLE_PLUGINS={self.current_plugin}")
        table[name] = obj
        self.owners[(kind, name)] = self.current_plugin

    def _require(self, kind: str, obj: Any, module: str, cls: str) -> None:
        base = getattr(importlib.import_module(module), cls)
        if not isinstance(obj, base):
            raise PluginError(f"plugin {self.current_plugin!r} passed a {type(obj).__name__} to add_{kind}",
                              fix=f"register an instance of a subclass of kbench.api.{cls}")

    def add_op(self, op: Op) -> None:
        self._require("op", op, "kbench.ops", "Op")
        self._add("op", self.ops, op.name, op)

    def add_device(self, device: Device) -> None:
        self._require("device", device, "kbench.devices", "Device")
        if isinstance(device.name, str) and not _DEVICE_NAME.match(device.name):
            raise PluginError(f"plugin {self.current_plugin!r} registered a device named {device.name!r}",
                              fix="device names are lowercase words such as cpu, cuda, rocm")
        self._add("device", self.devices, device.name, device)

    def add_backend(self, backend: Backend) -> None:
        """Register a backend; its ``op`` must be registered and its ``device`` a lowercase name.

        Ops and devices register before backends (hook order), so an unknown op here is a typo.
        An unknown but well-formed device warns instead: its plugin may simply not be installed
        (kbench-torch's CUDA backends without kbench-cuda), and such records are skipped.
        """
        from kbench.backends import Backend

        if not isinstance(backend, Backend):
            raise PluginError(f"plugin {self.current_plugin!r} passed {type(backend).__name__} to add_backend",
                              fix="register an instance of a subclass of kbench.api.Backend")
        self._check_backend(backend)
        self._add("backend", self.backends, backend.name, backend)
        backend.registered_by = self.current_plugin

    def _check_backend(self, backend: Backend) -> None:
        who = f"plugin {self.current_plugin!r}, backend {backend.name!r}"
        if not isinstance(backend.name, str) or not backend.name or "[" in backend.name:
            raise PluginError(f"plugin {self.current_plugin!r} registered a backend named {backend.name!r}",
                              fix="give the backend a non-empty string `name` without brackets "
                                  "(brackets are for settings: name[key=value])")
        if backend.op not in self.ops:
            raise PluginError(f"{who}: unknown op {backend.op!r}{_did_you_mean(backend.op, self.ops)}",
                              fix=f"set `op` to one of: {', '.join(sorted(self.ops))}")
        if backend.device not in self.devices:
            known = ", ".join(sorted(self.devices))
            if not isinstance(backend.device, str) or not _DEVICE_NAME.match(backend.device):
                raise PluginError(f"{who}: device {backend.device!r} is not a device name"
                                  f"{_did_you_mean(str(backend.device).lower(), self.devices)}",
                                  fix=f"device names are lowercase; known devices: {known}")
            warnings.warn(f"{who}: device {backend.device!r} is not registered by any plugin (known: {known}); "
                          "its records will be skipped until a plugin provides that device",
                          RegistrationWarning, stacklevel=3)
        for method in ("available", "supports"):
            returns = inspect.signature(getattr(type(backend), method)).return_annotation
            if returns in (bool, "bool"):
                raise PluginError(f"{who}: {method}() is declared to return bool",
                                  fix=f"{method}() returns None for yes and a reason string for no")

    def add_substrate(self, substrate: Substrate) -> None:
        self._add("substrate", self.substrates, substrate.name, substrate)

    def add_hardware(self, profile: HardwareProfile) -> None:
        """Register a hardware profile: ``kind`` one of HARDWARE_KINDS, rates keyed by the dtype names
        of ``kbench.hardware.DTYPES``, in FLOP/s and B/s (not the TFLOP/s of the YAML files)."""
        from kbench.hardware import DTYPES

        self._require("hardware", profile, "kbench.hardware", "HardwareProfile")
        who = f"plugin {self.current_plugin!r}, hardware profile {profile.name!r}"
        if profile.kind not in HARDWARE_KINDS:
            raise PluginError(f"{who}: kind {profile.kind!r} is not one of {', '.join(HARDWARE_KINDS)}",
                              fix=f"set kind to one of: {', '.join(HARDWARE_KINDS)}")
        unknown = sorted(set(profile.peak_flops) - set(DTYPES))
        if unknown:
            raise PluginError(f"{who}: peak_flops has unknown dtype(s) {', '.join(unknown)}",
                              fix=f"key the rates by: {', '.join(DTYPES)}")
        for figure, value in (("bandwidth", profile.bandwidth), *profile.peak_flops.items()):
            if value is not None and (not isinstance(value, (int, float)) or value <= 0):
                raise PluginError(f"{who}: {figure} is {value!r}", fix="give a positive number (FLOP/s, B/s) or None")
            if figure != "bandwidth" and value is not None and value < 1e9:
                raise PluginError(f"{who}: peak_flops[{figure!r}] = {value:g} FLOP/s looks like TFLOP/s",
                                  fix="HardwareProfile takes FLOP/s: multiply by 1e12 (or load a YAML file in "
                                      "the TFLOP/s units of kbench/data/hardware.yaml with load_profiles)")
        self._add("hardware", self.hardware, profile.name, profile)

    def add_executor(self, factory: ExecutorFactory) -> None:
        """Register an executor (where ``kbench run --executor NAME`` runs its jobs): a
        :class:`kbench.run.interface.ExecutorFactory` (``kbench.api.executor_kit.ExecutorFactory``) whose library
        is imported only by its ``create``."""
        self._require("executor", factory, "kbench.run.interface", "ExecutorFactory")
        self._add("executor", self.executors, factory.name, factory)

    def owner(self, kind: str, name: str) -> str:
        return self.owners.get((kind, name), "<unknown>")

    # -- lookups with messages that say what exists ------------------------------------------

    def op(self, name: str) -> Op:
        try:
            return self.ops[name]
        except KeyError:
            raise BadInput(f"unknown op {name!r}", fix=f"use one of: {', '.join(sorted(self.ops))}") from None

    def device(self, name: str) -> Device:
        try:
            return self.devices[name]
        except KeyError:
            raise BadInput(f"unknown device {name!r}",
                           fix=f"use one of: {', '.join(sorted(self.devices))} or auto") from None

    def executor(self, name: str) -> ExecutorFactory:
        try:
            return self.executors[name]
        except KeyError:
            raise BadInput(f"unknown executor {name!r}{_did_you_mean(name, self.executors)}", where="--executor",
                           fix=f"use one of: {', '.join(sorted(self.executors))} (the ray executor is the "
                               "kbench-ray plugin: pip install -e plugins/kbench-ray)") from None

    def resolve(self, name: str) -> Backend:
        """The backend called ``name``: a registered one, or ``base[key=value,...]`` configured.

        This is how a worker (or anything holding only a record's backend name) rebuilds a
        configured backend: ``resolve("numpy-flash[block_q=64]").name == "numpy-flash[block_q=64]"``.
        """
        if name in self.backends:
            return self.backends[name]
        pattern = BackendPattern.parse(name, where=None)
        if pattern.pattern not in self.backends:
            raise BadInput(f"unknown backend {pattern.pattern!r}{_did_you_mean(pattern.pattern, self.backends)}",
                           fix="load its plugin through an entry point, -p or KBENCH_PLUGINS; "
                               "`kbench list` shows the registered backends")
        return self.backends[pattern.pattern].configure(dict(pattern.settings))

    def select_backends(self, op: str, patterns: Iterable[str | BackendPattern]) -> list[Backend]:
        """Backends of ``op`` matching ``patterns`` (fnmatch over names; a leading ``!`` excludes).

        A pattern with settings (``numpy-flash[block_q=64]``) configures every backend it matches;
        several settings of one backend are separate backends. An exclusion without settings
        removes every setting of the backends it matches; with settings, those configured with them.
        """
        parsed = [p if isinstance(p, BackendPattern) else BackendPattern.parse(p) for p in patterns]
        mine = sorted((b for b in self.backends.values() if b.op == op), key=lambda b: b.name)
        include = [p for p in parsed if not p.exclude] or [BackendPattern("*")]
        chosen: dict[str, Backend] = {}
        for pattern in include:
            matched = [b for b in mine if fnmatch.fnmatchcase(b.name, pattern.pattern)]
            if pattern.settings and not matched:
                raise BadInput(f"no backend of op {op!r} matches {pattern.pattern!r}"
                               f"{_did_you_mean(pattern.pattern, [b.name for b in mine])}",
                               file=pattern.file, where=pattern.where,
                               fix=f"known backends: {', '.join(b.name for b in mine)}")
            if pattern.settings and any(c in pattern.pattern for c in "*?["):
                # a glob with settings configures the backends that declare those tunables
                keys = [k for k, _ in pattern.settings]
                matched = [b for b in matched if all(k in b.tunables for k in keys)]
                if not matched:
                    raise BadInput(f"no backend of op {op!r} matching {pattern.pattern!r} declares "
                                   f"{', '.join(keys)}", file=pattern.file, where=pattern.where,
                                   fix="check the tunable names with `kbench list` / docs/backends.md")
            for backend in matched:
                configured = backend.configure(dict(pattern.settings), file=pattern.file, where=pattern.where)
                chosen.setdefault(configured.name, configured)
        for pattern in (p for p in parsed if p.exclude):
            for name, backend in list(chosen.items()):
                base = backend.base_name or backend.name
                if fnmatch.fnmatchcase(base, pattern.pattern) and \
                        all(k in backend.configured and backend.configured[k] == v for k, v in pattern.settings):
                    del chosen[name]
        return sorted(chosen.values(), key=lambda b: b.base_name or b.name)  # stable: settings in given order


def _did_you_mean(name: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
