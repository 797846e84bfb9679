"""The ``ray`` executor: each job on a Ray actor holding one device, the judge and sandboxed workers inside.

Ray is imported only when a run uses this executor: ``kbench list`` and ``kbench run`` with the default
executor never import it. See docs/scale-out.md for what runs where and what travels over the wire.
"""
from __future__ import annotations

import importlib.util
import os
import socket
from pathlib import Path

from kbench.api import BadInput, hookimpl

#: the Ray release this plugin is tested with (pinned in its dependencies and requirements.txt)
RAY_VERSION = "2.60.0"
#: seconds a TCP probe of a cluster's address may take (``kbench list``)
PROBE_TIMEOUT = 2.0


def ray_missing() -> str | None:
    if importlib.util.find_spec("ray") is None:
        return f"ray is not installed (pip install 'ray=={RAY_VERSION}', or pip install -e plugins/kbench-ray)"
    return None


def current_cluster_file() -> Path:
    """Where ``ray start --head`` on this host writes the address of its cluster (``ray_current_cluster`` in
    Ray's temporary directory: ``$RAY_TMPDIR/ray``, else ``$TMPDIR/ray``, else ``/tmp/ray``, as Ray finds it)."""
    base = os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp"
    return Path(base) / "ray" / "ray_current_cluster"


def init_address(given: str | None) -> str:
    """What ``ray.init`` is given: ``--address``, else ``RAY_ADDRESS``, else ``"local"``.

    Never ``None``: given nothing, ``ray.init`` joins the cluster a ``ray start --head`` on this host left in
    :func:`current_cluster_file` (someone else's, maybe), where a run without ``--address`` must start its own.
    ``--address auto`` (or that file's address) joins it on purpose.
    """
    return given or os.environ.get("RAY_ADDRESS") or "local"


def split_address(address: str) -> tuple[str, int] | None:
    """``ray://host:10001`` or ``host:6379`` -> (host, port); None when it names no port."""
    rest = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]") or "127.0.0.1", int(port)


def cluster_note(address: str | None) -> str:
    """Where ``--executor ray`` would run, and whether that cluster answers (a TCP probe; Ray is not imported)."""
    source = "--address"
    if address is None and os.environ.get("RAY_ADDRESS"):
        address, source = os.environ["RAY_ADDRESS"], "RAY_ADDRESS"
    if address in (None, "auto", "local"):
        cluster_file = current_cluster_file()
        try:
            found = cluster_file.read_text().strip()
        except OSError:
            found = ""
        if address != "auto":
            here = (f"; the cluster of this host's `ray start --head` (at {found}, from {cluster_file}) is joined only "
                    "with --address auto" if found else "")
            return ("a run with --executor ray starts a local cluster for itself (RAY_ADDRESS unset); "
                    "--address HOST:PORT joins a running one" + here)
        if not found:
            return ("no cluster running on this host (no `ray start --head`: nothing in "
                    f"{cluster_file}): start one, or give --address HOST:PORT")
        address, source = found, f"{cluster_file}"
    why = unreachable(address)
    if why is None:
        return f"cluster at {address} (from {source}) answers"
    return f"{why} (from {source})" if why.startswith("cannot tell") else f"cluster at {address} (from {source}) {why}"


def refuse_unreachable(given: str | None) -> None:
    """BadInput when the cluster named by ``--address`` (or ``RAY_ADDRESS``) does not answer; a run without
    one starts its own local cluster, so there is nothing to probe."""
    address = given or os.environ.get("RAY_ADDRESS")
    if address in (None, "", "auto", "local"):
        return
    why = unreachable(address)
    if why is not None:
        raise BadInput(why if why.startswith("cannot tell") else f"cannot reach the Ray cluster at {address}: {why}",
                       where="--address" if given else "RAY_ADDRESS",
                       fix="check the address (`ray status` on the head node), or leave out --address to start "
                           "a local cluster")


def unreachable(address: str) -> str | None:
    """Why no Ray head answers at a cluster address, or None when one does: a connection and HTTP/2's
    preface, each within PROBE_TIMEOUT s. ``ray.init`` waits minutes on a dead address or on a port some
    other service holds (a run hung there before this probe)."""
    where = split_address(address)
    if where is None:
        return f"cannot tell where {address!r} is: give HOST:PORT or ray://HOST:PORT"
    try:
        with socket.create_connection(where, timeout=PROBE_TIMEOUT) as conn:
            # a Ray head (GCS, or the Ray Client server) speaks gRPC: HTTP/2 answers its connection preface
            # with a SETTINGS frame (9-byte header, type 4); ray.init would wait for minutes on anything else
            conn.sendall(HTTP2_PREFACE + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
            reply = b""
            while len(reply) < 9:
                got = conn.recv(9 - len(reply))
                if not got:
                    break
                reply += got
    except socket.timeout:
        return f"answers, but not as a Ray cluster (no gRPC reply within {PROBE_TIMEOUT:g} s)"
    except OSError as exc:
        return f"is not reachable: {exc.strerror or exc}"
    if len(reply) < 9 or reply[3] != 4:
        return "answers, but not as a Ray cluster (its reply is not gRPC's)"
    return None


#: what an HTTP/2 (gRPC) client sends first (RFC 9113, section 3.4)
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


@hookimpl
def kbench_register_executors(registry) -> None:
    # the executor API is the run side's: imported when executors are registered (never in a worker)
    from kbench_ray.factory import RayExecutorFactory

    registry.add_executor(RayExecutorFactory())
