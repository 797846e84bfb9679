"""The lineage store: one directory per lineage, every write atomic, so a kill never loses a commit.

Layout of ``<workspace>/<name>/``::

    lineage.json            name, created, seed path, first suite (written once, at init)
    suites/                 every suite the lineage was measured on, copied by content (``<sha>-<name>``),
                            so runs work from any directory and a later edit of the original changes nothing
    versions/v0001/         one directory per committed version, created by an atomic rename
        kernel.py           the full source
        version.json        scores per case, geomean, parent, operator, rationale, suite, timestamps
    attempts.jsonl          append-only: every candidate tried and why it was (not) committed
    state.json              the operator run in progress (budgets spent, conversation), for ``resume``
    memory.md               the agent's persistent notes
    candidates/             scratch files of candidates being measured
    runs/                   the kbench result files behind every score (evidence), each moved here when complete
    runs/.in-flight/        one directory per kbench run in progress (its result file, journal and lock)
    trajectories/           one JSONL per agent variation: every message and tool call
    .run.lock               held (flock) by the process that measures: its pid and a heartbeat

The champion is always the newest version: a version is only committed when it beats the previous
newest one (or, for ``transfer``, when the lineage moves to a new suite), so there is no pointer to
update and nothing to get out of step.

One process at a time measures a lineage (:meth:`Lineage.hold`). What a killed one leaves (half-made
version directories, unfinished kbench runs) is removed by the next holder, which also reads from the
lock file when the killed one was last alive, so the time it spent is counted.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import tempfile
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from kbench.api import (BadInput, atomic_write, atomic_write_json, check_output_dir, now_iso, parse_json, read_json,
                        read_text)

#: largest lineage file read (version.json, lineage.json), and the largest that grows with a run (state.json
#: with the agent's conversation, attempts.jsonl, memory.md); kernel sources as kbench reads suites
META_BYTES = 16 * 2**20
LOG_BYTES = 256 * 2**20

#: the agent's notes (memory.md) are kept within this many bytes: the oldest notes are dropped first
MEMORY_BYTES = 256 * 1024

VERSION_DIR = re.compile(r"^v(\d{4,})$")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
#: the lock a measuring process holds, and the directory of its kbench runs in progress
RUN_LOCK = ".run.lock"
IN_FLIGHT = ".in-flight"
#: seconds between heartbeats of the holder (the most run time a SIGKILL can leave uncounted)
HEARTBEAT = 0.5
#: the lock file's size: each heartbeat rewrites it whole, so a reader never meets the tail of an older one
LOCK_BYTES = 256


def workspace_root(explicit: str | Path | None = None) -> Path:
    """``--workspace``, else ``KBENCH_EVOLVE_DIR``, else ``./evolve``."""
    return Path(explicit or os.environ.get("KBENCH_EVOLVE_DIR") or "evolve")


def atomic_write_text(path: Path, text: str) -> None:
    """``text`` into ``path`` through the core's atomic write (temporary file, fsync, rename)."""
    atomic_write(path, lambda fh: fh.write(text))


def append_jsonl(path: Path, entry: dict[str, Any]) -> None:
    """Append one line and fsync; a kill mid-write leaves at most one torn last line, skipped on read."""
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(entry, default=str, allow_nan=False) + "\n"
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())


def bounded_memory(text: str, limit: int = MEMORY_BYTES) -> str:
    """``text`` (notes, each starting ``- `` on a line) within ``limit`` UTF-8 bytes: the oldest notes dropped."""
    if len(text.encode("utf-8", "replace")) <= limit:
        return text
    notes = text.split("\n- ")
    size = 0
    kept: list[str] = []
    for note in reversed(notes):
        size += len(note.encode("utf-8", "replace")) + 3
        if size > limit:
            break
        kept.insert(0, note)
    out = "\n- ".join(kept)
    return out if out.startswith("- ") else "- " + out if out else ""


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every line of a JSONL log, through the core's reader (its limits: a FIFO or device is refused by type);
    a line that is not JSON (torn by a kill mid-append) is skipped."""
    if not os.path.lexists(path):
        return []
    out = []
    for line in read_text(path, limit=LOG_BYTES, what="log").splitlines():
        try:
            entry = parse_json(line, file=str(path), what="log line")
        except BadInput:
            continue  # a torn line from a kill mid-append
        if isinstance(entry, dict):  # a line that is JSON but no entry (a number, a list) is no attempt either
            out.append(entry)
    return out


@dataclass(frozen=True)
class Version:
    number: int
    path: Path
    meta: dict[str, Any]

    @property
    def label(self) -> str:
        return f"v{self.number}"

    @property
    def kernel_path(self) -> Path:
        return self.path / "kernel.py"

    @property
    def source(self) -> str:
        return read_text(self.kernel_path, limit=META_BYTES, what="kernel source")

    @property
    def geomean(self) -> float:
        return float(self.meta.get("geomean") or 0.0)

    @property
    def scores(self) -> dict[str, float]:
        return dict(self.meta.get("scores") or {})


class Lineage:
    """One lineage on disk. Cheap to open; every read goes to the files."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.name = self.root.name

    # -- creation ---------------------------------------------------------------------------

    @classmethod
    def create(cls, workspace: Path, name: str, *, seed: Path, suite_path: str) -> Lineage:
        if not NAME_RE.match(name):
            raise BadInput(f"bad lineage name {name!r}", where="NAME",
                           fix="use letters, digits, '_', '-', '.' (it becomes the backend evolved:NAME)")
        root = Path(workspace) / name
        if (root / "lineage.json").exists():
            raise BadInput(f"lineage {name!r} already exists", file=str(root),
                           fix=f"pick another name, continue it with `kbench evolve run {name}`, or delete {root}")
        check_output_dir(Path(workspace), option="--workspace")  # the one rule of output paths: no device, pipe...
        check_output_dir(root, option="NAME")
        lineage = cls(root)
        stored = lineage.adopt_suite(suite_path)
        atomic_write_json(root / "lineage.json", {"format": "kbench-evolve-lineage", "version": 1, "name": name,
                                                 "created": now_iso(), "seed": str(Path(seed).resolve()),
                                                 "suite": stored, "suite_origin": str(Path(suite_path).resolve())})
        return lineage

    def adopt_suite(self, path: str | Path) -> str:
        """Copy a suite file into the lineage (named by its content); returns the stored path, relative to
        the lineage, as versions record it."""
        import hashlib

        text = read_text(path, limit=META_BYTES, what="suite file")
        name = f"{hashlib.sha256(text.encode()).hexdigest()[:12]}-{Path(path).name}"
        target = self.root / "suites" / name
        if not target.is_file():
            atomic_write_text(target, text)
        return f"suites/{name}"

    def suite_path(self, stored: str) -> Path:
        """A suite as a version recorded it: a copy in the lineage (relative), or, for lineages made before
        suites were copied, the path as given at the time."""
        p = Path(stored)
        return p if p.is_absolute() or not (self.root / p).is_file() else self.root / p

    @classmethod
    def open(cls, workspace: Path, name: str) -> Lineage:
        root = Path(workspace) / name
        if not (root / "lineage.json").is_file():
            known = ", ".join(sorted(p.name for p in list_lineages(workspace))) or "none"
            raise BadInput(f"no lineage {name!r} in {workspace}", where="NAME",
                           fix=f"create it with `kbench evolve init {name} --seed FILE --suite SUITE` "
                               f"(lineages here: {known}; set KBENCH_EVOLVE_DIR or --workspace for another place)")
        return cls(root)

    @contextmanager
    def hold(self) -> Iterator[RunLease]:
        """This process measures the lineage: an exclusive ``flock`` on ``.run.lock`` (the kernel drops it
        when the process ends, however it ends), refused naming the holder when another process has it.

        Holding it, nothing else writes versions or kbench runs, so what is there of either was left by a
        killed process and is removed (:meth:`clean_leftovers`). The lock file keeps the holder's heartbeat
        (:class:`RunLease`); ``lease.previous`` is the last one of the process before.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / RUN_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_lock(fd) or {}
            os.close(fd)
            since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder["started"])) if holder.get("started") else "?"
            raise BadInput(f"lineage {self.name!r} is being measured by another process (pid {holder.get('pid', '?')}, "
                           f"since {since})", file=str(self.root / RUN_LOCK),
                           fix="wait until it ends, or stop it (Ctrl-C; `kbench evolve resume` continues its run)") from None
        except BaseException:
            os.close(fd)
            raise
        lease = RunLease(fd, previous=_read_lock(fd))
        try:
            self.clean_leftovers()
            lease.start()
            yield lease
        finally:
            lease.release()

    def clean_leftovers(self) -> None:
        """Remove what a killed process left: version directories made before their rename, and its unfinished
        kbench runs (result files, journals and locks under ``runs/.in-flight``). Only the holder of
        :meth:`hold` may call this: another process could be writing them."""
        vdir = self.root / "versions"
        if vdir.is_dir():
            for p in vdir.iterdir():
                if p.name.startswith(".tmp-"):
                    shutil.rmtree(p, ignore_errors=True)
        shutil.rmtree(self.root / "runs" / IN_FLIGHT, ignore_errors=True)

    def holder(self) -> dict[str, Any] | None:
        """The last heartbeat in the lock file: ``pid``, ``token``, ``started`` and ``alive`` (Unix seconds),
        ``ended`` (false while it runs, and for ever when it was killed); None when nobody held the lineage."""
        try:
            fd = os.open(self.root / RUN_LOCK, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            return _read_lock(fd)
        finally:
            os.close(fd)

    @property
    def meta(self) -> dict[str, Any]:
        return read_json(self.root / "lineage.json", limit=META_BYTES, what="lineage file")

    # -- versions ---------------------------------------------------------------------------

    def versions(self) -> list[Version]:
        vdir = self.root / "versions"
        out = []
        if vdir.is_dir():
            for p in vdir.iterdir():
                m = VERSION_DIR.match(p.name)
                if m and (p / "version.json").is_file():
                    out.append(Version(int(m.group(1)), p, read_json(p / "version.json", limit=META_BYTES,
                                                                     what="version file")))
        return sorted(out, key=lambda v: v.number)

    def version(self, ref: str | int | None = None) -> Version:
        """``None``/"best"/"latest" is the champion; ``3``, ``"v3"``, ``"@v3"`` a given one."""
        versions = self.versions()
        if not versions:
            raise BadInput(f"lineage {self.name!r} has no versions yet", fix="run `kbench evolve init` again")
        if ref in (None, "", "best", "latest", "champion"):
            return versions[-1]
        text = str(ref).lstrip("@").lstrip("v")
        if not re.fullmatch(r"[0-9]{1,9}", text):  # ASCII digits only ("²" is a digit to str.isdigit, not to int)
            raise BadInput(f"bad version {ref!r}", where="VERSION", fix="write it as v3 or 3")
        for v in versions:
            if v.number == int(text):
                return v
        raise BadInput(f"lineage {self.name!r} has no version {ref}",
                       fix=f"versions: {', '.join(v.label for v in versions)}")

    def champion(self) -> Version:
        return self.version(None)

    def current_suite(self) -> str:
        """The suite the champion is measured on: a path to the lineage's own copy."""
        versions = self.versions()
        return str(self.suite_path(versions[-1].meta["suite"] if versions else self.meta["suite"]))

    def current_suite_record(self) -> str:
        """The champion's suite as versions record it (``suites/<sha>-<name>``)."""
        versions = self.versions()
        return versions[-1].meta["suite"] if versions else self.meta["suite"]

    def commit(self, source: str, meta: dict[str, Any]) -> Version:
        """Write a new version: a temporary directory renamed into place (atomic on one filesystem)."""
        vdir = self.root / "versions"
        vdir.mkdir(parents=True, exist_ok=True)
        number = (self.versions()[-1].number + 1) if self.versions() else 1
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=vdir))
        meta = {**meta, "number": number, "committed": now_iso()}
        atomic_write_text(tmp / "kernel.py", source)
        atomic_write_json(tmp / "version.json", meta)
        final = vdir / f"v{number:04d}"
        os.rename(tmp, final)  # fails if a concurrent commit took the number: never overwrites
        _fsync_dir(vdir)
        return Version(number, final, meta)

    # -- attempts, state, memory ------------------------------------------------------------

    @property
    def attempts_path(self) -> Path:
        return self.root / "attempts.jsonl"

    def log_attempt(self, entry: dict[str, Any]) -> None:
        append_jsonl(self.attempts_path, {"time": now_iso(), **entry})

    def attempts(self) -> list[dict[str, Any]]:
        return read_jsonl(self.attempts_path)

    def load_state(self) -> dict[str, Any] | None:
        path = self.root / "state.json"
        return read_json(path, limit=LOG_BYTES, what="state file") if os.path.lexists(path) else None

    def save_state(self, state: dict[str, Any] | None) -> None:
        path = self.root / "state.json"
        if state is None:
            path.unlink(missing_ok=True)
        else:
            atomic_write_json(path, {**state, "saved": now_iso()})

    @property
    def memory_path(self) -> Path:
        return self.root / "memory.md"

    def read_memory(self) -> str:
        """The notes, at most the newest :data:`MEMORY_BYTES` of them: a larger file (written by hand, or by an
        older kbench without the bound) is read from its end, never refused, so it cannot make the lineage unusable."""
        path = self.memory_path
        if not os.path.lexists(path):
            return ""
        if not path.is_file():
            raise BadInput(f"{path} is not a regular file", file=str(path), fix="remove it")
        with open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - MEMORY_BYTES))
            data = fh.read(MEMORY_BYTES)
        text = data.decode("utf-8", "replace")
        if size > MEMORY_BYTES:  # from the first whole note on
            cut = text.find("\n- ")
            text = text[cut + 1:] if cut >= 0 else ""
        return text

    def write_memory(self, text: str) -> None:
        atomic_write_text(self.memory_path, bounded_memory(text))

    def append_memory(self, note: str) -> bool:
        """Add one note (``- note``); the oldest notes are dropped while the file would exceed :data:`MEMORY_BYTES`
        (True when some were)."""
        whole = self.read_memory() + f"- {note.strip()}\n"
        text = bounded_memory(whole)
        atomic_write_text(self.memory_path, text)
        return len(text) < len(whole)

    def scratch(self, sub: str) -> Path:
        p = self.root / sub
        p.mkdir(parents=True, exist_ok=True)
        return p


class RunLease:
    """The lineage held by this process (:meth:`Lineage.hold`). A daemon thread rewrites the lock file every
    :data:`HEARTBEAT` seconds with the time (``alive``), and ``ended: true`` at the end, so the next holder knows
    whether the process before ended or was killed, and until when it ran."""

    def __init__(self, fd: int, previous: dict[str, Any] | None) -> None:
        self.fd = fd
        self.previous = previous
        self.token = uuid.uuid4().hex[:12]
        self.started = time.time()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        os.ftruncate(self.fd, LOCK_BYTES)
        self.beat()
        self._thread = threading.Thread(target=self._beat_on, name="evolve-heartbeat", daemon=True)
        self._thread.start()

    def beat(self, *, ended: bool = False) -> None:
        data = json.dumps({"pid": os.getpid(), "token": self.token, "started": round(self.started, 3),
                           "alive": round(time.time(), 3), "ended": ended}).encode()
        os.pwrite(self.fd, data.ljust(LOCK_BYTES), 0)

    def _beat_on(self) -> None:
        while not self._stop.wait(HEARTBEAT):
            try:
                self.beat()
            except OSError:  # the lineage was removed (a failed init): nothing left to keep alive
                return

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            try:
                self.beat(ended=True)
            except OSError:
                pass
        os.close(self.fd)  # drops the flock


def _read_lock(fd: int) -> dict[str, Any] | None:
    try:
        text = os.pread(fd, LOCK_BYTES, 0).decode("utf-8", "replace").strip()
        data = json.loads(text) if text else None
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def list_lineages(workspace: Path) -> Iterator[Lineage]:
    ws = Path(workspace)
    if not ws.is_dir():
        return
    for p in sorted(ws.iterdir()):
        if (p / "lineage.json").is_file():
            yield Lineage(p)


def lineage_histories(workspace: Path) -> list[Any]:
    """The lineages of a workspace as the core's history site draws them (``kbench.api.LineageHistory``):
    each committed version's scores and the result file that measured it; [] when it holds none."""
    from kbench.api import LineageHistory, LineageVersion

    out = []
    for lineage in list_lineages(workspace):
        versions = []
        for v in lineage.versions():
            files = v.meta.get("result_files") or []
            versions.append(LineageVersion(v.number, str(v.meta.get("committed") or ""),
                                           str(v.meta.get("operator") or ""), str(v.meta.get("rationale") or ""),
                                           v.geomean, v.scores, result_file=files[0] if files else None))
        out.append(LineageHistory(lineage.name, lineage.root, versions, len(lineage.attempts())))
    return out
