"""The core's CLI commands, one module each; registered by kbench.builtin.commands."""
