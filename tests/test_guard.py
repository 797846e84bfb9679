"""The audit hook (kbench.worker.guard): what a kernel may not do, and what NumPy, torch and Triton still may.

An audit hook cannot be removed, so every check runs in a fresh interpreter: a driver (harness
code, outside the scratch directory) loads the guard as a worker does, then imports a candidate
module from the scratch directory and calls its functions one by one, reporting each outcome and
the refusals the guard recorded.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

DRIVER = '''
import json, os, sys, importlib.util
import ctypes, gc, resource, socket, subprocess, threading  # loaded by the worker before any candidate code
import numpy
from kbench.worker import guard
from kbench.run.sandbox import SYSTEM_DIRS, readable_roots

scratch, names = sys.argv[1], sys.argv[2:]
g = guard.install(scratch, system_roots=[*readable_roots(), *SYSTEM_DIRS])
spec = importlib.util.spec_from_file_location("candidate", os.path.join(scratch, "candidate.py"))
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
out = {}
for name in names:
    try:
        result = repr(getattr(module, name)())
    except BaseException as exc:
        result = f"{type(exc).__name__}: {exc}"
    out[name] = {"result": result, "refusals": list(g.refusals)}
    g.refusals.clear()
print("RESULT " + json.dumps(out))
'''


def run_candidate(tmp_path: Path, source: str, names: list[str], env: dict | None = None,
                  driver: str = DRIVER) -> dict[str, dict]:
    scratch = tmp_path / "scratch"
    scratch.mkdir(exist_ok=True)
    (scratch / "candidate.py").write_text(textwrap.dedent(source))
    driver_text, driver = driver, tmp_path / "driver.py"
    driver.write_text(driver_text)
    env = {**os.environ, "HOME": str(scratch), "TMPDIR": str(scratch), **(env or {})}  # as in a worker
    proc = subprocess.run([sys.executable, str(driver), str(scratch), *names], capture_output=True, text=True,
                          timeout=300, cwd=scratch, env=env)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert line, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(line[0][len("RESULT "):])


ATTACKS = '''
import importlib, inspect, os, sys, subprocess, ctypes, gc

OUTSIDE = {outside!r}
VICTIM = {victim!r}

def socket_by_name():
    return importlib.import_module("so" + "cket").socket()

def subprocess_run():
    return subprocess.run(["/bin/echo", "x"], capture_output=True).stdout

def os_system():
    return os.system("true")

def fork():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    return pid

def posix_spawn():
    return os.posix_spawn("/bin/true", ["/bin/true"], {{}})

def exec_program():
    os.execv("/bin/true", ["/bin/true"])

def ctypes_call():
    return ctypes.CDLL(None).getpid()

def ctypes_read_memory():
    return ctypes.string_at(id(OUTSIDE), 8)

def getframe():
    return sys._getframe().f_back.f_globals["g"]

def inspect_frame():
    return inspect.currentframe().f_back

def current_frames():
    return sys._current_frames()

def gc_objects():
    return len(gc.get_objects())

def gc_referrers():
    return len(gc.get_referrers(OUTSIDE))

def traceback_frame():
    try:
        1 / 0
    except ZeroDivisionError as exc:
        return exc.__traceback__.tb_frame.f_back

def generator_frame():
    gen = (i for i in range(3))
    return gen.gi_frame

def write_outside():
    with open(OUTSIDE, "w") as fh:
        fh.write("x")

def os_open_outside():
    return os.open(OUTSIDE, os.O_WRONLY | os.O_CREAT)

def remove_outside():
    os.remove(VICTIM)

def rename_outside():
    os.rename(VICTIM, VICTIM + ".moved")

def import_flash_attn():
    import flash_attn
    return flash_attn

def import_xformers_spelled():
    return importlib.import_module("xfor" + "mers.ops")

def import_kbench_internals():
    return importlib.import_module("kbench.calibrate")

def harness_code():
    import kbench.worker.guard
    return kbench.worker.guard.install.__code__

def exec_code():
    exec("x = 1")

def settrace():
    sys.settrace(lambda *a: None)
    sys.settrace(None)

def raise_cpu_limit():
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
    resource.setrlimit(resource.RLIMIT_CPU, (hard, hard))

def add_audit_hook():
    sys.addaudithook(lambda *a: None)
'''

#: attack -> the start of the refusal it must produce
EXPECTED = {
    "socket_by_name": "audit: refused socket.__new__",
    "subprocess_run": "audit: refused subprocess.Popen '/bin/echo'",
    "os_system": "audit: refused os.system",
    "fork": "audit: refused os.fork",
    "posix_spawn": "audit: refused os.posix_spawn",
    "exec_program": "audit: refused os.exec",
    "ctypes_call": "audit: refused ctypes.dlsym",
    "ctypes_read_memory": "audit: refused ctypes.string_at",
    "getframe": "audit: refused sys._getframe",
    "inspect_frame": "audit: refused sys._getframe",
    "current_frames": "audit: refused sys._current_frames",
    "gc_objects": "audit: refused gc.get_objects",
    "gc_referrers": "audit: refused gc.get_referrers",
    "traceback_frame": "audit: refused object.__getattr__ 'tb_frame'",
    "generator_frame": "audit: refused object.__getattr__ 'gi_frame'",
    "write_outside": "audit: refused open",
    "os_open_outside": "audit: refused open",
    "remove_outside": "audit: refused os.remove",
    "rename_outside": "audit: refused os.rename",
    "import_flash_attn": "audit: refused import flash_attn",
    "import_xformers_spelled": "audit: refused import xformers",
    "import_kbench_internals": "audit: refused import kbench.calibrate",
    "harness_code": "audit: refused object.__getattr__ '__code__'",
    "exec_code": "audit: refused compile",
    "settrace": "audit: refused sys.settrace",
    "raise_cpu_limit": "audit: refused resource.setrlimit",
    "add_audit_hook": "audit: refused sys.addaudithook",
}


@pytest.fixture(scope="module")
def attacks(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("guard")
    outside, victim = tmp / "outside.txt", tmp / "victim.txt"
    victim.write_text("keep me")
    results = run_candidate(tmp, ATTACKS.format(outside=str(outside), victim=str(victim)), list(EXPECTED))
    return results, outside, victim


@pytest.mark.parametrize("attack", list(EXPECTED))
def test_attack_is_refused_naming_the_event(attacks, attack):
    results, _, _ = attacks
    outcome = results[attack]
    assert outcome["refusals"], outcome
    assert outcome["refusals"][0].startswith(EXPECTED[attack]), outcome
    if attack != "add_audit_hook":  # sys.addaudithook swallows a hook's exception (and adds nothing)
        assert outcome["result"].startswith("AuditRefused: " + EXPECTED[attack]), outcome


def test_refused_writes_left_the_files_alone(attacks):
    _, outside, victim = attacks
    assert not outside.exists()
    assert victim.read_text() == "keep me" and not Path(str(victim) + ".moved").exists()


HONEST = '''
import json, os, math, tempfile
import numpy as np

def numpy_work():
    a = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    s = np.einsum("qd,kd->qk", a, a)
    p = np.exp(s - s.max(-1, keepdims=True))
    return float((p / p.sum(-1, keepdims=True)).sum()), a.ctypes.data > 0

def scratch_files():
    path = os.path.join(tempfile.gettempdir(), "cache.json")
    with open(path, "w") as fh:
        json.dump({"ok": 1}, fh)
    os.rename(path, path + ".2")
    os.remove(path + ".2")
    os.makedirs(os.path.expanduser("~/.cache/x"), exist_ok=True)
    return open("/etc/os-release").read(5) if os.path.exists("/etc/os-release") else "read"

def own_function_internals():
    def f(x=1):
        return x
    return f.__code__.co_name, f.__defaults__, sorted(f.__globals__)[:1]

def exceptions():
    try:
        1 / 0
    except ZeroDivisionError as exc:
        return type(exc).__name__

def threads_of_numpy():
    import concurrent.futures, threading, traceback
    a = np.arange(64, dtype=np.float32).reshape(8, 8)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        rows = list(pool.map(lambda i: float(a[i] @ a[i]), range(8)))
    def failing():
        try:
            raise ValueError("a bug in a kernel's thread")
        except ValueError:
            rows.append(traceback.format_exc().count("ValueError"))  # a thread reads its own traceback
    t = threading.Thread(target=failing)
    t.start()
    t.join()
    return rows[-1], round(sum(rows[:-1]))
'''


def test_honest_numpy_kernel_code_is_not_refused(tmp_path):
    names = ["numpy_work", "scratch_files", "own_function_internals", "exceptions", "threads_of_numpy"]
    results = run_candidate(tmp_path, HONEST, names)
    for name in names:
        assert results[name]["refusals"] == [], (name, results[name])
        assert not results[name]["result"].startswith("AuditRefused"), (name, results[name])
    assert results["numpy_work"]["result"].startswith("(64.0")
    assert results["threads_of_numpy"]["result"] == "(2, 85344)"  # sum of k**2 for k < 64; its traceback read


#: calls the hook refuses whoever makes them: handed to a thread, an executor, a timer, a finalizer, a partial,
#: found with getattr or map (on 6cf3c74 a thread's target, an executor's job and a finalizer
#: ran os.kill and gc.get_objects unrefused, since the nearest frame was threading's, not the kernel's)
LAUNDERED = '''
import concurrent.futures, functools, gc, os, sys, threading, weakref

def thread_target_kill():
    t = threading.Thread(target=os.kill, args=(os.getpid(), 0))
    t.start()
    t.join()

def timer_kill():
    t = threading.Timer(0.0, os.kill, (os.getpid(), 0))
    t.start()
    t.join()

def executor_gc():
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return len(pool.submit(gc.get_objects).result())

def executor_exec():
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(exec, "x = 1", {}).result()

def thread_settrace():
    t = threading.Thread(target=sys.settrace, args=(None,))
    t.start()
    t.join()

class Box:
    pass

def finalizer_kill():
    box = Box()
    weakref.finalize(box, os.kill, os.getpid(), 0)
    return box  # dropped by the harness after the call: the finalizer runs from the harness's frames

def partial_kill():
    return functools.partial(os.kill, os.getpid(), 0)()

def getattr_kill():
    return getattr(os, "ki" + "ll")(os.getpid(), 0)

def map_kill():
    return list(map(os.kill, [os.getpid()], [0]))

START = "_start_new_thread" if hasattr(threading, "_start_new_thread") else "_start_joinable_thread"  # 3.13

def raw_thread():
    if START == "_start_new_thread":
        return threading._start_new_thread(os.kill, (os.getpid(), 0))
    return threading._start_joinable_thread(functools.partial(os.kill, os.getpid(), 0))

def gate_replaced():
    setattr(threading, START, getattr(threading, START)._start)
'''

#: attack -> (the start of its first refusal, whether the candidate's own call raises it)
LAUNDERED_EXPECTED = {
    "thread_target_kill": ("audit: refused os.kill", False),
    "timer_kill": ("audit: refused os.kill", False),
    "executor_gc": ("audit: refused gc.get_objects", True),
    "executor_exec": ("audit: refused compile", True),
    "thread_settrace": ("audit: refused sys.settrace", False),
    "finalizer_kill": ("audit: refused os.kill", False),
    "partial_kill": ("audit: refused os.kill", True),
    "getattr_kill": ("audit: refused os.kill", True),
    "map_kill": ("audit: refused os.kill", True),
    "raw_thread": ("audit: refused a raw thread started by candidate code", True),
    "gate_replaced": ("audit: refused threading._start_", False),
}


@pytest.fixture(scope="module")
def laundered(tmp_path_factory):
    driver = DRIVER.replace("    g.refusals.clear()", "    g.refusals.clear()\n    out[name][\"drained\"] = g.drain()")
    tmp = tmp_path_factory.mktemp("laundered")
    return run_candidate(tmp, LAUNDERED, list(LAUNDERED_EXPECTED), driver=driver)


@pytest.mark.parametrize("attack", list(LAUNDERED_EXPECTED))
def test_a_refused_call_is_refused_whoever_makes_it(laundered, attack):
    outcome = laundered[attack]
    expected, raised = LAUNDERED_EXPECTED[attack]
    refusals = outcome["refusals"] + outcome["drained"]
    assert refusals and refusals[0].startswith(expected), outcome
    if raised:
        assert outcome["result"].startswith("AuditRefused: " + expected), outcome


def test_libraries_of_an_environment_under_tmp_load_and_tmp_elsewhere_does_not(tmp_path):
    """A virtual environment in /tmp is where the worker's packages live (a read-only bind in the sandbox):
    torch loads its libraries from there; a library anywhere else under /tmp, or in the scratch directory,
    is one the candidate could have written."""
    from kbench.worker.guard import Guard

    venv, scratch = tmp_path / "venv", tmp_path / "scratch"
    guard = Guard(str(scratch), system_roots=[str(venv), "/usr"])
    assert guard._dlopen((str(venv / "lib" / "libtorch_global_deps.so"), 0)) is None
    assert guard._dlopen(("/usr/lib/libm.so.6", 0)) is None
    assert "writable place" in guard._dlopen((str(tmp_path / "elsewhere" / "libx.so"), 0))
    assert "writable place" in guard._dlopen((str(scratch / "libx.so"), 0))
    assert "writable place" in guard._dlopen(("/opt/unlisted/libx.so", 0))  # outside every root


TRITON = '''
import torch
import triton
import triton.language as tl


@triton.jit
def _scaled_softmax_rows(x_ptr, out_ptr, n_cols, scale, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=-float("inf")) * scale
    x = x - tl.max(x, axis=0)
    e = tl.exp(x)
    tl.store(out_ptr + row * n_cols + cols, e / tl.sum(e, axis=0), mask=mask)


def triton_interpreted():
    x = torch.randn(8, 20)
    out = torch.empty_like(x)
    _scaled_softmax_rows[(8,)](x, out, 20, 0.5, BLOCK=32)
    return bool(torch.allclose(out, torch.softmax(x * 0.5, dim=-1), atol=1e-5))
'''


def test_triton_kernel_under_the_interpreter_works_guarded(tmp_path):
    pytest.importorskip("triton")
    pytest.importorskip("torch")
    # torch and Triton are imported after the guard, by the candidate: their own frame, ctypes and exec use is fine
    results = run_candidate(tmp_path, TRITON, ["triton_interpreted"], env={"TRITON_INTERPRET": "1"})
    assert results["triton_interpreted"] == {"result": "True", "refusals": []}


def test_refusals_are_facts_the_judge_fails_the_record_on(tmp_path):
    """The worker only reports what its guard refused; the verdict is the judge's, in the parent."""
    from kbench.judge import replies
    from kbench.worker.guard import Guard

    guard = Guard(str(tmp_path))
    assert guard.drain() == []
    guard.refusals += ["audit: refused socket.__new__ (...)", "audit: refused socket.connect (...)"]
    refused = guard.drain()
    assert refused == ["audit: refused socket.__new__ (...)", "audit: refused socket.connect (...)"]
    assert guard.drain() == []
    why = replies.fault({"fault": None, "audit": refused, "audit_count": len(refused)})
    assert why == "audit: refused socket.__new__ (...) (and 1 more refused event)"
    assert replies.fault({"fault": None}) is None


CUPY = '''
import cupy

def cupy_import_and_launch():
    try:
        x = cupy.arange(4, dtype=cupy.float32)
        return float((x * 2).sum().get())
    except cupy.cuda.runtime.CUDARuntimeError as exc:  # no GPU here: the launch fails in CUDA, not in the guard
        return "CUDARuntimeError"
'''


def test_cupy_kernel_code_is_not_refused(tmp_path):
    pytest.importorskip("cupy")
    results = run_candidate(tmp_path, CUPY, ["cupy_import_and_launch"])
    outcome = results["cupy_import_and_launch"]
    assert outcome["refusals"] == [] and outcome["result"] in ("12.0", "'CUDARuntimeError'"), outcome
