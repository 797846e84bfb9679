"""Result files: versioned JSON under results/<machine>/, validated on write and read, written atomically.

Format history (``version``):
  1  draft format: raw samples as integer nanoseconds in ``timing.samples_ns``
  2  current: raw samples in seconds in ``timing.samples``
Older files are migrated on read; newer ones are refused.
"""
from __future__ import annotations

import datetime as _dt
import json
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Iterable

import jsonschema

from kbench.errors import BadInput, OutputError
from kbench.outputs import atomic_write, hold_result_lock, output_error, release_result_lock
from kbench.yamlsource import MAX_DEPTH

RESULT_VERSION = 2
FORMAT = "kbench-result"


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


def validate(data: dict[str, Any], *, file: str | None = None) -> None:
    validator = jsonschema.Draft202012Validator(result_schema())
    error = jsonschema.exceptions.best_match(validator.iter_errors(data))
    if error is not None:
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path).lstrip(".")
        raise BadInput(f"invalid result file: {error.message}", file=file, where=where or "(top level)",
                       fix="the file was edited or truncated by hand; re-run the suite to regenerate it")


def validate_record(record: dict[str, Any], *, file: str | None = None) -> None:
    schema = {**result_schema()["$defs"]["record"], "$defs": result_schema()["$defs"]}
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(record))
    if error is not None:
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path).lstrip(".")
        raise BadInput(f"invalid record for {record.get('backend')} {record.get('case_id')}: {error.message}",
                       file=file, where=where or "(record)", fix="this is a bug in the backend's plugin or kbench")


def load_result(path: str | Path) -> dict[str, Any]:
    """Read, migrate and validate a result file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BadInput("result file not found", file=str(path), fix="give the path `kbench run` printed") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"cannot read result file: {exc}", file=str(path), fix="check permissions") from None
    try:
        data = json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise BadInput(f"not valid JSON: {exc.msg}", file=str(path), where=f"line {exc.lineno}, column {exc.colno}",
                       fix="the file is damaged; re-run the suite") from None
    except _NonFinite as exc:
        raise BadInput(f"{exc.args[0]} is not a number JSON allows (kbench stores a missing number as null)",
                       file=str(path), fix="the file was edited by hand or by another tool; re-run the suite") from None
    except RecursionError:
        raise BadInput("nested too deeply to be a result file", file=str(path),
                       fix="give a file written by `kbench run`") from None
    depth = _depth(data)
    if depth > MAX_DEPTH:
        raise BadInput(f"nested {depth} levels deep; a result file is at most {MAX_DEPTH}", file=str(path),
                       fix="give a file written by `kbench run`")
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise BadInput("not a kbench result file (no `format: kbench-result`)", file=str(path),
                       fix="give a file written by `kbench run`")
    data = migrate(data, file=str(path))
    validate(data, file=str(path))
    return data


class _NonFinite(ValueError):
    pass


def _refuse_constant(name: str) -> Any:
    raise _NonFinite(name)


def _depth(data: Any) -> int:
    """Nesting depth of parsed JSON, without recursion."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        obj, d = stack.pop()
        if isinstance(obj, (dict, list)):
            deepest = max(deepest, d)
            if d <= MAX_DEPTH:  # beyond the limit the answer is already "too deep"
                stack.extend((v, d + 1) for v in (obj.values() if isinstance(obj, dict) else obj))
    return deepest


def atomic_write_json(path: Path, data: Any) -> None:
    """Write to a temporary file beside ``path``, fsync, then rename over it: readers never see half a file.
    The file gets the umask's permissions, like any file the user makes."""
    atomic_write(Path(path), lambda fh: json.dump(data, fh, indent=1, allow_nan=False, default=_json_default))


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
    """JSON has no NaN or Infinity: store them as null."""
    import math

    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: sanitize(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [sanitize(v) for v in obj]
    return obj


class ResultWriter:
    """A result file being written: every record is appended and the file rewritten atomically.

    The writer owns its file: it holds the file's lock (:func:`kbench.outputs.hold_result_lock`; the one
    ``plan_run`` took, else a new one) until :meth:`finish`, so a second run on the same file is refused.
    A failed write raises :class:`~kbench.errors.OutputError` saying what the file still holds.
    """

    def __init__(self, path: Path, header: dict[str, Any], records: Iterable[dict[str, Any]] = ()) -> None:
        self.path = Path(path)
        self.data = {"format": FORMAT, "version": RESULT_VERSION, **header, "complete": False,
                     "records": list(records)}
        self.data.setdefault("created", now_iso())
        #: records the file on disk holds (what a failed write leaves)
        self.written: int | None = None
        hold_result_lock(self.path)
        self.flush(full=True)

    def append(self, record: dict[str, Any]) -> None:
        record = sanitize(record)
        validate_record(record, file=str(self.path))  # one record, not the whole file: appends stay O(1)
        self.data["records"].append(record)
        self.flush()

    def finish(self, *, interrupted: str | None = None, extra: dict[str, Any] | None = None) -> None:
        """Mark the file complete (or interrupted), merge ``extra`` into the header, write it, release the lock."""
        self.data["complete"] = interrupted is None
        self.data["interrupted"] = interrupted
        self.data.update(extra or {})
        try:
            self.flush(full=True)
        finally:
            release_result_lock(self.path)

    def flush(self, *, full: bool = False) -> None:
        self.data["updated"] = now_iso()
        if full:
            validate(self.data, file=str(self.path))
        try:
            atomic_write_json(self.path, self.data)
        except OSError as exc:
            raise self._write_error(exc) from None
        self.written = len(self.data["records"])

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
