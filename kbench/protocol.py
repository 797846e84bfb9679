"""The one module both sides of the trust boundary import: setup, messages, arena layout, reply codec.

The parent (:mod:`kbench.run`, :mod:`kbench.judge`) and a worker (:mod:`kbench.worker`, where candidate code
runs) talk over a private socket:

* requests go parent -> worker pickled (trusted to untrusted): ``("job", payload)`` with the arena's file
  descriptor beside it, ``("batch", payload)``, ``("forward", payload)``, ``("collect", payload)``,
  ``("sustain", payload)``, ``("end",)``, ``("exit",)``;
* replies go worker -> parent as JSON, decoded by :func:`decode_reply` with limits on size, nesting depth
  and number length, so any bytes a worker sends are at worst a malformed reply: data to verify, never
  code, never a verdict. What a reply must hold is checked by the judge (:mod:`kbench.judge.replies`).

The **arena** is a sealed anonymous file (``memfd_create`` + ``F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL``):
the worker copies the outputs the judge asks for into it, the judge reads them there. Sealed, its size
cannot change, so nothing a worker does to its descriptor can make the parent's mapping fault (SIGBUS).
The worker maps it and closes the descriptor before any candidate code runs.

This module imports nothing heavy (NumPy for the layout's views): it is on the worker's import path.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import tempfile
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from kbench.ops.inputs import np_dtype
from kbench.text import safe_strings

#: byte alignment of every array in an arena (cache lines; SIMD loads)
ALIGN = 64
#: largest reply a worker may send (samples, stamps and a few strings; never arrays)
MAX_REPLY_BYTES = 4 * 2**20
#: deepest nesting of lists and objects a reply may have (the deepest real reply has 4)
MAX_REPLY_DEPTH = 16
#: most characters of one string in a reply (reasons and tracebacks are cut by the worker)
MAX_REPLY_STRING = 64 * 1024
#: characters of a worker's output kept for a record
STDERR_TAIL = 4000


class ProtocolError(Exception):
    """A reply the protocol does not allow: malformed, forged, or too large."""


# --------------------------------------------------------------------------------------------
# what a worker is told


@dataclass(frozen=True)
class WorkerSetup:
    """What a worker needs to start: its plugins, device and op, its limits and watches. Never a secret,
    a seed, a tolerance or a timing setting: the judge decides all of those in the parent."""

    plugins: tuple[str, ...]
    device: str
    op: str
    sandbox: bool
    check_threads: bool = True
    check_harness: bool = True
    memory_limit: int | None = None
    file_size_limit: int | None = None
    scratch: str | None = None
    #: start under bubblewrap (kbench.run.sandbox); False for trusted workers and with --allow-unsandboxed
    bwrap: bool = False
    #: install the audit hook (kbench.worker.guard) before candidate code loads: every untrusted worker
    guard: bool = False
    #: environment pinning the worker to its device, e.g. (("CUDA_VISIBLE_DEVICES", "1"),)
    device_env: tuple = ()
    #: size of each writable tmpfs of a sandboxed worker
    scratch_limit: int | None = None
    #: the read-only places of the sandbox (the audit hook allows reads there)
    readable_roots: tuple[str, ...] = ()
    #: the device's own bubblewrap options (``Device.sandbox_binds()``), decided by the parent
    sandbox_binds: tuple[str, ...] = ()


@dataclass(frozen=True)
class BackendSpec:
    """How a worker rebuilds a backend: by registry name, from a kernel file's text, or by pickle."""

    kind: str                      # registry | file | pickle | harness (a harness twin: no backend's code at all)
    name: str
    trusted: bool = True
    path: str | None = None        # file: the kernel file as the user named it
    text: str | None = None        # file: the exact text the parent read and checked
    settings: tuple = ()           # file: tunable settings as sorted (name, value) pairs
    blob: bytes | None = None      # pickle

    @property
    def key(self) -> str:
        digest = hashlib.sha1(repr((self.kind, self.name, self.path, self.text, self.settings, self.blob))
                              .encode()).hexdigest()[:12]
        return f"{self.kind}:{self.name}:{digest}"


# --------------------------------------------------------------------------------------------
# the arena


@dataclass(frozen=True)
class ArrayLayout:
    name: str
    shape: tuple[int, ...]
    dtype: str            # numpy dtype name ("float16", "bfloat16" via ml_dtypes)
    offset: int           # from the start of a slot

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np_dtype(self.dtype).itemsize


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass(frozen=True)
class Layout:
    """Where the outputs of each collected call live in the arena (``slots`` equal slots one after another)."""

    slots: int
    outputs: tuple[ArrayLayout, ...]
    slot_bytes: int

    @classmethod
    def plan(cls, out_shapes: Mapping[str, tuple[int, ...]], out_dtype: str | np.dtype, slots: int) -> Layout:
        offset, outputs = 0, []
        for name, shape in out_shapes.items():
            outputs.append(ArrayLayout(name, tuple(int(n) for n in shape), np_dtype(out_dtype).name, offset))
            offset = _aligned(offset + outputs[-1].nbytes)
        return cls(int(slots), tuple(outputs), max(offset, ALIGN))

    @property
    def nbytes(self) -> int:
        return self.slots * self.slot_bytes

    def view(self, buf: Any, slot: int, array: ArrayLayout) -> np.ndarray:
        if not 0 <= slot < self.slots:
            raise ValueError(f"slot {slot} is outside the arena's {self.slots} slots")
        return np.ndarray(array.shape, np_dtype(array.dtype), buffer=buf, offset=slot * self.slot_bytes + array.offset)

    def output_views(self, buf: Any, slot: int) -> dict[str, np.ndarray]:
        return {a.name: self.view(buf, slot, a) for a in self.outputs}


def arena_file(nbytes: int) -> int:
    """A file descriptor of ``nbytes`` of shared memory nobody else can open, sealed at that size.

    ``memfd_create`` with seals on Linux (passed to the worker over its private socket, so it works
    inside a sandbox with its own /dev/shm); an unlinked temporary file elsewhere (unsealed).
    """
    size = max(int(nbytes), 1)
    try:
        fd = os.memfd_create("kbench-arena", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    except (AttributeError, OSError):
        fd, path = tempfile.mkstemp(prefix="kbench-arena-")
        os.unlink(path)
        os.ftruncate(fd, size)
        return fd
    try:
        os.ftruncate(fd, size)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL)
    except BaseException:
        os.close(fd)
        raise
    return fd


def arena_sealed(fd: int) -> bool:
    """Whether the arena's size is sealed (what the worker is told to rely on, and tests check)."""
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except (AttributeError, OSError):
        return False
    need = fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK
    return seals & need == need


# --------------------------------------------------------------------------------------------
# replies: JSON, bounded


def _plain(value: Any, depth: int = 0) -> Any:
    """JSON-ready data: NumPy scalars as numbers, non-finite floats as null, anything unknown as its string."""
    if depth > MAX_REPLY_DEPTH:
        raise ValueError(f"nested deeper than {MAX_REPLY_DEPTH} levels")
    if isinstance(value, (str, bool, int)) or value is None:
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, depth + 1) for v in value]
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return _plain(item(), depth + 1)
        except Exception:  # noqa: BLE001 - an array of several elements: its text
            pass
    return str(value)[:MAX_REPLY_STRING]


def encode_reply(reply: tuple) -> bytes:
    """A worker's reply as bytes (:func:`_plain` data).

    A reply that cannot be encoded, or is larger than the parent reads, becomes an ``error`` reply that
    says so: the worker never sends what the parent would refuse.
    """
    try:
        data = json.dumps(_plain(reply), allow_nan=False).encode()
    except (TypeError, ValueError, RecursionError) as exc:
        data = json.dumps(("error", {"reason": f"the reply could not be sent to the parent: {exc}"[:500]})).encode()
    if len(data) > MAX_REPLY_BYTES:
        data = json.dumps(("error", {"reason": f"the reply of {len(data)} bytes exceeds the protocol's "
                                               f"{MAX_REPLY_BYTES} bytes"})).encode()
    return data


def _depth_ok(data: bytes, limit: int) -> bool:
    """Nesting depth of JSON text at most ``limit``, counted without parsing (brackets outside strings)."""
    depth, in_string, escape = 0, False, False
    for byte in data:
        if in_string:
            if escape:
                escape = False
            elif byte == 0x5C:      # backslash
                escape = True
            elif byte == 0x22:      # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > limit:
                return False
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return True


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > 40:
        raise ValueError(f"an integer of {len(text)} digits")
    return int(text)


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number a reply may hold")


def decode_reply(data: bytes) -> Any:
    """A worker's reply from its bytes; :class:`ProtocolError` for anything that is not a bounded JSON value.

    Bounded before parsing: size (:data:`MAX_REPLY_BYTES`) and depth (:data:`MAX_REPLY_DEPTH`, so a deeply
    nested reply cannot exhaust the parser's recursion); while parsing: integers of at most 40 digits,
    no NaN/Infinity literals; after: strings of at most :data:`MAX_REPLY_STRING` characters, each made safe
    text (:func:`kbench.text.safe_text`: lone surrogates, control and bidi characters escaped), so no text a
    worker sends can break a record's file or the screen.
    """
    if len(data) > MAX_REPLY_BYTES:
        raise ProtocolError(f"a reply of {len(data)} bytes exceeds {MAX_REPLY_BYTES} bytes")
    if not _depth_ok(data, MAX_REPLY_DEPTH):
        raise ProtocolError(f"a reply nested deeper than {MAX_REPLY_DEPTH} levels")
    try:
        value = json.loads(data, parse_int=_bounded_int, parse_constant=_refuse_constant)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ProtocolError(f"a reply that is not valid JSON ({str(exc)[:200]})") from None
    _check_strings(value, 0)
    value = safe_strings(value)
    return tuple(value) if isinstance(value, list) else value


def _check_strings(value: Any, depth: int) -> None:
    if isinstance(value, str):
        if len(value) > MAX_REPLY_STRING:
            raise ProtocolError(f"a reply holds a string of {len(value)} characters (at most {MAX_REPLY_STRING})")
    elif isinstance(value, list):
        for item in value:
            _check_strings(item, depth + 1)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_strings(key, depth + 1)
            _check_strings(item, depth + 1)


def as_sent(reply: tuple) -> Any:
    """A reply as the judge receives it from a worker: through the same encoding and decoding."""
    return decode_reply(encode_reply(reply))
