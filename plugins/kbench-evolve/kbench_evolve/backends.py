"""Evolved kernels as backends: ``evolved:<name>`` (the champion) and ``evolved:<name>@vN``.

Registered by scanning the workspace (``KBENCH_EVOLVE_DIR`` or ``./evolve``). Nothing of a
version is executed at registration (op, substrate and tunables are read as literals), and evolved
kernels are untrusted: the core runner sends them to sandboxed workers like any kernel file.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from kbench.api import KbenchError, KernelFileRef, Tunable

from kbench_evolve import source as src
from kbench_evolve.store import Version, list_lineages, workspace_root


class EvolvedBackend(KernelFileRef):
    """A committed version as a kernel-file backend: read as text here, run in an isolated worker.

    Being a :class:`kbench.api.KernelFileRef`, it reaches the worker as its source text, so the
    worker does not need to find the workspace, and nothing of it is executed in this process.
    """

    def __init__(self, name: str, version: Version, registry) -> None:
        super().__init__(version.kernel_path, registry, name=name, trusted=False)
        self.version = version
        glob = src.module_globals(self.source_text)
        self.tunables = {k: Tunable(v.get("default"), tuple(v.get("choices", ())), v.get("help", ""))
                         for k, v in (glob.get("TUNABLES") or {}).items() if isinstance(v, dict)}
        geo = version.meta.get("geomean")
        self.description = (f"evolved {version.label} of {version.path.parent.parent.name} "
                            f"({version.meta.get('operator', '?')}; {geo:.4g} TFLOP/s on its suite)"
                            if geo else f"evolved {version.label}")

    def info(self) -> dict[str, Any]:
        return {**super().info(), "lineage_version": self.version.label,
                "geomean_on_suite": self.version.meta.get("geomean"), "suite": self.version.meta.get("suite")}


def register_evolved(registry, workspace: Path | None = None) -> None:
    for lineage in list_lineages(workspace or workspace_root()):
        versions = lineage.versions()
        if not versions:
            continue
        for name, v in [(f"evolved:{lineage.name}", versions[-1])] + [
                (f"evolved:{lineage.name}@{v.label}", v) for v in versions]:
            try:
                backend = EvolvedBackend(name, v, registry)
            except KbenchError:
                continue  # a damaged version directory must not stop kbench from starting
            registry.add_backend(backend)
