"""The call runner: runs batches of a prepared kernel's calls where candidate code lives, and reports facts.

It never judges. For each call of a batch, in the device's order and with no host round trip in between:

1. the call's inputs are generated in place, in its slot's buffers, from the input key the judge sent
   (the counter-based generator of kbench.ops.inputs, on the device): no call's inputs exist before the
   previous call's sample ended, so no call can do a later call's work;
2. its output buffers are poisoned (NaN), the device's cache flush is queued (outside the sample);
3. the sample: the clock's start mark, the kernel, the stop mark;
4. a shadow copy of each output is taken at once (on the device), to see later whether it still changed.

After the batch the device is synchronised once; then the samples are read, every output is compared
with its shadow (work left running after the call returned), and its NaN/Inf elements are counted where
it lives. What the judge asks for next (``collect``) is copied into the shared arena: outputs of the calls
it chose after the batch, and whether those calls' inputs are unchanged. Everything reported is a fact
the judge verifies or can only fail a record with; the verdict is the parent's (kbench.judge).
"""
from __future__ import annotations

import gc
import mmap
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from kbench.backends import missing_feature
from kbench.protocol import Layout
from kbench.unsupported import Unsupported
from kbench.worker.watches import CLOCK, Fault, OpWatch, QuietWorld, ThreadLeak, ThreadWatch

#: characters of a traceback kept in an error reply
TRACEBACK_CHARS = 6000


@dataclass
class Slot:
    """One call's device buffers, kept for the whole job (new content is written in place each time:
    a cache keyed by address hits, and answers stale, which the judge's verification sees)."""

    inputs: dict[str, Any]
    outputs: dict[str, Any]
    shadows: dict[str, Any]
    key: tuple[int, int] | None = None
    answer: dict[str, Any] = field(default_factory=dict)
    saved: Any = None


def _nothing() -> None:
    return None


class _NoKernel:
    """What the harness-only backend prepares: never called (its batches are all ``empty``)."""

    def __call__(self, *args, **kwargs) -> None:
        return None

    forward = backward = __call__


class HarnessOnly:
    """The backend of a harness twin (kbench.judge.judge): a worker of the same setup as an untrusted kernel's
    that never loads candidate code and only runs ``empty`` batches, so what its batches cost is the harness's own
    cost, measured where no candidate code has ever run. Built in the worker from a ``harness`` spec."""

    name = "harness-only"
    trusted = True
    device = None
    features = frozenset({"bwd", "varlen", "paged_kv", "gqa"})

    def available(self) -> None:
        return None

    def supports(self, case) -> None:
        return None

    def info(self) -> dict[str, Any]:
        return {"harness_only": True}

    def prepare(self, case) -> _NoKernel:
        return _NoKernel()


class CallRunner:
    """Runs the calls of one prepared kernel on the slots and keys the judge names; reports facts."""

    def __init__(self, device, op, *, check_threads: bool = True, harness=None) -> None:
        self.device, self.op = device, op
        self.check_threads = check_threads
        self.harness = harness          # HarnessSnapshot taken before candidate code loaded, or None
        self.kernel: Any = None
        self.case = None
        self.layout: Layout | None = None
        self.map: mmap.mmap | None = None
        self.slots: dict[int, Slot] = {}
        self.specs: dict[str, Any] | None = None
        self.watch = ThreadWatch(check_threads)
        self.forbidden_ops: tuple[str, ...] = ()
        self.backward_inputs: tuple[str, ...] = ()
        try:  # the worker's start: no candidate code has run yet
            CLOCK.bind(type(device.sample_clock(1)))
        except Exception:  # noqa: BLE001 - a device that cannot make a clock yet: its jobs will say why
            pass
        self.quiet = QuietWorld()                 # the threads and hooks of that moment
        self.strict = False                       # an untrusted kernel's job: no thread outlives its call

    # -- job -----------------------------------------------------------------------------------

    def attach(self, layout: Layout, fd: int) -> None:
        """Map a job's arena (before any of the job's candidate code runs; the caller closes ``fd``)."""
        self.end()
        self.layout = layout
        try:  # Python 3.13+: no duplicate of the descriptor is kept open while candidate code runs
            self.map = mmap.mmap(fd, layout.nbytes, trackfd=False)  # type: ignore[call-arg]
        except TypeError:
            self.map = mmap.mmap(fd, layout.nbytes)

    def start(self, backend, payload: Mapping[str, Any]) -> dict[str, Any]:
        """Ask the backend whether it runs this case, prepare its kernel (the arena is attached)."""
        from kbench.enums import DType

        self.kernel, self.slots = None, {}
        case = self.case = payload["case"]
        self.forbidden_ops = tuple(payload.get("forbidden_ops", ()))
        self.strict = bool(payload.get("strict"))
        from kbench.ops import inputs as drawn

        # an untrusted kernel shares this process: inputs are drawn afresh from their keys, never copied from a
        # cache it could rewrite (kbench.ops.inputs.HostInputCache)
        drawn.CACHE.enabled = not self.strict
        if self.strict:
            drawn.CACHE.clear()
        else:  # the worker's address-space cap holds the kernel's arrays too: the cache takes an eighth at most
            import resource

            soft, _ = resource.getrlimit(resource.RLIMIT_AS)
            drawn.CACHE.max_bytes = drawn.cache_within(None if soft == resource.RLIM_INFINITY else soft)
        self.backward_inputs = tuple(payload.get("backward_inputs", ()))
        self.out_dtype = DType(payload["out_dtype"])
        self.specs = dict(self.op.input_specs(case) or {}) or None
        self.watch = ThreadWatch(self.check_threads)
        # features first: a backend is never asked about a case it declares it cannot run
        for question in (backend.available, lambda: missing_feature(backend, payload.get("required_features", ())),
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
        try:
            self._alone("after the kernel was loaded and prepared", hooks=True)
        except (Fault, ThreadLeak) as exc:
            fault = fault or str(exc)
        return {"backend_info": info, "fault": fault}

    def end(self) -> dict[str, Any]:
        self.kernel = None
        self.slots = {}
        if self.map is not None:
            try:
                self.map.close()
            except BufferError:  # a view is still alive somewhere: the mapping goes with the process
                pass
            self.map = None
        return {"telemetry": self.device.telemetry()}

    # -- slots and inputs ----------------------------------------------------------------------

    def _slot(self, number: int) -> Slot:
        slot = self.slots.get(number)
        if slot is None:
            dev = self.device
            shapes = self.op.output_shapes(self.case)
            inputs = ({name: dev.empty(spec.shape, _np_dtype(spec.dtype)) for name, spec in self.specs.items()}
                      if self.specs is not None else {})
            outputs = {name: dev.poisoned(tuple(shape), self.out_dtype) for name, shape in shapes.items()}
            shadows = {name: dev.empty(tuple(shape), self.out_dtype.numpy) for name, shape in shapes.items()}
            slot = self.slots[number] = Slot(inputs, outputs, shadows)
        return slot

    def _fill(self, slot: Slot, key: tuple[int, int]) -> None:
        """The slot's inputs for ``key``, generated in place where they live."""
        dev = self.device
        if self.specs is None:  # an op that makes inputs on the host only
            made = self.op.make_inputs(self.case, key)
            if not slot.inputs:
                slot.inputs.update({name: dev.from_host(arr) for name, arr in made.items()})
            else:
                for name, arr in made.items():
                    dev.write(slot.inputs[name], arr)
        else:
            for stream, (name, spec) in enumerate(self.specs.items()):
                dev.generate(slot.inputs[name], spec, key, stream)
        slot.key = key

    def _unchanged(self, slot: Slot) -> None:
        """The slot's inputs still hold what was generated for its key (compared where they live)."""
        if slot.key is None:
            return
        dev = self.device
        if self.specs is None:
            fresh = {name: dev.from_host(arr) for name, arr in self.op.make_inputs(self.case, slot.key).items()}
        else:
            fresh = {}
            for stream, (name, spec) in enumerate(self.specs.items()):
                fresh[name] = dev.empty(spec.shape, _np_dtype(spec.dtype))
                dev.generate(fresh[name], spec, slot.key, stream)
        for name, arr in fresh.items():
            if not dev.same_content(arr, slot.inputs[name]):
                raise Fault(f"input {name!r} was modified by the kernel (inputs must be read-only)")

    # -- batches -------------------------------------------------------------------------------

    def forward(self, kind: str, calls: list) -> dict[str, Any]:
        """Split cases (mode bwd): every named slot's inputs generated and its untimed forward run; the judge
        times this request with its own clock and asks for the timed backward calls next."""
        reply: dict[str, Any] = {"fault": None}
        watch = OpWatch(self.forbidden_ops) if kind in ("check", "warmup") and self.forbidden_ops else None
        try:
            later = set(self.backward_inputs)
            for number, key in calls:
                slot = self._slot(int(number))
                self._fill(slot, _key(key))
                first = [v for n, v in slot.inputs.items() if n not in later]
                before = self.watch.before()

                def run(first=first):
                    return self.kernel.forward(*first)

                slot.saved = watch.run(run) if watch is not None else run()
                self.device.synchronize()
                self.watch.after(before)
                self._alone(f"after an untimed forward ({kind})")
            reply["fault"] = self._harness_fault(_phase(kind))
        except (Fault, ThreadLeak) as exc:
            reply["fault"] = str(exc)
        return reply

    def batch(self, kind: str, calls: list, scan: bool = True, copy: int = 0) -> dict[str, Any]:
        """One batch of calls (module doc). ``kind`` "empty" runs the same loop with a call that does nothing:
        the judge measures the loop's own cost with it. A slot's inputs are generated when its key differs from
        the one its content was made for (untrusted kernels get a new key for every call; a trusted library
        keeps one per slot, do_bench-style). ``scan``: shadows and non-finite counts of every call (the judge
        turns them off for trusted libraries' timed calls; what it collects it scans itself). ``copy``: the outputs
        of the first ``copy`` calls are copied into arena slots 0, 1, ... before the reply, inside the parent's
        window of this request (an untrusted kernel's: the judge verifies them while the worker is stopped, so no
        work left running after the reply can change what is verified)."""
        dev = self.device
        reply: dict[str, Any] = {"samples": [], "stamps": None, "window": None, "nonfinite": [], "fault": None}
        empty = kind == "empty"
        split = bool(self.backward_inputs) and not empty
        watch = OpWatch(self.forbidden_ops) if kind in ("check", "warmup") and self.forbidden_ops else None
        clock = dev.sample_clock(len(calls))
        numbers = [int(n) for n, _ in calls]
        collecting = gc.isenabled()
        gc.disable()  # no collector (and so no finalizer of candidate objects) runs between samples
        ref = CLOCK   # the timers captured at the worker's start: every clock read below is checked against them
        # the same identity tests as ref.intact(), inline on locals (about 50 ns): the one before the stop mark is
        # inside the sample
        tmod, counter, devices, (mark_start, mark_stop) = ref.module, ref.perf_counter_ns, ref.devices, ref.marks
        kind_of_clock = type(clock)
        if kind_of_clock is not ref.clock_class:  # a clock the runner did not capture: its marks are not compared
            mark_start, mark_stop = kind_of_clock.start, kind_of_clock.stop
        try:
            _clock_intact(ref, kind, "its start")
            self._alone(f"when a {kind} batch started", hooks=True)
            begin = time.perf_counter_ns()
            for i, (number, key) in enumerate(calls):
                slot = self._slot(numbers[i])
                if not split and slot.key != _key(key):
                    self._fill(slot, _key(key))
                for buf in slot.outputs.values():
                    dev.repoison(buf)
                call = dev.prepare_call(_nothing if empty else self._call(slot))
                dev.before_sample()
                # the slot's previous answer (possibly an array the kernel returned) is let go only inside this
                # call's sample: a finalizer or __del__ of it is candidate code, and runs timed
                held, slot.answer = slot.answer, {}
                before = self.watch.before()
                if tmod.perf_counter_ns is not counter or devices.time is not tmod or \
                        kind_of_clock.start is not mark_start:
                    _clock_intact(ref, kind, f"call {i + 1} started", True)
                clock.start(i)
                held = None  # noqa: F841 - released here, inside the sample
                result = watch.run(call) if watch is not None else call()
                # before the read that ends the sample: a self-restoring swap is seen here
                if tmod.perf_counter_ns is not counter or devices.time is not tmod or \
                        kind_of_clock.stop is not mark_stop:
                    _clock_intact(ref, kind, f"call {i + 1} returned", True)
                clock.stop(i)
                self.watch.after(before)
                if self.strict and not empty:
                    self._alone(f"after call {i + 1} of a {kind} batch returned")
                # an empty call's "answer" is its poisoned buffers: shadowed, compared and scanned like a kernel's,
                # so the empty loop costs what a timed batch's harness work costs. Whatever the kernel returned was
                # bound before the stop mark: nothing the kernel made is let go after it (the slot's old answer
                # went inside the sample, ``result`` stays referenced until the next call's sample)
                slot.answer = dict(slot.outputs) if empty else self._answers(result, slot)
                if scan:
                    for name, arr in slot.answer.items():
                        dev.copy_into(slot.shadows[name], arr)
            dev.synchronize()
            _clock_intact(ref, kind, "its end")
            self._alone(f"when a {kind} batch ended", hooks=True)
            reply["window"] = [begin, time.perf_counter_ns()]
            reply["samples"] = clock.seconds()
            reply["stamps"] = clock.stamps() if clock.host else None
            for i, number in enumerate(numbers if scan else ()):
                slot = self.slots[number]
                for name, arr in slot.answer.items():
                    if not dev.same_content(slot.shadows[name], arr):
                        which = "" if len(slot.answer) == 1 else f" {name!r}"
                        raise Fault(f"the output{which} changed after the kernel returned (call {i + 1} of a {kind} "
                                    f"batch): work was left running (a thread, a stream or lazy evaluation) and "
                                    f"would not be timed")
                reply["nonfinite"].append([dev.nonfinite(arr) for arr in slot.answer.values()])
            for j, number in enumerate(numbers[:max(0, min(int(copy), self.layout.slots if self.layout else 0))]):
                self._to_arena(self.slots[number], j)
            reply["fault"] = self._harness_fault(_phase(kind))
        except (Fault, ThreadLeak) as exc:
            reply["fault"] = str(exc) + (" (during timing)" if kind == "timed" and isinstance(exc, ThreadLeak) else "")
        finally:
            if collecting:
                gc.enable()
        reply["threads"] = list(self.watch.max_seen)
        return reply

    def _call(self, slot: Slot) -> Callable[[], Any]:
        kernel = self.kernel
        if not self.backward_inputs:
            arrays = {**slot.inputs, **slot.outputs}
            return lambda: kernel(**arrays)
        later = [slot.inputs[n] for n in self.backward_inputs]
        buffers = list(slot.outputs.values())
        saved = slot.saved
        return lambda: kernel.backward(saved, *later, *buffers)

    def _to_arena(self, slot: Slot, j: int) -> None:
        """The slot's last outputs copied into arena slot ``j`` (NaN where an output is missing)."""
        for name, view in self.layout.output_views(self.map, j).items():
            arr = slot.answer.get(name)
            if arr is None:
                view[...] = np.nan
                continue
            host = np.asarray(self.device.to_host(arr))
            np.copyto(view, host.reshape(view.shape))

    def collect(self, numbers: list[int], inputs: bool = True, outputs: bool = True) -> dict[str, Any]:
        """Copy the outputs of the named slots' last calls into arena slots 0, 1, ... (``outputs``) and
        (``inputs``) check that their inputs are unchanged."""
        reply: dict[str, Any] = {"fault": None}
        try:
            for j, number in enumerate(numbers):
                slot = self.slots[int(number)]
                if outputs:
                    self._to_arena(slot, j)
                if inputs:
                    self._unchanged(slot)
            reply["fault"] = self._harness_fault("while outputs were collected")
        except Fault as exc:
            reply["fault"] = str(exc)
        return reply

    def sustain(self, seconds: float) -> dict[str, Any]:
        """Calls of slot 0's kernel back to back for ``seconds`` or more (no new inputs, no flush): the
        device measures energy, power and clocks over the loop (``Device.sustained``)."""
        slot = self._slot(0)
        call = self._call(slot)
        facts = self.device.sustained(call, float(seconds))
        if facts is None:
            return {"energy": None, "why": f"the {self.device.name} device does not measure energy"}
        return {"energy": facts, "fault": self._harness_fault("during the sustained loop")}

    # -- facts ---------------------------------------------------------------------------------

    def _answers(self, result: Any, slot: Slot) -> dict[str, Any]:
        """name -> the array holding that output: the buffer, or what the kernel returned instead."""
        outs = slot.outputs
        if len(outs) > 1 and (result is None or type(result) is dict):
            result = result or {}
            unknown = sorted(set(result) - set(outs))
            if unknown:
                raise Fault(f"the kernel returned outputs {', '.join(map(repr, unknown))}; this case's outputs are "
                            f"{', '.join(outs)}")
            return {name: self._answer(result.get(name), buf, slot.inputs, name) for name, buf in outs.items()}
        if len(outs) > 1 and result is not None:
            raise Fault(f"the kernel returned a {type(result).__name__}; a kernel with several outputs "
                        f"({', '.join(outs)}) writes their buffers or returns a dict name -> array")
        (name, buf), = outs.items()
        return {name: self._answer(result, buf, slot.inputs, name)}

    def _answer(self, result: Any, out: Any, inputs: Mapping[str, Any], name: str = "out") -> Any:
        if result is None:
            return out
        which = "output" if name == "out" else f"output {name!r}"
        if not self.device.is_array(result):
            raise Fault(f"the kernel returned a {type(result).__name__}, not a {type(out).__name__} like its output "
                        f"buffer {name!r} (exactly that type: results must be materialised before return, and "
                        f"no subclass may run its own code inside the harness)")
        if tuple(result.shape) != tuple(out.shape):
            raise Fault(f"{which} shape {tuple(result.shape)} differs from expected {tuple(out.shape)}")
        if result.dtype != out.dtype:
            raise Fault(f"{which} dtype {result.dtype} differs from the case's output dtype ({out.dtype}): "
                        f"precision must not change")
        for in_name, arr in inputs.items():
            if self.device.is_same_memory(result, arr):
                raise Fault(f"output {name!r} aliases input {in_name!r}: a kernel must write its own buffer")
        return result

    def _alone(self, when: str, hooks: bool = False) -> None:
        """An untrusted kernel's job: no Python thread that was not alive at the worker's start (a thread the
        kernel started outlived the call that started it) and, with ``hooks``, no trace, profile or monitoring
        hook, NumPy error callback, timer-signal handler or interval timer that was not there then. Either could
        run candidate code between samples or during an empty batch (raising the loop's cost the accounting
        allows: holding the GIL, burning a core); so none may exist (kbench.worker.watches.QuietWorld)."""
        if not self.strict:
            return
        strangers = self.quiet.strangers()
        if strangers:
            more = f" and {len(strangers) - 1} more" if len(strangers) > 1 else ""
            raise ThreadLeak(f"the kernel left threads still running: a thread it started ({strangers[0].name!r}"
                             f"{more}) is alive {when}; no thread of candidate code may outlive the call that started "
                             f"it (it could work, hold the GIL or burn a core while only the harness should run, e.g. "
                             f"in the empty loop)")
        changed = self.quiet.changed_hooks() if hooks else []
        if changed:
            raise Fault(f"harness tampering: {', '.join(changed[:4])} set by the kernel (found {when}): a hook runs "
                        f"candidate code while only the harness should run")

    def _harness_fault(self, phase: str) -> str | None:
        if self.harness is None:
            return None
        changed = self.harness.changed() + self._shadowed()
        if not changed:
            return None
        shown = ", ".join(changed[:4]) + (f" and {len(changed) - 4} more" if len(changed) > 4 else "")
        return f"harness tampering: {shown} replaced {phase} (timer or harness functions must not be patched)"

    def _shadowed(self) -> list[str]:
        """Methods of the runner and of its class's bases hidden by an attribute of this instance (``runner.batch =
        ...`` replaces the loop for this object only: the module-level snapshot does not see it), and methods of
        the class replaced since the worker's start."""
        klass = type(self)
        found = [f"CallRunner instance attribute {name!r}" for name in vars(self)
                 if callable(getattr(klass, name, None))]
        if getattr(klass, "_methods", None) is None:
            return found
        return found + [f"CallRunner.{name}" for name, fn in klass._methods.items() if vars(klass).get(name) is not fn]

    # -- messages ------------------------------------------------------------------------------

    def handle(self, message: tuple, backend=None) -> tuple[str, dict[str, Any]]:
        """One request -> one reply; a kernel's exception becomes an ``error`` reply, never a crash."""
        kind = message[0]
        try:
            if kind == "job":
                return "prepared", self.start(backend, message[1])
            if kind == "batch":
                return "batch", self.batch(message[1]["kind"], list(message[1]["calls"]), bool(message[1].get("scan", True)),
                                           int(message[1].get("copy", 0)))
            if kind == "forward":
                return "forward", self.forward(message[1]["kind"], list(message[1]["calls"]))
            if kind == "collect":
                return "collected", self.collect(list(message[1]["slots"]), bool(message[1].get("inputs", True)),
                                                 bool(message[1].get("outputs", True)))
            if kind == "sustain":
                return "sustained", self.sustain(message[1]["seconds"])
            if kind == "end":
                return "ended", self.end()
            return "error", {"reason": f"unknown request {kind!r}"}
        except MemoryError as exc:
            return "error", {"reason": f"out of memory: {exc}".rstrip(": "), "memory": True}
        except Unsupported as exc:  # a library refused the case: a skip with its own words, not an error
            return "error", {"reason": str(exc), "unsupported": True}
        except Exception as exc:  # noqa: BLE001 - a failing kernel is a record, never the end of a run
            text = "".join(traceback.format_exception(exc)[-6:])
            return "error", {"reason": f"{type(exc).__name__}: {exc}"[:2000], "traceback": text[-TRACEBACK_CHARS:]}


def _clock_intact(ref, kind: str, when: str, failed: bool = False) -> None:
    """Fault unless the process's timers are the ones captured at the worker's start (kbench.worker.watches):
    a replaced timer, even one that puts the original back later, makes no sample. ``failed``: a per-call test
    already saw a difference (so this faults, naming what it finds)."""
    changed = ref.replaced() or (["the sample clock's timer or marks"] if failed else [])
    if changed:
        raise Fault(f"harness tampering: {', '.join(changed)} replaced, seen before a clock read ({kind} batch, "
                    f"{when}); the timers are the ones captured when the worker started, and a replaced one, even "
                    f"one that restores itself, makes no sample")


def _key(key: Any) -> tuple[int, int]:
    return int(key[0]), int(key[1])


def _phase(kind: str) -> str:
    return {"check": "during the correctness check", "timed": "during timing"}.get(kind, f"({kind})")


def _np_dtype(name: str) -> np.dtype:
    from kbench.ops.inputs import np_dtype

    return np_dtype(name)


#: the runner's own methods as imported (before any candidate code): a replaced one is harness tampering
CallRunner._methods = {name: fn for name, fn in vars(CallRunner).items() if callable(fn) and not name.startswith("__")}
