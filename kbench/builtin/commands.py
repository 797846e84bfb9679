"""Default plugin: the core's CLI commands."""
from __future__ import annotations

import kbench


@kbench.hookimpl
def kbench_register_commands(cli):
    from kbench.commands.list import list_command
    from kbench.commands.run import run_command
    from kbench.commands.show import show_command

    for command in (run_command, list_command, show_command):
        cli.add_command(command)
