"""Result files: versioned JSON under results/<machine>/, validated on write and read, written atomically.

A run's records go first to an append-only journal beside the file (``.<name>.journal``, one JSON line per
record, fsync'd), so writing stays linear in the run; the JSON file is rewritten at the start, at checkpoints
and at the end (when the journal is folded in and removed). :func:`load_result` folds a journal it finds,
so a run killed at any point reads (and resumes) with everything but the record being written.

Format history (``version``):
  1  draft format: raw samples as integer nanoseconds in ``timing.samples_ns``
  2  current: raw samples in seconds in ``timing.samples``
Older files are migrated on read; newer ones are refused.
"""
from __future__ import annotations

import contextlib
import copy
import datetime as _dt
import json
import os
import reprlib
import secrets
import signal
import threading
import time
import warnings
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

from kbench.errors import BadInput, OutputError
from kbench.record import Record
from kbench.outputs import (atomic_write, current_umask, explain, hold_result_lock, journal_path, output_error,
                            release_result_lock)
from kbench.reader import (MAX_DEPTH, MAX_RESULT_BYTES, MAX_STRING, decode_text, parse_json, path_text, read_bytes,
                           read_json)

if TYPE_CHECKING:  # jsonschema is imported where a file is validated (start-up stays light)
    import jsonschema

RESULT_VERSION = 2
FORMAT = "kbench-result"
JOURNAL_FORMAT = "kbench-journal"

#: a writer rewrites the JSON file after this many journal records, or the number the file holds if larger
#: (so the rewrites add up to at most about twice the final file: linear in the run)...
CHECKPOINT_RECORDS = 100
#: ...or once this many seconds have passed since the last rewrite, and at most this share of the time
CHECKPOINT_SECONDS = 10.0
CHECKPOINT_SHARE = 0.02


def results_root() -> Path:
    """Where result files live: ``$KBENCH_RESULTS``, else ``./results``."""
    return Path(os.environ.get("KBENCH_RESULTS") or "results")


class JournalNote(UserWarning):
    """Something about a result file's journal a reader should know (a torn last line, a stale journal)."""


@lru_cache(maxsize=None)
def result_schema() -> dict[str, Any]:
    return json.loads(resources.files("kbench").joinpath("schemas/result.schema.json").read_text())


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    for rec in data.get("records", []):
        timing = rec.get("timing")
        if timing and "samples_ns" in timing:
            timing["samples"] = [ns * 1e-9 for ns in timing.pop("samples_ns")]
    data["version"] = 2
    return data


#: MIGRATIONS[v] turns a version-v document into version v+1
MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _v1_to_v2}


def migrate(data: dict[str, Any], *, file: str | None = None) -> dict[str, Any]:
    version = data.get("version")
    if not isinstance(version, int):
        raise BadInput("result file has no integer `version`", file=file, where="version",
                       fix="is this a kbench result file? (`kbench run` writes them)")
    if version > RESULT_VERSION:
        raise BadInput(f"result format version {version} is newer than this kbench reads ({RESULT_VERSION})",
                       file=file, where="version", fix="upgrade kbench to read it")
    if version < 1:
        raise BadInput(f"result format version {version} does not exist", file=file, where="version",
                       fix="give a file written by `kbench run`")
    while version < RESULT_VERSION:
        try:  # a migration reads a file not yet validated: a malformed one is bad input, not a crash
            data = MIGRATIONS[version](data)
        except (TypeError, AttributeError, KeyError, ValueError):
            raise BadInput(f"result file of format version {version} is malformed and cannot be migrated",
                           file=file, where="version", fix="give a file written by `kbench run`") from None
        version = data["version"]
    return data


@lru_cache(maxsize=None)
def _validators(plain_samples: bool) -> tuple[jsonschema.Draft202012Validator, jsonschema.Draft202012Validator]:
    """(whole file, one record), built once per process with the schema's ``$ref``s inlined (resolving a
    reference per array item, and building the validator per call, made a file take ~0.5 s).

    ``plain_samples``: ``timing.samples`` is only checked to be an array, for data whose samples
    :func:`_plain_samples` has already checked item by item (a few thousand per record, the bulk of the work)."""
    import jsonschema

    schema = copy.deepcopy(result_schema())
    defs = schema.get("$defs", {})
    if plain_samples:
        defs["record"]["properties"]["timing"]["properties"]["samples"] = {"type": "array"}

    def inline(node: Any, depth: int = 0) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/") and depth < 32:
                return inline(defs[ref.rsplit("/", 1)[1]], depth + 1)
            return {k: inline(v, depth) for k, v in node.items()}
        if isinstance(node, list):
            return [inline(v, depth) for v in node]
        return node

    whole = inline(schema)
    return (jsonschema.Draft202012Validator(whole), jsonschema.Draft202012Validator(whole["$defs"]["record"]))


def _plain_samples(records: Iterable[Any]) -> bool:
    """Every record's ``timing.samples`` (where it is a list) holds only non-negative ints and floats, which is
    what the schema asks of each item; when not, the full schema finds and names the bad one."""
    for rec in records:
        timing = rec.get("timing") if isinstance(rec, dict) else None
        samples = timing.get("samples") if isinstance(timing, dict) else None
        if isinstance(samples, list) and samples:
            if not set(map(type, samples)) <= {float, int} or min(samples) < 0:
                return False
    return True


def _where(error: jsonschema.ValidationError) -> str:
    return path_text(tuple(error.absolute_path))


def schema_message(error: jsonschema.ValidationError) -> str:
    """jsonschema's message, with the offending value shortened (its message quotes the value whole: a
    64 KiB string, or a list of a million samples)."""
    value = error.instance
    if error.validator in ("maxLength", "minLength") and isinstance(value, str):
        return f"a string of {len(value):,} characters (at most {error.validator_value:,})" \
            if error.validator == "maxLength" else "an empty string"
    if error.validator in ("maxItems", "minItems") and isinstance(value, list):
        return f"an array of {len(value):,} items (at most {error.validator_value:,})"
    if len(error.message) <= 300:
        return error.message
    short = reprlib.Repr()
    short.maxstring = short.maxother = 60
    short.maxlist = short.maxdict = short.maxlevel = 4
    shown = short.repr(value)
    return error.message.replace(repr(value), shown) if repr(value) in error.message else error.message[:300] + "..."


def validate(data: dict[str, Any], *, file: str | None = None) -> None:
    records = data.get("records") if isinstance(data, dict) else None
    plain = _plain_samples(records) if isinstance(records, list) else False
    import jsonschema

    error = jsonschema.exceptions.best_match(_validators(plain)[0].iter_errors(data))
    if error is not None:
        raise BadInput(f"invalid result file: {schema_message(error)}", file=file, where=_where(error),
                       fix="the file was edited by hand or by another tool; restore it, or re-run the suite")


def validate_record(record: dict[str, Any], *, file: str | None = None) -> None:
    import jsonschema

    error = jsonschema.exceptions.best_match(_validators(_plain_samples([record]))[1].iter_errors(record))
    if error is not None:
        where = _where(error)
        raise BadInput(f"invalid record for {record.get('backend')} {record.get('case_id')}: {schema_message(error)}",
                       file=file, where="(record)" if where == "(top level)" else where,
                       fix="this is a bug in the backend's plugin or kbench")


#: what to do with a file that is not a result file at all
NOT_A_RESULT = "give a result file written by `kbench run` (results/<machine>/*.json)"
#: ... and with one that was, but is damaged
DAMAGED = "restore it from where it came (a copy cut short?), or re-run the suite to measure it again"


def read_result_json(path: str | Path) -> Any:
    """A result file's JSON through the one reader (:mod:`kbench.reader`): special files refused by type,
    the size, depth, number, string and array limits, duplicate keys refused."""
    return read_json(path, limit=MAX_RESULT_BYTES, what="result file", missing_fix="give the path `kbench run` printed",
                     fix=NOT_A_RESULT, damaged_fix=DAMAGED)


def load_result(path: str | Path) -> dict[str, Any]:
    """Read, migrate and validate a result file, with the records of its journal (a run still writing it,
    or one that was killed) folded in. Every command that reads result files reads them here."""
    path = Path(path)
    data = read_result_json(path)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise BadInput("not a kbench result file (no `format: kbench-result`)", file=str(path), fix=NOT_A_RESULT)
    data = migrate(data, file=str(path))
    fold_journal(path, data)
    validate(data, file=str(path))
    check_unique(data["records"], file=str(path))
    return data


def check_unique(records: list[dict[str, Any]], *, file: str | None = None) -> None:
    """Refuse two records of one (case, backend): every reader pairs records by it and would keep one of the
    two silently (a file edited by hand, or two files merged)."""
    seen: dict[tuple[str, str], int] = {}
    for i, rec in enumerate(records):
        key = (rec["case_id"], rec["backend"])
        first = seen.setdefault(key, i)
        if first != i:
            raise BadInput(f"the same (case, backend) as records[{first}]: {key[1]} {key[0]}",
                           file=file, where=f"records[{i}]",
                           fix="keep one of the two (a run writes each pair once: the file was edited or merged)")


def read_journal(path: Path, token: Any) -> list[tuple[int, dict[str, Any]]]:
    """The (index, record) entries of the journal beside the result file ``path`` that belongs to the file's
    writer ``token``. A journal of another writer (a crash between rewriting the file and starting the new
    journal) is ignored; a torn last line (a kill while it was written) is ignored with a
    :class:`JournalNote`; any other damage is bad input naming the journal's line. Read through the one
    reader: a FIFO or device in its place is refused, its size limited like the file's."""
    jpath = journal_path(path)
    if not os.path.lexists(jpath):
        return []
    raw = read_bytes(jpath, limit=MAX_RESULT_BYTES, what="journal", missing_fix="check the path")
    lines = raw.split(b"\n")
    del raw
    torn = lines.pop()  # b"" when the journal ends with its newline
    header = _journal_line(jpath, lines, 0, quiet=True) if lines else None
    if not isinstance(header, dict) or header.get("format") != JOURNAL_FORMAT or header.get("file") != token \
            or not isinstance(token, str):
        return []
    if torn:
        warnings.warn(f"{jpath}: the last line ({len(torn)} bytes) is cut short (its run was killed while writing "
                      f"it, or is writing it now); that record is not in what was read", JournalNote, stacklevel=4)
    entries = []
    for n in range(1, len(lines)):
        entry = _journal_line(jpath, lines, n)
        lines[n] = b""  # parsed: its text is not needed any more
        if isinstance(entry, dict) and "stopped" in entry and "i" not in entry:
            entries.append((-1, entry))  # why the run stopped, written when the file itself could not be
            continue
        if not (isinstance(entry, dict) and isinstance(entry.get("i"), int) and isinstance(entry.get("record"), dict)):
            raise BadInput("a journal line is not an entry {\"i\": N, \"record\": {...}}", file=str(jpath),
                           where=f"line {n + 1}", fix="the journal was edited; remove it to keep only the JSON file's records")
        entries.append((entry["i"], entry["record"]))
    return entries


def _journal_line(jpath: Path, lines: list[bytes], n: int, *, quiet: bool = False) -> Any:
    """Line ``n`` of a journal, parsed by the one reader (a complete line: damage, not a kill). ``quiet``: a
    line that is not JSON is None (the header of a file that is not a journal at all)."""
    fix = "the journal is damaged; remove it to keep only the JSON file's records"
    try:
        text = decode_text(lines[n], file=str(jpath), what="journal", fix=fix)
        return parse_json(text, file=str(jpath), what="journal line", fix=fix, max_depth=MAX_DEPTH - 2)
    except BadInput as exc:
        if quiet:
            return None
        inner = exc.where or ""  # "line 1, column C" of the line alone: the column is the journal's too
        where = f"line {n + 1}" + (inner[len("line 1"):] if inner.startswith("line 1,") else f" ({inner})" if inner else "")
        raise BadInput(exc.message, file=str(jpath), where=where, fix=fix) from None


def fold_journal(path: Path, data: dict[str, Any]) -> dict[str, Any]:
    """Append to ``data["records"]`` the journal's records the file does not hold yet (in place); a note of
    why the run stopped (written to the journal when the file could not be rewritten: a full disk) becomes
    the file's ``interrupted``."""
    records = data.get("records")
    if not isinstance(records, list):
        return data
    for i, record in read_journal(Path(path), data.get("journal")):
        if i == -1:
            if not data.get("complete") and not data.get("interrupted") and isinstance(record.get("stopped"), str):
                data["interrupted"] = record["stopped"]
            continue
        if i < len(records):
            continue  # already in the file (a checkpoint was written after it)
        if i > len(records):
            raise BadInput(f"the journal skips from record {len(records)} to {i}", file=str(journal_path(Path(path))),
                           fix="the journal is damaged; remove it to keep only the JSON file's records")
        records.append(record)
    return data


def journal_write(fd: int, data: bytes) -> None:
    """Append ``data`` to the open journal ``fd`` and sync it to the disk."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.fdatasync(fd)  # the data and the file's new size; not its times


def atomic_write_json(path: Path, data: Any) -> None:
    """Write to a temporary file beside ``path``, fsync, then rename over it: readers never see half a file.
    The file gets the umask's permissions, like any file the user makes. A result file is written with its
    header indented and one record per line (each encoded once by its writer, see :class:`Records`)."""
    atomic_write(Path(path), lambda fh: fh.writelines(_json_chunks(data)))


def encode_record(record: dict[str, Any]) -> str:
    """A record as one line of JSON (NaN refused: :func:`sanitize` first)."""
    return json.dumps(record, allow_nan=False, default=_json_default, separators=(",", ":"))


class Records(list):
    """A result's records with their JSON text (``texts``), encoded once for the journal and every rewrite."""

    def __init__(self, records: Iterable[dict[str, Any]] = ()) -> None:
        super().__init__(records)
        self.texts = [encode_record(r) for r in self]


def _json_chunks(data: Any) -> Iterable[str]:
    records = data.get("records") if isinstance(data, dict) and data.get("format") == FORMAT else None
    if not isinstance(records, list):
        yield json.dumps(data, indent=1, allow_nan=False, default=_json_default)
        return
    texts = getattr(records, "texts", None)
    if not isinstance(texts, list) or len(texts) != len(records):
        texts = [encode_record(r) for r in records]
    head = json.dumps({k: v for k, v in data.items() if k != "records"}, indent=1, allow_nan=False,
                      default=_json_default)
    yield head[:-2] + ',\n "records": [' if len(head) > 2 else '{\n "records": ['
    for i, text in enumerate(texts):
        yield ("\n  " if i == 0 else ",\n  ") + text
    yield "\n ]\n}\n" if texts else "]\n}\n"


def _json_default(obj: Any) -> Any:
    import numpy as np

    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, (set, tuple)):
        return list(obj)
    return str(obj)


def sanitize(obj: Any) -> Any:
    """JSON has no NaN or Infinity: store them as null. A string longer than every reader takes
    (:data:`kbench.reader.MAX_STRING`: an exception's message of megabytes) is cut, saying so, so that kbench
    never writes a file it refuses to read."""
    import math

    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, str):
        return obj if len(obj) <= MAX_STRING else f"{obj[:MAX_STRING - 64]}... ({len(obj):,} characters, cut)"
    if isinstance(obj, dict):
        return {k: sanitize(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        if obj and set(map(type, obj)) == {float} and math.isfinite(sum(obj)):
            return list(obj)  # timing samples: thousands of finite floats, checked in C (a NaN or inf sums to one)
        return [sanitize(v) for v in obj]
    return obj


def unmeasured_note(records: list[dict[str, Any]]) -> str | None:
    """Why a finished run is not complete when the environment, not a backend, failed some records
    (``cause: infrastructure``); None when every record is a measurement."""
    spoiled = [r for r in records if r.get("cause") == "infrastructure"]
    if not spoiled:
        return None
    reason = str(spoiled[0].get("reason") or "no reason given").splitlines()[0][:300]
    return (f"{len(spoiled)} of {len(records)} records could not be measured because the environment failed "
            f"(not the backends), e.g. {spoiled[0].get('backend')}: {reason}")


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM while a file is being finished (in the main thread; elsewhere signals do not
    arrive), then deliver them to the handlers that were there: a signal no longer cuts the last rewrite short,
    and the command still ends as that signal says (130, 143)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    old: dict[int, Any] = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            old[sig] = signal.signal(sig, lambda signum, frame: caught.append(signum))
        except (ValueError, OSError):  # pragma: no cover - not the main interpreter
            pass
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        for sig in dict.fromkeys(caught):
            signal.raise_signal(sig)


class ResultWriter:
    """A result file being written: each record is appended to the journal (one fsync'd line), and the file
    rewritten atomically at the start, at checkpoints and at :meth:`finish`, which folds the journal in.

    Checkpoints come after ``checkpoint_records`` journal records (or as many as the file already holds, so
    rewriting stays linear in the run) or ``checkpoint_seconds`` after the last one (at most
    :data:`CHECKPOINT_SHARE` of the time), so a reader of the bare JSON sees progress too.
    The writer owns its file: it holds the file's lock (:func:`kbench.outputs.hold_result_lock`; the one
    ``plan_run`` took, else a new one) until :meth:`finish`, so a second run on the same file is refused.
    A failed write raises :class:`~kbench.errors.OutputError` saying what the file still holds.
    """

    def __init__(self, path: Path, header: dict[str, Any], records: Iterable[dict[str, Any]] = (), *,
                 checkpoint_records: int = CHECKPOINT_RECORDS, checkpoint_seconds: float = CHECKPOINT_SECONDS
                 ) -> None:
        self.path = Path(path)
        # a new journal id per writer: a journal another writer of this path left is never folded in
        header = sanitize(header)
        hardware = header.get("hardware")
        if isinstance(hardware, dict):  # a rate nobody knows is absent (readers divide by the ones present)
            for key in ("peak_flops", "measured_flops"):
                if isinstance(hardware.get(key), dict):
                    hardware[key] = {k: v for k, v in hardware[key].items() if v is not None}
        self.data = {"format": FORMAT, "version": RESULT_VERSION, **header, "complete": False,
                     "journal": secrets.token_hex(8), "records": Records(records)}
        self.data.setdefault("created", now_iso())
        #: records the file on disk holds, journal included (what a failed write leaves)
        self.written: int | None = None
        self.checkpoint_records = max(1, int(checkpoint_records))
        self.checkpoint_seconds = float(checkpoint_seconds)
        self._fd: int | None = None
        self._journal_size = 0      # bytes of complete lines in the journal
        self._in_file = 0           # records the JSON file holds
        self._last_checkpoint = time.monotonic()
        self._checkpoint_cost = 0.0
        hold_result_lock(self.path)
        validate(self.data, file=str(self.path))  # every record once; after this each is checked as appended
        self.flush(full=True)

    def append(self, record: dict[str, Any] | Record) -> None:
        if isinstance(record, Record):
            record = record.to_json()
        record = sanitize(record)
        validate_record(record, file=str(self.path))  # one record, not the whole file: appends stay O(1)
        text = encode_record(record)
        records = self.data["records"]
        line = f'{{"i":{len(records)},"record":{text}}}\n'.encode()
        records.append(record)
        records.texts.append(text)
        try:
            journal_write(self._journal(), line)
        except OSError as exc:
            self._cut_journal()
            raise self._stopped(exc) from None
        self._journal_size += len(line)
        self.written = len(self.data["records"])
        if self._checkpoint_due():
            self.flush()

    def finish(self, *, interrupted: str | None = None, extra: dict[str, Any] | None = None) -> None:
        """Mark the file complete (or interrupted), merge ``extra`` into the header, write it with every record
        (the journal folded in and removed), release the lock.

        A file some of whose records are ``cause: infrastructure`` (the environment failed: a worker that could
        not start, no sandbox, the file-size limit) is not complete: those are not measurements, and
        ``kbench run --resume`` measures them again once the environment is fixed (``interrupted`` says so).
        Ctrl-C or SIGTERM while the file is written is held until it is written, then delivered."""
        note = unmeasured_note(self.data["records"]) if interrupted is None else None
        if note:
            interrupted = f"{note}; once fixed, measure them with: kbench run --resume {self.path}"
        self.data["complete"] = interrupted is None
        self.data["interrupted"] = interrupted
        self.data.update(extra or {})
        with signals_held():
            try:
                self.flush(full=True)
                self._close_journal(remove=True)
            finally:
                self._close_journal(remove=False)
                release_result_lock(self.path)

    def flush(self, *, full: bool = False) -> None:
        """Rewrite the JSON file with every record (a checkpoint) and start the journal again."""
        self.data["updated"] = now_iso()
        if full:  # the header: the records were validated as they came in
            validate({**self.data, "records": []}, file=str(self.path))
        start = time.monotonic()
        try:
            atomic_write_json(self.path, self.data)
        except OSError as exc:
            raise self._stopped(exc) from None
        self.written = self._in_file = len(self.data["records"])
        try:  # the file holds every record now: the journal's entries are below its count, and skipped on read
            self._restart_journal()
        except OSError as exc:
            raise self._stopped(exc) from None
        self._last_checkpoint = time.monotonic()
        self._checkpoint_cost = self._last_checkpoint - start

    def _checkpoint_due(self) -> bool:
        pending = len(self.data["records"]) - self._in_file
        if pending >= max(self.checkpoint_records, self._in_file):
            return True
        since = time.monotonic() - self._last_checkpoint
        return since >= max(self.checkpoint_seconds, self._checkpoint_cost / CHECKPOINT_SHARE)

    # -- the journal ------------------------------------------------------------------------------

    def _journal(self) -> int:
        if self._fd is None:
            self._restart_journal()
        assert self._fd is not None
        return self._fd

    def _restart_journal(self) -> None:
        """An empty journal (its header line only) for this writer's file."""
        header = json.dumps({"format": JOURNAL_FORMAT, "file": self.data["journal"]}).encode() + b"\n"
        if self._fd is None:
            self._fd = os.open(journal_path(self.path), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666 & ~current_umask())
        os.ftruncate(self._fd, 0)
        self._journal_size = 0
        journal_write(self._fd, header)
        self._journal_size = len(header)

    def _cut_journal(self) -> None:
        """After a failed append: drop a partly written line, so the journal ends with a whole one."""
        if self._fd is not None:
            try:
                os.ftruncate(self._fd, self._journal_size)
            except OSError:
                pass  # a reader ignores a torn last line anyway

    def _close_journal(self, *, remove: bool) -> None:
        if self._fd is None:
            return
        if remove:
            try:
                os.unlink(journal_path(self.path))
            except OSError:
                pass  # its entries are all in the file now: a reader skips them
        os.close(self._fd)
        self._fd = None

    def _stopped(self, exc: OSError) -> OutputError:
        """The error that stops the run; first, where the journal still takes a line (the free end of its last
        block, even on a full disk), why the run stopped: readers show it as the file's ``interrupted``."""
        error = self._write_error(exc)
        if self._fd is not None and self._journal_size:
            why, _ = explain(exc)
            line = json.dumps({"stopped": f"cannot write the result file: {why}"}).encode() + b"\n"
            try:
                journal_write(self._fd, line)
                self._journal_size += len(line)
            except OSError:
                self._cut_journal()  # nothing more can be written: readers say "still running or killed"
        return error

    def _write_error(self, exc: OSError) -> OutputError:
        if self.written is None and not self.path.exists():
            kept = "nothing was measured yet and nothing was written"
            return output_error(self.path, exc, what="cannot write the result file",
                                kept=kept + "; fix it and run again")
        held = "the records" if self.written is None else f"the {self.written} records written before"
        kept = (f"the file still holds {held} this failure (valid, marked incomplete); "
                f"once fixed, finish the run with: kbench run --resume {self.path}")
        return output_error(self.path, exc, what="cannot write the result file", kept=kept)

    @property
    def records(self) -> list[dict[str, Any]]:
        return self.data["records"]
