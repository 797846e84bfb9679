"""kbench's pytest plugin, for kbench and for authors of backend plugins.

Installed with kbench (entry point ``pytest11``), so these fixtures are available in any test:

``kbench_pm``          a fresh plugin manager (default plugins + installed entry points)
``kbench_case``        ``kbench_case(**params)`` -> a Case of the attention op (or ``op=...``)
``kbench_check``       ``kbench_check(backend, case)`` -> the record of one in-process execution
                       (correctness on 2 seeds, a few timing samples); assert on its ``status``
``fake_backend``       ``fake_backend(fn, name=..., device="cpu")`` -> a Backend whose kernel is ``fn``
                       (``fn(q, k, v, out, case)``) -- for testing harness behaviour
``kbench_kernel_file`` ``kbench_kernel_file(path, **settings)`` -> the kernel file as a backend, as
                       ``kbench run -b FILE`` makes it (:func:`kernel_file_backend`)
``kbench_measure``     ``kbench_measure(kernel, baseline="numpy-flash", cases=[...])`` -> a
                       :class:`kbench.api.Measurement`: :func:`kbench.api.measure` (the runner of
                       ``kbench run``: its judge, sandbox and timing) named after the test; assert
                       ``m.passed`` and a bound on ``m.speedup()``. ``pytest --kbench-save DIR`` keeps each
                       result file under ``DIR/<machine>/`` for ``kbench compare`` and ``kbench publish``

and, for code outside a fixture (a worker script, a helper of a test module):

``make_case(pm, op="attention", **params)`` and ``check_backend(pm, backend, case, timing=..., check=...)``
                       what ``kbench_case`` and ``kbench_check`` call; ``TEST_TIMING`` / ``TEST_CHECK`` their
                       settings, ``ONE_SAMPLE_TIMING`` one timed call and no warm-up (an emulator such as
                       Triton's interpreter, where only correctness is under test)
``kernel_file_backend(pm, path, **settings)``  what ``kbench_kernel_file`` calls
``static_violations(source, **integrity)``  what the static checks of an untrusted kernel file find in a
                       source (empty: it would run)
``skip_reason(pm, backend, case)``  why kbench would skip ``(backend, case)`` without running it, or None
``cli``                the ``kbench`` click group, for ``click.testing.CliRunner().invoke(cli, [...])``: a
                       command's test in this process, no new interpreter
``imported_by(modules, candidates)``  to check that a plugin imports nothing heavy
``sandbox_unavailable(monkeypatch, calls=None)``  the machine's sandbox probe fails (for the first ``calls``
                       asks, or always), as where user namespaces went away: untrusted work becomes records
                       of ``cause: infrastructure``
"""
from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Callable

import pytest

from kbench.backends import Backend
from kbench.judge.context import RunContext
from kbench.judge.policy import IntegritySettings
from kbench.ops import Case
from kbench.plugins import PluginManager
from kbench.suite import CheckSettings
from kbench.timing import TimingSettings

#: fast settings for tests: correctness on 2 seeds, a handful of samples
TEST_TIMING = TimingSettings(warmup_calls=1, warmup_time=0.0, min_samples=3, max_samples=5, min_time=0.0,
                             max_time=0.5, target_rel_se=1.0, rotate=2)
TEST_CHECK = CheckSettings(seeds=2, max_rows=64)
#: one timed call, no warm-up: for an emulator (Triton's interpreter) where a call takes seconds and only
#: correctness is under test
ONE_SAMPLE_TIMING = TimingSettings(warmup_calls=0, warmup_time=0.0, min_samples=1, max_samples=1, min_time=0.0,
                                   max_time=0.0, target_rel_se=1.0, rotate=1)


class FunctionBackend(Backend):
    """A backend from a plain function ``fn(q, k, v, out, case)`` (writes ``out`` or returns the result)."""

    def __init__(self, fn: Callable[..., Any], name: str = "fake", op: str = "attention", device: str = "cpu",
                 *, available: str | None = None, supports: Callable[[Case], str | None] | None = None) -> None:
        self.fn, self.name, self.op, self.device = fn, name, op, device
        self._available, self._supports = available, supports

    def available(self) -> str | None:
        return self._available

    def supports(self, case: Case) -> str | None:
        return self._supports(case) if self._supports else None

    def prepare(self, case: Case):
        def run(out, **inputs):
            return self.fn(*inputs.values(), out, case)
        return run


def imported_by(modules: list[str], candidates: tuple[str, ...]) -> list[str]:
    """Which of ``candidates`` are in ``sys.modules`` after importing ``modules`` in a fresh interpreter.

    For the rule that a plugin imports its heavy libraries (torch, cupy, triton) lazily:
    ``assert imported_by(["my_plugin.plugin"], ("torch",)) == []``.
    """
    import json
    import subprocess
    import sys

    code = (f"import sys, json; import {', '.join(modules)}; "
            f"print(json.dumps(sorted(m for m in {list(candidates)!r} if m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def make_case(pm: PluginManager, op: str = "attention", **params: Any) -> Case:
    the_op = pm.registry.op(op)
    defaults = {"seqlen": 32, "heads": 2, "head_dim": 16} if op == "attention" else {}
    # a default alias ("seqlen") yields to any parameter it would set ("seqlen_q")
    defaults = {k: v for k, v in defaults.items()
                if not any(t in params for t in the_op.aliases.get(k, ()))}
    return the_op.make_case({**defaults, **params})


def check_backend(pm: PluginManager, backend: Backend, case: Case, *, device: str | None = None,
                  timing: TimingSettings = TEST_TIMING, check: CheckSettings = TEST_CHECK,
                  integrity: IntegritySettings | None = None) -> dict[str, Any]:
    """Execute one (backend, case) in-process with test settings and return its record."""
    dev = pm.registry.device(device or backend.device)
    from kbench.run.pool import execute_in_process

    ctx = RunContext(op=pm.registry.op(case.op), device=dev, check=check, timing=timing,
                     hardware=pm.detect_hardware(dev), integrity=integrity or IntegritySettings())
    return execute_in_process(ctx, backend, case)


def kernel_file_backend(pm: PluginManager, path: str | Path, **settings: Any) -> Backend:
    """The kernel file at ``path`` as a backend with its tunables set to ``settings``: what ``kbench run -b
    FILE`` makes of it, with its substrate (``SUBSTRATE``) from ``pm``'s plugins.

    The file is imported in this process (a trusted use, for tests); ``kbench run`` runs an untrusted one
    only in a sandboxed worker. A bad file raises :class:`kbench.api.BadInput` naming it and the fix.
    """
    from kbench.kernelfile import KernelFileBackend

    return KernelFileBackend(path, pm.registry, settings=settings)


def static_violations(source: str, **integrity: Any) -> list[Any]:
    """What the static checks of an untrusted kernel file find in ``source``: a list of violations, each with
    ``line``, ``rule`` (``forbidden_calls``, ``forbid_exec``, ``forbid_module_state``, ...) and ``message``;
    empty when the file would run. ``integrity`` overrides keys of a suite's ``integrity:`` section
    (``allowed_calls=("torch.*",)``); the defaults are kbench's.
    """
    from kbench.judge.policy import static_check

    return static_check(source, IntegritySettings(**integrity))


def skip_reason(pm: PluginManager, backend: Backend, case: Case) -> str | None:
    """Why kbench would skip ``(backend, case)`` without running it, or None: the backend is unavailable
    (``available()``), lacks a feature the case needs (``mode: bwd``, ``window``, ...: ``features``) or
    refuses the case (``supports()``), in the order the harness asks."""
    from kbench.backends import missing_feature

    return (backend.available() or missing_feature(backend, pm.registry.op(case.op).required_features(case))
            or backend.supports(case))


def sandbox_unavailable(monkeypatch: Any, calls: int | None = None) -> None:
    """Make the sandbox probe answer "unavailable" for its first ``calls`` asks (every ask, with None)."""
    from kbench.run import sandbox

    real, asked = sandbox.probe, itertools.count(1)

    def probe():
        if calls is None or next(asked) <= calls:
            return sandbox.SandboxStatus(False, None, None, "simulated: user namespaces are disabled")
        return real()
    monkeypatch.setattr(sandbox, "probe", probe)


def __getattr__(name: str) -> Any:
    if name == "cli":  # imported on first use, not with the pytest plugin
        from kbench.cli import cli

        return cli
    raise AttributeError(f"module 'kbench.testing' has no attribute {name!r}")


@pytest.fixture
def kbench_pm() -> PluginManager:
    return PluginManager()


@pytest.fixture
def kbench_case(kbench_pm):
    return lambda op="attention", **params: make_case(kbench_pm, op, **params)


@pytest.fixture
def kbench_check(kbench_pm):
    return lambda backend, case, **kw: check_backend(kbench_pm, backend, case, **kw)


@pytest.fixture
def fake_backend():
    return FunctionBackend


@pytest.fixture
def kbench_kernel_file(kbench_pm):
    """``kbench_kernel_file(path, **settings)`` -> the kernel file as a backend (:func:`kernel_file_backend`)."""
    return lambda path, **settings: kernel_file_backend(kbench_pm, path, **settings)


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("kbench")
    group.addoption("--kbench-save", metavar="DIR", default=None,
                    help="kbench_measure keeps each measurement's result file under DIR/<machine>/, named after the "
                         "test (compare two with `kbench compare`, chart them with `kbench publish DIR`)")


def measurement_name(nodeid: str) -> str:
    """A suite name (``[A-Za-z0-9_.-]+``) for a test: ``tests/test_k.py::test_a[x-1]`` -> ``test_k.test_a-x-1``.

    The result files of one test share it across sessions, so ``kbench publish`` draws them as one history."""
    import re

    path, _, rest = nodeid.partition("::")
    stem = path.rsplit("/", 1)[-1].removesuffix(".py")
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", f"{stem}.{rest.replace('::', '.')}" if rest else stem).strip("-.")
    return name[:120] or "test"


@pytest.fixture
def kbench_measure(request):
    """``kbench_measure(*targets, **kw)`` = :func:`kbench.api.measure` with the test's name as the suite name
    and, under ``--kbench-save DIR``, ``output=DIR`` (unless the call gives ``output``). The plugin manager is
    the process's (``get_plugin_manager()``): plugins load once per session, not once per test."""
    from kbench.measurement import measure

    save = request.config.getoption("kbench_save", None)

    def run(*targets: Any, **kw: Any):
        kw.setdefault("name", measurement_name(request.node.nodeid))
        if save and kw.get("output") is None:
            kw["output"] = save
        return measure(*targets, **kw)
    return run


def pytest_runtest_logreport(report: Any) -> None:
    """With ``KBENCH_INSTAFAIL=1``, a failure's report is printed the moment it happens, not at the end.

    ``scripts/gpu-check`` sets it: its test stage runs under a deadline, and a stage killed at its budget
    prints no end-of-session summary, so without this a failure on a lent GPU would leave only an ``F``.
    """
    import os
    import sys

    if report.failed and os.environ.get("KBENCH_INSTAFAIL") == "1":
        text = str(report.longrepr)
        lines = text.splitlines()
        if len(lines) > 60:  # the end of a traceback says what failed; keep the log readable
            text = "\n".join(["...", *lines[-60:]])
        sys.stdout.write(f"\n--- FAILED {report.nodeid} ({report.when})\n{text}\n")
        sys.stdout.flush()
