"""Default plugin: the core's CLI commands."""
from __future__ import annotations

import importlib

import kbench

#: "module:attribute" of each core command; loaded when the CLI starts
CORE_COMMANDS = (
    "kbench.commands.run:run_command",
    "kbench.commands.list:list_command",
    "kbench.commands.show:show_command",
    "kbench.commands.roofline:roofline_command",
    "kbench.commands.plan:plan_command",
    "kbench.commands.calibrate:calibrate_command",
    "kbench.commands.compare:compare_command",
    "kbench.commands.ab:ab_command",
    "kbench.commands.report:report_command",
    "kbench.commands.publish:publish_command",
    "kbench.commands.regressions:regressions_command",
    "kbench.commands.fuzz:fuzz_command",
)


@kbench.hookimpl
def kbench_register_commands(cli):
    for spec in CORE_COMMANDS:
        module, attr = spec.split(":")
        cli.add_command(getattr(importlib.import_module(module), attr))
