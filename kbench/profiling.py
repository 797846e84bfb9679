"""Nsight Compute figures per (case, backend), taken outside the timed samples: ``kbench run --profile ncu``.

After the engine has made a record (the timing is done), :func:`attach_profile` starts a separate process
under Nsight Compute (``ncu``): it builds the same backend for the same case, makes inputs with
``op.make_inputs(case, seed)``, warms up with a few calls, then makes :data:`PROFILED_CALLS` call(s) between
``cuProfilerStart``/``cuProfilerStop`` (``ncu --profile-from-start off``), so only the kernels of those calls
are profiled, each replayed by ncu as often as its metrics need. The small fixed set :data:`METRICS` (duration,
achieved occupancy, tensor-pipe utilisation, DRAM throughput, registers per thread, spill instructions, shared
memory) is read from ncu's CSV (``--csv --page raw --print-units base``) into ``record["profile"]``.
``kbench show --profile`` and ``kbench report`` show it; the evolve plugin's brief quotes it.

An untrusted backend (a kernel file) is profiled inside the same bubblewrap sandbox its worker runs in
(:func:`kbench.run.sandbox.bwrap_command`), ncu included. Its figures are advisory: the candidate shares that
process tree with ncu and could print a forged CSV; nothing the judge decides reads them.

``python -m kbench.profiling run --backend NAME --case JSON`` profiles one (backend, case) by hand
(``--dry-run`` prints the command line only); ``python -m kbench.profiling call ...`` is the profiled process.

Sources: the Nsight Compute CLI manual (docs.nvidia.com/nsight-compute/NsightComputeCli: ``--csv``, ``--page
raw``, ``--print-units base``, ``--metrics``, ``--profile-from-start off``, ``--target-processes all``,
``--clock-control none``) and the Kernel Profiling Guide (docs.nvidia.com/nsight-compute/ProfilingGuide:
metric names, ``.sum``/``.avg``/``.pct_of_peak_sustained_*`` suffixes, the raw page's units row).
"""
from __future__ import annotations

import csv
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

#: seconds one profiled (case, backend) may take: interpreter start, JIT, warm-up and ncu's replays
PROFILE_TIMEOUT = 300.0
#: calls made before profiling starts (JIT, autotuning and lazy allocation stay out of the profile)
WARMUP_CALLS = 3
#: calls profiled; every kernel launch inside them is one row of ncu's CSV
PROFILED_CALLS = 1
#: the input seed of the profiled calls (profiling is not judged: any valid inputs do)
PROFILE_SEED = 0
#: at most this many kernels are kept per profile (a backend made of many small kernels keeps its longest)
MAX_KERNELS = 16


@dataclass(frozen=True)
class Metric:
    """One figure of the profile: its key in the record, ncu's metric and how it is combined over kernels."""

    key: str
    ncu: str
    label: str
    #: "sum": added over the profiled kernels; "main": the value of the longest kernel
    combine: str = "main"


#: the fixed metric set (Kernel Profiling Guide names; percentages are of the peak sustained rate, over the
#: cycles the unit was active for occupancy and the tensor pipe, over the elapsed cycles for DRAM)
METRICS: tuple[Metric, ...] = (
    Metric("duration_ns", "gpu__time_duration.sum", "duration", "sum"),
    Metric("occupancy_pct", "sm__warps_active.avg.pct_of_peak_sustained_active", "achieved occupancy %"),
    Metric("tensor_pct", "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active", "tensor pipe %"),
    Metric("dram_pct", "dram__throughput.avg.pct_of_peak_sustained_elapsed", "DRAM throughput %"),
    Metric("registers", "launch__registers_per_thread", "registers/thread"),
    Metric("spill_instructions", "sass__inst_executed_register_spilling", "spill instructions", "sum"),
    Metric("smem_dynamic_bytes", "launch__shared_mem_per_block_dynamic", "dynamic shared memory/block"),
    Metric("smem_static_bytes", "launch__shared_mem_per_block_static", "static shared memory/block"),
)
BY_NCU = {m.ncu: m for m in METRICS}

#: ncu's units (base units with ``--print-units base``; the scaled ones in case a CSV was exported without)
_SCALE = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6, "second": 1e9,
          "s": 1e9, "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9,
          "Kibyte": 1024.0, "Mibyte": 1024.0 ** 2, "KiB": 1024.0, "MiB": 1024.0 ** 2}


class ProfileError(Exception):
    """ncu could not profile, or its output is not a CSV this module reads; the message says which."""


# -- the command line ----------------------------------------------------------------------------------

def ncu_binary() -> str | None:
    """``ncu`` on PATH, else the CUDA toolkit's (``$CUDA_HOME/bin``, ``/usr/local/cuda/bin``)."""
    found = shutil.which("ncu")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and os.access(os.path.join(root, "bin", "ncu"), os.X_OK):
            return os.path.join(root, "bin", "ncu")
    return None


def ncu_command(ncu: str, target: Sequence[str], metrics: Iterable[Metric] = METRICS) -> list[str]:
    """The ncu command line that profiles the CUDA kernels ``target`` launches between its profiler start
    and stop (all of its child processes too), printing the raw page as CSV in base units.

    Clocks are left as the GPU sets them (``--clock-control none``: ncu's default locks them to the base
    clock, so durations would not compare with the timed samples); caches are flushed before each replay
    pass (``--cache-control all``, the default, stated)."""
    return [ncu, "--csv", "--page", "raw", "--print-units", "base",
            "--metrics", ",".join(m.ncu for m in metrics),
            "--profile-from-start", "off", "--target-processes", "all",
            "--clock-control", "none", "--cache-control", "all", *target]


def target_command(target: Target, params: Mapping[str, Any], *, device: str = "cuda", seed: int = PROFILE_SEED,
                   warmup: int = WARMUP_CALLS, calls: int = PROFILED_CALLS) -> list[str]:
    """The profiled process: ``python -m kbench.profiling call ...`` for one (backend, case)."""
    cmd = [sys.executable, "-m", "kbench.profiling", "call", "--backend", target.backend, "--op", target.op,
           "--case", json.dumps(dict(params), sort_keys=True), "--device", device, "--seed", str(seed),
           "--warmup", str(warmup), "--calls", str(calls)]
    if target.kernel_file:
        cmd += ["--kernel-file", target.kernel_file, "--settings", json.dumps(dict(target.settings or {}),
                                                                              sort_keys=True)]
    return cmd


# -- ncu's CSV -----------------------------------------------------------------------------------------

def _number(text: str, unit: str) -> float | None:
    text = (text or "").strip().replace(",", "")
    if not text or text.lower() in ("n/a", "nan", "-"):
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value * _SCALE.get(unit.strip(), 1.0)


def parse_ncu_csv(text: str) -> list[dict[str, Any]]:
    """One dict per profiled kernel launch from ncu's CSV: ``name``, ``block``, ``grid`` and the figures of
    :data:`METRICS` by key (None where ncu wrote ``n/a`` or lacks the metric), in launch order.

    Reads the raw page (``--page raw``: a header row of the fixed columns then metric names, a row of units,
    then one row per launch) and, for CSVs saved from the details page, the long form (one row per metric:
    ``Metric Name``, ``Metric Unit``, ``Metric Value``). Lines before the header (``==PROF==`` messages, the
    profiled program's own output) are skipped."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"') and "Kernel Name" in line), None)
    if start is None:
        raise ProfileError("no Nsight Compute CSV header (\"ID\",...,\"Kernel Name\",...) in ncu's output: "
                           + _tail(text))
    rows = [r for r in csv.reader(io.StringIO("\n".join(lines[start:]))) if r]
    header = rows[0]
    col = {name: i for i, name in enumerate(header)}
    if "Metric Name" in col:
        return _parse_long(rows[1:], col)
    # the raw page's second row holds the units: its fixed columns (ID...) are empty
    has_units = len(rows) > 1 and not rows[1][col["ID"]].strip()
    units = rows[1] if has_units else [""] * len(header)
    launches = []
    for row in rows[2:] if has_units else rows[1:]:
        if len(row) < len(header) or not row[col["ID"]].strip():
            continue
        launch: dict[str, Any] = {"name": row[col["Kernel Name"]], "block": row[col.get("Block Size", 0)],
                                  "grid": row[col.get("Grid Size", 0)]}
        for metric in METRICS:
            i = col.get(metric.ncu)
            launch[metric.key] = None if i is None else _number(row[i], units[i] if i < len(units) else "")
        launches.append(launch)
    return launches


def _parse_long(rows: list[list[str]], col: dict[str, int]) -> list[dict[str, Any]]:
    by_id: dict[str, dict[str, Any]] = {}
    for row in rows:
        if len(row) <= max(col["Metric Value"], col["Kernel Name"]):
            continue
        launch = by_id.setdefault(row[col["ID"]], {"name": row[col["Kernel Name"]],
                                                   "block": row[col["Block Size"]] if "Block Size" in col else "",
                                                   "grid": row[col["Grid Size"]] if "Grid Size" in col else "",
                                                   **{m.key: None for m in METRICS}})
        metric = BY_NCU.get(row[col["Metric Name"]])
        if metric is not None:
            unit = row[col["Metric Unit"]] if "Metric Unit" in col else ""
            launch[metric.key] = _number(row[col["Metric Value"]], unit)
    return list(by_id.values())


def summarize(launches: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The profile's figures: ``sum`` metrics added over the kernels, the others the longest kernel's;
    ``kernels`` how many launches, ``main_kernel`` the longest one's name."""
    if not launches:
        raise ProfileError("ncu profiled no kernel: the backend launched none between the profiler's start and "
                           "stop (a CPU backend, or work on a stream ncu cannot see)")
    main = max(launches, key=lambda k: k.get("duration_ns") or 0.0)
    out: dict[str, Any] = {"kernels": len(launches), "main_kernel": main["name"]}
    for metric in METRICS:
        if metric.combine == "sum":
            values = [k[metric.key] for k in launches if k.get(metric.key) is not None]
            out[metric.key] = sum(values) if values else None
        else:
            out[metric.key] = main.get(metric.key)
    return out


def _tail(text: str, n: int = 600) -> str:
    text = text.strip()
    return (text[-n:] if len(text) > n else text) or "(no output)"


# -- the record ----------------------------------------------------------------------------------------

def profile_from_output(text: str) -> dict[str, Any]:
    """``record["profile"]`` from ncu's output: status ``ok`` with ``metrics`` and ``kernels``."""
    launches = parse_ncu_csv(text)
    kept = sorted(launches, key=lambda k: -(k.get("duration_ns") or 0.0))[:MAX_KERNELS]
    return {"tool": "ncu", "status": "ok", "metrics": summarize(launches), "kernels": kept}


@dataclass(frozen=True)
class Target:
    """What the profiled process builds: a registered backend by name, or a kernel file with its settings."""

    backend: str
    op: str = "attention"
    kernel_file: str | None = None
    settings: Mapping[str, Any] | None = None
    #: False: ncu and the process it profiles run inside the sandbox (kernel files, evolved kernels)
    trusted: bool = True

    @classmethod
    def of(cls, record: Mapping[str, Any], backend: Any) -> Target:
        path = getattr(backend, "source_path", None) if hasattr(backend, "substrate") else None
        return cls(record["backend"], record.get("op") or getattr(backend, "op", "attention"), path,
                   getattr(backend, "settings", None) if path else None, bool(getattr(backend, "trusted", True)))


def attach_profile(record: dict[str, Any], backend: Any, *, device: str = "cuda", timeout: float = PROFILE_TIMEOUT,
                   ncu: str | None = None) -> dict[str, Any]:
    """Profile ``backend`` on the record's case with ncu; store the result as ``record["profile"]`` (returned).

    The runner calls it after the record is made, so nothing here touches the timed samples. Only passed
    records are profiled. Whatever goes wrong (no ncu, no GPU counters, a timeout, a crash) becomes
    ``{"status": "error" | "skipped", "reason": ...}`` in the profile: the rest of the record never changes."""
    started = time.monotonic()
    if record.get("status") != "passed":
        profile = {"status": "skipped", "reason": f"the record is {record.get('status')}: only passed records "
                                                  f"are profiled"}
    else:
        profile = profile_target(Target.of(record, backend), record.get("case") or {}, device=device,
                                 timeout=timeout, ncu=ncu)
    profile = {"tool": "ncu", **profile, "seconds": round(time.monotonic() - started, 3)}
    record["profile"] = profile
    return profile


def profile_target(target: Target, params: Mapping[str, Any], *, device: str = "cuda",
                   timeout: float = PROFILE_TIMEOUT, ncu: str | None = None) -> dict[str, Any]:
    """Run the target's calls under ncu (sandboxed when untrusted) and read the figures."""
    if device != "cuda":
        return {"status": "skipped", "reason": f"ncu profiles CUDA kernels; this run is on {device!r}"}
    ncu = ncu or ncu_binary()
    if ncu is None:
        return {"status": "skipped", "reason": "ncu (Nsight Compute) is not on PATH nor in $CUDA_HOME/bin"}
    command = ncu_command(ncu, target_command(target, params, device=device))
    result: dict[str, Any] = {"command": shlex.join(command), "sandboxed": not target.trusted}
    with tempfile.TemporaryDirectory(prefix="kbench-profile-") as scratch:
        argv, env = command, None
        if not target.trusted:
            try:
                argv, env = sandboxed(command, ncu, scratch)
            except ProfileError as exc:
                return {**result, "status": "skipped", "reason": str(exc)}
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return {**result, "status": "error", "reason": f"ncu did not finish within {timeout:.0f} s"}
    if proc.returncode != 0:
        why = _ncu_error(proc.stdout + "\n" + proc.stderr)
        return {**result, "status": "error", "reason": f"ncu exited with {proc.returncode}: {why}"}
    try:
        return {**result, **profile_from_output(proc.stdout)}
    except ProfileError as exc:
        return {**result, "status": "error", "reason": str(exc)}


def _ncu_error(output: str) -> str:
    errors = [line for line in output.splitlines() if line.startswith("==ERROR==")]
    return " ".join(errors)[:600] if errors else _tail(output)


def sandboxed(command: list[str], ncu: str, scratch: str) -> tuple[list[str], dict[str, str]]:
    """``command`` (ncu and its target) inside the bubblewrap sandbox untrusted workers run in, with ncu's
    installation readable; the environment is the sandbox's allow-list."""
    from kbench.run import sandbox

    binary = sandbox.bwrap_binary()
    if binary is None or not sandbox.probe().available:
        raise ProfileError("an untrusted backend is profiled in the sandbox, which does not work here: "
                           f"{sandbox.probe().describe()}")
    root = os.path.dirname(os.path.dirname(os.path.realpath(ncu)))
    from kbench.plugins import get_plugin_manager

    binds = get_plugin_manager().registry.device("cuda").sandbox_binds()
    argv = sandbox.bwrap_command(binary, command, scratch=scratch, binds=binds)
    # ncu's own files (its injection libraries, sections) must be visible inside: bound read-only before "--"
    cut = argv.index("--")
    argv = argv[:cut] + ["--ro-bind-try", root, root] + argv[cut:]
    return argv, sandbox.sandbox_environment(os.environ, scratch)


# -- display -------------------------------------------------------------------------------------------

PROFILE_HEADERS = ("case", "backend", "kernels", "duration", "occupancy", "tensor pipe", "DRAM", "regs",
                   "spill inst", "smem KiB", "note")


def profile_of(rec: Any) -> dict[str, Any] | None:
    """The ``profile`` section of a record (a dict or a :class:`kbench.record.Record`), or None."""
    if isinstance(rec, Mapping):
        return rec.get("profile")
    return (getattr(rec, "extra", None) or {}).get("profile")


def _pct(v: float | None) -> str:
    return "" if v is None else f"{v:.1f}%"


def profile_row(case_id: str, backend: str, profile: Mapping[str, Any]) -> list[str]:
    if profile.get("status") != "ok":
        return [case_id, backend, "", "", "", "", "", "", "", "", f"{profile.get('status')}: {profile.get('reason')}"]
    m = profile.get("metrics") or {}
    smem = sum(m.get(k) or 0 for k in ("smem_dynamic_bytes", "smem_static_bytes"))
    duration = m.get("duration_ns")
    return [case_id, backend, str(m.get("kernels", "")), "" if duration is None else f"{duration / 1e6:.4g} ms",
            _pct(m.get("occupancy_pct")), _pct(m.get("tensor_pct")), _pct(m.get("dram_pct")),
            "" if m.get("registers") is None else f"{m['registers']:.0f}",
            "" if m.get("spill_instructions") is None else f"{m['spill_instructions']:.0f}",
            f"{smem / 1024:.0f}", f"longest: {str(m.get('main_kernel', ''))[:60]}"]


def profile_rows(records: Iterable[Any]) -> list[list[str]]:
    """One row per record that has a profile (case, backend, the figures or why there are none)."""
    rows = []
    for rec in records:
        profile = profile_of(rec)
        if profile:
            get = rec.get if isinstance(rec, Mapping) else lambda k: getattr(rec, k)
            rows.append(profile_row(get("case_id"), get("backend"), profile))
    return rows


def profile_table(records: Iterable[Any], fmt: str = "table") -> str:
    """The profiles of ``records`` as a table (``kbench show --profile``); a line saying so when none has one."""
    from kbench.tables import render

    rows = profile_rows(records)
    if not rows:
        return "no record has a profile (run with `kbench run --profile ncu` on a CUDA device)"
    return render(PROFILE_HEADERS, rows, fmt)


def profile_summary(profile: Mapping[str, Any] | None) -> str:
    """One line for a brief or a log: ``ncu: 3.18 ms in 1 kernel, occupancy 18.7%, tensor pipe 71.2%, ...``."""
    if not profile:
        return "no profile"
    if profile.get("status") != "ok":
        return f"no profile ({profile.get('status')}: {profile.get('reason')})"
    m = profile.get("metrics") or {}
    parts = []
    if m.get("duration_ns") is not None:
        parts.append(f"{m['duration_ns'] / 1e6:.4g} ms in {m.get('kernels', '?')} kernel(s)")
    for key, label in (("occupancy_pct", "achieved occupancy"), ("tensor_pct", "tensor pipe"),
                       ("dram_pct", "DRAM throughput")):
        if m.get(key) is not None:
            parts.append(f"{label} {m[key]:.1f}%")
    if m.get("registers") is not None:
        parts.append(f"{m['registers']:.0f} registers/thread")
    if m.get("spill_instructions") is not None:
        parts.append(f"{m['spill_instructions']:.0f} spill instructions")
    smem = sum(m.get(k) or 0 for k in ("smem_dynamic_bytes", "smem_static_bytes"))
    if smem:
        parts.append(f"{smem / 1024:.0f} KiB shared memory/block")
    return "ncu: " + ", ".join(parts)


# -- the profiled process ------------------------------------------------------------------------------

def _cuda_profiler(start: bool) -> None:
    """``cuProfilerStart``/``Stop`` on the current context (the CUDA driver library, whichever array library
    made the context): with ``ncu --profile-from-start off`` only the launches in between are profiled."""
    import ctypes

    lib = ctypes.CDLL("libcuda.so.1")
    status = (lib.cuProfilerStart if start else lib.cuProfilerStop)()
    if status != 0:
        raise ProfileError(f"cuProfiler{'Start' if start else 'Stop'} returned CUDA error {status}")


def call(backend_name: str, params: Mapping[str, Any], *, op_name: str = "attention", device_name: str = "cuda",
         seed: int = PROFILE_SEED,
         warmup: int = WARMUP_CALLS, calls: int = PROFILED_CALLS, kernel_file: str | None = None,
         settings: Mapping[str, Any] | None = None, profiler: bool = True) -> int:
    """Build the backend for the case, make inputs, warm up, then make ``calls`` calls inside the profiler's
    range; returns how many calls were profiled. A split case (mode ``bwd``) runs its forward before the
    range and profiles the backward."""
    from kbench.plugins import PluginManager

    pm = PluginManager()
    reg = pm.registry
    op = reg.op(op_name)
    case = op.make_case(dict(params))
    if kernel_file:
        from kbench.kernelfile import KernelFileBackend

        backend = KernelFileBackend(kernel_file, reg, settings=dict(settings or {}) or None, trusted=True)
    else:
        found = reg.select_backends(op.name, [backend_name])
        if len(found) != 1:
            raise ProfileError(f"{backend_name!r} names {len(found)} backends of {op.name!r}; give one")
        backend = found[0]
    from kbench.backends import missing_feature

    why = backend.available() or missing_feature(backend, op.required_features(case)) or backend.supports(case)
    if why:
        raise ProfileError(f"{backend.name} cannot run {case.id}: {why}")
    device = reg.device(device_name)
    kernel = backend.prepare(case)
    inputs = {k: device.from_host(v) for k, v in op.make_inputs(case, seed).items()}
    outputs = {name: device.poisoned(shape, op.output_dtype(case)) for name, shape in op.output_shapes(case).items()}
    later = op.backward_inputs(case)

    def one() -> None:
        if later:
            saved = kernel.forward(*[v for n, v in inputs.items() if n not in later])
            device.synchronize()
            if profiler:
                _cuda_profiler(True)
            kernel.backward(saved, *[inputs[n] for n in later], *outputs.values())
        else:
            if profiler:
                _cuda_profiler(True)
            kernel(**inputs, **outputs)
        device.synchronize()
        if profiler:
            _cuda_profiler(False)

    for _ in range(warmup):
        _call_unprofiled(kernel, inputs, outputs, later, device)
    for _ in range(calls):
        one()
    return calls


def _call_unprofiled(kernel, inputs, outputs, later, device) -> None:
    if later:
        saved = kernel.forward(*[v for n, v in inputs.items() if n not in later])
        kernel.backward(saved, *[inputs[n] for n in later], *outputs.values())
    else:
        kernel(**inputs, **outputs)
    device.synchronize()


def main(argv: Sequence[str] | None = None) -> int:
    import click

    @click.group()
    def cli() -> None:
        """Nsight Compute profiles of kbench backends (docs/gpu.md, "Profiles")."""

    @cli.command("run")
    @click.option("--backend", "-b", required=True, help="A registered backend (settings allowed: name[K=V]).")
    @click.option("--case", "case_json", required=True, help='The case\'s parameters as JSON, e.g. {"batch": 1, ...}.')
    @click.option("--op", default="attention", show_default=True)
    @click.option("--kernel-file", default=None, help="Profile this kernel file (as trusted) instead.")
    @click.option("--timeout", default=PROFILE_TIMEOUT, show_default=True, type=float)
    @click.option("--dry-run", is_flag=True, help="Print the ncu command line and stop.")
    @click.option("--json", "as_json", is_flag=True, help="Print the profile as JSON.")
    def run_cmd(backend, case_json, op, kernel_file, timeout, dry_run, as_json):
        """Profile BACKEND on one case with ncu and print the figures."""
        params = _case_arg(case_json)
        target = Target(backend, op, kernel_file)
        if dry_run:
            click.echo(shlex.join(ncu_command(ncu_binary() or "ncu", target_command(target, params))))
            return
        profile = profile_target(target, params, timeout=timeout)
        if as_json:
            click.echo(json.dumps(profile, indent=1))
        else:
            click.echo(profile_summary(profile))
        if profile.get("status") != "ok":
            sys.exit(1)

    @cli.command("call")
    @click.option("--backend", required=True)
    @click.option("--op", default="attention")
    @click.option("--case", "case_json", required=True)
    @click.option("--device", default="cuda")
    @click.option("--seed", default=PROFILE_SEED, type=int)
    @click.option("--warmup", default=WARMUP_CALLS, type=int)
    @click.option("--calls", default=PROFILED_CALLS, type=int)
    @click.option("--kernel-file", default=None)
    @click.option("--settings", default="{}")
    def call_cmd(backend, op, case_json, device, seed, warmup, calls, kernel_file, settings):
        """The profiled process (started by ncu): warm up, then profile CALLS calls."""
        call(backend, _case_arg(case_json), op_name=op, device_name=device, seed=seed, warmup=warmup, calls=calls,
             kernel_file=kernel_file, settings=json.loads(settings))

    try:
        cli.main(args=list(argv) if argv is not None else None, prog_name="python -m kbench.profiling",
                 standalone_mode=False)
    except click.ClickException as exc:
        exc.show()
        return 2
    except ProfileError as exc:
        print(f"kbench.profiling: {exc}", file=sys.stderr)
        return 1
    return 0


def _case_arg(text: str) -> dict[str, Any]:
    import click

    try:
        params = json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--case") from None
    if not isinstance(params, dict):
        raise click.BadParameter("give the case's parameters as a JSON object", param_hint="--case")
    return params


if __name__ == "__main__":
    sys.exit(main())
