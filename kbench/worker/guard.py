"""The audit hook of untrusted workers: refuses what a kernel has no business doing.

Installed with :func:`install` in a sandboxed worker after the trusted plugins loaded and before
any candidate code (a kernel file) is imported. Defence in depth behind the OS sandbox
(:mod:`kbench.run.sandbox`): the sandbox is what stops an escape; the guard turns the attempt into a
``failed`` record that names it ("audit: refused socket.connect ...") instead of a quiet no-op.

Two kinds of events (https://docs.python.org/3/library/audit_events.html):

* **never allowed** after install, whoever raises them: sockets, ``os.system``, fork, exec, spawn,
  a subprocess other than the C toolchain Triton's JIT runs, writes (``open`` for writing, remove,
  rename, mkdir, chmod...) outside the scratch directory, ``ctypes`` loading a shared library from a
  writable place (except Triton's own cache), importing a forbidden module (FlashAttention, xFormers,
  cuDNN bindings, Transformer Engine) however spelled.
* **introspection and the like**, refused when candidate code asks for it (the nearest frame that is
  not ctypes/inspect machinery belongs to a file in the scratch directory, where the worker keeps the
  kernel file it loads; under the import system, the module being imported is the one asking): frames
  (``sys._getframe``, ``sys._current_frames``, ``tb_frame``, ``gi_frame``...), ``gc`` walks, tracing and
  profiling hooks, ``exec``/``compile``, every ``ctypes`` call, signals, ``resource.setrlimit``, the
  code and defaults of kbench's own functions, importing ``socket``/``subprocess``/``ctypes``/``gc``/
  ``multiprocessing`` or kbench modules the worker had not loaded. NumPy, torch, CuPy and Triton's
  interpreter do such things themselves, from their own frames, and keep working (tests/test_guard.py);
  Triton's JIT is allowed its toolchain and cache by design, not yet run guarded on a GPU.

An audit hook cannot be removed once added, and the candidate has no reference to the
:class:`Guard` (the worker holds it in a local variable; frame and ``gc`` access are refused).
"""
from __future__ import annotations

import fnmatch
import os
import sys
import threading
import weakref
from typing import Any, Iterable

#: modules a kernel may not import, however the import is spelled (fnmatch on the module name)
FORBIDDEN_MODULES: tuple[str, ...] = ("flash_attn", "flash_attn.*", "flash_attn_*", "xformers", "xformers.*",
                                      "cudnn", "cudnn.*", "transformer_engine", "transformer_engine.*")

#: modules candidate code may not import itself (libraries it imports may: torch imports multiprocessing)
CANDIDATE_FORBIDDEN_MODULES: tuple[str, ...] = ("socket", "_socket", "ssl", "_ssl", "http", "http.*", "urllib.request",
                                                "ftplib", "smtplib", "multiprocessing", "multiprocessing.*",
                                                "_posixsubprocess", "subprocess", "pty", "gc", "ctypes", "ctypes.*",
                                                "_ctypes", "resource", "signal", "faulthandler", "_thread")

#: executables a subprocess may run (the C toolchain and CUDA tools Triton's JIT calls)
ALLOWED_EXECUTABLES: frozenset[str] = frozenset({"cc", "gcc", "g++", "c++", "clang", "clang++", "ptxas", "nvcc",
                                                 "cuobjdump", "nvdisasm", "ldconfig", "ldconfig.real", "nvlink"})

#: events refused whoever raises them (prefix match when the name ends with a dot)
NEVER: tuple[str, ...] = ("socket.", "os.system", "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn",
                          "os.startfile", "pty.spawn", "sys.addaudithook", "sys.remote_exec",
                          "os.setuid", "os.setgid", "webbrowser.open", "urllib.Request", "ftplib.", "smtplib.",
                          "http.client.", "imaplib.", "poplib.", "telnetlib.", "nntplib.")

#: events refused when candidate code raises them itself
INTROSPECTION: tuple[str, ...] = ("sys._getframe", "sys._getframemodulename", "sys._current_frames",
                                  "sys._current_exceptions", "gc.get_objects", "gc.get_referrers",
                                  "gc.get_referents", "sys.settrace", "sys.setprofile", "sys.monitoring.",
                                  "exec", "compile", "ctypes.", "code.__new__", "function.__new__",
                                  "os.kill", "os.killpg", "signal.pthread_kill", "resource.setrlimit",
                                  "resource.prlimit")

#: events refused **whoever raises them** (a thread's target, a ``functools.partial``, a ``weakref.finalize``
#: callback, a method found with ``getattr``), unless the harness itself does with no candidate code on the stack:
#: nothing a library does for a kernel needs them, so they need no attribution to the frame that asked
WHOEVER: tuple[str, ...] = ("os.kill", "os.killpg", "signal.pthread_kill", "resource.setrlimit", "resource.prlimit",
                            "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._current_frames",
                            "sys._current_exceptions")
#: machinery that calls what it was handed: a frame of it nearest an event says nothing about who asked
_LAUNDERING = (os.sep + "threading.py", os.sep + "weakref.py", os.sep + "concurrent" + os.sep + "futures" + os.sep,
               os.sep + "asyncio" + os.sep, os.sep + "sched.py", os.sep + "_weakrefset.py")

#: events that reach only the calling thread's own stack: not refused in a candidate's thread for that alone
_OWN_STACK = frozenset({"sys._getframe", "sys._getframemodulename"})

#: attributes that lead to frames: candidate code may not read them (``object.__getattr__`` events)
FRAME_ATTRIBUTES: frozenset[str] = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"})
#: attributes candidate code may not read, set or delete on the harness's own functions and classes
HARNESS_ATTRIBUTES: frozenset[str] = frozenset({"__code__", "__globals__", "__closure__", "__defaults__",
                                                "__kwdefaults__", "__dict__"})

#: events that write to a path (the path is the first argument)
WRITES: frozenset[str] = frozenset({"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.symlink", "os.link",
                                    "os.truncate", "os.chmod", "os.chown", "os.utime", "os.chflags", "os.lchmod",
                                    "os.mkfifo", "os.mknod", "shutil.rmtree", "shutil.copyfile", "shutil.move",
                                    "os.setxattr", "os.removexattr"})

#: files whose frames are machinery between the candidate and an event, not its originator
_PASS_THROUGH = (os.sep + "ctypes" + os.sep, os.sep + "inspect.py", os.sep + "functools.py", os.sep + "operator.py")
#: the import system: an event raised under it belongs to the module being loaded (compile, exec of
#: its code, its own introspection), never to the candidate that asked for the import
_IMPORT_SYSTEM = ("<frozen importlib", os.sep + "importlib" + os.sep)

#: what :meth:`Guard._originator` says when the import system's frames come first
_IMPORTING = "<the import system>"

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


class AuditRefused(PermissionError):
    """Raised in the worker when the guard refuses an event."""


class Guard:
    """The installed hook's state: the scratch directory, what was loaded before, what was refused."""

    def __init__(self, scratch: str, *, system_roots: Iterable[str] = ()) -> None:
        self.scratch = os.path.realpath(scratch)
        self.triton_cache = os.path.join(self.scratch, ".triton")
        self.system_roots = tuple(os.path.realpath(r) for r in system_roots if r)
        self.loaded_kbench = frozenset(m for m in sys.modules if m == "kbench" or m.startswith("kbench."))
        self.refusals: list[str] = []
        self._busy = threading.local()
        #: threads started while candidate code was on the stack (or by such a thread): theirs, whatever they run
        self.tainted: weakref.WeakSet[threading.Thread] = weakref.WeakSet()
        self._files: dict[str, bool] = {}   # code file -> in the scratch directory (realpath once per file)
        self.thread_gates: dict[str, _ThreadGate] = {}   # threading's start function(s) -> the gate in place

    # -- the hook

    def __call__(self, event: str, args: tuple) -> None:
        if getattr(self._busy, "on", False):
            return  # events raised by this hook's own work (its sys._getframe)
        self._busy.on = True
        try:
            why = self._judge(event, args)
        finally:
            self._busy.on = False
        if why is not None:
            self.refusals.append(why)
            raise AuditRefused(why)

    def _judge(self, event: str, args: tuple) -> str | None:
        if event == "open":
            return self._open(args)
        if event == "import":
            return self._import(args)
        if event == "object.__getattr__" and len(args) > 1:
            if args[1] in FRAME_ATTRIBUTES:  # a thread's own frames lead to its own stack only
                return self._if_candidate(f"{event} {args[1]!r}", thread_too=False)
            if args[1] in HARNESS_ATTRIBUTES:
                # Triton's JIT and torch read these constantly; candidate code reading them on kbench's own
                # functions is how harness state is reached
                return self._if_candidate(f"{event} {args[1]!r} of {_short((args[0],))}", target=args[0])
            return None
        if event in ("object.__setattr__", "object.__delattr__") and args:
            # raised for attributes of classes: patching a harness class from a kernel
            return self._if_candidate(f"{event} {_short(args[:2])}", target=args[0])
        if event == "subprocess.Popen":
            return self._popen(args)
        if event == "ctypes.dlopen":
            return self._dlopen(args)
        if event in WRITES:
            return self._writes(event, args)
        if _matches(event, NEVER):
            return f"audit: refused {event} {_short(args)}"
        if _matches(event, WHOEVER):
            return self._unless_harness(f"{event} {_short(args)}")
        if _matches(event, INTROSPECTION):
            return self._if_candidate(f"{event} {_short(args)}", thread_too=event not in _OWN_STACK)
        return None

    # -- the rules

    def _open(self, args: tuple) -> str | None:
        path, mode, flags = (tuple(args) + (None, None, None))[:3]
        if isinstance(path, int) or path is None:
            return None
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & _WRITE_FLAGS)
        if not writing or self._writable(path):
            return None
        return f"audit: refused open {_path(path)!r} for writing (outside the scratch directory {self.scratch})"

    def _writes(self, event: str, args: tuple) -> str | None:
        paths = [a for a in args[:2] if isinstance(a, (str, bytes, os.PathLike))]
        bad = [p for p in paths if not self._writable(p)]
        if not bad:
            return None
        return f"audit: refused {event} {_path(bad[0])!r} (outside the scratch directory {self.scratch})"

    def _writable(self, path: Any) -> bool:
        real = os.path.realpath(_path(path))
        # /dev/shm: the sandbox's own tmpfs (shared memory segments)
        return real == os.devnull or _under(real, self.scratch) or _under(real, "/dev/shm")

    def _import(self, args: tuple) -> str | None:
        name = args[0] if args else ""
        if any(fnmatch.fnmatchcase(name, p) for p in FORBIDDEN_MODULES):
            return f"audit: refused import {name} (a forbidden module)"
        if (name == "kbench" or name.startswith("kbench.")) and name not in self.loaded_kbench:
            return self._if_candidate(f"import {name} (kbench internals)", through_imports=True)
        if any(fnmatch.fnmatchcase(name, p) for p in CANDIDATE_FORBIDDEN_MODULES):
            return self._if_candidate(f"import {name}", through_imports=True)
        return None

    def _popen(self, args: tuple) -> str | None:
        executable = args[0] if args else None
        argv = args[1] if len(args) > 1 else None
        if executable is None and argv:
            executable = argv[0] if isinstance(argv, (list, tuple)) else argv
        exe = _path(executable) if executable is not None else ""
        base = os.path.basename(exe)
        resolved = os.path.realpath(exe) if os.sep in exe else exe
        if base in ALLOWED_EXECUTABLES and not _under(resolved, self.scratch) and not resolved.startswith("/tmp"):
            return None
        return f"audit: refused subprocess.Popen {exe!r} (only the C toolchain Triton's JIT needs may run)"

    def _dlopen(self, args: tuple) -> str | None:
        name = args[0] if args else None
        if name is None or os.sep not in _path(name):
            return None  # the process itself or a library found by the loader in the system's directories
        if not self._loads_from_writable(_path(name)):
            return None
        return f"audit: refused ctypes.dlopen {_path(name)!r} (a shared library from a writable place)"

    def _loads_from_writable(self, filename: str) -> bool:
        real = os.path.realpath(filename)
        if _under(real, self.triton_cache):
            return False  # Triton's JIT compiles its launcher there and imports it
        if _under(real, self.scratch):
            return True
        # the interpreter's and its packages' directories (read-only binds in the sandbox), wherever they
        # live: a virtual environment under /tmp loads torch's libraries from there
        if any(_under(real, r) for r in self.system_roots):
            return False
        return real.startswith(("/tmp/", "/dev/shm/", "/var/tmp/")) or bool(self.system_roots)

    def _unless_harness(self, what: str) -> str | None:
        """Refused unless the harness or a library raised the event on its own: no candidate code anywhere on the
        stack, not in a thread candidate code started, and the nearest frame is neither missing (a builtin run
        straight from C: a raw thread's target, an ``atexit`` handler) nor machinery that calls what it was
        handed (``threading``, ``weakref.finalize``, ``concurrent.futures``)."""
        if self.candidate_involved():
            return f"audit: refused {what} (candidate code on the stack or in its thread)"
        origin = self._nearest()
        if origin is None or any(p in origin for p in _LAUNDERING):
            return f"audit: refused {what} (called through {origin or 'no Python frame'})"
        return None

    def _nearest(self) -> str | None:
        """The file of the nearest frame that is not this module's or ctypes/inspect/functools machinery."""
        frame = sys._getframe()
        while frame is not None:
            name = frame.f_code.co_filename
            if name != __file__ and not any(p in name for p in _PASS_THROUGH):
                return name
            frame = frame.f_back
        return None

    def _in_scratch(self, filename: str) -> bool:
        known = self._files.get(filename)
        if known is None:
            known = filename.startswith(os.sep) and _under(os.path.realpath(filename), self.scratch)
            if len(self._files) < 4096:
                self._files[filename] = known
        return known

    def candidate_involved(self) -> bool:
        """Whether candidate code is anywhere on this thread's stack, or this thread is one it started."""
        if self.tainted and threading.current_thread() in self.tainted:
            return True
        frame = sys._getframe()
        while frame is not None:
            if self._in_scratch(frame.f_code.co_filename):
                return True
            frame = frame.f_back
        return False

    def _if_candidate(self, what: str, *, target: Any = None, through_imports: bool = False,
                      thread_too: bool = True) -> str | None:
        """Refused when candidate code raised the event (and, with ``target``, it concerns kbench's own objects).

        ``through_imports``: the event is an import request itself, so the import system's frames are
        passed through to the code that asked for it. ``thread_too``: also when machinery that calls what it
        is handed (:data:`_LAUNDERING`: ``threading``, ``concurrent.futures``...) raised it, or no Python frame
        did, in a thread candidate code started or with candidate code on the stack (not for events that reach
        only the thread's own frames).
        """
        if target is not None:
            module = getattr(target, "__module__", None)
            if not isinstance(module, str) or not (module == "kbench" or module.startswith("kbench.")):
                return None  # the kernel's own functions and classes, NumPy's, Triton's: fine
        origin = self._originator(through_imports)
        if origin is not None and _under(origin, self.scratch):
            return f"audit: refused {what}"
        if thread_too and origin != _IMPORTING and (origin is None or any(p in origin for p in _LAUNDERING)) \
                and self.candidate_involved():
            # machinery (a thread, an executor, a timer) running what candidate code handed it
            return f"audit: refused {what} (handed to {origin or 'no Python frame'} by candidate code)"
        return None

    def _originator(self, through_imports: bool = False) -> str | None:
        """The file of the nearest frame that is not ctypes or inspect machinery (or this module);
        :data:`_IMPORTING` when the import system comes first (a module being loaded did it), unless
        ``through_imports``; None when there is no Python frame at all."""
        frame = sys._getframe()
        here = __file__
        while frame is not None:
            name = frame.f_code.co_filename
            if any(p in name for p in _IMPORT_SYSTEM):
                if not through_imports:
                    return _IMPORTING
            elif name != here and not any(p in name for p in _PASS_THROUGH):
                return os.path.realpath(name) if name.startswith(os.sep) else name
            frame = frame.f_back
        return None

    # -- what was refused

    def drain(self) -> list[str]:
        """The events refused since the last call (facts for the judge, which fails the record on any), and the
        thread gate found replaced (threads a kernel starts would no longer be known as its)."""
        for attr, gate in self.thread_gates.items():
            if getattr(threading, attr, None) is not gate:
                self.refusals.append(f"audit: refused threading.{attr} replaced (harness tampering: threads "
                                     f"started by candidate code would no longer be known as its)")
                setattr(threading, attr, gate)
        refused, self.refusals = self.refusals, []
        return refused


#: threading's functions that start a thread: 3.10-3.12 ``_start_new_thread``, 3.13+ ``_start_joinable_thread``
_THREAD_STARTS = ("_start_new_thread", "_start_joinable_thread")


class _ThreadGate:
    """``threading._start_new_thread`` (3.13: ``_start_joinable_thread``) while the guard is installed: a thread
    started with candidate code on the stack (or from a thread it started) is the candidate's, so what its target
    does is refused as the candidate's (``threading.Thread(target=os.kill, ...)``); a raw thread (not a
    ``threading.Thread``) started by candidate code is refused outright.

    Python 3.10-3.12 raise no audit event when a thread starts, hence a wrapper of the function every
    ``threading.Thread`` starts through (whichever name this Python has). Candidate code could find the original
    through the wrapper; the static policy forbids ``threading._*`` and ``sys.modules``, and :meth:`Guard.drain`
    puts the wrapper back and says so when it was replaced."""

    def __init__(self, guard: Guard, start: Any) -> None:
        self._guard, self._start = guard, start

    def __call__(self, function: Any, *args: Any, **kwargs: Any) -> Any:
        guard = self._guard
        busy, was = guard._busy, getattr(guard._busy, "on", False)
        busy.on = True  # the gate's own sys._getframe is not the candidate's
        try:
            involved = guard.candidate_involved()
        finally:
            busy.on = was
        if involved:
            owner = getattr(function, "__self__", None)
            if isinstance(owner, threading.Thread) and getattr(function, "__name__", "") == "_bootstrap":
                guard.tainted.add(owner)
            else:
                why = f"audit: refused a raw thread started by candidate code {_short((function,))}"
                guard.refusals.append(why)
                raise AuditRefused(why)
        return self._start(function, *args, **kwargs)


class _ImportGate:
    """A meta path finder asking the guard about every module not yet loaded.

    ``importlib.import_module`` raises no ``import`` audit event (only the ``import`` statement and
    ``__import__`` do), so the same rules are applied here, first in ``sys.meta_path``.
    """

    def __init__(self, guard: Guard) -> None:
        self._guard = guard

    def find_spec(self, name, path=None, target=None):
        why = self._guard._import((name,))
        if why is not None:
            self._guard.refusals.append(why)
            raise AuditRefused(why)
        return None  # not ours to find: the next finder loads it


def install(scratch: str, *, system_roots: Iterable[str] = ()) -> Guard:
    """Add the audit hook for this process (for good: audit hooks cannot be removed) and return its state."""
    guard = Guard(scratch, system_roots=system_roots)
    sys.meta_path.insert(0, _ImportGate(guard))
    for attr in _THREAD_STARTS:  # the one(s) this Python's threading.Thread.start goes through
        start = getattr(threading, attr, None)
        if start is not None:
            guard.thread_gates[attr] = _ThreadGate(guard, start)
            setattr(threading, attr, guard.thread_gates[attr])
    sys.addaudithook(guard)
    return guard


def _matches(event: str, patterns: tuple[str, ...]) -> bool:
    return any(event.startswith(p) if p.endswith(".") else event == p for p in patterns)


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _path(value: Any) -> str:
    value = os.fspath(value) if isinstance(value, os.PathLike) else value
    return os.fsdecode(value) if isinstance(value, bytes) else str(value)


def _short(args: tuple) -> str:
    text = ", ".join(repr(a) for a in args)
    return f"({text[:160]}{'...' if len(text) > 160 else ''})"
