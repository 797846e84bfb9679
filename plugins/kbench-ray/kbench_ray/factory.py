"""The ``ray`` executor's factory: what ``kbench list`` and ``kbench run --executor ray`` ask before any Ray import."""
from __future__ import annotations

import importlib.metadata as md

from kbench.api import executor_kit as kx
from kbench_ray.plugin import cluster_note, ray_missing, refuse_unreachable


class RayExecutorFactory(kx.ExecutorFactory):
    name = "ray"
    description = "a Ray cluster: one actor per device, the judge and sandboxed workers inside it"
    remote = True

    def available(self) -> str | None:
        return ray_missing()

    def status(self, options=None) -> str | None:
        try:
            version = md.version("ray")
        except md.PackageNotFoundError:
            version = "?"
        return f"ray {version}; " + cluster_note(options.address if options else None)

    def check(self, options) -> None:
        """Settings valid and the cluster's address answering (exit 2 before any work otherwise); plan_run
        calls it before the executor is made, so ray.init never meets a dead address."""
        from kbench_ray.settings import check_settings

        check_settings(options)
        refuse_unreachable(options.address)

    def create(self, pm, planned, options):
        from kbench_ray.executor import RayExecutor

        return RayExecutor(pm, planned, options)
