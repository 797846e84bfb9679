"""The ``kbench`` command group. Commands live in kbench/commands/ and in plugins.

Errors of the KbenchError family become one clean message and the family's exit code here,
at the edge; nothing below this module prints tracebacks for bad input.
"""
from __future__ import annotations

import signal
import sys
import threading

import click

from kbench import __version__
from kbench.errors import KbenchError


class Terminated(KeyboardInterrupt):
    """SIGTERM during a command, raised like Ctrl-C's KeyboardInterrupt so that what is being written is
    finished or left valid (``finally`` blocks run), and the command exits 143 (128 + SIGTERM) with one line."""


def _terminated(signum, frame):
    raise Terminated("terminated (SIGTERM)")


class KbenchClickError(click.ClickException):
    def __init__(self, error: KbenchError) -> None:
        super().__init__(error.format())
        self.exit_code = error.exit_code

    def show(self, file=None) -> None:
        click.echo(f"kbench: error: {self.format_message()}", err=True)


class KbenchGroup(click.Group):
    """Loads plugins (default, entry points, ``-p``) before resolving a command, so plugins can add commands."""

    def _ensure_plugins(self, ctx: click.Context) -> None:
        from kbench.plugins import get_plugin_manager

        extra = tuple((ctx.params or {}).get("plugins") or ()) if ctx else ()
        try:
            pm = get_plugin_manager(extra)
            if getattr(self, "_commands_from", None) is not pm:
                pm.hook.kbench_register_commands(cli=self)
                self._commands_from = pm
        except KbenchError as exc:
            raise KbenchClickError(exc) from exc

    def list_commands(self, ctx):
        self._ensure_plugins(ctx)
        return super().list_commands(ctx)

    def get_command(self, ctx, name):
        self._ensure_plugins(ctx)
        return super().get_command(ctx, name)

    def invoke(self, ctx):
        # SIGTERM as an exception for the command's duration (the default would end the process at once,
        # silently, maybe halfway through writing a file); the handler that was there comes back after
        main = threading.current_thread() is threading.main_thread()
        old = signal.signal(signal.SIGTERM, _terminated) if main else None
        try:
            return super().invoke(ctx)
        except KbenchError as exc:
            raise KbenchClickError(exc) from exc
        except KeyboardInterrupt as exc:
            # Ctrl-C or SIGTERM outside a run's own handling (planning, a signal while the result file is being
            # finished): one line and the shell's convention 128 + the signal, not click's "Aborted!" and exit 1
            term = isinstance(exc, Terminated) or "SIGTERM" in str(getattr(exc, "how", ""))
            click.echo(f"\nkbench: {'terminated (SIGTERM)' if term else 'interrupted (Ctrl-C)'}", err=True)
            ctx.exit(143 if term else 130)
        finally:
            if main:
                signal.signal(signal.SIGTERM, old if old is not None else signal.SIG_DFL)


@click.group(cls=KbenchGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kbench")
@click.option("-p", "--plugin", "plugins", multiple=True, metavar="MODULE",
              help="Load MODULE as a plugin (repeatable; also KBENCH_PLUGINS=a,b).")
@click.pass_context
def cli(ctx: click.Context, plugins: tuple[str, ...]) -> None:
    """kbench: benchmark attention kernels with checked correctness and sound timing."""
    from kbench.plugins import get_plugin_manager, show_plugin_warnings_plainly

    show_plugin_warnings_plainly()
    ctx.obj = get_plugin_manager(plugins)


def main(argv: list[str] | None = None) -> None:
    cli.main(args=argv, prog_name="kbench")


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])
