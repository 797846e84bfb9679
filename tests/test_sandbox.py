"""The bubblewrap sandbox of untrusted workers (kbench.run.sandbox), with real bwrap and real processes.

Skipped only where the OS refuses the namespaces (the probe says why). Each sandboxed command is
the exact command line untrusted workers get (``bwrap_command``), running a small Python program.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from kbench.run import sandbox
from kbench.run.sandbox import BwrapProcess, bwrap_command, memory_limit, memory_refusal, probe, sandbox_environment

ROOT = Path(__file__).resolve().parents[1]
STATUS = probe()
needs_sandbox = pytest.mark.skipif(not STATUS.available, reason=f"no sandbox here: {STATUS.reason}")


def sandboxed(code: str, scratch: Path, *, env: dict | None = None, pass_fds=(), popen=False, extra=(),
              writable_limit: int | None = sandbox.SCRATCH_LIMIT):
    """Run ``code`` in the workers' sandbox; the completed process (or the BwrapProcess with ``popen``).

    ``writable_limit=None``: the host's ``scratch`` bound in (what a bwrap without --size gets), for the
    tests that read back what the sandboxed program wrote."""
    cmd = bwrap_command(STATUS.binary, [sys.executable, "-c", textwrap.dedent(code)], scratch=str(scratch),
                        writable_limit=writable_limit)
    cmd[1:1] = list(extra)
    environment = sandbox_environment({**os.environ, **(env or {})}, str(scratch))
    if popen:
        return BwrapProcess(cmd, env=environment, pass_fds=pass_fds, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    return subprocess.run(cmd, env=environment, pass_fds=pass_fds, capture_output=True, text=True, timeout=120)


def result(proc) -> dict:
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------------------------
# the environment: an allow-list


def test_environment_is_an_allow_list():
    base = {"PATH": "/usr/bin", "LANG": "C.UTF-8", "LC_ALL": "C", "OMP_NUM_THREADS": "2", "TRITON_INTERPRET": "1",
            "CUDA_VISIBLE_DEVICES": "0", "KBENCH_PLUGINS": "x", "DB_PASS": "s", "MYSQL_PWD": "s",
            "X_PASSPHRASE": "s", "DATABASE_URL": "postgres://u:s@h/d", "RANDOM_NAME": "s", "HOME": "/root",
            "TRITON_CACHE_DIR": "/root/.triton", "OMP_SECRET": "s", "LD_PRELOAD": "/x.so", "PYTHONSTARTUP": "/x.py",
            "LC_PROXY": "https://user:s@proxy:3128"}
    env = sandbox_environment(base, "/scratch")
    kept = {k for k in base if k in env and env[k] == base[k]}
    assert kept == {"PATH", "LANG", "LC_ALL", "OMP_NUM_THREADS", "TRITON_INTERPRET", "CUDA_VISIBLE_DEVICES",
                    "KBENCH_PLUGINS"}
    assert env["HOME"] == env["TMPDIR"] == "/scratch" and env["TRITON_CACHE_DIR"].startswith("/scratch/")
    assert "LD_PRELOAD" not in env and "PYTHONSTARTUP" not in env and "s" not in env.values()


def test_trusted_workers_get_the_environment_without_credentials():
    from kbench.run.pool import worker_environment

    base = {"PATH": "/bin", "TORCH_HOME": "/models", "DB_PASS": "s", "MYSQL_PWD": "s", "X_PASSPHRASE": "s",
            "DATABASE_URL": "s", "OPENAI_API_KEY": "s", "GITHUB_TOKEN": "s", "HTTPS_PROXY": "http://u:s@proxy:3128"}
    env = worker_environment(base, scratch=None)
    assert {k for k in base if k in env} == {"PATH", "TORCH_HOME"}


def test_both_worker_environments_pass_by_allow_list_so_a_secret_by_another_name_never_passes():
    from kbench.run.pool import worker_environment

    needed = {"PATH": "/bin", "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
              "MKL_NUM_THREADS": "1", "OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_L2_SIZE": "1048576",
              "CUDA_VISIBLE_DEVICES": "0", "KBENCH_PLUGINS": "x", "TRITON_INTERPRET": "1"}
    # names no deny-list of secret-looking words catches, some under prefixes an allow-list by wildcard passed
    hidden = {"DEPLOY_PW": "s1", "A_TKN_B": "s2", "OPENBLAS_TKN": "s3", "TRITON_PW": "s4", "LC_TKN": "s5",
              "KBENCH_ADMIN_PW": "s6", "OMP_CANARY": "s7", "NVIDIA_NGC_TKN": "s8", "CUPY_PW": "s9"}
    base = {**needed, **hidden, "HOME": "/home/u", "TORCH_HOME": "/models"}
    sandboxed_env = worker_environment(base, scratch="/scratch")
    trusted_env = worker_environment(base, scratch=None)
    for env in (sandboxed_env, trusted_env):
        assert not set(hidden) & set(env) and not set(hidden.values()) & set(env.values())
        assert {k: env[k] for k in needed} == needed
        assert env["PYTHONPATH"]
    assert trusted_env["HOME"] == "/home/u" and trusted_env["TORCH_HOME"] == "/models"
    assert sandboxed_env["HOME"] == "/scratch" and "TORCH_HOME" not in sandboxed_env


def test_the_sandbox_binds_an_interpreter_prefix_library_folders_never_its_root_and_pip_conf(tmp_path, monkeypatch):
    venv = tmp_path / "venv"
    for part in ("bin", "lib/python3/site-packages", "include"):
        (venv / part).mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (venv / "pip.conf").write_text("[global]\nindex-url = https://user:hunter2@pypi.example/simple\n")
    (venv / "etc").mkdir()
    monkeypatch.setattr(sys, "prefix", str(venv))
    monkeypatch.setattr(sys, "exec_prefix", str(venv))
    roots = sandbox.readable_roots()
    real = str(venv.resolve())
    assert real not in roots
    assert {f"{real}/bin", f"{real}/lib", f"{real}/include", f"{real}/pyvenv.cfg"} <= set(roots)
    assert not any(sandbox._under(str((venv / name).resolve()), roots) for name in ("pip.conf", "etc"))


# --------------------------------------------------------------------------------------------
# the sandbox itself


@needs_sandbox
def test_probe_names_the_tool_and_namespaces():
    assert STATUS.version.startswith("bubblewrap") and os.access(STATUS.binary, os.X_OK)
    assert STATUS.describe().startswith(STATUS.version + " (user, pid, mount, net")


@needs_sandbox
def test_namespaces_user_pid_and_no_parent_in_proc(tmp_path):
    parent = os.getpid()
    out = result(sandboxed(f'''
        import json, os
        pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
        status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l)
        print(json.dumps({{"pid": os.getpid(), "ppid": os.getppid(), "uid": os.getuid(), "pids": pids,
                          "cap": status["CapEff"].strip(), "parent": os.path.exists("/proc/{parent}/environ"),
                          "host": os.uname().nodename}}))
    ''', tmp_path))
    assert out["pid"] == 2 and out["ppid"] == 1 and out["pids"] == [1, 2]
    assert out["uid"] == sandbox.SANDBOX_UID and int(out["cap"], 16) == 0
    assert out["parent"] is False and out["host"] == "kbench-sandbox"


@needs_sandbox
def test_filesystem_is_read_only_except_the_scratch_dir(tmp_path):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    host_tmp = Path(tempfile.gettempdir()) / f"kbench-sandbox-test-{os.getpid()}"
    out = result(sandboxed(f'''
        import json, os
        def write(path):
            try:
                with open(path, "w") as fh:
                    fh.write("x")
                return "written"
            except OSError as exc:
                return exc.strerror
        print(json.dumps({{
            "checkout": write({str(ROOT / "kbench-sandbox-test.txt")!r}),
            "results": write({str(ROOT / "results" / "kbench-sandbox-test.json")!r}),
            "tmp": write({str(host_tmp)!r}),
            "scratch": write({str(scratch / "ok.txt")!r}),
            "shadow": os.path.exists("/etc/shadow"),
            "home": sorted(os.listdir({str(Path.home())!r})) if os.path.isdir({str(Path.home())!r}) else [],
            "kbench": os.path.exists({str(ROOT / "kbench" / "run" / "sandbox.py")!r}),
        }}))
    ''', scratch))
    # the checkout's folder is a bare mount point: read-only, empty; a checkout under /tmp lies in the sandbox's own
    # /tmp instead (a private tmpfs: writable there, and nothing reaches the host, asserted at the end)
    in_tmp = ROOT.resolve().is_relative_to(Path(tempfile.gettempdir()).resolve())
    assert out["checkout"] == ("written" if in_tmp else "Read-only file system")
    assert out["results"] == "No such file or directory"  # only the packages' folders are bound, not results/
    assert out["tmp"] == "written" and not host_tmp.exists()  # the sandbox's /tmp is its own
    assert out["scratch"] == "written" and not (scratch / "ok.txt").exists()  # so is its scratch directory
    assert out["kbench"] is True and out["shadow"] is False
    # of the home directory, at most the parents of what is bound (e.g. ~/.pyenv holding the interpreter)
    bound = {Path(r).relative_to(Path.home()).parts[0] for r in sandbox.readable_roots()
             if Path(r).is_relative_to(Path.home())}
    assert set(out["home"]) <= bound and len(os.listdir(Path.home())) > len(bound)
    assert not (ROOT / "kbench-sandbox-test.txt").exists()


@needs_sandbox
def test_no_network_not_even_the_host_loopback(tmp_path):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    try:
        out = result(sandboxed(f'''
            import json, socket
            try:
                socket.create_connection(("127.0.0.1", {port}), timeout=3).close()
                how = "connected"
            except OSError as exc:
                how = type(exc).__name__
            print(json.dumps({{"how": how, "interfaces": [n for _, n in socket.if_nameindex()]}}))
        ''', tmp_path))
        with pytest.raises(socket.timeout):
            listener.accept()
    finally:
        listener.close()
    assert out["how"] == "ConnectionRefusedError" and out["interfaces"] == ["lo"]


@needs_sandbox
def test_the_channel_fd_survives_bwrap(tmp_path):
    parent_end, child_end = socket.socketpair()
    with parent_end:
        proc = sandboxed(f'''
            import socket
            s = socket.socket(fileno={child_end.fileno()})
            s.sendall(s.recv(5).upper())
        ''', tmp_path, pass_fds=(child_end.fileno(),), popen=True)
        child_end.close()
        parent_end.sendall(b"hello")
        parent_end.settimeout(60)
        assert parent_end.recv(5) == b"HELLO"
        assert proc.wait(timeout=60) == 0


@needs_sandbox
def test_a_signal_is_reported_as_the_workers_not_bwraps(tmp_path):
    proc = sandboxed("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", tmp_path, popen=True)
    assert proc.wait(timeout=60) == -signal.SIGSEGV and proc.returncode == -signal.SIGSEGV


@needs_sandbox
def test_rlimits_are_hard(tmp_path):
    out = result(sandboxed('''
        import json, resource
        from kbench.worker.main import apply_limits, hard_limits
        apply_limits(hard_limits(memory=3 * 2**30, file_size=2**20, cpu_count=2))
        raised = []
        for which in (resource.RLIMIT_AS, resource.RLIMIT_FSIZE, resource.RLIMIT_NPROC, resource.RLIMIT_NOFILE):
            soft, hard = resource.getrlimit(which)
            try:
                resource.setrlimit(which, (hard * 2, hard * 2))
                raised.append(which)
            except (ValueError, OSError):
                pass
        print(json.dumps({"as": resource.getrlimit(resource.RLIMIT_AS),
                          "fsize": resource.getrlimit(resource.RLIMIT_FSIZE), "nproc": resource.getrlimit(resource.RLIMIT_NPROC)[0], "raised": raised}))
    ''', tmp_path))
    assert out["as"] == [3 * 2**30] * 2 and out["fsize"] == [2**20] * 2
    from kbench.worker.main import NPROC_BASE

    assert out["nproc"] == NPROC_BASE + 16 and out["raised"] == []


@needs_sandbox
def test_killing_the_sandbox_kills_every_process_in_it(tmp_path):
    marker = f"kbench-sandbox-test-{os.getpid()}-{time.monotonic_ns()}"
    half = len(marker) // 2  # the marker is assembled inside: only the spawned processes carry it whole
    proc = sandboxed(f'''
        import os, sys, time
        spin = "import time  # " + {marker[:half]!r} + {marker[half:]!r} + "\\ntime.sleep(600)"
        os.posix_spawn(sys.executable, [sys.executable, "-c", spin], dict(os.environ), setsid=True)
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.execv(sys.executable, [sys.executable, "-c", spin])
            os._exit(0)
        print("started", flush=True)
        time.sleep(600)
    ''', tmp_path, popen=True)
    assert proc.stdout.readline().strip() == b"started"

    def marked():
        return [p for p in os.listdir("/proc") if p.isdigit()
                and marker.encode() in _cmdline(p)]
    deadline = time.monotonic() + 30
    while len(marked()) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(marked()) == 2  # a new-session child and a double-forked grandchild
    os.killpg(proc.pid, signal.SIGKILL)  # what Worker.kill does
    proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while marked() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marked() == []


def _cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


# --------------------------------------------------------------------------------------------
# memory: limits and the footprint check


def test_memory_limit_shares_ram_among_live_workers():
    gib = 2**30
    assert memory_limit(None, 4) is None
    assert memory_limit(20 * gib, 1) == 16 * gib + sandbox.WORKER_BASE_MEMORY
    assert memory_limit(20 * gib, 9) == 16 * gib - 8 * sandbox.IDLE_WORKER_MEMORY + sandbox.WORKER_BASE_MEMORY


def test_memory_refusal_names_the_bytes_and_the_limit():
    gib = 2**30
    assert memory_refusal(10 * gib, None) is None
    assert memory_refusal(gib, 4 * gib + sandbox.WORKER_BASE_MEMORY) is None  # 3 GiB needed, 4 GiB usable
    why = memory_refusal(2 * gib, 4 * gib + sandbox.WORKER_BASE_MEMORY)
    assert "6.00 GiB (6442450944 bytes)" in why and "4.00 GiB" in why and "integrity.memory_limit" in why


def _plan(tmp_path, suite_data, files=(), patterns=(), **request):
    from kbench.plugins import PluginManager
    from kbench.run.runner import RunRequest, plan_run
    from kbench.suite import suite_from_data

    pm = PluginManager()
    req = RunRequest(suite=suite_from_data(suite_data), device="cpu", kernel_files=[str(f) for f in files],
                     backend_patterns=list(patterns), output=tmp_path / "run.json", **request)
    return pm, plan_run(pm, req)


TIMING = {"warmup_time": 0.0, "min_samples": 3, "min_time": 0.0, "max_time": 0.05, "target_rel_se": 1.0,
          "rotate": 2, "case_timeout": 120}


def test_a_case_too_big_for_the_workers_memory_is_skipped_before_any_work(tmp_path):
    from kbench.run.runner import run_suite

    suite = {"name": "big", "grid": [{"seqlen": 4096, "heads": 8, "head_dim": 128, "dtype": "fp32"}],
             "timing": TIMING, "integrity": {"memory_limit": "1.1GiB"}}
    pm, planned = _plan(tmp_path, suite, patterns=["numpy"])
    started = time.perf_counter()
    records = run_suite(pm, planned).records
    assert [r["status"] for r in records] == ["skipped"]
    assert records[0]["reason"].startswith("memory: the case needs about") and "1.10 GiB" in records[0]["reason"]
    assert time.perf_counter() - started < 60  # no worker started, nothing measured (a bound, not a timing test)


@needs_sandbox
def test_honest_kernel_files_pass_in_the_sandbox(tmp_path):
    from kbench.run.runner import run_suite

    seed = ROOT / "plugins" / "kbench-evolve" / "kbench_evolve" / "seeds" / "numpy_attention_seed.py"
    suite = {"name": "honest", "grid": [{"seqlen": 64, "heads": 2, "head_dim": 32, "dtype": "fp32",
                                         "causal": [False, True]}], "timing": TIMING}
    pm, planned = _plan(tmp_path, suite, files=[ROOT / "tests" / "redteam" / "honest_numpy.py", seed])
    records = run_suite(pm, planned).records
    assert len(records) == 4
    for rec in records:
        assert rec["status"] == "passed", (rec["backend"], rec["reason"])
        assert rec["worker"]["sandbox"]


# --------------------------------------------------------------------------------------------
# where the OS refuses: a sandbox whose own sandbox forbids user namespaces (bwrap --disable-userns)


NESTED = '''
import json, subprocess, sys
def kbench(*args):
    p = subprocess.run([sys.executable, "-c", "from kbench.cli import main; main()", *args],
                       capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr
listing = kbench("list")
refused = kbench("run", "SUITE", "-b", "KERNEL", "-b", "numpy", "-o", "SCRATCH/refused.json", "--no-progress")
allowed = kbench("run", "SUITE", "-b", "KERNEL", "-b", "numpy", "-o", "SCRATCH/allowed.json", "--no-progress",
                 "--allow-unsandboxed")
print(json.dumps({"list": listing, "refused": refused, "allowed": allowed}))
'''


@needs_sandbox
def test_without_user_namespaces_untrusted_code_does_not_run_unless_allowed(tmp_path):
    from kbench.plugins import get_plugin_manager

    get_plugin_manager()  # the plugins the nested kbench loads are imported here, so their folders are bound
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    suite = scratch / "suite.yaml"
    suite.write_text("name: nested\ngrid:\n  - {seqlen: 32, heads: 2, head_dim: 16, dtype: fp32}\n"
                     "timing: {warmup_time: 0, min_samples: 3, min_time: 0, max_time: 0.05, target_rel_se: 1.0}\n")
    kernel = scratch / "kernel.py"
    kernel.write_text((ROOT / "tests" / "redteam" / "honest_numpy.py").read_text())
    code = NESTED.replace("SUITE", str(suite)).replace("KERNEL", str(kernel)).replace("SCRATCH", str(scratch))
    out = result(sandboxed(code, scratch, extra=["--disable-userns"], writable_limit=None))

    rc, text = out["list"]
    assert rc == 0 and "sandbox: unavailable: bwrap refused to create the namespaces" in text
    assert "--allow-unsandboxed" in text

    rc, _ = out["refused"]
    data = json.loads((scratch / "refused.json").read_text())
    by = {r["backend"]: r for r in data["records"]}
    # trusted backends are not affected; the refused record is the environment's: exit 2, the file incomplete
    assert rc == 2 and by["numpy"]["status"] == "passed" and data["complete"] is False
    rec = by["file:kernel"]
    assert rec["status"] == "error" and rec["cause"] == "infrastructure"
    assert rec["reason"].startswith("sandbox unavailable: bwrap refused") and "--allow-unsandboxed" in rec["reason"]
    assert data["selection"]["allow_unsandboxed"] is False

    rc, _ = out["allowed"]
    data = json.loads((scratch / "allowed.json").read_text())
    assert rc == 0 and {r["status"] for r in data["records"]} == {"passed"}
    assert data["selection"]["allow_unsandboxed"] is True


def test_trusted_workers_get_a_memory_limit_too(tmp_path):
    from kbench.run.pool import WorkerPool

    suite = {"name": "trusted", "grid": [{"seqlen": 32, "heads": 2, "head_dim": 16, "dtype": "fp32"}],
             "timing": TIMING}
    pm, planned = _plan(tmp_path, suite, patterns=["numpy"])
    case, backend = planned.work()[0]
    with WorkerPool(pm, planned.ctx) as pool:
        assert pool(backend, case)["status"] == "passed"
        worker = pool.workers["trusted"]
        limits = Path(f"/proc/{worker.proc.pid}/limits").read_text()
        expected = pool.memory_limit()
    line = next(ln for ln in limits.splitlines() if ln.startswith("Max address space"))
    assert expected and line.split()[3:5] == [str(expected), str(expected)]


@needs_sandbox
def test_cuda_workers_get_the_gpu_device_nodes(tmp_path, kbench_pm):
    import glob

    if "cuda" not in kbench_pm.registry.devices:
        pytest.skip("the cuda device plugin is not installed")
    binds = kbench_pm.registry.devices["cuda"].sandbox_binds()
    cmd = bwrap_command(STATUS.binary, ["true"], scratch=str(tmp_path), binds=binds)
    pairs = {(cmd[i], cmd[i + 1]) for i in range(len(cmd) - 1)}
    assert all(("--dev-bind-try", node) in pairs for node in glob.glob("/dev/nvidia*"))
    assert ("--ro-bind-try", "/sys") in pairs
    assert "--dev-bind-try" not in bwrap_command(STATUS.binary, ["true"], scratch=str(tmp_path),
                                                 binds=kbench_pm.registry.devices["cpu"].sandbox_binds())
    # and such a sandbox starts (with the nodes this machine has: none without a GPU)
    code = "import json, os; print(json.dumps(os.listdir('/dev')))"
    proc = subprocess.run(cmd[:-1] + [sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=sandbox_environment({}, str(tmp_path)))
    devices = result(proc)
    assert {Path(n).name for n in glob.glob("/dev/nvidia*")} <= set(devices) and "null" in devices


@needs_sandbox
def test_every_writable_place_is_bounded_before_the_kernel_runs(tmp_path):
    """Scratch, /tmp and /dev/shm are tmpfs mounts of integrity.scratch_limit: filling one answers ENOSPC
    (the host's disk and RAM are not the limit), and nothing written reaches the host's scratch directory."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    limit = 8 * 2**20
    out = result(sandboxed('''
        import errno, json, os
        def fill(where):
            total, chunk = 0, b"x" * 2**20
            try:
                for i in range(64):  # up to 64 MiB, one file per MiB (each under the file-size limit)
                    with open(os.path.join(where, f"fill{i}"), "wb") as fh:
                        fh.write(chunk)
                    total += len(chunk)
            except OSError as exc:
                return total, errno.errorcode.get(exc.errno)
            return total, None
        print(json.dumps({w: fill(w) for w in (os.getcwd(), "/tmp", "/dev/shm")}))
    ''', scratch, writable_limit=limit))
    for where, (written, error) in out.items():
        assert error == "ENOSPC" and 0 < written <= limit, (where, written, error)
    assert os.listdir(scratch) == []


def test_scratch_limit_is_a_suite_setting():
    from kbench.judge.policy import IntegritySettings
    from kbench.suite import suite_from_data

    assert IntegritySettings().scratch_limit == sandbox.SCRATCH_LIMIT
    assert IntegritySettings.from_mapping({"scratch_limit": "64MiB"}).scratch_limit == 64 * 2**20
    suite = suite_from_data({"name": "s", "grid": [{"seqlen": 32, "heads": 2, "head_dim": 16}],
                             "integrity": {"scratch_limit": "1GiB"}})  # the schema takes the key
    assert IntegritySettings.from_mapping(suite.data["integrity"]).scratch_limit == 2**30
    cmd = bwrap_command("bwrap", ["true"], scratch="/s", writable_limit=2**30)
    assert cmd[cmd.index("/s") - 3:cmd.index("/s") + 1] == ["--size", str(2**30), "--tmpfs", "/s"]
    assert "--bind" not in cmd and cmd.count("--size") == 3
    old = bwrap_command("bwrap", ["true"], scratch="/s", writable_limit=None)
    assert "--size" not in old and old[old.index("--bind"):old.index("--bind") + 3] == ["--bind", "/s", "/s"]


ARENA_PROBE = '''"""Honest maths, but fails its call when a descriptor of the arena is open in its process."""
import os

import numpy as np


def arena_descriptors():
    found = []
    for number in os.listdir("/proc/self/fd"):
        try:
            if "kbench-arena" in os.readlink("/proc/self/fd/" + number):
                found.append(number)
        except OSError:
            pass
    return found


OPEN_AT_IMPORT = len(arena_descriptors())


def attention(q, k, v, out, *, causal, scale):
    found = arena_descriptors()
    if found or OPEN_AT_IMPORT:
        raise RuntimeError(f"the arena is open in the kernel's process: fds {found} ({OPEN_AT_IMPORT} at import)")
    s = np.einsum("bqhd,bkhd->bhqk", q, k) * np.float32(scale)
    p = np.exp(s - s.max(-1, keepdims=True))
    out[...] = np.einsum("bhqk,bkhd->bqhd", p / p.sum(-1, keepdims=True), v)
'''


@needs_sandbox
def test_no_descriptor_of_the_arena_is_open_while_candidate_code_runs(tmp_path):
    """Python 3.11's mmap kept a duplicate of the arena's descriptor: a kernel found it in
    /proc/self/fd at import and in every call. Now the worker points it at /dev/null before candidate code."""
    from kbench.run.runner import run_suite

    probe_file = tmp_path / "arena_probe.py"
    probe_file.write_text(ARENA_PROBE)
    suite = {"name": "arena", "grid": [{"seqlen": 32, "heads": 1, "head_dim": 16, "dtype": "fp32"}],
             "timing": TIMING}
    pm, planned = _plan(tmp_path, suite, files=[probe_file])
    records = run_suite(pm, planned).records
    assert [(r["status"], r["reason"]) for r in records] == [("passed", None)]


def test_forget_file_leaves_the_mapping_and_no_other_descriptor(tmp_path):
    import mmap

    from kbench.protocol import arena_file
    from kbench.worker.main import forget_file

    def open_copies():
        return [n for n in os.listdir("/proc/self/fd") if "kbench-arena" in _link(n)]

    fd = arena_file(4096)
    mapping = mmap.mmap(fd, 4096)
    try:
        forget_file(fd)
    finally:
        os.close(fd)
    assert open_copies() == []
    mapping[:5] = b"hello"  # the mapping itself stays, and closes without touching another file
    assert bytes(mapping[:5]) == b"hello"
    mapping.close()


def _link(number: str) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{number}")
    except OSError:
        return ""
