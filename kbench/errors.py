"""The one error family of kbench, turned into a clean message and an exit code at the CLI edge."""
from __future__ import annotations


class KbenchError(Exception):
    """Base of every error kbench raises on purpose. ``exit_code`` is what the CLI exits with."""

    exit_code = 1

    def __init__(self, message: str, *, file: str | None = None, where: str | None = None,
                 fix: str | None = None) -> None:
        self.message = message
        self.file = None if file is None else str(file)
        self.where = where
        self.fix = fix
        super().__init__(self.format())

    def format(self) -> str:
        head = ": ".join(p for p in (self.file, self.where) if p)
        text = f"{head}: {self.message}" if head else self.message
        if self.fix:
            text += f"\n  fix: {self.fix}"
        return text


class BadInput(KbenchError):
    """Bad suite, argument or result file: exit 2, message names the file, the place and the fix."""

    exit_code = 2


class PluginError(BadInput):
    """A plugin failed to import or broke the registration contract (e.g. a duplicate name)."""


class OutputError(BadInput):
    """An output (result file, report, plot) cannot be written: the message says why in words, what was kept
    and how to go on. Exit 2 like other bad input: the run's data is safe, the environment needs a fix."""
