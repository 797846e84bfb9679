"""The registry handed to registration hooks: ops, devices, backends, substrates, hardware profiles."""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kbench.errors import BadInput, PluginError

if TYPE_CHECKING:
    from kbench.backends import Backend
    from kbench.devices import Device
    from kbench.hardware import HardwareProfile
    from kbench.kernelfile import Substrate
    from kbench.ops import Op

KINDS = ("op", "device", "backend", "substrate", "hardware")


@dataclass
class Registry:
    """Everything plugins registered, each entry remembering which plugin registered it."""

    ops: dict[str, Op] = field(default_factory=dict)
    devices: dict[str, Device] = field(default_factory=dict)
    backends: dict[str, Backend] = field(default_factory=dict)
    substrates: dict[str, Substrate] = field(default_factory=dict)
    hardware: dict[str, HardwareProfile] = field(default_factory=dict)
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

    def add_op(self, op: Op) -> None:
        self._add("op", self.ops, op.name, op)

    def add_device(self, device: Device) -> None:
        self._add("device", self.devices, device.name, device)

    def add_backend(self, backend: Backend) -> None:
        self._add("backend", self.backends, backend.name, backend)

    def add_substrate(self, substrate: Substrate) -> None:
        self._add("substrate", self.substrates, substrate.name, substrate)

    def add_hardware(self, profile: HardwareProfile) -> None:
        self._add("hardware", self.hardware, profile.name, profile)

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

    def select_backends(self, op: str, patterns: list[str]) -> list[Backend]:
        """Backends of ``op`` matching the fnmatch ``patterns``; a leading ``!`` excludes."""
        mine = [b for b in self.backends.values() if b.op == op]
        include = [p for p in patterns if not p.startswith("!")] or ["*"]
        exclude = [p[1:] for p in patterns if p.startswith("!")]
        chosen = [b for b in mine
                  if any(fnmatch.fnmatchcase(b.name, p) for p in include)
                  and not any(fnmatch.fnmatchcase(b.name, p) for p in exclude)]
        return sorted(chosen, key=lambda b: b.name)
