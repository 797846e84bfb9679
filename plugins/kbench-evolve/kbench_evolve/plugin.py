"""Entry point of the kbench-evolve plugin (group ``kbench``). Imports nothing heavy at import time.

Hooks: this plugin's own hookspecs (``kbench_evolve_register_operators``), the built-in operators
(registered through that hook like any third-party operator), the ``evolve`` command group, the
``evolved:<name>`` backends found in the workspace, and the lineages of a workspace for the history
site (``kbench publish --lineages``).
"""
from __future__ import annotations

import kbench

#: built-in variation operators, "module:Class", registered through our own hook
BUILTIN_OPERATORS = (
    "kbench_evolve.operators.mutate:MutateOperator",
    "kbench_evolve.operators.llm_rewrite:LLMRewriteOperator",
    "kbench_evolve.operators.agent:AgentOperator",
)


@kbench.hookimpl
def kbench_add_hookspecs(pluginmanager):
    from kbench_evolve import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


@kbench.hookimpl
def kbench_evolve_register_operators(registry):
    import importlib

    for spec in BUILTIN_OPERATORS:
        module, attr = spec.split(":")
        registry.add(getattr(importlib.import_module(module), attr))


@kbench.hookimpl
def kbench_register_commands(cli):
    from kbench_evolve.cli import evolve_group

    cli.add_command(evolve_group)


@kbench.hookimpl
def kbench_register_backends(registry):
    from kbench_evolve.backends import register_evolved

    register_evolved(registry)


@kbench.hookimpl
def kbench_read_lineages(workspace):
    from kbench_evolve.store import lineage_histories

    return lineage_histories(workspace)
