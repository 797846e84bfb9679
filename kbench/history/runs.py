"""The runs of a history: result files found under directories, read once, reduced to what a history needs.

A result file holds every raw sample; a history of a thousand runs cannot keep them all in memory, so
each file is read through ``kbench.results.load_result`` (migration and validation included) and
reduced at once to one ``Point`` per passed record: median, its confidence interval, sample count.
Runs are ordered by the date of their git commit (asv's order) where the commit is known to the
repository, else by the time the run started.
"""
from __future__ import annotations

import datetime as _dt
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from kbench.enums import Status
from kbench.errors import BadInput
from kbench.record import records_of
from kbench.reader import read_head, read_json
from kbench.results import FORMAT, load_result

#: machine description keys that name the host rather than describe the hardware
_MACHINE_NOT_HARDWARE = {"id", "hostname"}
#: environment keys that change with every run or say where, not what
_ENV_NOT_SOFTWARE = {"git_commit", "executable"}


@dataclass(frozen=True)
class Point:
    """One passed record of one run, reduced: the median time and its 95% confidence interval."""

    op: str
    case_id: str
    case: Mapping[str, Any]
    backend: str
    median: float
    ci_low: float
    ci_high: float
    n: int
    min: float


@dataclass
class Run:
    """One result file, reduced to its header and one ``Point`` per passed record."""

    path: Path
    id: str
    machine_id: str
    device: str
    suite: str
    created: _dt.datetime
    commit: str | None            # the git commit of the measured tree, ``-dirty`` removed
    dirty: bool
    complete: bool
    environment: dict[str, str]   # software and hardware that explain a step (see ``environment_of``)
    points: list[Point]
    statuses: dict[str, int]
    commit_time: _dt.datetime | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def time(self) -> _dt.datetime:
        """Where the run stands in its history: its commit's date, else when it ran."""
        return self.commit_time or self.created

    @property
    def sort_key(self) -> tuple[_dt.datetime, _dt.datetime, str]:
        return (self.time, self.created, str(self.path))

    @property
    def method(self) -> str:
        """How its times were made (kbench.timing.MEASURING_METHOD), as a string."""
        return self.environment.get("measuring_method", "1")

    @property
    def label(self) -> str:
        commit = f"{self.commit[:10]}{'-dirty' if self.dirty else ''}" if self.commit else "no commit"
        return f"{self.created:%Y-%m-%d %H:%M} {commit}"


def _parse_time(text: str | None, *, file: str) -> _dt.datetime:
    try:
        t = _dt.datetime.fromisoformat(str(text))
    except ValueError:
        raise BadInput(f"`created` is not an ISO 8601 time: {text!r}", file=file, where="created",
                       fix="the file was edited by hand; re-run the suite to regenerate it") from None
    return t if t.tzinfo else t.replace(tzinfo=_dt.timezone.utc)


def _flat(prefix: str, value: Any) -> Iterable[tuple[str, str]]:
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield from _flat(f"{prefix}.{k}" if prefix else str(k), v)
    elif isinstance(value, (str, int, float, bool)):
        yield prefix, str(value)


def environment_of(data: Mapping[str, Any]) -> dict[str, str]:
    """What of a run's machine and software can explain a step: CPU/GPU model, driver, CUDA, library
    and plugin versions, the hardware profile. Not the host name, the commit or the interpreter's path."""
    env: dict[str, str] = {}
    for key, value in (data.get("machine") or {}).items():
        if key not in _MACHINE_NOT_HARDWARE:
            env.update(_flat(f"machine.{key}", value))
    hardware = data.get("hardware") or {}
    if hardware.get("name"):
        env["hardware profile"] = str(hardware["name"])
    for key, value in (data.get("environment") or {}).items():
        if key not in _ENV_NOT_SOFTWARE:
            env.update(_flat(str(key), value))
    env["measuring_method"] = str(measuring_method_of(data))
    return env


def measuring_method_of(data: Mapping[str, Any]) -> int:
    """The way the run's times were made (kbench.timing.MEASURING_METHOD); files written before it was recorded:
    2 when the judge drew the inputs from a run secret (the file has ``input_secrets``), else 1."""
    value = (data.get("environment") or {}).get("measuring_method")
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    return 2 if "input_secrets" in data else 1


def reduce_result(path: Path, data: Mapping[str, Any]) -> Run:
    """The header and passed records of a loaded result file (samples are dropped here)."""
    commit = (data.get("environment") or {}).get("git_commit") or None
    dirty = bool(commit and str(commit).endswith("-dirty"))
    if dirty:
        commit = str(commit)[: -len("-dirty")]
    points, statuses = [], {}
    for rec in records_of(data, file=str(path)):
        statuses[rec.status.value] = statuses.get(rec.status.value, 0) + 1
        if rec.status is not Status.PASSED or not rec.median:
            continue
        median = float(rec.median)
        points.append(Point(rec.op, rec.case_id, dict(rec.case), rec.backend, median,
                            float(rec.stat("ci_low") or median), float(rec.stat("ci_high") or median),
                            int(rec.stat("n") or 0), float(rec.stat("min") or median)))
    return Run(path=path, id=str(data.get("id") or path.stem), machine_id=str(data["machine"]["id"]),
               device=str(data.get("device") or data["machine"].get("device") or ""),
               suite=str((data.get("suite") or {}).get("name") or ""),
               created=_parse_time(data.get("created"), file=str(path)), commit=commit, dirty=dirty,
               complete=bool(data.get("complete")), environment=environment_of(data), points=points,
               statuses=statuses)


def _is_result_file(path: Path) -> bool:
    """A JSON file that says it is a kbench result (calibrations and other JSON beside results are not), or
    one that cannot tell (damaged, not JSON, not a regular file): :func:`load_result` then says what is wrong."""
    try:
        head = read_head(path, 4096)
    except BadInput:
        return True  # a FIFO, a device, unreadable: reported (and skipped) by the reader, never opened here
    # `format` is written first by kbench; a hand-formatted file may order keys otherwise: then load_result judges
    if f'"format": "{FORMAT}"'.encode() in head or f'"format":"{FORMAT}"'.encode() in head:
        return True
    if head.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"["):
        return False  # a JSON array (scripts/gpu_check.py's gpu-check-stages.json): a result is always an object
    return b'"format"' not in head


def _identity(path: Path) -> Path:
    """Where a path leads, to find a file named twice; a loop of symbolic links leads nowhere: the path itself
    (the reader then refuses it with why, and the history goes on without it)."""
    try:
        return path.resolve()
    except (OSError, RuntimeError):  # RuntimeError: pathlib's "Symlink loop" before Python 3.13
        return path.absolute()


def find_result_files(paths: Sequence[str | Path]) -> list[Path]:
    """Every result file under the given directories (recursively) and the given files."""
    found: list[Path] = []
    for arg in paths:
        p = Path(arg)
        if p.is_dir():
            found.extend(f for f in sorted(p.rglob("*.json")) if not f.name.startswith(".") and _is_result_file(f))
        elif os.path.lexists(p):
            found.append(p)  # a file, or something that is not one: the reader says which
        else:
            raise BadInput("no such file or directory", file=str(p),
                           fix="give directories of result files (e.g. results/) or result files")
    if not found:
        raise BadInput(f"no kbench result files under {', '.join(str(p) for p in paths)}", where="RESULTS_DIR",
                       fix="give the directories `kbench run` writes to (results/<machine>/)")
    unique = {_identity(f): f for f in found}  # a file named twice (a directory and a file in it) is one run
    return sorted(unique.values())


def commit_times(commits: Iterable[str], repo: Path | None) -> dict[str, _dt.datetime]:
    """The committer date of each commit the repository knows; unknown commits (or no git) are left out."""
    shas = sorted({c for c in commits if c})
    if not shas or repo is None:
        return {}
    out: dict[str, _dt.datetime] = {}
    try:
        proc = subprocess.run(["git", "-C", str(repo), "log", "--no-walk=unsorted", "--ignore-missing",
                               "--format=%H %cI", *shas], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if proc.returncode != 0:
        return {}
    for line in proc.stdout.splitlines():
        sha, _, when = line.partition(" ")
        try:
            out[sha] = _dt.datetime.fromisoformat(when)
        except ValueError:
            continue
    found = {c: out[c] for c in shas if c in out}
    for c in set(shas) - set(found):  # a run may store an abbreviated commit: match by prefix
        found.update({c: t for full, t in out.items() if full.startswith(c)})
    return found


def default_repo(paths: Sequence[str | Path]) -> Path | None:
    """The git work tree holding the first results directory, if any (where its runs' commits live)."""
    start = _identity(Path(paths[0])) if paths else Path.cwd()
    for p in (start, *start.parents):
        if (p / ".git").exists():
            return p
    return None


#: bump when ``Run``/``Point`` or the cache's layout change: older caches are then ignored
CACHE_VERSION = 3  # 3: environment has measuring_method


def default_cache(paths: Sequence[str | Path]) -> Path:
    """Where the runs read from these directories are kept between commands: the user's cache directory
    (``$XDG_CACHE_HOME``, else ``~/.cache``), one file per set of directories, so ``kbench regressions``
    after ``kbench publish`` of the same results reads nothing again."""
    import hashlib

    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kbench"
    key = "|".join(sorted(str(_identity(Path(p))) for p in paths))
    return root / f"history-{hashlib.sha1(key.encode()).hexdigest()[:16]}.json"


def run_to_json(run: Run, cases: dict[str, Any]) -> dict[str, Any]:
    """A run for the cache; each case's parameters go once into ``cases`` (a thousand runs repeat them)."""
    for p in run.points:
        cases.setdefault(p.case_id, dict(p.case))
    return {"path": str(run.path), "id": run.id, "machine_id": run.machine_id, "device": run.device,
            "suite": run.suite, "created": run.created.isoformat(), "commit": run.commit, "dirty": run.dirty,
            "complete": run.complete, "environment": run.environment, "statuses": run.statuses,
            "points": [[p.op, p.case_id, p.backend, p.median, p.ci_low, p.ci_high, p.n, p.min] for p in run.points]}


def run_from_json(d: Mapping[str, Any], cases: Mapping[str, Any]) -> Run:
    return Run(path=Path(d["path"]), id=d["id"], machine_id=d["machine_id"], device=d["device"], suite=d["suite"],
               created=_dt.datetime.fromisoformat(d["created"]), commit=d["commit"], dirty=d["dirty"],
               complete=d["complete"], environment=dict(d["environment"]), statuses=dict(d["statuses"]),
               points=[Point(op, case_id, cases[case_id], *rest) for op, case_id, *rest in d["points"]])


def _file_key(path: Path) -> str:
    try:
        st = path.stat()
    except OSError:
        return f"{path}|unreadable"
    return f"{_identity(path)}|{st.st_size}|{st.st_mtime_ns}"


def _read_one(path: Path) -> Run | BadInput:
    """In a worker process: a reduced run, or the error as a value (exceptions with keyword
    arguments do not survive pickling whole)."""
    try:
        return reduce_result(path, load_result(path))
    except BadInput as exc:
        return exc


def _read_all(files: Sequence[Path], jobs: int) -> list[Run | BadInput]:
    """Read and validate files, in ``jobs`` processes when there are many (validation is the cost)."""
    if jobs <= 1 or len(files) < 16:
        return [_read_one(f) for f in files]
    import concurrent.futures as cf
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")  # no fork of a process that may hold threads
    with cf.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        results = list(pool.map(_read_one, files, chunksize=max(1, len(files) // (8 * jobs))))
    return [BadInput(r.message, file=r.file, where=r.where, fix=r.fix) if isinstance(r, BadInput) else r
            for r in results]


def _read_cache(cache: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The cache's runs and cases; a cache that is missing, damaged or not a regular file is empty (it only
    makes the command slower)."""
    if not os.path.lexists(cache):
        return {}, {}
    try:
        doc = read_json(cache, what="history cache")
        if isinstance(doc, dict) and doc.get("version") == CACHE_VERSION \
                and isinstance(doc.get("runs"), dict) and isinstance(doc.get("cases"), dict):
            return doc["runs"], doc["cases"]
    except BadInput:
        pass
    return {}, {}


def _cached_run(entry: Any, cases: Mapping[str, Any]) -> Run | None:
    try:
        return run_from_json(entry, cases)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None  # an entry of another layout, or edited: the file is read again


def load_runs(paths: Sequence[str | Path], *, repo: Path | None = None, cache: Path | None = None,
              jobs: int | None = None, skipped: list[BadInput] | None = None) -> list[Run]:
    """Every run under ``paths``, read and reduced, with commit dates from ``repo``, in history order.

    ``cache``: a JSON file of reduced runs keyed by path, size and modification time, so a nightly
    publish reads only the new result files (reading validates every file against the schema, which
    is most of the cost; see ``default_cache``). ``jobs``: processes that read files (default: one per CPU).
    ``skipped``: a file the reader refuses (damaged, not a result, a FIFO...) is added to this list with why,
    and left out; without the list, the first one is raised. A history with no readable run is bad input.
    """
    files = find_result_files(paths)
    cached, cases = _read_cache(cache) if cache is not None else ({}, {})
    keys = [_file_key(f) for f in files]
    known = {k: _cached_run(cached[k], cases) for k in keys if k in cached}
    missing = [f for f, k in zip(files, keys) if known.get(k) is None]
    fresh = dict(zip((_file_key(f) for f in missing), _read_all(missing, jobs or os.cpu_count() or 1)))
    runs, kept_keys = [], []
    for f, k in zip(files, keys):
        r = fresh[k] if k in fresh else known[k]
        if isinstance(r, BadInput):
            if skipped is None:
                raise r
            skipped.append(r)
            continue
        r.path = f  # the path as given (links are made relative to it), whatever the cache stored
        runs.append(r)
        kept_keys.append(k)
    if not runs:
        raise BadInput(f"none of the {len(files)} result files could be read (each is named with why)",
                       where="RESULTS_DIR", fix="repair or remove them, or give other result files")
    if cache is not None and any(not isinstance(v, BadInput) for v in fresh.values()):
        from kbench.results import atomic_write_json

        cases = {}
        stored = {k: run_to_json(r, cases) for k, r in zip(kept_keys, runs)}
        try:
            atomic_write_json(cache, {"version": CACHE_VERSION, "cases": cases, "runs": stored})
        except OSError:
            pass  # a cache that cannot be written (read-only home) only makes the next command slower
    times = commit_times((r.commit for r in runs if r.commit), repo)
    for r in runs:
        r.commit_time = times.get(r.commit) if r.commit else None
    return sorted(runs, key=lambda r: r.sort_key)


@dataclass(frozen=True)
class EnvChange:
    """A change of hardware or software between two consecutive runs of one machine."""

    run: int                     # index of the first run with the new environment
    changes: tuple[tuple[str, str | None, str | None], ...]  # (key, before, after)

    @property
    def text(self) -> str:
        return "; ".join(f"{k} {a or '(none)'} \u2192 {b or '(none)'}" for k, a, b in self.changes)


def environment_changes(runs: Sequence[Run]) -> list[EnvChange]:
    """Where the environment differs from the run before (runs of one machine, in history order)."""
    out = []
    for i in range(1, len(runs)):
        a, b = runs[i - 1].environment, runs[i].environment
        diff = tuple((k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k))
        if diff:
            out.append(EnvChange(i, diff))
    return out


def relpath(path: Path, start: Path) -> str:
    """A link from ``start`` to ``path`` that works from the file system and on a static host."""
    return Path(os.path.relpath(Path(path).resolve(), Path(start).resolve())).as_posix()
