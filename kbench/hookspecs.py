"""The kbench plugin API: every hook a plugin may implement.

Hooks are called with keyword arguments; an implementation may accept any subset of the
arguments named here. Registration hooks receive a :class:`kbench.registry.Registry`; the
core, not the plugin, refuses duplicate names and names both plugins in the error.

Implement a hook with ``@kbench.hookimpl`` in a module that is either one of the core's
default plugins, an entry point in group ``kbench``, or named with ``-p MODULE`` /
``KBENCH_PLUGINS``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from pathlib import Path

    import click

    from kbench.devices import Device
    from kbench.hardware import HardwareProfile
    from kbench.registry import Registry

hookspec = pluggy.HookspecMarker("kbench")


# ---------------------------------------------------------------------------------------------
# Registration: called once per process, when the plugin manager is built.
# ---------------------------------------------------------------------------------------------

@hookspec(historic=True)
def kbench_add_hookspecs(pluginmanager: pluggy.PluginManager) -> None:
    """Add a plugin's own hook specifications with ``pluginmanager.add_hookspecs(module)``.

    Fires first, once every plugin is imported and before hook names are checked, so a plugin
    may define hooks for its own plugins (e.g. the evolve plugin's variation operators).
    """


@hookspec
def kbench_register_ops(registry: Registry) -> None:
    """Register ops (mathematical functions with a parameter space) with ``registry.add_op(op)``.

    Fires first, before backends, so backends may name ops from any plugin.
    """


@hookspec
def kbench_register_devices(registry: Registry) -> None:
    """Register devices (where arrays live and how time is read) with ``registry.add_device(device)``.

    A device whose runtime is missing is still registered; its ``available()`` says why not.
    """


@hookspec
def kbench_register_backends(registry: Registry) -> None:
    """Register backends with ``registry.add_backend(backend)``.

    Register unconditionally and import heavy libraries lazily: a backend whose library or
    hardware is missing reports ``available() -> "reason"`` instead of not registering.
    """


@hookspec
def kbench_register_kernel_substrates(registry: Registry) -> None:
    """Register substrates for single-file kernels with ``registry.add_substrate(substrate)``.

    A substrate (``numpy``, ``triton``, ``cupy``) says on which device a kernel file runs and how
    the harness's arrays are handed to its function. See :mod:`kbench.kernelfile`.
    """


@hookspec
def kbench_register_hardware(registry: Registry) -> None:
    """Register hardware profiles (peak rates, bandwidth, capacity) with ``registry.add_hardware(p)``."""


@hookspec
def kbench_register_executors(registry: Registry) -> None:
    """Register executors (where ``kbench run --executor NAME`` runs its (case, backend) jobs) with
    ``registry.add_executor(factory)``, a :class:`kbench.run.executors.ExecutorFactory` (``kbench.api.executor_kit``).

    Import the engine (Ray, ...) only in the factory's ``create``: ``available()``/``status()`` say why it
    cannot run (library missing, no cluster reachable) without importing it. See docs/scale-out.md.
    """


@hookspec
def kbench_register_commands(cli: click.Group) -> None:
    """Add click commands to the ``kbench`` command group with ``cli.add_command(cmd)``."""


# ---------------------------------------------------------------------------------------------
# Detection and environment: called during a run.
# ---------------------------------------------------------------------------------------------

@hookspec(firstresult=True)
def kbench_detect_hardware(device: Device, registry: Registry) -> HardwareProfile | None:
    """Return the hardware profile that describes ``device`` on this machine, or ``None``.

    ``firstresult``: the first non-``None`` answer wins; plugins registered later are asked first,
    so a third-party plugin can override a built-in detection.
    """


@hookspec(firstresult=True)
def kbench_float64_reference(op: str, case: Any, inputs: Any, rows: Any) -> Any:
    """Return the float64 reference of ``case`` computed elsewhere than the host (e.g. on a GPU), or ``None``.

    Asked by an op's ``reference()`` only for large cases (``kbench.ops.attention.OFFLOAD_REFERENCE_FLOPS``:
    small correctness cases keep the host's NumPy reference), and by the judge only during a run on a device
    whose ``offloads_reference`` is true (the CUDA device's; a CPU run keeps its references on the host). ``inputs`` are the exact host arrays the
    backends received, ``rows`` the sampled query rows (or ``None`` for all). The answer is a host NumPy
    float64 array of the op's reference shape, computed in float64 by an implementation independent of
    the backends under test; ``None`` when this plugin cannot (no GPU, op not handled). ``firstresult``.
    """


@hookspec
def kbench_environment() -> dict[str, Any]:
    """Return facts to record in each result's ``environment`` (library versions, driver, ...).

    Must be fast and must not fail: return ``{}`` when the library is absent.
    """


# ---------------------------------------------------------------------------------------------
# History: called by ``kbench publish --lineages DIR``.
# ---------------------------------------------------------------------------------------------

@hookspec
def kbench_read_lineages(workspace: Path) -> list[Any] | None:  # LineageHistory: kbench.history sits above this module
    """Return the lineages this plugin keeps in ``workspace`` (the directory given to ``kbench publish
    --lineages``), oldest version first, as ``kbench.api.LineageHistory`` objects; ``None`` when this plugin
    keeps no lineages (``[]`` when it does but the directory holds none).

    Each ``kbench.api.LineageVersion`` names the result file that measured it (``result_file``); the core
    reads the confidence bands from that file, so leave ``bands`` empty. The answers of all plugins are joined;
    when no plugin implements the hook, ``--lineages`` is refused naming the plugin to install.
    """
