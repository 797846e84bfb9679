"""Ray clusters that listen on loopback only (docs/scale-out.md, "Loopback only").

Ray 2.60's servers (GCS, raylet, object manager, core workers, agents) listen on the loopback interface
only when their node's address is exactly ``127.0.0.1``; for any other node address they listen on every
interface (``[::]``, measured: 127.0.0.2 gives ``[::]`` too). But Ray's Python side turns a loopback
address into the host's network address before using it (``services.resolve_ip_for_localhost``: given
``--node-ip-address 127.0.0.1`` or ``--address 127.0.0.1:PORT``, a node takes, say, 192.0.2.2 and its
servers listen everywhere). :func:`keep_loopback` makes that function keep a loopback address as it is,
in this process: a cluster started or joined from it with 127.0.0.1 then is, and listens on, 127.0.0.1
only. Nothing changes for a non-loopback address (a real multi-host cluster).

``python -m kbench_ray.loopback start ...`` is ``ray start ...`` with the same fix, for the head and the
worker nodes of a cluster on one host (the tests' multi-node clusters)::

    python -m kbench_ray.loopback start --head --node-ip-address 127.0.0.1 --port 6379 --num-cpus 1 --block
    python -m kbench_ray.loopback start --address 127.0.0.1:6379 --node-ip-address 127.0.0.1 --num-cpus 1 --block
"""
from __future__ import annotations

import ipaddress
import sys

#: a node address this module keeps (Ray binds its servers to loopback only for exactly this one)
LOOPBACK = "127.0.0.1"


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1, an IPv4-mapped loopback, or ``localhost``."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or bool(mapped and mapped.is_loopback)


def keep_loopback() -> None:
    """Make Ray keep a loopback node or cluster address in this process (idempotent; Ray imported)."""
    from ray._private import services

    if getattr(services.resolve_ip_for_localhost, "kbench_keeps_loopback", False):
        return
    original = services.resolve_ip_for_localhost

    def resolve_ip_for_localhost(host: str):
        if host and is_loopback(host):
            return LOOPBACK if host == "localhost" else host.strip("[]")
        return original(host)

    resolve_ip_for_localhost.kbench_keeps_loopback = True  # type: ignore[attr-defined]
    services.resolve_ip_for_localhost = resolve_ip_for_localhost


def main(argv: list[str] | None = None) -> None:
    """``ray ARGS`` (``ray start ...``) with loopback addresses kept (:func:`keep_loopback`)."""
    from ray.scripts.scripts import cli

    keep_loopback()
    cli.main(args=list(sys.argv[1:] if argv is None else argv), prog_name="ray")


if __name__ == "__main__":
    main()
