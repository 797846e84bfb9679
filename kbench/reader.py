"""The one reader of kbench's input files: every command that reads a result file, its journal, a suite or
other YAML file, the history cache or an evolve lineage goes through :func:`read_bytes` and, for JSON,
:func:`parse_json`, so every file gets the same limits and the same message (file, place, fix; exit 2).

What it refuses, and why each limit is where it is (docs/results.md, "Limits"):

* anything but a regular file, by its type, before it is opened: a FIFO (reading would wait forever), a
  device (``/dev/zero``, also behind a symlink, never ends), a directory, a socket;
* more bytes than the caller's limit, counted while reading (the size ``stat`` reports is not trusted: a
  file of ``/proc`` says 0, a file being appended to grows);
* text that is not UTF-8, naming the byte;
* (not refused, escaped) lone surrogates, control and bidi characters in any string, keys included: written as
  their escapes by :func:`kbench.text.safe_text`, the function that also cleans a worker's replies;
* JSON that is not a document kbench writes: integer literals of more than :data:`MAX_INT_DIGITS` digits
  (Python refuses to convert > 4,300 and is slow before), numbers that overflow to infinity (``1e999``) and
  the ``NaN``/``Infinity`` literals, a key twice in one object (JSON parsers keep the last, silently),
  nesting deeper than :data:`MAX_DEPTH`, strings longer than :data:`MAX_STRING` characters, arrays of more
  than :data:`MAX_ITEMS` items, and a structure that would take more than :data:`MAX_EXPANSION` times the
  file's size in memory once parsed (counted on the text before parsing: ``[{},{},...]`` is 24x).

Strings and arrays of the lengths refused here are of no real result (names and reasons are a few hundred
characters, a record's samples at most the suite's ``max_samples``), and are what made readers copy
megabytes per record, series or chart. Peak memory of a reader command is then bounded by a small multiple
of its input (docs/results.md states the bound and tests/test_readers_memory.py measures it).
"""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from kbench.errors import BadInput
from kbench.text import may_need_escapes, safe_strings

#: deepest nesting of any file kbench reads (its own are under 10 levels deep)
MAX_DEPTH = 64
#: longest integer literal (a 64-bit count has 20 digits; nothing kbench stores is larger)
MAX_INT_DIGITS = 32
#: longest string (characters): names and ids are under a few hundred, a reason or traceback a few thousand
MAX_STRING = 64 * 1024
#: most items in one array, and keys in one object (a record's samples: at most the suite's ``max_samples``,
#: which the suite schema caps at this)
MAX_ITEMS = 1_000_000
#: a JSON file's parsed structure may take at most this many times its size in memory (+ MAX_EXPANSION_SLACK);
#: result files take 2-3x (estimated 3.5-6x by :func:`structure_cost`, which errs high)
MAX_EXPANSION = 10
MAX_EXPANSION_SLACK = 16 * 2**20
#: largest result file (a 10,000-record GPU run with 3,000 samples per record is ~700 MB)
MAX_RESULT_BYTES = 2**30

_KINDS = ((stat.S_ISFIFO, "a named pipe (FIFO)", "reading it would wait for a writer, maybe forever"),
          (stat.S_ISCHR, "a character device", "reading it may never end (/dev/zero, a terminal)"),
          (stat.S_ISBLK, "a block device", "it is a disk, not a file kbench wrote"),
          (stat.S_ISSOCK, "a socket", "it is not a file"),
          (stat.S_ISDIR, "a directory", "a file is read here"))


def check_regular(path: str | Path, *, what: str = "file", missing_fix: str = "check the path") -> os.stat_result:
    """The ``stat`` of ``path`` (links followed) if it is a regular file; else bad input saying what it is.
    Decided by the file's type, before anything opens it."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise BadInput(f"{what} not found", file=str(path), fix=missing_fix) from None
    except NotADirectoryError:
        raise BadInput(f"{what} not found (a part of the path is a file, not a directory)", file=str(path),
                       fix=missing_fix) from None
    except OSError as exc:
        raise BadInput(f"cannot read the {what}: {_why(exc)}", file=str(path), fix=_fix(exc)) from None
    if not stat.S_ISREG(st.st_mode):
        for test, kind, why in _KINDS:
            if test(st.st_mode):
                break
        else:
            kind, why = "not a regular file", "it is not a file kbench can read"
        shown = f"{kind} (through a link to {os.path.realpath(path)})" if os.path.islink(path) else kind
        raise BadInput(f"is {shown}, not a {what}: {why}", file=str(path),
                       fix="give the path of a regular file" + (" inside it" if stat.S_ISDIR(st.st_mode) else ""))
    return st


def read_bytes(path: str | Path, *, limit: int, what: str = "file", missing_fix: str = "check the path",
               limit_fix: str | None = None, head: bool = False) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them (counted while reading; ``head``: the
    first ``limit`` bytes of a file that may be longer)."""
    before = check_regular(path, what=what, missing_fix=missing_fix)
    too_big = limit_fix or f"give a {what} kbench wrote; no real one is this large"
    if before.st_size > limit and not head:  # a size told is enough to refuse; it is never trusted to accept
        raise BadInput(f"the {what} of {before.st_size:,} bytes is over the limit of {limit:,} bytes",
                       file=str(path), fix=too_big)
    try:
        # O_NONBLOCK: were the path swapped for a FIFO since the check, opening it does not wait for a writer
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise BadInput(f"{what} not found", file=str(path), fix=missing_fix) from None
    except OSError as exc:
        raise BadInput(f"cannot read the {what}: {_why(exc)}", file=str(path), fix=_fix(exc)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino):
            raise BadInput(f"the {what} was replaced while it was being opened", file=str(path),
                           fix="read it again once nothing else is changing it")
        os.set_blocking(fd, True)
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, min(1 << 24, limit + (not head) - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if head and total >= limit:
                break
            if total > limit:
                raise BadInput(f"the {what} is over the limit of {limit:,} bytes (counted while reading it)",
                               file=str(path), fix=too_big)
    except OSError as exc:
        raise BadInput(f"cannot read the {what}: {_why(exc)}", file=str(path), fix=_fix(exc)) from None
    finally:
        os.close(fd)
    return b"".join(chunks)


def read_head(path: str | Path, size: int, *, what: str = "file") -> bytes:
    """The first ``size`` bytes of the regular file ``path`` (to recognise a file's kind without reading it all)."""
    return read_bytes(path, limit=size, what=what, head=True)


def decode_text(raw: bytes, *, file: str | None, what: str = "file", fix: str | None = None) -> str:
    """``raw`` as UTF-8 text (a byte-order mark dropped); otherwise bad input naming the first bad byte."""
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line, column = _line_column(raw, exc.start)
        raise BadInput(f"not UTF-8 text: byte 0x{raw[exc.start]:02x} at offset {exc.start:,} is not valid UTF-8",
                       file=file, where=f"line {line}, column {column}",
                       fix=fix or f"give a {what} kbench wrote (UTF-8 text)") from None


def read_text(path: str | Path, *, limit: int, what: str = "file", missing_fix: str = "check the path",
              limit_fix: str | None = None, fix: str | None = None) -> str:
    """A regular file's UTF-8 text, at most ``limit`` bytes (see :func:`read_bytes`)."""
    return decode_text(read_bytes(path, limit=limit, what=what, missing_fix=missing_fix, limit_fix=limit_fix),
                       file=str(path), what=what, fix=fix)


def read_json(path: str | Path, *, limit: int = MAX_RESULT_BYTES, what: str = "JSON file",
              missing_fix: str = "check the path", fix: str | None = None, damaged_fix: str | None = None) -> Any:
    """A regular file's JSON document, read and parsed with every limit of this module (see
    :func:`parse_json` for ``fix`` and ``damaged_fix``)."""
    before = _version(path)
    text = read_text(path, limit=limit, what=what, missing_fix=missing_fix, fix=fix)
    try:
        return parse_json(text, file=str(path), what=what, fix=fix, damaged_fix=damaged_fix)
    except BadInput as exc:
        if before is None or _version(path) in (None, before):
            raise
        # not "cut short": another process was writing it (its size or time changed while it was read)
        raise BadInput(f"the {what} changed while it was read ({before[0]:,} bytes before, {_version(path)[0]:,} "
                       f"after: another process is writing it?), and what was read is not a whole {what}",
                       file=str(path), where=exc.where,
                       fix="read it again once nothing is writing it (a running `kbench run` finishes its file "
                           "with one atomic rename)") from None


def _version(path: str | Path) -> tuple[int, int] | None:
    """(size, modification time in ns) of ``path``, None where it cannot be seen."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


# -- JSON --------------------------------------------------------------------------------------------------------

class _Refused(ValueError):
    """Raised inside the parser's hooks: the message and the literal to find in the text for its place."""

    def __init__(self, message: str, token: str | None = None) -> None:
        super().__init__(message)
        self.message, self.token = message, token


def _parse_int(text: str) -> int:
    digits = len(text) - (text[0] == "-")
    if digits > MAX_INT_DIGITS:
        raise _Refused(f"an integer of {digits:,} digits (at most {MAX_INT_DIGITS} in a file kbench reads)",
                       text[:40])
    return int(text)


def _parse_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise _Refused(f"{text[:40]} is beyond the range of a number (it reads as infinity); kbench stores a "
                       "missing number as null", text[:40])
    return value


def _parse_constant(name: str) -> Any:
    raise _Refused(f"{name} is not a number JSON allows (kbench stores a missing number as null)", name)


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        key = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise _Refused(f"the key {_short(key)} appears twice in one object (a JSON reader would keep the last "
                       "silently)", json.dumps(key) if len(key) < 200 else None)
    return obj


_DECODER = json.JSONDecoder(object_pairs_hook=_object, parse_int=_parse_int, parse_float=_parse_float,
                            parse_constant=_parse_constant)


def structure_cost(text: str | bytes) -> int:
    """An estimate, erring high, of the bytes of Python objects ``json.loads(text)`` builds, from counts of its
    tokens (each a single pass in C): a non-empty object ~184 bytes, an entry ~48, an array 56 + 8 per item,
    a string 57 + its characters, a number 32. Counted before parsing, so ``[{},{},...]`` (24 bytes of objects
    per 3 of text) is refused before it fills the memory."""
    q, esc = ('"', '\\"') if isinstance(text, str) else (b'"', b'\\"')
    c = (lambda s: text.count(s)) if isinstance(text, str) else (lambda s: text.count(s.encode()))  # noqa: E731
    lbrace, empty_obj, lbrack, empty_list = c("{"), c("{}"), c("["), c("[]")
    strings = (text.count(q) - text.count(esc)) // 2
    keys, commas = c(":"), c(",")
    literals = c("true") + c("false") + c("null")
    values = commas + (lbrace - empty_obj) + (lbrack - empty_list) + 1
    value_strings = max(0, strings - keys)
    numbers = max(0, values - value_strings - lbrace - lbrack - literals)
    return (184 * (lbrace - empty_obj) + 64 * empty_obj + 56 * lbrack + 8 * max(0, values - keys) + 48 * keys
            + 57 * value_strings + 32 * numbers)


def parse_json(text: str, *, file: str | None, what: str = "JSON file", fix: str | None = None,
               damaged_fix: str | None = None, max_depth: int = MAX_DEPTH) -> Any:
    """Parse ``text`` with the limits of this module; bad input names the file, the place and the fix.
    ``fix``: what to do about a file that is not what was expected ("give a result file written by ...");
    ``damaged_fix``: about one that is (it begins like JSON) but is broken or cut short."""
    fix = fix or f"give a {what} kbench wrote"
    cost = structure_cost(text)
    if cost > MAX_EXPANSION * len(text) + MAX_EXPANSION_SLACK:
        raise BadInput(f"its structure would take about {cost / 2**20:,.0f} MiB in memory, {cost / len(text):.0f}x "
                       f"its size (a {what} kbench writes takes 2-6x; refused above {MAX_EXPANSION}x)",
                       file=file, fix=fix)
    try:
        data = _DECODER.decode(text)
    except _Refused as exc:
        where = _locate(text, exc.token)
        raise BadInput(exc.message, file=file, where=where, fix=fix) from None
    except json.JSONDecodeError as exc:
        raise BadInput(*_syntax_error(text, exc, what), file=file, where=f"line {exc.lineno}, column {exc.colno}",
                       fix=fix if text.lstrip()[:1] not in ("{", "[") else (damaged_fix or fix)) from None
    except RecursionError:
        raise BadInput(f"nested too deeply (more than {max_depth} levels)", file=file, fix=fix) from None
    except MemoryError:
        raise BadInput("too large to parse in the memory available", file=file, fix=fix) from None
    problem = check_shape(data, max_depth=max_depth)
    if problem is not None:
        message, path = problem
        raise BadInput(message, file=file, where=path_text(path), fix=fix)
    # the same escape as a worker's replies (kbench.text): a hand-edited "\ud800" or "\u202e" in a case id
    # reaches no record and no screen as it is
    return safe_strings(data) if may_need_escapes(text) else data


def check_shape(data: Any, *, max_depth: int = MAX_DEPTH) -> tuple[str, tuple] | None:
    """(message, JSON path) of the first thing in parsed JSON beyond the limits on depth, string length and
    array length, else None. One walk without recursion; arrays of numbers (samples) are checked in bulk."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        obj, depth = stack.pop()
        if type(obj) is dict:
            if depth > max_depth:
                return _problem(data, max_depth)
            if len(obj) > MAX_ITEMS:
                return _problem(data, max_depth)
            for key, value in obj.items():
                kind = type(value)
                if (type(key) is str and len(key) > MAX_STRING) or (kind is str and len(value) > MAX_STRING):
                    return _problem(data, max_depth)
                if kind is dict or kind is list:
                    stack.append((value, depth + 1))
        elif type(obj) is list:
            if depth > max_depth or len(obj) > MAX_ITEMS:
                return _problem(data, max_depth)
            kinds = set(map(type, obj))
            if str in kinds and max(len(v) for v in obj if type(v) is str) > MAX_STRING:
                return _problem(data, max_depth)
            if dict in kinds or list in kinds:
                stack.extend((v, depth + 1) for v in obj if type(v) is dict or type(v) is list)
        elif type(obj) is str and len(obj) > MAX_STRING:
            return _problem(data, max_depth)
    return None


def _problem(data: Any, max_depth: int) -> tuple[str, tuple]:
    """The first problem :func:`check_shape` saw, found again with its path (the fast walk keeps none)."""
    stack: list[tuple[Any, tuple]] = [(data, ())]
    while stack:
        obj, path = stack.pop()
        if isinstance(obj, (dict, list)) and len(path) >= max_depth:
            return f"nested more than {max_depth} levels deep (a file kbench writes is under 10)", path
        if isinstance(obj, dict):
            if len(obj) > MAX_ITEMS:
                return f"an object of {len(obj):,} keys (at most {MAX_ITEMS:,})", path
            for key, value in obj.items():
                if isinstance(key, str) and len(key) > MAX_STRING:
                    return f"a key of {len(key):,} characters (at most {MAX_STRING:,})", path
                stack.append((value, path + (key,)))
        elif isinstance(obj, list):
            if len(obj) > MAX_ITEMS:
                return f"an array of {len(obj):,} items (at most {MAX_ITEMS:,}; no run takes more samples)", path
            stack.extend((v, path + (i,)) for i, v in enumerate(obj) if isinstance(v, (dict, list, str)))
        elif isinstance(obj, str) and len(obj) > MAX_STRING:
            return (f"a string of {len(obj):,} characters (at most {MAX_STRING:,}: names and reasons are a few "
                    "hundred)", path)
    raise AssertionError("check_shape saw a problem that is not there")  # pragma: no cover


def path_text(path: tuple) -> str:
    """``records[3].stats.median`` for a JSON path; ``(top level)`` for the root."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{_short(part, quote=False)}" if text
                                                           else _short(part, quote=False))
    return text or "(top level)"


def _short(text: str, *, quote: bool = True, keep: int = 60) -> str:
    shown = text if len(text) <= keep else f"{text[:keep]}... ({len(text):,} characters)"
    return repr(shown) if quote else shown


def _line_column(text: str | bytes, pos: int) -> tuple[int, int]:
    nl = "\n" if isinstance(text, str) else b"\n"
    line = text.count(nl, 0, pos) + 1
    return line, pos - (text.rfind(nl, 0, pos) + 1) + 1


def _locate(text: str, token: str | None) -> str | None:
    if not token:
        return None
    pos = text.find(token)
    if pos < 0:
        return None
    line, column = _line_column(text, pos)
    return f"line {line}, column {column}"


def _syntax_error(text: str, exc: json.JSONDecodeError, what: str) -> tuple[str]:
    head = text.lstrip()[:1]
    if head not in ("{", "["):
        # nothing of it is quoted: a file that is not what was expected may be anything (a link to
        # /proc/self/environ quoted the environment's first variable); only its kind is said
        return (f"not a {what}: {_kind_of(text)}" if text.strip() else f"not a {what}: it is empty",)
    if text.rstrip()[-1:] not in ("}", "]"):  # a document that does not end as one: cut short
        return (f"not valid JSON: {exc.msg} (the file ends early: cut short by a copy or a full disk?)",)
    return (f"not valid JSON: {exc.msg}",)


def _kind_of(text: str) -> str:
    """What a text that is not JSON looks like, in words, without quoting any of it."""
    lines = text.count("\n") + 1
    if "\0" in text:
        kind = "binary data (NUL characters; e.g. a file of /proc)"
    elif text.lstrip().startswith("#"):
        kind = "text that begins with a '#' line (Markdown? a script?)"
    elif text.lstrip().startswith(("version:", "name:", "---")):
        kind = "text that begins like YAML (a suite?)"
    else:
        kind = "text that does not begin with { or ["
    return (f"it is not JSON: {kind}, {len(text):,} characters on {lines:,} line{'s' if lines > 1 else ''} "
            "(nothing of it is quoted here)")


# -- OS errors in words ---------------------------------------------------------------------------------------

def _why(exc: OSError) -> str:
    from kbench.outputs import explain

    return explain(exc)[0]


def _fix(exc: OSError) -> str:
    import errno

    if exc.errno in (errno.EACCES, errno.EPERM):
        return "check the file's permissions"
    if exc.errno == errno.ENAMETOOLONG:
        return "give a shorter path"
    if exc.errno == errno.ELOOP:
        return "the path is a loop of symbolic links; give the file itself"
    return "check the path"

