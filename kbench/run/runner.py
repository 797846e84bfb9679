"""``kbench run``: a suite on one device -> a result file, one record at a time.

The parent owns the suite, the result file and the screen. Each (backend, case) goes to an
executor: in-process, or a worker process (kbench.run.pool) for isolation; the judge (kbench.judge)
makes every record through the same messages either way, so moving work into a worker changes nothing else.
"""
from __future__ import annotations

import datetime as _dt
import importlib.metadata as md
import platform
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol

from kbench import __version__
from kbench.backends import Backend
from kbench.enums import Status
from kbench.record import Record, run_repro
from kbench.errors import BadInput, OutputError
from kbench.judge.context import RunContext, new_record
from kbench.judge.policy import IntegritySettings
from kbench.ops import Case
from kbench.plugins import PluginManager
from kbench.results import ResultWriter, load_result
from kbench.selection import Keyword, refuse_name_collisions
from kbench.suite import MAX_CASES, DevicePlan, Suite, suite_from_data


class Executor(Protocol):
    """A plain executor: one record per call (see :mod:`kbench.run.executors` for the full API)."""

    def __call__(self, backend: Backend, case: Case) -> dict[str, Any]: ...


def pick_device(pm: PluginManager, requested: str, *, here: bool = True) -> str:
    """The device to run on; ``here=False`` (an executor that runs elsewhere): a named device need not be
    usable on this host."""
    reg = pm.registry
    if requested != "auto":
        dev = reg.device(requested)
        reason = dev.available() if here else None
        if reason:
            raise BadInput(f"device {requested!r} is not available: {reason}", where="--device",
                           fix="use --device cpu, or --device auto to pick what is available")
        return requested
    # prefer an accelerator when one is usable; the CPU is always there
    for name in sorted(reg.devices, key=lambda n: n == "cpu"):
        if reg.devices[name].available() is None:
            return name
    return "cpu"


def git_commit(cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5)
        if out.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def environment(pm: PluginManager) -> dict[str, Any]:
    """kbench, Python and plugin versions, git commit, and what the plugins' ``kbench_environment`` hooks add
    (a hook that raises is recorded under ``plugin_errors`` and the run goes on)."""
    from kbench.timing import MEASURING_METHOD

    env: dict[str, Any] = {"kbench": __version__, "measuring_method": MEASURING_METHOD,
                           "python": platform.python_version(), "executable": sys.executable,
                           "git_commit": git_commit()}
    plugins = {}
    for info in pm.infos:
        top = info.module.split(".")[0]
        try:
            plugins[info.name] = md.version(top if top != "kbench" else "kbench")
        except md.PackageNotFoundError:
            plugins[info.name] = None
    env["plugins"] = plugins
    env.update(pm.environment())
    return env


def default_output(machine: str, suite: Suite) -> Path:
    """``<results root>/<machine>/<suite>-<date>-<time>-<ms>-<random>.json``: never the name of another run's file;
    the root is :func:`kbench.results.results_root` (``$KBENCH_RESULTS``, else ``results``), as for calibrations."""
    from kbench.outputs import unique_result_path
    from kbench.results import results_root

    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f")[:-3]
    return unique_result_path(results_root() / machine, suite.name, stamp)


@dataclass
class RunRequest:
    suite: Suite
    device: str = "auto"
    backend_patterns: list[str] = field(default_factory=list)
    kernel_files: list[str] = field(default_factory=list)
    keyword: str | None = None
    output: Path | None = None
    #: trusted backends in a shared worker (True) or in this process (False); untrusted ones always in workers
    isolate: bool = True
    #: seconds one (backend, case) may take; overrides the suite's timing.case_timeout
    case_timeout: float | None = None
    #: tunable settings per kernel file path
    kernel_settings: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: load kernel files as trusted backends (in-process with isolate=False, no sandbox, no static checks)
    trust_kernel_files: bool = False
    #: untrusted backends run without the OS sandbox where it does not work here (else they are error records)
    allow_unsandboxed: bool = False
    #: grids larger than this are refused before they are expanded (None: no limit)
    max_cases: int | None = MAX_CASES
    #: overwrite an existing ``output`` (else refused)
    force: bool = False
    #: the header of the result file being resumed (machine, environment, created... are kept from it)
    resumed_from: dict[str, Any] | None = None
    #: resume a file made on another machine or environment (recorded in the file's ``resumes``)
    allow_different_machine: bool = False
    #: where the jobs run (a registered executor, kbench.run.executors) and its options
    executor: str = "local"
    #: device indices, one job at a time on each (``--devices 0,1``); None: one job at a time in all
    devices: list[str] | None = None
    executor_address: str | None = None
    executor_settings: dict[str, str] = field(default_factory=dict)
    #: backend objects measured besides the selection (the Python API's callables and Backend instances,
    #: kbench.api.measure); routed like any backend: a trusted one that cannot be rebuilt in a worker runs here
    backends: list[Backend] = field(default_factory=list)
    #: a profiler run after each record, outside its timed samples (``"ncu"``: kbench.profiling), or None
    profile: str | None = None
    #: rounds each record's samples are taken in (kbench.run.rounds); overrides the suite's timing.rounds
    rounds: int | None = None


@dataclass
class PlannedRun:
    """Everything decided before the first measurement: device, cases, backends, context."""

    request: RunRequest
    plan: DevicePlan
    backends: list[Backend]
    ctx: RunContext
    keyword: Keyword
    output: Path
    case_timeout: float | None = None
    #: rounds each record's samples are taken in; ``ctx.timing`` is what one round runs
    rounds: int = 1

    def work(self) -> list[tuple[Case, Backend]]:
        """(case, backend) pairs in case-major order, so inputs and references are shared."""
        return [(c, b) for c in self.plan.cases for b in self.backends if self.keyword.matches(b.name, c.id)]


def plan_run(pm: PluginManager, req: RunRequest) -> PlannedRun:
    """Everything decided before the first measurement; bad input and unwritable outputs are refused here.

    Also removes the scratch directories of killed runs (:mod:`kbench.run.scratch`) and takes the result
    file's lock (:mod:`kbench.outputs`), which the run's ResultWriter keeps."""
    from kbench.run.scratch import remove_stale_worker_dirs

    remove_stale_worker_dirs()
    reg = pm.registry
    try:
        op = reg.op(req.suite.op)
    except BadInput as exc:
        raise BadInput(exc.message, file=req.suite.path, where=req.suite.where(("op",)), fix=exc.fix) from None
    factory = reg.executor(req.executor)
    why = factory.available()
    if why:
        raise BadInput(f"executor {req.executor!r} cannot run here: {why}", where="--executor",
                       fix="`kbench list` shows the executors and why each is unavailable")
    factory.check(executor_options(req))
    device_name = pick_device(pm, req.device, here=not factory.remote)
    device = reg.device(device_name)
    plan = req.suite.plan(device_name, op, max_cases=req.max_cases)
    patterns = req.backend_patterns or plan.backends
    # -b replaces the suite's selection: kernel files alone mean "just these kernels"
    backends = [] if req.kernel_files and not req.backend_patterns else reg.select_backends(op.name, patterns)
    if req.kernel_files:
        from kbench.kernelfile import KernelFileBackend
        from kbench.kernelfile import KernelFileRef

        for path in req.kernel_files:
            settings = req.kernel_settings.get(path)
            # an untrusted kernel file is never imported here: the parent reads its text, a worker runs it
            kb = (KernelFileBackend(path, reg, settings=settings, trusted=True) if req.trust_kernel_files
                  else KernelFileRef(path, reg, settings=settings))
            if kb.op != op.name:
                raise BadInput(f"kernel implements op {kb.op!r} but the suite is for {op.name!r}", file=path,
                               fix="use a suite of the kernel's op")
            backends.append(kb)
    for extra in req.backends:
        if extra.op != op.name:
            raise BadInput(f"backend {extra.name!r} implements op {extra.op!r} but the suite is for {op.name!r}",
                           where="backends", fix="use a suite of the backend's op")
        backends.append(extra)
    refuse_name_collisions(backends)  # a kernel file never runs under another selected backend's name
    if not backends:
        known = sorted(b.name for b in reg.backends.values() if b.op == op.name)
        raise BadInput(f"no backend of op {op.name!r} matches {patterns}", where="-b / suite backends",
                       fix=f"known backends: {', '.join(known)}; or give a kernel file path")
    keyword = Keyword(req.keyword)
    if req.keyword and not any(keyword.matches(b.name, c.id) for c in plan.cases for b in backends):
        raise BadInput(f"{req.keyword!r} matches none of the {len(plan.cases) * len(backends)} "
                       f"(case, backend) pairs", where="-k",
                       fix=f"a case id looks like {plan.cases[0].id} and a backend like {backends[0].name}; "
                           "words match parts of either (see docs/suites.md)")
    rounds = req.rounds or plan.timing.rounds
    if rounds > 1 and plan.timing.energy_seconds > 0:
        raise BadInput(f"timing.energy_seconds ({plan.timing.energy_seconds:g}) and {rounds} rounds: the sustained "
                       f"energy loop is one stretch of calls and cannot be split into rounds", file=req.suite.path,
                       where="--rounds" if req.rounds else req.suite.where(("timing", "rounds")),
                       fix="measure energy in a run of one round (timing.rounds: 1), or drop timing.energy_seconds")
    timing = replace(plan.timing, rounds=rounds).per_round()
    ctx = RunContext(op=op, device=device, check=plan.check, timing=timing,
                      hardware=pm.detect_hardware(device), integrity=integrity_settings(req.suite))
    output = Path(req.output) if req.output else default_output(device.machine_id(), req.suite)
    from kbench.outputs import claim_result_file

    claim_result_file(output, force=req.force, resuming=req.resumed_from is not None)
    return PlannedRun(req, plan, backends, ctx, keyword, output, req.case_timeout or plan.case_timeout, rounds)


def integrity_settings(suite: Suite) -> IntegritySettings:
    try:
        return IntegritySettings.from_mapping(suite.data.get("integrity"))
    except (TypeError, ValueError) as exc:
        raise BadInput(f"bad integrity settings: {exc}", file=suite.path, where=suite.where(("integrity",)),
                       fix="see docs/integrity.md for the keys") from None


def run_header(pm: PluginManager, planned: PlannedRun, executor=None) -> dict[str, Any]:
    """The result file's header; a resumed run keeps the original's (machine, environment, created...) and
    adds an entry to its ``resumes`` list instead. ``executor``: recorded (name, slots, devices)."""
    where = executor.describe() if executor is not None else None
    device = planned.ctx.device
    hw = planned.ctx.hardware
    req = planned.request
    if req.resumed_from is not None:
        original = {k: v for k, v in req.resumed_from.items() if k not in ("records", "complete", "interrupted")}
        env_changes = environment_changes(original.get("environment") or {}, environment(pm))
        entry = {"time": _now(), "machine": device.machine_id(), "hostname": platform.node(),
                 "allowed_different_machine": req.allow_different_machine, "environment_changes": env_changes}
        if where is not None:
            entry["executor"] = where
        return {**original, "resumes": [*original.get("resumes", []), entry]}
    header = {
        "id": planned.output.stem,
        "machine": {"id": device.machine_id(), "hostname": platform.node(), **device.describe()},
        "hardware": hw.to_json() if hw else None,
        "environment": environment(pm),
        "suite": {"name": req.suite.name, "path": req.suite.path, "data": req.suite.data},
        "device": device.name,
        "selection": {"backends": [b.name for b in planned.backends], "keyword": req.keyword,
                      "kernel_files": list(req.kernel_files), "kernel_settings": dict(req.kernel_settings),
                      "isolate": req.isolate, "case_timeout": req.case_timeout,
                      "trust_kernel_files": req.trust_kernel_files, "allow_unsandboxed": req.allow_unsandboxed, "max_cases": req.max_cases,
                      "rounds": planned.rounds},
    }
    if where is not None:
        header["executor"] = where
    return header


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM during a run; the result file is left valid and marked incomplete."""

    def __init__(self, how: str) -> None:
        super().__init__(how)
        self.how = how


def _on_sigterm(signum, frame):
    raise RunInterrupted("terminated (SIGTERM)")


def run_suite(pm: PluginManager, planned: PlannedRun, *, executor: Executor | Callable | None = None,
              on_record: Callable[[dict[str, Any], int, int], None] | None = None,
              existing: Iterable[dict[str, Any]] = ()) -> ResultWriter:
    """Run every (case, backend) not already in ``existing``; append each record as it is made.

    Without an ``executor``, the request's (``planned.request.executor``, default ``local``: a
    :class:`kbench.run.pool.WorkerPool`, untrusted backends in sandboxed workers always, trusted ones in a
    worker unless ``planned.request.isolate`` is False). An executor may finish jobs out of order
    (several devices): records are written in the order of the work list all the same; a plain
    ``callable(backend, case) -> record`` runs one job at a time in this thread.
    Ctrl-C or SIGTERM cancels the jobs in flight, keeps every finished record, finishes the file as
    interrupted and raises :class:`RunInterrupted`.
    """
    from kbench.run.executors import Executor as ExecutorBase
    from kbench.run.executors import InlineExecutor, Job
    from kbench.run.pool import not_started, stops_after_timeout
    from kbench.run.rounds import BLOCK, merge_rounds, round_order

    existing = list(existing)
    req = planned.request
    done = {(r["case_id"], r["backend"]) for r in existing}
    todo = [(c, b) for c, b in planned.work() if (c.id, b.name) not in done]
    if executor is None:
        ex = make_executor(pm, planned)
    elif isinstance(executor, ExecutorBase):
        ex = executor
    else:
        ex = InlineExecutor(executor)
    try:
        writer = ResultWriter(planned.output, run_header(pm, planned, ex), existing)
    except BaseException:
        ex.close()
        raise
    todo = ex.order(todo)
    rounds = planned.rounds
    # jobs: (record index, round); a record is written once its rounds are back (kbench.run.rounds)
    jobs = round_order(len(todo), rounds, 1 if req.profile else BLOCK)
    first_job = {}
    for position, (unit, _) in enumerate(jobs):
        first_job.setdefault(unit, position)
    in_main = threading.current_thread() is threading.main_thread()
    old_term = signal.signal(signal.SIGTERM, _on_sigterm) if in_main else None
    parts: dict[int, dict[int, dict[str, Any]]] = {}  # record index -> round -> what the round gave
    outstanding = [rounds] * len(todo)  # rounds of a record neither back nor dropped
    finished: dict[int, dict[str, Any]] = {}  # records complete before an earlier one
    written = submitted = in_flight = 0
    # jobs handed out ahead of the first unwritten record's first job; one record at a time when profiling, so
    # that a profile (taken while its record is written) never runs beside another record's timed samples
    window = rounds if req.profile else max(64, 4 * ex.slots, BLOCK * rounds)
    stopped: dict[str, str] = {}  # untrusted backend -> the case it timed out on: its later cases are not started

    def merged(unit: int) -> dict[str, Any]:
        got = parts.pop(unit, {})
        case = todo[unit][0]
        return merge_rounds([got[k] for k in sorted(got)], rounds, hardware=planned.ctx.hardware,
                            op=planned.ctx.op, case=case)

    def settle(unit: int) -> None:
        outstanding[unit] -= 1
        if outstanding[unit] == 0:
            finished[unit] = merged(unit)

    try:
        while written < len(todo):
            while submitted < len(jobs) and submitted - first_job[written] < window:
                unit, k = jobs[submitted]
                if rounds - outstanding[unit] < k - 1:
                    break  # a round is handed out once the one before it is back: it may not be wanted
                case, backend = todo[unit]
                earlier = parts.get(unit, {})
                if k > 1 and any(r.get("status") != Status.PASSED.value for r in earlier.values()):
                    settle(unit)  # a round that did not pass is the record: no further rounds
                elif backend.name in stopped:
                    if k == 1:
                        parts.setdefault(unit, {})[k] = not_started(backend.name, case, planned.ctx.device.name,
                                                                    stopped[backend.name])
                    settle(unit)
                else:
                    ex.submit(Job(submitted, case, backend))
                    in_flight += 1
                submitted += 1
            got = ex.next_done(0.2) if in_flight else None
            if got is not None:
                in_flight -= 1
                unit, k = jobs[got[0].index]
                case, backend = todo[unit]
                parts.setdefault(unit, {})[k] = got[1]
                if got[1].get("status") == Status.TIMEOUT.value and stops_after_timeout(backend):
                    stopped.setdefault(backend.name, case.id)
                settle(unit)
            while written in finished:
                case, backend = todo[written]
                record = finished.pop(written)
                if req.profile:
                    from kbench.profiling import attach_profile
                    attach_profile(record, backend, device=planned.ctx.device.name)
                _append(writer, record, backend, case, planned)
                written += 1
                if on_record is not None:
                    on_record(record, written, len(todo))
    except KeyboardInterrupt as exc:
        how = exc.how if isinstance(exc, RunInterrupted) else "interrupted by the user (Ctrl-C)"
        ex.cancel()
        for unit in list(parts):  # rounds measured already: pooled and kept, so a resume does not run them again
            if unit not in finished and parts[unit]:
                finished[unit] = merged(unit)
        for index in sorted(finished):
            _append(writer, finished[index], todo[index][1], todo[index][0], planned)
        writer.finish(interrupted=how, extra=_secret_record(writer, planned))
        raise exc if isinstance(exc, RunInterrupted) else RunInterrupted(how) from None
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, old_term if old_term is not None else signal.SIG_DFL)
        ex.close()
    writer.finish(extra=_secret_record(writer, planned))
    return writer


def make_executor(pm: PluginManager, planned: PlannedRun):
    """The executor the request names (``local`` by default), made by its registered factory."""
    req = planned.request
    return pm.registry.executor(req.executor).create(pm, planned, executor_options(req))


def executor_options(req: RunRequest):
    from kbench.run.executors import ExecutorOptions

    return ExecutorOptions(devices=req.devices, address=req.executor_address, settings=dict(req.executor_settings))


def _secret_record(writer: ResultWriter, planned: PlannedRun) -> dict[str, Any]:
    """The run's input secret, published only now that nothing more is measured with it (a resumed run
    drew its own: every part's secret is kept, in order), so anyone can regenerate and re-check the inputs."""
    earlier = writer.data.get("input_secrets")
    earlier = list(earlier) if isinstance(earlier, list) else []
    return {"input_secrets": [*earlier, planned.ctx.secret.hex()]}


def _append(writer: ResultWriter, record: dict[str, Any], backend: Backend, case: Case, planned: PlannedRun) -> None:
    """Append a record; one a plugin made invalid becomes an error record instead of ending the run."""
    record.setdefault("repro", run_repro(planned.request, backend, case.id, planned.ctx.device.name))
    try:
        writer.append(record)
    except OutputError:
        raise  # the file cannot be written: the run stops with the message, not an error record
    except BadInput as exc:
        fallback = new_record(backend.name, case, planned.ctx.device.name)
        fallback.update(status=Status.ERROR.value, reason=f"the backend produced an invalid record: {exc.message}")
        writer.append(fallback)
    except (TypeError, ValueError) as exc:  # not JSON-serialisable
        fallback = new_record(backend.name, case, planned.ctx.device.name)
        fallback.update(status=Status.ERROR.value, reason=f"the backend produced a record that is not JSON: {exc}")
        writer.append(fallback)


#: environment entries that must match for a resume (besides every plugin's version)
COMPARED_ENVIRONMENT = ("kbench", "python")


def _now() -> str:
    from kbench.results import now_iso

    return now_iso()


def environment_changes(was: dict[str, Any], now: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{"python": {"was": "3.11.2", "now": "3.12.1"}, "plugins.kbench-torch": {...}}``: what differs."""
    changes: dict[str, dict[str, Any]] = {}
    for key in sorted(set(was) | set(now)):
        if key == "plugins":
            a, b = was.get(key) or {}, now.get(key) or {}
            if isinstance(a, dict) and isinstance(b, dict):
                for name in sorted(set(a) | set(b)):
                    if a.get(name) != b.get(name):
                        changes[f"plugins.{name}"] = {"was": a.get(name), "now": b.get(name)}
                continue
        if isinstance(was.get(key), (str, int, float, bool, type(None))) and was.get(key) != now.get(key):
            changes[key] = {"was": was.get(key), "now": now.get(key)}
    return changes


def measuring_plugins(pm: PluginManager, data: dict[str, Any], kernel_files: Iterable[Any] = ()) -> dict[str, str]:
    """The plugins whose code measures a result file's records: the owners of its op, its device, every backend
    of its selection and records (a configured ``name[k=v]`` by its base name) and the substrates of its kernel
    files, each with what it provides (``{"torch": "backend torch-sdpa"}``). A change of any other plugin (one
    installed since, say) changes nothing measured."""
    reg = pm.registry
    provides: dict[str, list[str]] = {}

    def note(kind: str, name: str) -> None:
        owner = reg.owners.get((kind, name))
        if owner is not None:
            provides.setdefault(owner, []).append(f"{kind} {name}")

    note("op", str((data.get("suite") or {}).get("data", {}).get("op", "attention")))
    note("device", str(data.get("device")))
    names = [*((data.get("selection") or {}).get("backends") or []), *(r.get("backend") for r in data["records"])]
    for name in dict.fromkeys(str(n).split("[", 1)[0] for n in names):
        note("backend", name)
    for ref in kernel_files:
        note("substrate", getattr(getattr(ref, "substrate", None), "name", ""))
    return {owner: ", ".join(dict.fromkeys(what)) for owner, what in provides.items()}


def resume_blockers(pm: PluginManager, data: dict[str, Any], kernel_files: Iterable[Any] = ()) -> list[str]:
    """Why the records of ``data`` and the ones a resume would add here could not stand side by side: another
    kbench or Python, or another version of a plugin that measures them (:func:`measuring_plugins`), each
    said in words. Empty: a resume adds comparable records (other changes are recorded in ``resumes``)."""
    changes = environment_changes(data["environment"], environment(pm))
    measuring = measuring_plugins(pm, data, kernel_files)
    why = [f"{k}: {c['was']} -> {c['now']}" for k, c in changes.items() if k in COMPARED_ENVIRONMENT]
    for key, c in changes.items():
        name = key[len("plugins."):] if key.startswith("plugins.") else None
        if name in measuring:
            why.append(f"plugin {name!r} ({measuring[name]}): {c['was'] or 'not installed'} -> "
                       f"{c['now'] or 'not installed'}")
    return why


def resume_request(pm: PluginManager, path: str | Path, *,
                   allow_different_machine: bool = False) -> tuple[RunRequest, list[dict[str, Any]]]:
    """The request that made the result file ``path`` (same suite, device and selection) and its records.

    Refused when the file was made on another machine or with other kbench, Python or plugin versions,
    unless ``allow_different_machine`` (then recorded in the file's ``resumes``)."""
    from kbench.kernelfile import KernelFileRef

    data = load_result(path)  # validated to the leaves before anything is rewritten
    device_name = data.get("device", "auto")
    here = pm.registry.device(device_name).machine_id() if device_name in pm.registry.devices else None
    sel = data.get("selection") or {}
    kernel_files = list(sel.get("kernel_files") or [])
    settings = dict(sel.get("kernel_settings") or {})
    refs = [KernelFileRef(p, pm.registry, settings=settings.get(p)) for p in kernel_files]
    if not allow_different_machine:
        why = []
        if here != data["machine"]["id"]:
            why.append(f"it was made on {data['machine']['id']!r}, this is {here or 'a machine without ' + device_name!r}")
        why += resume_blockers(pm, data, refs)
        if why:
            raise BadInput("refusing to resume: the records it holds and the ones a resume would add here would not "
                           "be comparable: " + "; ".join(why), file=str(path), where="--resume",
                           fix="resume it where it was made, start a new run, or add --allow-different-machine "
                               "(recorded in the file)")
    suite_info = data["suite"]
    suite = suite_from_data(suite_info["data"], path=suite_info.get("path"))
    file_names = {ref.name for ref in refs}
    patterns = [b for b in sel.get("backends") or [] if b not in file_names]
    req = RunRequest(suite=suite, device=data.get("device", "auto"), backend_patterns=patterns,
                     kernel_files=kernel_files, keyword=sel.get("keyword"), output=Path(path),
                     isolate=sel.get("isolate", True), case_timeout=sel.get("case_timeout"),
                     kernel_settings=settings, trust_kernel_files=bool(sel.get("trust_kernel_files", False)),
                     allow_unsandboxed=bool(sel.get("allow_unsandboxed", False)),
                     max_cases=sel.get("max_cases", MAX_CASES), rounds=sel.get("rounds"),
                     resumed_from={k: v for k, v in data.items() if k != "records"},
                     allow_different_machine=allow_different_machine)
    # records the environment spoiled (a worker that could not start, the file-size limit...) are not
    # measurements: the resume runs them again
    return req, [r for r in data["records"] if r.get("cause") != "infrastructure"]


def exit_code(records: Iterable[dict[str, Any] | Record]) -> int:
    """1 when any record failed, errored, crashed or timed out; 0 when all passed or were skipped."""
    bad = {Status.FAILED, Status.ERROR, Status.CRASHED, Status.TIMEOUT}
    return 1 if any(Record.of(r).status in bad for r in records) else 0
