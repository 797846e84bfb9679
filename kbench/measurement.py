"""Measure from Python: backends, kernel files or callables on cases, by the runner of ``kbench run``.

:func:`measure` builds a :class:`~kbench.api.RunRequest` and goes through ``plan_run``/``run_suite`` as the
CLI does, so a record made here has the same judge, sandbox choice, timing settings and integrity checks
as one made by ``kbench run`` (docs/evaluators.md). A kernel file is untrusted: it runs in a sandboxed
worker. A callable is trusted code (yours): no sandbox, no static checks, and its records say so
(``backend_info.trusted``); on the CPU it runs in a forked child of this process with a memory cap, killed at
the case timeout (kbench.run.forked), so it can neither hang, end nor exhaust its caller.
"""
from __future__ import annotations

import contextlib
import copy
import datetime as _dt
import difflib
import math
import os
import re
import shutil
import tempfile
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from kbench.backends import Backend
from kbench.errors import BadInput, KbenchError
from kbench.ops import Case
from kbench.plugins import PluginManager, get_plugin_manager
from kbench.record import Record
# the one import of the runner: where it lives may change, what it offers does not
from kbench.run.runner import RunRequest, pick_device, plan_run, run_suite
from kbench.suite import Suite, load_suite, suite_from_data

#: the suite name of a run made from case dicts (result files are named after it)
DEFAULT_NAME = "measure"


class CallableBackend(Backend):
    """A plain function as a backend, with a kernel file's signature: ``fn(q, k, v, out, *, causal, scale)``
    (the op's inputs, then its outputs, then the op's keyword arguments); it writes ``out`` or returns the result.

    Trusted by construction: it is the caller's own code, so it is never pickled to a worker: on the CPU it
    runs in a forked child of the calling process (memory cap, killed at the case timeout: kbench.run.forked),
    on a GPU in the calling process; without the sandbox or the static checks, and ``info()`` says so in every
    record. After a timeout its remaining cases in the run are not started (kbench.run.runner).
    """

    trusted = True
    stop_after_timeout = True

    def __init__(self, fn: Callable[..., Any], op, *, name: str | None = None, device: str = "cpu") -> None:
        if not callable(fn):
            raise BadInput(f"{fn!r} is not callable", where="measure(...)",
                           fix="give a function fn(q, k, v, out, *, causal, scale), a backend name, a kernel "
                               "file path or a Backend")
        self.fn, self._op = fn, op
        self.op, self.device = op.name, device
        self.name = name or f"fn:{getattr(fn, '__qualname__', type(fn).__name__)}"
        self.description = (getattr(fn, "__doc__", None) or "").strip().split("\n")[0] or "a Python callable"

    def prepare(self, case: Case):
        fn, kwargs = self.fn, self._op.kernel_kwargs(case)

        def run(**arrays):
            return fn(*arrays.values(), **kwargs)
        return run

    def info(self) -> dict[str, Any]:
        code = getattr(self.fn, "__code__", None)
        where = f"{code.co_filename}:{code.co_firstlineno}" if code is not None else None
        return {"callable": f"{getattr(self.fn, '__module__', '?')}.{getattr(self.fn, '__qualname__', '?')}",
                "source": where, "trusted": True,
                "isolation": "none: a callable is trusted code, run without the sandbox or the static checks (on "
                             "the CPU in a forked child with a memory cap and the case timeout; the judge's checks "
                             "of outputs and clock still apply)"}

    def __copy__(self) -> CallableBackend:
        clone = CallableBackend.__new__(CallableBackend)
        clone.__dict__.update(self.__dict__)
        return clone

    def __reduce_ex__(self, protocol):
        # the worker pool pickles trusted backends it can: a callable stays in the process that holds it
        raise TypeError("a callable backend runs in the calling process")


@dataclass
class Measurement:
    """What :func:`measure` returns: the records, which backend each target became, and the result file."""

    records: list[Record]
    #: backend names in the order the targets were given (a glob pattern adds every backend it selected)
    names: list[str]
    #: the baseline's backend name, when one was given
    baseline: str | None
    suite: Suite
    device: str
    #: the result file, when one was kept (``output=``); None when the run wrote to a temporary file
    result_file: Path | None = None
    #: the result file's header (machine, environment, suite, selection), as written
    header: dict[str, Any] = field(default_factory=dict, repr=False)
    #: backend name -> the held-out shapes' verdict (kbench.fuzz.heldout.HeldOut) of each kernel file measured, as
    #: the checker gave it (shapes included): read it through :attr:`held_out`, which hides them like ``failures``
    held_out_verdicts: dict[str, Any] = field(default_factory=dict, repr=False)
    #: show the held-out shapes in ``held_out`` and ``failures`` (else only what went wrong)
    show_held_out: bool = field(default=False, repr=False)

    @property
    def held_out(self) -> dict[str, Any]:
        """backend name -> held-out verdict. Unless ``show_held_out``, the shapes are hidden here exactly as in
        :meth:`failures`: no case id in the verdict's failure, no list of cases (a candidate's author, or a model
        reading the verdict, learns that a hidden shape failed and how, never which)."""
        if self.show_held_out:
            return dict(self.held_out_verdicts)
        out = {}
        for name, verdict in self.held_out_verdicts.items():
            failure = verdict.failure
            if failure is not None:
                case_id, status, why, rel_l2, bound = failure
                failure = ("(hidden)", status, verdict.reason(False), rel_l2, bound)
            out[name] = dataclasses.replace(verdict, failure=failure, cases=[])
        return out

    # -- which records ------------------------------------------------------------------------------

    @property
    def subject(self) -> str:
        """The first target that is not the baseline: what ``speedup()`` and ``tflops()`` default to."""
        for name in self.names:
            if name != self.baseline:
                return name
        return self.names[0]

    def of(self, backend: str | None = None) -> list[Record]:
        """The records of one backend (default: the subject), in case order."""
        name = self._name(backend)
        return [r for r in self.records if r.backend == name]

    def record(self, case_id: str, backend: str | None = None) -> Record:
        for r in self.of(backend):
            if r.case_id == case_id:
                return r
        raise KeyError(f"no record of {self._name(backend)!r} on {case_id!r}")

    def _name(self, backend: str | None) -> str:
        name = backend or self.subject
        if name not in self.names:
            raise KeyError(f"{name!r} was not measured; the backends are: {', '.join(self.names)}")
        return name

    # -- verdicts -------------------------------------------------------------------------------------

    def failures(self, backend: str | None = None) -> dict[str, str]:
        """``"backend @ case id" -> "status: reason"`` for every record that did not pass (a skipped case
        counts: it was not measured). ``backend``: only that one's."""
        records = self.records if backend is None else self.of(backend)
        out = {f"{r.backend} @ {r.case_id}": r.status_text for r in records if not r.passed}
        for name, verdict in self.held_out_verdicts.items():  # docs/fuzz.md, "Held-out shapes"
            if (backend is None or name == self._name(backend)) and not verdict.passed:
                out[f"{name} @ (held-out)"] = verdict.reason(self.show_held_out) or str(verdict.infrastructure)
        return out

    @property
    def passed(self) -> bool:
        """Every record of every backend passed (correct on every check, timed), and every kernel file on the
        held-out shapes."""
        return (bool(self.records) and all(r.passed for r in self.records)
                and all(v.passed for v in self.held_out_verdicts.values()))

    def assert_passed(self, backend: str | None = None) -> None:
        """AssertionError listing each record that did not pass (for tests)."""
        bad = self.failures(backend)
        if bad or not self.records:
            lines = "\n".join(f"  {k}: {v}" for k, v in bad.items()) or "  no records"
            raise AssertionError(f"{len(bad)} of {len(self.records)} records did not pass:\n{lines}")

    # -- figures --------------------------------------------------------------------------------------

    def tflops(self, backend: str | None = None) -> dict[str, float]:
        """Case id -> attained TFLOP/s of the records that passed."""
        return {r.case_id: float(r.tflops) for r in self.of(backend) if r.passed and r.tflops}

    def speedups(self, backend: str | None = None, over: str | None = None) -> dict[str, Any]:
        """Case id -> :class:`kbench.compare.RatioTest`-based speedup (``median(over) / median(backend)``, with
        its bootstrap CI and U-test p-value), for the cases where both passed."""
        from kbench.compare import Settings, ratio_test

        name, base = self._name(backend), self._over(over)
        mine = {r.case_id: r for r in self.of(name) if r.passed}
        theirs = {r.case_id: r for r in self.of(base) if r.passed}
        out = {}
        for cid in mine:
            if cid in theirs and len(mine[cid].samples) >= 2 and len(theirs[cid].samples) >= 2:
                t = ratio_test(mine[cid].samples, theirs[cid].samples, Settings())  # theirs / mine: > 1 faster
                out[cid] = Speedup(cid, t.ratio, t.ci_low, t.ci_high, t.p_value)
        return out

    def speedup(self, backend: str | None = None, over: str | None = None) -> float:
        """Geometric mean over cases of ``median(over) / median(backend)`` (> 1: ``backend`` is faster),
        both measured in this run. Raises :class:`KbenchError` naming the failures when no case has both."""
        from kbench.compare import geomean

        cells = self.speedups(backend, over)
        if not cells:
            bad = {**self.failures(self._name(backend)), **self.failures(self._over(over))}
            raise KbenchError(f"no case where both {self._name(backend)!r} and {self._over(over)!r} passed"
                              + (": " + "; ".join(f"{k}: {v}" for k, v in list(bad.items())[:5]) if bad else ""))
        return float(geomean(c.speedup for c in cells.values()))

    def _over(self, over: str | None) -> str:
        name = over or self.baseline
        if name is None:
            raise KbenchError("no baseline: give measure(..., baseline=...) or speedup(over=BACKEND)")
        return self._name(name)


@dataclass(frozen=True)
class Speedup:
    """One case's speedup of a backend over another measured in the same run (> 1: faster)."""

    case_id: str
    speedup: float
    ci_low: float
    ci_high: float
    p_value: float


# --------------------------------------------------------------------------------------------------
# measure()


def measure(*targets: Any, cases: Sequence[Mapping[str, Any] | Case] | Mapping[str, Any] | None = None,
            suite: str | os.PathLike | Mapping[str, Any] | Suite | None = None, op: str = "attention",
            baseline: Any = None, device: str = "auto", output: str | os.PathLike | None = None,
            name: str | None = None, timing: Mapping[str, Any] | None = None,
            check: Mapping[str, Any] | None = None, integrity: Mapping[str, Any] | None = None,
            keyword: str | None = None, isolate: bool = True, case_timeout: float | None = None,
            trust_kernel_files: bool = False, allow_unsandboxed: bool = False, force: bool = False,
            held_out: int | None = None, show_held_out: bool = False,
            pm: PluginManager | None = None) -> Measurement:
    """Measure ``targets`` (and ``baseline``) on cases, in one run, as ``kbench run`` would.

    A target is a registered backend name or pattern (``"numpy-flash"``, ``"numpy-flash[block_q=64]"``), a
    kernel file path (``"kernel.py"``: untrusted, sandboxed, statically checked), a :class:`~kbench.api.Backend`
    instance, or a callable ``fn(q, k, v, out, *, causal, scale)`` (trusted: run in this process).

    The cases come from ``suite`` (a suite file, a suite dict as the YAML holds it, or a Suite) or from
    ``cases`` (case dicts of ``op``, each a grid entry: ``{"seqlen": 256, "heads": 4, "head_dim": 64}``).
    ``timing``, ``check`` and ``integrity`` override the suite's settings of the same names (docs/suites.md).
    ``output``: a ``.json`` path, or a directory that gets ``<machine>/<suite>-<time>.json`` as the results
    root does; None: the result file is temporary and removed once its records are read.

    Held-out shapes (docs/fuzz.md): every kernel file target (untrusted: a candidate) that passed every case is
    also checked, for correctness only, on ``held_out`` shapes near the suite's (default
    :data:`kbench.fuzz.heldout.HELD_OUT_CASES`; 0 turns it off), drawn from a secret of this call's; the verdict
    is in ``Measurement.held_out`` and a failure in ``failures()`` (the shape hidden unless ``show_held_out``).
    """
    pm = pm if pm is not None else get_plugin_manager()
    if not targets and baseline is None:
        raise BadInput("nothing to measure", where="measure()",
                       fix="give a backend name, a kernel file, a Backend or a callable")
    the_suite = _suite(suite, cases, op, name=name, timing=timing, check=check, integrity=integrity)
    the_op = pm.registry.op(the_suite.op)
    with python_terms():
        device_name = pick_device(pm, device)
    every = [*targets] + ([baseline] if baseline is not None else [])
    patterns, files, objects, plan = [], [], [], []
    for i, target in enumerate(every):
        kind, value = _classify(target, the_op, device_name)
        if kind == "pattern":
            _refuse_unmatched(pm, the_op, value, "baseline=..." if i == len(targets) else f"*targets: target {i + 1}")
            patterns.append(value)
        elif kind == "file":
            files.append(value)
        else:
            objects.append(value)
        plan.append((kind, value, i == len(targets)))
    _unique_names(objects)
    tmp = None
    if output is None:
        tmp = tempfile.mkdtemp(prefix="kbench-measure-")
        path = Path(tmp) / f"{the_suite.name}.json"
    else:
        path = _output_path(Path(output), pm, device_name, the_suite)
    req = RunRequest(suite=the_suite, device=device_name, backend_patterns=patterns or ["!*"],
                     kernel_files=files, keyword=keyword, output=path, isolate=isolate, case_timeout=case_timeout,
                     trust_kernel_files=trust_kernel_files, allow_unsandboxed=allow_unsandboxed, force=force,
                     backends=objects)
    try:
        with python_terms():
            planned = plan_run(pm, req)
        names, base_name = _names(plan, planned, pm, the_op)
        if len(set(b.name for b in planned.backends)) != len(planned.backends):
            from kbench.outputs import release_result_lock

            release_result_lock(path)  # plan_run took the result file's lock for a run that will not happen
            dup = sorted({b.name for b in planned.backends if [c.name for c in planned.backends].count(b.name) > 1})
            raise BadInput(f"two targets are both called {dup[0]!r}: their records would be indistinguishable",
                           where="measure(...)", fix="give one of them another NAME (kernel file) or name")
        writer = run_suite(pm, planned)
        records = [Record.of(r) for r in writer.records]
        header = {k: v for k, v in writer.data.items() if k != "records"}
        held = _held_out(pm, planned, records, held_out, allow_unsandboxed)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return Measurement(records, names, base_name, the_suite, device_name, None if tmp else path, header, held,
                       show_held_out)


def _held_out(pm: PluginManager, planned, records: list[Record], n: int | None, allow_unsandboxed: bool):
    """The held-out verdicts of the run's kernel files that passed every case (kbench.fuzz.heldout)."""
    from kbench.fuzz.heldout import check_held_out, held_out_default

    n = held_out_default(n)  # $KBENCH_EVAL_HELD_OUT when the caller gives no number, as score_kernel reads it
    given = {Path(f) for f in planned.request.kernel_files}
    files = [b for b in planned.backends if b.source_path and Path(b.source_path) in given and not b.trusted]
    ok = [b for b in files if all(r.passed for r in records if r.backend == b.name)
          and any(r.backend == b.name for r in records)]
    if n <= 0 or not ok:
        return {}
    return check_held_out(pm, ok, planned.plan.cases, device=planned.ctx.device.name, n=n,
                          allow_unsandboxed=allow_unsandboxed, case_timeout=planned.case_timeout,
                          check=planned.plan.check, integrity=planned.ctx.integrity)


def _suite(suite, cases, op: str, *, name, timing, check, integrity) -> Suite:
    if (suite is None) == (cases is None):
        raise BadInput("give the cases either as suite=... or as cases=[...], not both" if suite is not None
                       else "no cases", where="measure()",
                       fix="suite='suites/smoke.yaml' (or a suite dict), or cases=[{'seqlen': 128, 'heads': 4, "
                           "'head_dim': 64}]")
    if suite is not None:
        if isinstance(suite, Suite):
            base, path = suite.data, suite.path
        elif isinstance(suite, Mapping):
            base, path = suite, None
        else:
            loaded = load_suite(suite)
            base, path = loaded.data, loaded.path
        data = copy.deepcopy(dict(base))
    else:
        entries = [cases] if isinstance(cases, Mapping) else list(cases)
        if not entries:
            raise BadInput("cases is empty", where="measure(cases=...)", fix="give at least one case dict")
        grid = [dict(c.params) if isinstance(c, Case) else dict(c) for c in entries]
        data, path = {"version": 1, "name": DEFAULT_NAME, "op": op, "grid": grid}, None
    if name is not None:
        data["name"] = name
    for key, extra in (("timing", timing), ("check", check), ("integrity", integrity)):
        if extra:
            data[key] = {**data.get(key, {}), **extra}
            for per in (data.get("devices") or {}).values():  # a device's own settings would win: override too
                if key in per:
                    per[key] = {**per[key], **extra}
    return suite_from_data(data, path=path)


def _classify(target: Any, op, device: str) -> tuple[str, Any]:
    if isinstance(target, Backend):
        return "object", target
    if isinstance(target, (str, os.PathLike)):
        text = os.fspath(target)
        if text.endswith(".py") or Path(text).is_file():
            return "file", text
        return "pattern", text
    if callable(target):
        return "object", CallableBackend(target, op, device=device)
    raise BadInput(f"cannot measure a {type(target).__name__}", where="measure(...)",
                   fix="give a backend name, a kernel file path, a Backend or a callable")


def _refuse_unmatched(pm: PluginManager, op, pattern: str, argument: str) -> None:
    """A target or baseline name that selects no backend is refused (never silently dropped), naming the argument."""
    if pattern.startswith("!"):
        return
    with python_terms(where=f"measure({argument})"):
        if pm.registry.select_backends(op.name, [pattern]):
            return
        known = sorted(b.name for b in pm.registry.backends.values() if b.op == op.name)
        close = difflib.get_close_matches(pattern, known, n=1, cutoff=0.6)
        raise BadInput(f"no backend of op {op.name!r} matches {pattern!r}"
                       + (f" (did you mean {close[0]!r}?)" if close else ""), where=f"measure({argument})",
                       fix=f"known backends: {', '.join(known)}; or give a kernel file path, a Backend or a callable")


#: the command line's words for the places of an error, and the Python argument each one is here
CLI_WHERE = {"-b / suite backends": "measure(*targets, baseline=...)", "-b": "measure(*targets)",
             "-o": "measure(output=...)", "-k": "measure(keyword=...)", "--device": "measure(device=...)",
             "--case-timeout": "measure(case_timeout=...)", "--executor": "measure()"}
CLI_WORDS = ((r"add --force", "pass force=True"), (r"or --resume it", "or finish it with `kbench run --resume`"), (r"--force", "force=True"), (r"leave out -o", "leave out output="),
             (r"--device (\w+)", r"device='\1'"), (r"--trust-kernel-files", "trust_kernel_files=True"),
             (r"--allow-unsandboxed", "allow_unsandboxed=True"), (r"--no-isolate", "isolate=False"),
             (r"--case-timeout", "case_timeout="), (r"(?<![\w-])-o(?![\w-])", "output="),
             (r"(?<![\w-])-k(?![\w-])", "keyword="), (r"(?<![\w-])-b(?![\w-])", "a target"))


@contextlib.contextmanager
def python_terms(where: str | None = None):
    """Errors raised inside speak Python to a Python caller: argument names, not ``kbench run``'s flags."""
    try:
        yield
    except KbenchError as exc:
        fix = exc.fix
        for pattern, words in CLI_WORDS:
            fix = re.sub(pattern, words, fix) if fix else fix
        place = CLI_WHERE.get(exc.where or "", exc.where) if where is None or exc.where not in CLI_WHERE else where
        if place == exc.where and fix == exc.fix:
            raise
        raise type(exc)(exc.message, file=exc.file, where=place, fix=fix) from None


def _unique_names(objects: list[Backend]) -> None:
    """Two callables of the same name (two lambdas) get ``#2``, ``#3``...; other backends keep theirs."""
    seen: dict[str, int] = {}
    for b in objects:
        if isinstance(b, CallableBackend):
            n = seen.get(b.name, 0) + 1
            seen[b.name] = n
            if n > 1:
                b.name = f"{b.name}#{n}"


def _names(plan, planned, pm: PluginManager, op) -> tuple[list[str], str | None]:
    """Backend names in target order, and the baseline's."""
    by_path = {b.source_path: b.name for b in planned.backends if b.source_path}
    names, base = [], None
    for kind, value, is_baseline in plan:
        if kind == "pattern":
            got = [b.name for b in pm.registry.select_backends(op.name, [value])]
        elif kind == "file":
            got = [by_path[str(Path(value))]]
        else:
            got = [value.name]
        for n in got:
            if n not in names:
                names.append(n)
        if is_baseline and got:
            base = got[0]
    return names, base


def _output_path(output: Path, pm: PluginManager, device: str, suite: Suite) -> Path:
    if output.suffix == ".json":
        return output
    from kbench.outputs import unique_result_path

    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f")[:-3]
    return unique_result_path(output / pm.registry.device(device).machine_id(), suite.name, stamp)


def geomean_or_zero(values: Iterable[float]) -> float:
    """The geometric mean, or 0 when any value is missing, zero, negative or not finite (a fitness: one
    failed case makes the whole worth nothing)."""
    vals = list(values)
    if not vals or any(v is None or not math.isfinite(v) or v <= 0 for v in vals):
        return 0.0
    return float(math.exp(sum(math.log(v) for v in vals) / len(vals)))


__all__ = ["CallableBackend", "Measurement", "Speedup", "measure", "geomean_or_zero"]
