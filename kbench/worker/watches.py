"""What the worker watches around candidate code: harness identity, threads, torch operators.

These are facts the call runner reports (kbench.worker.calls); each can only fail a record, and the judge
in the parent decides. They run in the process that runs candidate code, so they are defence in depth
behind the parent's own checks (secret inputs, verification, the parent's clock), never the only check.
"""
from __future__ import annotations

import fnmatch
import os
import sys
import threading
import time
from typing import Any, Callable, Iterable

import kbench.devices as _devices

#: timer functions a kernel could patch to shorten its samples
TIMER_NAMES = ("perf_counter", "perf_counter_ns", "time", "time_ns", "monotonic", "monotonic_ns",
               "process_time", "process_time_ns", "thread_time", "thread_time_ns", "sleep")
#: device methods the timed loop calls
DEVICE_METHODS = ("time_call", "synchronize", "before_sample", "poisoned", "repoison", "from_host", "to_host",
                  "write", "generate", "sample_clock", "is_array", "copy", "copy_into", "same_content", "nonfinite",
                  "is_same_memory", "sustained")
#: modules whose functions the worker's timed loop relies on
HARNESS_MODULES = ("kbench.worker.calls", "kbench.worker.watches", "kbench.worker.main", "kbench.protocol",
                   "kbench.ops.inputs", "kbench.devices")


class ClockReference:
    """The process's timers as they were when this module loaded: at the worker's start, before any candidate
    code (kbench.worker.main imports this module before it loads the plugins, and a job's kernel after both).

    The sample clock reads ``time.perf_counter_ns`` through the ``time`` module that ``kbench.devices`` holds. A
    replacement that gives itself back on the very read that ends a call (the original is in place again when
    the harness snapshot looks, after the batch) is seen only if every read is checked, so the call runner makes
    the tests of :meth:`intact` right before each of them (the batch's window, every call's start and stop marks:
    three identity tests on locals, about 50 ns). Any replacement seen, even one restored later, faults the
    record; it is never a sample. :meth:`replaced` names every timer that differs (checked around each batch, outside the samples).
    """

    def __init__(self) -> None:
        self.module = time
        self.devices = _devices
        self.perf_counter_ns = time.perf_counter_ns
        self.timers = {name: getattr(time, name, None) for name in TIMER_NAMES}
        self.clock_class: type = _devices.SampleClock
        self.marks = (_devices.SampleClock.start, _devices.SampleClock.stop)

    def bind(self, clock_class: type) -> None:
        """The device's sample clock class (its start/stop marks are what the harness reads): captured by the call
        runner, made at the worker's start before any candidate code."""
        self.clock_class = clock_class
        self.marks = (clock_class.start, clock_class.stop)

    def intact(self) -> bool:
        cls = self.clock_class
        return (self.devices.time is self.module and self.module.perf_counter_ns is self.perf_counter_ns
                and cls.start is self.marks[0] and cls.stop is self.marks[1])

    def replaced(self) -> list[str]:
        out = [f"time.{name}" for name, fn in self.timers.items() if getattr(self.module, name, None) is not fn]
        for name, fn in zip(("start", "stop"), self.marks):
            if getattr(self.clock_class, name, None) is not fn:
                out.append(f"{self.clock_class.__name__}.{name}")
        if sys.modules.get("time") is not self.module:
            out.append("sys.modules['time']")
        if self.devices.time is not self.module:
            out.append("kbench.devices.time")
        return out


#: captured once, at import (the worker's start); kbench.worker.calls reads through it
CLOCK = ClockReference()


class HarnessSnapshot:
    """Identity of every function the worker relies on to run, time and report a kernel's calls."""

    def __init__(self, device: Any | None = None) -> None:
        self.device = device
        self.items = dict(self._current())

    def _current(self) -> Iterable[tuple[str, Any]]:
        import importlib

        import numpy as np

        for name in TIMER_NAMES:
            yield f"time.{name}", getattr(time, name, None)
        for name in ("isfinite", "count_nonzero", "array", "asarray", "ascontiguousarray", "array_equal", "copyto",
                     "take", "full", "empty"):
            yield f"numpy.{name}", getattr(np, name)
        yield "numpy.random.Philox", np.random.Philox
        yield "threading.active_count", threading.active_count
        yield "os.listdir", os.listdir
        for modname in HARNESS_MODULES:
            mod = importlib.import_module(modname)
            for key, value in vars(mod).items():
                # functions, classes and the modules they call through (``time`` swapped for a fake clock)
                if not key.startswith("__") and (callable(value) or isinstance(value, type(os))):
                    yield f"{modname}.{key}", value
        if self.device is not None:
            cls = type(self.device)
            for klass in cls.__mro__:
                if klass is object:
                    continue
                for name in DEVICE_METHODS:
                    if name in vars(klass):
                        yield f"{klass.__name__}.{name}", vars(klass)[name]
            for name in DEVICE_METHODS:
                yield f"{self.device.name} device instance .{name}", vars(self.device).get(name)

    def changed(self) -> list[str]:
        """Names whose object is no longer the one captured (or that appeared since)."""
        now = dict(self._current())
        return sorted(k for k in set(now) | set(self.items) if now.get(k) is not self.items.get(k))


class QuietWorld:
    """What could run candidate code while the harness alone should be running (an empty batch, the gaps between
    samples), captured at the worker's start, before any candidate code: the Python threads alive then, the
    trace, profile and monitoring hooks, NumPy's floating-point error callback, the handlers of the timer
    signals and the interval timers. The call runner of an untrusted kernel holds every call to it (no thread
    the kernel started may outlive the call that started it) and every batch to the rest, so no candidate code
    can run during an empty batch: the empty loop's cost is the harness's own (docs/integrity.md)."""

    SIGNALS = ("SIGALRM", "SIGVTALRM", "SIGPROF", "SIGUSR1", "SIGUSR2", "SIGIO", "SIGCHLD")

    def __init__(self) -> None:
        self.threads = frozenset(t.ident for t in threading.enumerate())
        self.hooks = self._hooks()

    @classmethod
    def _hooks(cls) -> dict[str, Any]:
        import signal

        import numpy as np

        hooks: dict[str, Any] = {"sys.settrace": sys.gettrace(), "sys.setprofile": sys.getprofile(),
                                 "threading.settrace": getattr(threading, "_trace_hook", None),
                                 "threading.setprofile": getattr(threading, "_profile_hook", None),
                                 "numpy.seterrcall": np.geterrcall()}
        monitoring = getattr(sys, "monitoring", None)
        if monitoring is not None:
            for tool in range(6):
                hooks[f"sys.monitoring tool {tool}"] = monitoring.get_tool(tool)
        for name in cls.SIGNALS:
            number = getattr(signal, name, None)
            if number is not None:
                hooks[f"signal handler {name}"] = signal.getsignal(number)
        for name in ("ITIMER_REAL", "ITIMER_VIRTUAL", "ITIMER_PROF"):
            which = getattr(signal, name, None)
            if which is not None:
                hooks[f"interval timer {name}"] = any(value > 0 for value in signal.getitimer(which))
        return hooks

    def strangers(self) -> list[threading.Thread]:
        """Python threads alive now that were not alive at the worker's start."""
        return [t for t in threading.enumerate() if t.ident not in self.threads]

    def changed_hooks(self) -> list[str]:
        now = self._hooks()
        return sorted(k for k in set(now) | set(self.hooks) if now.get(k) != self.hooks.get(k)
                      and now.get(k) is not self.hooks.get(k))


def native_threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:  # not Linux: Python threads are what we can see
        return threading.active_count()


def thread_counts() -> tuple[int, int]:
    return threading.active_count(), native_threads()


class ThreadLeak(Exception):
    """A kernel call returned with more threads alive than when it started."""


class ThreadWatch:
    """Counts Python and native threads before and after each call.

    The first call of a kernel may start a library's persistent thread pool (BLAS, OpenMP, torch),
    so growth is only an error from the second call on: a kernel that starts a thread per call, or
    leaves work running when it returns, is caught there.
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.calls = 0
        self.max_seen = thread_counts()

    def before(self) -> tuple[int, int] | None:
        return thread_counts() if self.enabled else None

    def after(self, before: tuple[int, int] | None) -> None:
        if not self.enabled or before is None:
            return
        after = thread_counts()
        self.calls += 1
        self.max_seen = tuple(max(a, b) for a, b in zip(self.max_seen, after))
        if self.calls > 1 and (after[0] > before[0] or after[1] > before[1]):
            raise ThreadLeak(f"the kernel returned with threads still running (Python threads {before[0]} -> "
                             f"{after[0]}, native threads {before[1]} -> {after[1]}): work left running after "
                             f"return is not timed")


class Fault(Exception):
    """Something the runner saw that fails the record (reported as data; the judge names it)."""


class OpWatch:
    """Names every torch operator the dispatcher runs inside it and faults on a forbidden one.

    The dispatcher sees the operator however the Python call was spelled (``getattr`` with a computed
    name, ``torch.ops.aten...``, an alias): the run-time half of ``integrity.forbidden_calls``. Used on
    the untimed calls only (the correctness and warm-up batches): it costs a Python call per operator.
    """

    def __init__(self, patterns: tuple[str, ...]) -> None:
        self.patterns = patterns
        self.seen: list[str] = []
        self.mode = None
        torch = sys.modules.get("torch") if patterns else None
        if torch is not None:
            from torch.utils._python_dispatch import TorchDispatchMode

            watch = self

            class _Mode(TorchDispatchMode):
                def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                    name = str(func)
                    if any(fnmatch.fnmatchcase(name, p) for p in watch.patterns):
                        watch.seen.append(name)
                    return func(*args, **(kwargs or {}))

            self.mode = _Mode()

    def __enter__(self) -> OpWatch:
        if self.mode is not None:
            self.mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.mode is not None:
            self.mode.__exit__(*exc)

    def run(self, fn: Callable[[], Any]) -> Any:
        with self:
            result = fn()
        if self.seen:
            raise Fault(f"forbidden operator {self.seen[0]} ran inside the kernel (integrity.forbidden_calls: "
                        f"the library attention it competes with, however the call is spelled)")
        return result
