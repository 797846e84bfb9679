"""The untrusted side of an execution: a runner of calls that never judges (docs/integrity.md).

The process that runs candidate code maps a shared-memory arena the trusted side (:mod:`kbench.judge`)
filled with inputs, copies each slot's inputs to the device, calls the kernel into a fresh poisoned
buffer, copies the output back to the arena and reports raw facts: per-call samples and their start/end
stamps on the system-wide monotonic clock, and faults it saw (a thread left running, an input
modified, an output written late, an aliased or lazy result). It never sees a seed, a reference, a
tolerance or the verified rows, so nothing it says can make a record pass: the judge verifies the
outputs in the arena and accounts for the samples with its own clock.

One code path for both executors: a worker process drives a :class:`CallRunner` from its channel
(``kbench.workers.child_main``); trusted backends with ``--no-isolate`` drive one through
:class:`LocalChannel`, the same messages in the same process.
"""
from __future__ import annotations

import fnmatch
import json
import mmap
import os
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from kbench.backends import missing_feature
from kbench.integrity import ThreadLeak, ThreadWatch, thread_counts
from kbench.unsupported import Unsupported

#: byte alignment of every array in an arena (cache lines; SIMD loads)
ALIGN = 64


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass(frozen=True)
class ArrayLayout:
    name: str
    shape: tuple[int, ...]
    dtype: str            # numpy dtype name ("float16", "bfloat16" via ml_dtypes)
    offset: int           # from the start of a slot

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np_dtype(self.dtype).itemsize


def np_dtype(name: str) -> np.dtype:
    if name in ("bfloat16", "float8_e4m3fn"):
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


@dataclass(frozen=True)
class Layout:
    """Where each slot's inputs and outputs live in an arena (``slots`` equal slots one after another)."""

    slots: int
    inputs: tuple[ArrayLayout, ...]
    outputs: tuple[ArrayLayout, ...]
    slot_bytes: int

    @classmethod
    def plan(cls, inputs: dict[str, np.ndarray], out_shapes: Mapping[str, tuple[int, ...]] | tuple[int, ...],
             out_dtype: np.dtype, slots: int) -> Layout:
        """``out_shapes``: one shape (a single output named ``out``) or {name: shape} in call order."""
        if not isinstance(out_shapes, Mapping):
            out_shapes = {"out": tuple(out_shapes)}
        offset, arrays, outputs = 0, [], []
        for name, arr in inputs.items():
            arrays.append(ArrayLayout(name, tuple(arr.shape), arr.dtype.name, offset))
            offset = _aligned(offset + arrays[-1].nbytes)
        for name, shape in out_shapes.items():
            outputs.append(ArrayLayout(name, tuple(shape), np.dtype(out_dtype).name, offset))
            offset = _aligned(offset + outputs[-1].nbytes)
        return cls(slots, tuple(arrays), tuple(outputs), offset)

    @property
    def output(self) -> ArrayLayout:
        """The first output (the only one of a single-output op)."""
        return self.outputs[0]

    @property
    def nbytes(self) -> int:
        return self.slots * self.slot_bytes

    def view(self, buf: Any, slot: int, array: ArrayLayout) -> np.ndarray:
        if not 0 <= slot < self.slots:
            raise ValueError(f"slot {slot} is outside the arena's {self.slots} slots")
        return np.ndarray(array.shape, np_dtype(array.dtype), buffer=buf,
                          offset=slot * self.slot_bytes + array.offset)

    def input_views(self, buf: Any, slot: int) -> dict[str, np.ndarray]:
        return {a.name: self.view(buf, slot, a) for a in self.inputs}

    def output_view(self, buf: Any, slot: int, name: str | None = None) -> np.ndarray:
        array = self.output if name is None else next(a for a in self.outputs if a.name == name)
        return self.view(buf, slot, array)

    def output_views(self, buf: Any, slot: int) -> dict[str, np.ndarray]:
        return {a.name: self.view(buf, slot, a) for a in self.outputs}


def anonymous_file(nbytes: int) -> int:
    """A file descriptor of ``nbytes`` of shared memory with no name anyone else can open.

    ``memfd_create`` on Linux (passed to the worker over its private socket, so it works inside a
    sandbox with its own /dev/shm); an unlinked temporary file elsewhere.
    """
    try:
        fd = os.memfd_create("kbench-arena", os.MFD_CLOEXEC)
    except (AttributeError, OSError):
        fd, path = tempfile.mkstemp(prefix="kbench-arena-")
        os.unlink(path)
    os.ftruncate(fd, max(nbytes, 1))
    return fd


class Fault(Exception):
    """Something the runner saw that fails the record (reported as data; the judge names it)."""


class CallRunner:
    """Runs calls of one prepared kernel on the slots the judge names; reports samples and faults."""

    def __init__(self, device, *, check_threads: bool = True, harness=None) -> None:
        self.device = device
        self.check_threads = check_threads
        self.harness = harness          # HarnessSnapshot taken before candidate code loaded, or None
        self.kernel: Callable[..., Any] | None = None
        self.layout: Layout | None = None
        self.map: mmap.mmap | None = None
        self.watch = ThreadWatch(check_threads)
        self.buffers: dict[int, tuple[dict[str, Any], Any]] = {}
        self.forbidden_ops: tuple[str, ...] = ()

    # -- messages ------------------------------------------------------------------------------

    def start(self, backend, case, layout: Layout, fd: int, forbidden_ops: tuple[str, ...] = (),
              required_features: tuple[str, ...] = (), backward_inputs: tuple[str, ...] = (),
              out_dtype: str | None = None) -> dict[str, Any]:
        """Map the arena, ask the backend whether it runs this case, prepare its kernel."""
        from kbench.enums import DType

        self.end()
        self.forbidden_ops = tuple(forbidden_ops)
        self.backward_inputs = tuple(backward_inputs)
        self.layout, self.dtype = layout, DType(out_dtype) if out_dtype else case.dtype
        self.map = mmap.mmap(fd, layout.nbytes)
        self.watch = ThreadWatch(self.check_threads)
        # features first: a backend is never asked about a case it declares it cannot run
        for question in (backend.available, lambda: missing_feature(backend, required_features),
                         lambda: backend.supports(case)):
            reason = question()
            if reason:
                return {"skip": str(reason)}
        info = backend.info()
        self.kernel = backend.prepare(case)
        if self.backward_inputs and not (callable(getattr(self.kernel, "forward", None))
                                         and callable(getattr(self.kernel, "backward", None))):
            raise TypeError(f"backend {backend.name!r} prepared a {type(self.kernel).__name__} for a split "
                            f"(untimed forward, timed backward) case: it must have forward() and backward() "
                            f"methods (kbench.api.TrainingKernel)")
        fault = self._harness_fault("while the kernel was prepared")
        return {"backend_info": info, "fault": fault}

    def end(self) -> dict[str, Any]:
        self.kernel = None
        self.buffers = {}
        if self.map is not None:
            try:
                self.map.close()
            except BufferError:  # a view is still alive somewhere: the mapping goes with the process
                pass
            self.map = None
        return {"telemetry": self.device.telemetry()}

    def batch(self, slots: list[int], kind: str) -> dict[str, Any]:
        """Call the kernel once per slot, each into fresh poisoned buffers, outputs copied to the arena.

        ``kind`` "empty" calls a function that does nothing through the same loop: the judge measures
        the loop's own overhead with it. A split case (``backward_inputs``) calls ``forward`` untimed
        before each timed ``backward`` (not for "empty": the loop's overhead is the same).
        """
        dev, layout = self.device, self.layout
        reply: dict[str, Any] = {"samples": [], "stamps": [], "fault": None}
        try:
            inputs, outs = [], []
            for s in slots:
                # one set of device buffers per slot for the whole job, new content written in place: a
                # cache keyed by address hits and answers stale, which the judge's verification sees
                if s not in self.buffers:
                    self.buffers[s] = ({k: dev.from_host(v) for k, v in layout.input_views(self.map, s).items()},
                                       {a.name: dev.poisoned(a.shape, self.dtype) for a in layout.outputs})
                else:
                    for k, v in layout.input_views(self.map, s).items():
                        dev.write(self.buffers[s][0][k], v)
                inputs.append(self.buffers[s][0])
                outs.append(self.buffers[s][1])
            dev.synchronize()
            answers = []
            watch = OpWatch(self.forbidden_ops) if kind in ("check", "warmup") else None
            for i, slot in enumerate(slots):
                for buf in outs[i].values():
                    dev.repoison(buf)
                holder: list[Any] = []
                fn = _nothing if kind == "empty" else self._call(inputs[i], outs[i], holder, watch, reply)
                dev.before_sample()
                before = thread_counts()
                start = time.perf_counter_ns()
                if watch is not None:
                    with watch:
                        seconds = dev.time_call(fn)
                    watch.raise_if_seen()
                else:
                    seconds = dev.time_call(fn)
                stop = time.perf_counter_ns()
                reply["samples"].append(float(seconds))
                reply["stamps"].append((start, stop))
                # the same work after an empty call as after a kernel: the judge calibrates the loop with it
                self._after_call(before)
                answer = self._answers(holder[0] if holder else None, outs[i], inputs[i])
                stored = {}
                for name, arr in answer.items():
                    host = np.asarray(dev.to_host(arr))
                    self._store(layout.output_view(self.map, slot, name), host, name)
                    stored[name] = host.tobytes()
                answers.append((answer, stored))
            dev.synchronize()
            for i, (answer, stored) in enumerate(answers):
                for name, arr in answer.items():
                    if np.asarray(dev.to_host(arr)).tobytes() != stored[name]:
                        which = "" if len(answer) == 1 else f" {name!r}"
                        raise Fault(f"the output{which} changed after the kernel returned (call {i + 1} of a {kind} "
                                    f"batch): work was left running (a thread, a stream or lazy evaluation) and "
                                    f"would not be timed")
                # compared with the arena, which the kernel is never given (a memcmp, not a hash)
                for name, view in layout.input_views(self.map, slots[i]).items():
                    host = np.ascontiguousarray(dev.to_host(inputs[i][name]))
                    if not np.array_equal(host.view(np.uint8).ravel(), view.view(np.uint8).ravel()):
                        raise Fault(f"input {name!r} was modified by the kernel (inputs must be read-only)")
            phase = {"check": "during the correctness check", "timed": "during timing"}.get(kind, f"({kind})")
            reply["fault"] = self._harness_fault(phase)
        except Fault as exc:
            reply["fault"] = str(exc)
        except ThreadLeak as exc:
            reply["fault"] = str(exc) + (" (during timing)" if kind == "timed" else "")
        reply["threads"] = list(self.watch.max_seen)
        return reply

    def _call(self, dev_in: dict[str, Any], out: dict[str, Any], holder: list[Any], watch,
              reply: dict[str, Any]) -> Callable[[], None]:
        """The timed function of one call; a split case runs its untimed forward here, before it.

        The forward's start/end stamps go into ``reply["untimed"]``: the judge checks them against its
        clock like the samples' and does not count that time as unexplained.
        """
        kernel = self.kernel
        if not self.backward_inputs:
            def fn() -> None:
                holder.append(kernel(**dev_in, **out))
            return fn
        later = [dev_in[n] for n in self.backward_inputs]
        first = [v for n, v in dev_in.items() if n not in self.backward_inputs]
        before = thread_counts()
        begin = time.perf_counter_ns()
        if watch is not None:
            with watch:
                saved = kernel.forward(*first)
            watch.raise_if_seen()
        else:
            saved = kernel.forward(*first)
        self.device.synchronize()
        reply.setdefault("untimed", []).append((begin, time.perf_counter_ns()))
        self._after_call(before)
        buffers = list(out.values())

        def fn() -> None:
            holder.append(kernel.backward(saved, *later, *buffers))
        return fn

    # -- facts ---------------------------------------------------------------------------------

    def _after_call(self, before: tuple[int, int]) -> None:
        pending = getattr(self.device, "pending_work", None)
        if callable(pending) and pending():
            raise ThreadLeak("work was still running on the device when the sample ended (extra streams?)")
        self.watch.after(before)

    def _answers(self, result: Any, outs: dict[str, Any], inputs: dict[str, Any]) -> dict[str, Any]:
        """name -> the array holding that output: the buffer, or what the kernel returned instead."""
        if len(outs) > 1 and (result is None or isinstance(result, Mapping)):
            result = result or {}
            unknown = sorted(set(result) - set(outs))
            if unknown:
                raise Fault(f"the kernel returned outputs {', '.join(map(repr, unknown))}; this case's outputs are "
                            f"{', '.join(outs)}")
            return {name: self._answer(result.get(name), buf, inputs, name) for name, buf in outs.items()}
        if len(outs) > 1 and result is not None:
            raise Fault(f"the kernel returned a {type(result).__name__}; a kernel with several outputs "
                        f"({', '.join(outs)}) writes their buffers or returns a dict name -> array")
        (name, buf), = outs.items()
        return {name: self._answer(result, buf, inputs, name)}

    def _answer(self, result: Any, out: Any, inputs: dict[str, Any], name: str = "out") -> Any:
        if result is not None and not isinstance(result, type(out)):
            raise Fault(f"the kernel returned a {type(result).__name__}, not a {type(out).__name__} like its output "
                        f"buffer {name!r}: results must be materialised before return (lazy results are not timed)")
        answer = out if result is None else result
        for in_name, arr in inputs.items():
            if self.device.is_same_memory(answer, arr):
                raise Fault(f"output {name!r} aliases input {in_name!r}: a kernel must write its own buffer")
        return answer

    def _store(self, view: np.ndarray, host: np.ndarray, name: str = "out") -> None:
        which = "output" if name == "out" else f"output {name!r}"
        if tuple(host.shape) != tuple(view.shape):
            raise Fault(f"{which} shape {tuple(host.shape)} differs from expected {tuple(view.shape)}")
        if host.dtype != view.dtype:
            raise Fault(f"{which} dtype {host.dtype} differs from the case's output dtype ({view.dtype}): "
                        f"precision must not change")
        np.copyto(view, host)

    def _harness_fault(self, phase: str) -> str | None:
        if self.harness is None:
            return None
        changed = self.harness.changed()
        if not changed:
            return None
        shown = ", ".join(changed[:4]) + (f" and {len(changed) - 4} more" if len(changed) > 4 else "")
        return f"harness tampering: {shown} replaced {phase} (timer or harness functions must not be patched)"

    def handle(self, message: tuple, backend=None, fd: int | None = None) -> tuple[str, dict[str, Any]]:
        """One request -> one reply; a kernel's exception becomes an ``error`` reply, never a crash."""
        kind = message[0]
        try:
            if kind == "job":
                _, payload = message
                return "prepared", self.start(backend, payload["case"], payload["layout"], fd,
                                              payload.get("forbidden_ops", ()), payload.get("required_features", ()),
                                              payload.get("backward_inputs", ()), payload.get("out_dtype"))
            if kind == "batch":
                _, payload = message
                return "batch", self.batch(list(payload["slots"]), payload["kind"])
            if kind == "end":
                return "ended", self.end()
            return "error", {"reason": f"unknown request {kind!r}"}
        except MemoryError as exc:
            return "error", {"reason": f"out of memory: {exc}".rstrip(": "), "memory": True}
        except Unsupported as exc:  # a library refused the case: a skip with its own words, not an error
            return "error", {"reason": str(exc), "unsupported": True}
        except Exception as exc:  # noqa: BLE001 - a failing kernel is a record, never the end of a run
            return "error", {"reason": f"{type(exc).__name__}: {exc}",
                             "traceback": "".join(traceback.format_exception(exc)[-6:])}


def _nothing() -> None:
    return None


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

    def raise_if_seen(self) -> None:
        if self.seen:
            raise Fault(f"forbidden operator {self.seen[0]} ran inside the kernel (integrity.forbidden_calls: "
                        f"the library attention it competes with, however the call is spelled)")


def as_sent(reply: tuple) -> Any:
    """A reply as the judge receives it from a worker: through JSON (tuples become lists)."""
    decoded = json.loads(json.dumps(reply, default=lambda v: v.item() if hasattr(v, "item") else str(v)))
    return tuple(decoded) if isinstance(decoded, list) else decoded


class LocalChannel:
    """The judge's channel to a :class:`CallRunner` in this process (trusted backends, ``--no-isolate``):
    the same requests, the replies through the same JSON encoding as a worker's."""

    def __init__(self, runner: CallRunner, backend) -> None:
        self.runner, self.backend = runner, backend

    def start(self, payload: dict[str, Any], fd: int, timeout: float | None) -> Any:
        return as_sent(self.runner.handle(("job", payload), self.backend, fd))

    def request(self, message: tuple, timeout: float | None) -> Any:
        return as_sent(self.runner.handle(message))
