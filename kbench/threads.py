"""Threads kbench decides for CPU work, and the machine's load before timing.

Left to themselves, OpenBLAS, MKL and OpenMP start one thread per core in every process. A CPU timing then
depends on what else runs: on a busy machine the library's threads wait for each other at every barrier and
a NumPy backend's median moves by tens of times between an idle and a loaded run. kbench therefore decides:

* every worker runs with :data:`DEFAULT_THREADS` (1) BLAS/OpenMP thread and one torch intra-op thread, set
  in its environment at spawn (:func:`thread_environment`, the variables of :data:`THREAD_VARIABLES`);
* ``kbench run --threads N`` (or ``KBENCH_THREADS=N``) sets N instead, for every worker, overriding what
  the caller's environment says; ``--threads 0`` leaves the libraries to their own defaults;
* without ``--threads``, a thread variable the caller set is kept (their choice, recorded as such);
* a trusted in-process run (``--no-isolate``) gets the same limit applied in this process with threadpoolctl
  (and torch's ``set_num_threads`` when torch is loaded already): :func:`apply_threads`.

The setting lands in the result file's ``machine.threads`` (the variables) and ``machine.thread_setting``;
``kbench show`` prints it. :func:`load_state` reads the load average the way pyperf's system check does: a
1-minute load above the cores means other work competes for them, said on screen and in ``machine.load``.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Mapping, MutableMapping

#: the one variable that carries a decided setting from ``kbench run`` to every worker it spawns
SETTING_VARIABLE = "KBENCH_THREADS"

#: threads per worker unless told otherwise: one, so that workers never oversubscribe the cores and a record's
#: time does not depend on what else the machine runs (docs/compare.md, "Threads")
DEFAULT_THREADS = 1

#: what the BLAS, OpenMP and torch runtimes read at start-up (kbench's torch backends read KBENCH_TORCH_THREADS)
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
                    "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS", "KBENCH_TORCH_THREADS")

#: the most threads --threads accepts (a typo guard, far above any core count this runs on)
MAX_THREADS = 1024


@dataclass(frozen=True)
class ThreadSetting:
    """``threads``: per worker (0: the libraries' own defaults); ``source``: "default", "--threads" or
    "caller's environment" (without --threads, variables the caller set are kept)."""

    threads: int
    source: str

    def to_json(self) -> dict[str, Any]:
        return {"threads": self.threads, "source": self.source}

    @property
    def text(self) -> str:
        if self.threads == 0:
            return "threads: the libraries' own defaults (--threads 0)"
        return f"threads: {self.threads} BLAS/OpenMP/torch thread{'s' * (self.threads != 1)} per worker ({self.source})"


def parse_threads(value: str | int, *, where: str = "--threads") -> int:
    """A thread count: an integer from 0 (the libraries' defaults) to :data:`MAX_THREADS`."""
    from kbench.errors import BadInput

    try:
        n = int(str(value).strip())
    except ValueError:
        n = -1
    if not 0 <= n <= MAX_THREADS:
        raise BadInput(f"bad thread count {str(value)[:40]!r}", where=where,
                       fix=f"give a whole number from 1 to {MAX_THREADS} (threads per worker), or 0 for the "
                           "libraries' own defaults")
    return n


def decided(environ: Mapping[str, str] | None = None) -> ThreadSetting:
    """The setting ``environ`` carries (:data:`SETTING_VARIABLE`), else the default."""
    environ = os.environ if environ is None else environ
    raw = environ.get(SETTING_VARIABLE)
    if raw is not None and raw.strip():
        return ThreadSetting(parse_threads(raw, where=SETTING_VARIABLE), "--threads")
    own = [v for v in THREAD_VARIABLES if environ.get(v)]
    return ThreadSetting(DEFAULT_THREADS, "default" if not own else "default; caller's " + ", ".join(own) + " kept")


def thread_environment(base: Mapping[str, str]) -> dict[str, str]:
    """The thread variables a worker spawned from ``base`` (the parent's environment) gets: the decided count
    in every variable; without an explicit setting, variables ``base`` sets itself are kept as they are."""
    setting = decided(base)
    if setting.threads == 0:
        return {}
    explicit = base.get(SETTING_VARIABLE, "").strip() != ""
    return {v: str(setting.threads) for v in THREAD_VARIABLES if explicit or not base.get(v)}


def apply_threads(threads: int | None, environ: MutableMapping[str, str] | None = None, *,
                  in_process: bool = False) -> ThreadSetting:
    """Decide for this run: ``threads`` (``--threads``; None: the default) goes into ``environ`` (this process's
    environment by default, which workers inherit and the result header records); with ``in_process``
    (``--no-isolate``: trusted code timed in this process) also into the BLAS/OpenMP pools loaded here
    (threadpoolctl) and torch's intra-op threads when torch is loaded already. :func:`restore_threads` undoes it."""
    environ = os.environ if environ is None else environ
    _SAVED.append({v: environ.get(v) for v in (SETTING_VARIABLE, *THREAD_VARIABLES)})
    if threads is not None:
        environ[SETTING_VARIABLE] = str(threads)
    setting = decided(environ)  # before the variables are filled in: which ones the caller set
    environ.update(thread_environment(environ))
    if in_process and setting.threads and all(environ.get(v) == str(setting.threads) for v in THREAD_VARIABLES):
        limit_this_process(setting.threads)
    return setting


#: what :func:`apply_threads` replaced, to put back; threadpoolctl's controllers (the limit holds while kept)
_SAVED: list[dict[str, str | None]] = []
_LIMITS: list[Any] = []


def restore_threads(environ: MutableMapping[str, str] | None = None) -> None:
    """Undo the last :func:`apply_threads`: the environment as it was, this process's pools as they were (a
    command run inside a longer-lived process, a test, leaves no trace)."""
    environ = os.environ if environ is None else environ
    if _SAVED:
        for name, value in _SAVED.pop().items():
            if value is None:
                environ.pop(name, None)
            else:
                environ[name] = value
    while _LIMITS:
        _LIMITS.pop().restore_original_limits()


def limit_this_process(threads: int) -> None:
    """The BLAS/OpenMP pools loaded in this process to ``threads``, and torch's intra-op threads when torch is
    already imported (never imported here: it takes seconds)."""
    from threadpoolctl import threadpool_limits

    _LIMITS.append(threadpool_limits(limits=threads))
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "set_num_threads"):
        torch.set_num_threads(threads)


def in_process_threads() -> dict[str, int]:
    """The threads each BLAS/OpenMP pool loaded in this process uses now (by its library's name)."""
    from threadpoolctl import threadpool_info

    return {f"{p.get('internal_api')}:{os.path.basename(str(p.get('filepath')))}": int(p.get("num_threads") or 0)
            for p in threadpool_info()}


def cores() -> int:
    """The cores this process may run on: the CPU device's count, one function for both."""
    from kbench.devices.cpu import cpu_count

    return cpu_count()


def load_state() -> dict[str, Any] | None:
    """The load averages (1, 5, 15 minutes), the cores this process may use, and ``busy``: the 1-minute load
    above the cores (other work competes for them: timings are slower and noisier). None where the OS has no
    load average."""
    try:
        one, five, fifteen = os.getloadavg()
    except (AttributeError, OSError):
        return None
    n = cores()
    return {"load1": round(one, 2), "load5": round(five, 2), "load15": round(fifteen, 2), "cores": n,
            "busy": one > n}


def load_line(state: Mapping[str, Any] | None, *, paired: bool = False) -> str:
    """One line for the screen: the load, and when it exceeds the cores, what that means and what to do
    (``paired``: for ``kbench ab``, which is what to do)."""
    if not state:
        return "load average: not known on this system"
    text = f"load average {state['load1']:.2f} on {state['cores']} cores"
    if state.get("busy"):
        text += (" (BUSY: more runnable work than cores; timings will be slower and noisier than on an idle "
                 + ("machine; the pairs share each moment, so the intervals widen rather than move)" if paired else
                    "machine; to gate a change here, time old and new in one run: kbench ab, docs/compare.md)"))
    return text


def busy(data: Mapping[str, Any]) -> bool:
    """Whether a result file says its machine was busy before or after its run (``machine.load``)."""
    return bool(loads(data)) and any(state.get("busy") is True for state in loads(data))


def loads(data: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The load states a result file recorded (``machine.load.before`` and ``.after``) that hold a number."""
    machine = data.get("machine")
    load = machine.get("load") if isinstance(machine, Mapping) else None
    if not isinstance(load, Mapping):
        return []
    return [v for v in (load.get("before"), load.get("after")) if isinstance(v, Mapping)
            and isinstance(v.get("load1"), (int, float)) and not isinstance(v.get("load1"), bool)]


def stamp_result(path, setting: ThreadSetting, before: Mapping[str, Any] | None,
                 after: Mapping[str, Any] | None) -> None:
    """Write the run's thread setting and the load before and after its timing into the finished result file
    ``path`` (``machine.thread_setting``, ``machine.load``; a resumed run: its entry of ``resumes``). A file
    that cannot be read back is left as it is: the run's records matter more than this note."""
    import json
    from pathlib import Path

    from kbench.results import atomic_write_json

    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if not isinstance(data, dict) or not isinstance(data.get("machine"), dict):
        return
    note = {"thread_setting": setting.to_json(), "load": {"before": dict(before) if before else None,
                                                          "after": dict(after) if after else None}}
    resumes = data.get("resumes")
    if isinstance(resumes, list) and resumes and isinstance(resumes[-1], dict) and "load" in data["machine"]:
        resumes[-1].update(note)
    else:
        data["machine"].update(note)
    atomic_write_json(Path(path), data)


def describe(data: Mapping[str, Any]) -> str | None:
    """One line of a result's thread setting and load for ``kbench show`` (None: recorded before either was)."""
    machine = data.get("machine") or {}
    parts = []
    setting = machine.get("thread_setting")
    if isinstance(setting, Mapping) and isinstance(setting.get("threads"), int):
        parts.append(ThreadSetting(setting["threads"], str(setting.get("source", "?"))).text)
    variables = machine.get("threads")
    if isinstance(variables, Mapping) and variables:
        parts.append(", ".join(f"{k}={v}" for k, v in sorted(variables.items())))
    elif setting is None:
        parts.append("threads: not recorded (the libraries' defaults: as many as cores per worker)")
    load = machine.get("load")
    if isinstance(load, Mapping):
        for when in ("before", "after"):
            state = load.get(when)
            if isinstance(state, Mapping) and isinstance(state.get("load1"), (int, float)) \
                    and not isinstance(state.get("load1"), bool):
                parts.append(f"load {when} {state['load1']:.2f} on {state.get('cores', '?')} cores"
                             + (" (BUSY)" if state.get("busy") else ""))
    return "; ".join(parts) or None
