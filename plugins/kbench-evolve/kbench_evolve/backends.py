"""Evolved kernels as backends: ``evolved:<name>`` (the champion) and ``evolved:<name>@vN``.

Registered by scanning the workspace (``KBENCH_EVOLVE_DIR`` or ``./evolve``). Nothing of the
candidate is executed at registration: op, substrate and tunables are read from the source with
``ast``, and the module is loaded only when the backend is prepared for a case. Evolved kernels
are untrusted (``trusted = False``): the core runner isolates them like any kernel file.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from kbench.backends import Backend, Tunable
from kbench.errors import KbenchError

from kbench_evolve import source as src
from kbench_evolve.store import Lineage, Version, list_lineages, workspace_root


class EvolvedBackend(Backend):
    trusted = False

    def __init__(self, name: str, version: Version, registry) -> None:
        self.name = name
        self.version = version
        self.source_path = str(version.kernel_path)
        self._registry = registry
        self._inner = None
        self._load_error: str | None = None
        try:
            text = version.source
            glob = src.module_globals(text)
        except (OSError, SyntaxError) as exc:
            text, glob = "", {}
            self._load_error = f"cannot read {self.source_path}: {exc}"
        self.op = glob.get("OP", "attention")
        self.substrate_name = glob.get("SUBSTRATE", "numpy")
        sub = registry.substrates.get(self.substrate_name)
        self.device = sub.device if sub is not None else "cpu"
        self.tunables = {k: Tunable(v.get("default"), tuple(v.get("choices", ())), v.get("help", ""))
                         for k, v in (glob.get("TUNABLES") or {}).items() if isinstance(v, dict)}
        geo = version.meta.get("geomean")
        self.description = (f"evolved kernel {version.label} of lineage {version.path.parent.parent.name} "
                            f"({version.meta.get('operator', '?')}; {geo:.4g} TFLOP/s on its suite)"
                            if geo else f"evolved kernel {version.label}")

    def available(self) -> str | None:
        if self._load_error:
            return self._load_error
        sub = self._registry.substrates.get(self.substrate_name)
        if sub is None:
            return f"substrate {self.substrate_name!r} is not installed"
        return sub.available()

    def _kernel(self):
        if self._inner is None:
            from kbench.kernelfile import KernelFileBackend

            self._inner = KernelFileBackend(self.source_path, self._registry, name=self.name)
        return self._inner

    def supports(self, case) -> str | None:
        try:
            return self._kernel().supports(case)
        except KbenchError as exc:
            return f"kernel does not load: {exc.message}"

    def prepare(self, case):
        return self._kernel().prepare(case)

    def info(self) -> dict[str, Any]:
        return {"kernel_file": self.source_path, "lineage_version": self.version.label,
                "sha": src.sha(self.version.source), "geomean_on_suite": self.version.meta.get("geomean"),
                "suite": self.version.meta.get("suite")}


def register_evolved(registry, workspace: Path | None = None) -> None:
    for lineage in list_lineages(workspace or workspace_root()):
        versions = lineage.versions()
        if not versions:
            continue
        registry.add_backend(EvolvedBackend(f"evolved:{lineage.name}", versions[-1], registry))
        for v in versions:
            registry.add_backend(EvolvedBackend(f"evolved:{lineage.name}@{v.label}", v, registry))


def lineage_of_backend(name: str) -> tuple[Lineage, Version] | None:  # pragma: no cover - convenience
    if not name.startswith("evolved:"):
        return None
    rest = name[len("evolved:"):]
    lname, _, ver = rest.partition("@")
    lin = Lineage.open(workspace_root(), lname)
    return lin, lin.version(ver or None)
