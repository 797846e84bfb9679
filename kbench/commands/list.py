"""``kbench list``: plugins, ops, devices, backends, hardware profiles and executors, each with availability
(an executor that needs a cluster also says whether one is reachable, docs/scale-out.md), and whether
untrusted code can be sandboxed here (docs/sandbox.md)."""
from __future__ import annotations

import click

from kbench.tables import render

#: rows of the listing fit a wide terminal: long reasons and descriptions wrap instead
WIDTH = 140


def _avail(obj) -> str:
    try:
        reason = obj.available()
    except Exception as exc:  # noqa: BLE001 - a plugin's availability check must not end the listing
        return f"error: {type(exc).__name__}: {exc}"
    return "available" if not reason else f"unavailable: {reason}"


def _executor_status(factory) -> str:
    """``available`` / ``unavailable: why``, and what its ``status()`` adds (a cluster it cannot reach...)."""
    status = _avail(factory)
    if status != "available":
        return status
    try:
        note = factory.status()
    except Exception as exc:  # noqa: BLE001 - as for availability
        note = f"status check failed: {type(exc).__name__}: {exc}"
    return f"available; {note}" if note else status


@click.command("list")
@click.option("--format", "fmt", type=click.Choice(["table", "markdown", "json"]), default="table", show_default=True)
@click.option("--plugins", "plugins_only", is_flag=True,
              help="Only the plugins: where each was found, its hooks, what it registered; entry points in a "
                   "mistyped group.")
@click.pass_obj
def list_command(pm, fmt, plugins_only):
    """List what the installed plugins provide, and why anything is unavailable."""
    if plugins_only:
        from kbench.plugins import format_plugin_report, plugin_report

        click.echo(format_plugin_report(plugin_report(pm), fmt))
        return
    reg = pm.registry
    sections = {
        "plugins": (("name", "module", "from"), [(i.name, i.module, i.source) for i in pm.infos]),
        "ops": (("op", "plugin", "description"),
                [(o.name, reg.owner("op", o.name), o.description) for o in reg.ops.values()]),
        "devices": (("device", "plugin", "status"),
                    [(d.name, reg.owner("device", d.name), _avail(d)) for d in reg.devices.values()]),
        "backends": (("backend", "op", "device", "plugin", "status"),
                     [(b.name, b.op, b.device, reg.owner("backend", b.name), _avail(b))
                      for b in sorted(reg.backends.values(), key=lambda b: (b.op, b.name))]),
        "substrates": (("substrate", "device", "plugin", "status"),
                       [(s.name, s.device, reg.owner("substrate", s.name), _avail(s))
                        for s in reg.substrates.values()]),
        "hardware": (("profile", "title", "plugin", "source"),
                     [(h.name, h.title, reg.owner("hardware", h.name), h.source) for h in reg.hardware.values()]),
        "executors": (("executor", "plugin", "status", "description"),
                      [(e.name, reg.owner("executor", e.name), _executor_status(e), e.description)
                       for e in reg.executors.values()]),
    }
    from kbench.run.sandbox import UNSANDBOXED_FIX, probe

    sandbox = probe()
    if fmt == "json":
        import json

        listing = {k: [dict(zip(h, r)) for r in rows] for k, (h, rows) in sections.items()}
        listing["sandbox"] = {"available": sandbox.available, "version": sandbox.version, "binary": sandbox.binary,
                              "reason": sandbox.reason, "bounded_writes": sandbox.sized_tmpfs}
        click.echo(json.dumps(listing, indent=1))
        return
    import textwrap

    click.echo(textwrap.fill(f"sandbox: {sandbox.describe()}", WIDTH, subsequent_indent="  ", break_on_hyphens=False,
                             break_long_words=False)
               + ("" if sandbox.available else "\n" + textwrap.fill(UNSANDBOXED_FIX, WIDTH, initial_indent="  ",
                                                                    subsequent_indent="  ")))
    click.echo()
    for title, (headers, rows) in sections.items():
        click.echo(f"{title}:")
        click.echo(render(headers, rows, fmt, max_width=WIDTH) if rows else "  (none)")
        click.echo()
