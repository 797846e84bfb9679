"""scripts/gpu-check's driver: the one bounded check of kbench's GPU side, stage by stage.

Stages, in order, each with its own time budget (seconds; ``--budget NAME=S`` changes one):

  machine   nvidia-smi and Python (what the machine is)
  install   carried wheels (.whl/, split ones reassembled) into /tmp/kbench-site; the project editable, offline
  list      ``kbench list`` (devices and backends, each available or why not)
  suite     ``kbench run suites/gpu-check.yaml --device cuda``: the forward table, the FA3 paper's 36-case sweep
            for five backends (the measurement engine's target: <= 150 s); records written as they come
  engine    ``kbench run suites/gpu-check-engine.yaml`` with the Triton seed as an untrusted kernel file: the
            kernel's share of wall time, trusted and untrusted, and a sustained loop for energy at 16k tokens
  crosscheck ``benchmarks/timing_crosscheck.py --device cuda``: kbench's medians against triton's do_bench
  tuning    ``kbench run suites/gpu-check-tuning.yaml``: configuration candidates of our Triton kernels
  training  ``kbench run suites/gpu-check-training.yaml``: forward+backward (fwd_bwd)
  profile   ``kbench run ... --profile ncu`` on two records: Nsight Compute's figures in the records
  summary   TFLOP/s and rel-L2 per backend next to the FA3 paper's and cuDNN's figures, the targets, SM clock,
            throttling, energy, profiles
  tests     the GPU-marked tests of the plugins (``pytest -m gpu``), the decisive Triton ones first

A stage that overruns is sent SIGTERM (``kbench run`` then marks its result file interrupted and keeps
every record written), SIGKILL after a grace period, recorded as ``timeout``, and the next stage runs:
the summary of a cut-off suite is a partial summary. The budgets add up to under 10 minutes (one device call).

``--dry-run`` runs every stage's logic on a machine without a GPU: the same stage runner and timeouts,
``kbench list``, the suite on ``--device cpu`` (every CUDA backend is skipped with its reason), the
summary of that result (the table skeleton) and the GPU tests (skipped without a GPU); it installs nothing.

Standard library only at import: the install stage runs before kbench is importable.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

ROOT = Path(__file__).resolve().parent.parent
#: seconds per stage; with a grace period per stage the worst case is 572 s, under the device tool's 600 s per
#: call (docs/gpu.md). The suite gets most: its table is what the check is for; the budgets are estimates from
#: the two earlier H200 runs (16k-token records 4-9 s each, Triton compiles 5-10 s per configuration there).
BUDGETS = {"machine": 5.0, "install": 30.0, "list": 10.0, "suite": 170.0, "engine": 50.0, "crosscheck": 60.0,
           "tuning": 40.0, "training": 60.0, "profile": 35.0, "summary": 10.0, "tests": 70.0}
#: the limit the budgets must fit, grace periods included: one call of the device tool (600 s) minus a margin
CALL_LIMIT_S = 575.0
#: what a stage function returns when it ran out of time
TIMED_OUT = 124
#: seconds between SIGTERM and SIGKILL of an overrunning stage (kbench run finishes its file on SIGTERM)
GRACE_S = 3.0
SITE = "/tmp/kbench-site"
PLUGIN_DIRS = ("plugins/kbench-cuda", "plugins/kbench-torch", "plugins/kbench-triton", "plugins/kbench-evolve")
TEST_DIRS = ("plugins/kbench-cuda/tests", "plugins/kbench-torch/tests", "plugins/kbench-triton/tests")
#: the GPU tests in the order they run, each group given what is left of the stage's budget: the Triton
#: tests first (kernel files through the sandboxed substrate, the Hopper kernel, the backward), then the
#: torch backends' training and FP8 paths through kbench's judge, then the rest
#: the decisive Triton tests first: every row of a causal 16k case, warp specialisation under causal masks,
#: compute-sanitizer
DECISIVE = "every_row or causal_masks or sanitizer"
TEST_GROUPS = (("plugins/kbench-triton/tests", "-k", DECISIVE), ("plugins/kbench-triton/tests", "-k", f"not ({DECISIVE})"),
               ("plugins/kbench-torch/tests", "-k", "judge"), ("plugins/kbench-cuda/tests", "tests/test_paged.py"),
               ("plugins/kbench-torch/tests", "-k", "not judge"))

#: Published anchors: Shah et al., "FlashAttention-3: Fast and Accurate Attention with Asynchrony and
#: Low-precision", 2024, forward pass, H100 SXM5, bf16, 16k total tokens, hidden size 2048 (32 heads at head_dim
#: 64, 16 at 128, 8 at 256; figures "attention forward speed, head dim 64/128/256").
#: (head_dim, causal) -> {implementation: TFLOP/s}
ANCHORS = {
    (64, False): {"FA3": 497, "cuDNN": 413},
    (64, True): {"FA3": 473, "cuDNN": 388},
    (128, False): {"FA3": 648, "cuDNN": 595},
    (128, True): {"FA3": 616},
    (256, False): {"FA3": 756, "cuDNN": 581},
    (256, True): {"FA3": 642, "cuDNN": 509},
}
ANCHOR_SOURCE = "Shah et al., FlashAttention-3, 2024: H100 SXM5, bf16, 16k tokens, hidden 2048, forward"
#: The targets the check measures, our kernels against cuDNN measured in the same run: mode -> (the head_dim
#: the target is set at, the fraction of cuDNN's TFLOP/s)
TARGETS = {"fwd": (128, 0.90), "fwd_bwd": (128, 0.60)}
#: our kernels: backends whose name starts with one of these count for the targets
OURS = ("triton",)


@dataclass
class Stage:
    """One step of the check: a command line, or a Python function given its deadline (``time.monotonic``)."""

    name: str
    budget_s: float
    command: Sequence[str] | None = None
    func: Callable[["Context", float], int] | None = None


@dataclass
class Outcome:
    name: str
    status: str          # ok | failed | timeout | error
    seconds: float
    budget_s: float
    returncode: int | None = None
    note: str = ""


@dataclass
class Context:
    out_dir: Path
    dry_run: bool
    python: str = sys.executable
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    log: Any = None

    @property
    def result_path(self) -> Path:
        return self.out_dir / "gpu-check.json"

    @property
    def training_path(self) -> Path:
        return self.out_dir / "gpu-check-training.json"

    @property
    def tuning_path(self) -> Path:
        return self.out_dir / "gpu-check-tuning.json"

    @property
    def profile_path(self) -> Path:
        return self.out_dir / "gpu-check-profile.json"

    @property
    def engine_path(self) -> Path:
        return self.out_dir / "gpu-check-engine.json"

    def say(self, text: str) -> None:
        print(text, flush=True)
        if self.log:
            self.log.write(text + "\n")
            self.log.flush()


# -- running one stage under its budget -------------------------------------------------------------

def _pump(stream, ctx: Context) -> None:
    for line in iter(stream.readline, ""):
        ctx.say(line.rstrip("\n"))
    stream.close()


def run_command(ctx: Context, command: Sequence[str], deadline: float) -> tuple[int | None, bool]:
    """Run ``command`` (its own process group) until it ends or ``deadline``; (return code, timed out).

    On the deadline the whole group gets SIGTERM, then SIGKILL after ``GRACE_S``.
    """
    proc = subprocess.Popen(list(command), cwd=ROOT, env=ctx.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace", start_new_session=True)
    pump = threading.Thread(target=_pump, args=(proc.stdout, ctx), daemon=True)
    pump.start()
    try:
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out = True
        _signal_group(proc, signal.SIGTERM)
        try:
            proc.wait(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
            proc.wait()
    pump.join(timeout=2.0)
    return proc.returncode, timed_out


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def run_stage(ctx: Context, stage: Stage) -> Outcome:
    ctx.say(f"\n== {stage.name} (budget {stage.budget_s:g} s)")
    start = time.monotonic()
    deadline = start + stage.budget_s
    timed_out, code, note = False, None, ""
    try:
        if stage.command is not None:
            code, timed_out = run_command(ctx, stage.command, deadline)
        else:
            code = stage.func(ctx, deadline)
            timed_out = code == TIMED_OUT or time.monotonic() > deadline + GRACE_S
    except Exception as exc:  # noqa: BLE001 - a broken stage is reported; the next one still runs
        note = f"{type(exc).__name__}: {exc}"
        ctx.say(f"stage {stage.name} failed: {note}")
        return Outcome(stage.name, "error", time.monotonic() - start, stage.budget_s, None, note)
    seconds = time.monotonic() - start
    if timed_out:
        status, note = "timeout", f"stopped after its budget of {stage.budget_s:g} s"
    else:
        status = "ok" if code == 0 else "failed"
    ctx.say(f"-- {stage.name}: {status} in {seconds:.1f} s" + (f" (exit {code})" if code not in (0, None) else ""))
    return Outcome(stage.name, status, seconds, stage.budget_s, code, note)


def run_stages(ctx: Context, stages: Sequence[Stage]) -> list[Outcome]:
    """Every stage in order, whatever happened to the previous ones."""
    return [run_stage(ctx, stage) for stage in stages]


# -- the stages --------------------------------------------------------------------------------------

def _kbench(ctx: Context, *args: str) -> list[str]:
    return [ctx.python, "-m", "kbench.cli", *args]


def install(ctx: Context, deadline: float) -> int:
    """Carried wheels into SITE, then the project editable, offline; when the editable install fails or runs
    out of time, the tree is imported through PYTHONPATH with the plugins named in KBENCH_PLUGINS.

    Later stages inherit the environment this decides. ``--dry-run`` only says what it would run.
    """
    wheels = sorted(str(p) for p in (ROOT / ".whl").glob("*.whl"))
    assembled, missing = assemble_split_wheels(ROOT, Path(SITE + "-wheels"), dry_run=ctx.dry_run)
    for line in missing:
        ctx.say(line)
    wheels += [str(p) for p in assembled]
    pip = [ctx.python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir"]
    editables = [a for d in (".", *PLUGIN_DIRS) if (ROOT / d / "pyproject.toml").exists() for a in ("-e", d)]
    wheel_cmd = pip + ["--upgrade", "--target", SITE, *wheels]
    editable_cmd = pip + ["--no-build-isolation", *editables]
    if ctx.dry_run:
        if wheels:
            ctx.say(f"would run (wheels): {shlex.join(wheel_cmd)}")
        ctx.say(f"would run (editable): {shlex.join(editable_cmd)}")
        code, _ = run_command(ctx, [ctx.python, "-c", "import kbench.cli"], deadline)
        return code or 0
    status, out_of_time = 0, False
    if wheels:
        code, out_of_time = run_command(ctx, wheel_cmd, deadline - 10.0)  # leave time for the editable step
        if code == 0:
            _prepend(ctx.env, "PYTHONPATH", SITE)
            ctx.say(f"carried wheels: {' '.join(Path(w).name for w in wheels)}")
        status = code or 0
    # the editable install must leave a few seconds: the fallback below is what makes later stages work
    code, timed_out = run_command(ctx, editable_cmd, deadline - 4.0)
    if code != 0 or timed_out:
        ctx.say("editable install " + ("ran out of time" if timed_out else "failed")
                + ": importing from the tree with PYTHONPATH and KBENCH_PLUGINS")
        use_the_tree(ctx.env)
    status = status or (code or 0)
    versions = ("import importlib\nfor m in ('torch','cupy','triton','pynvml','jsonschema','threadpoolctl','cudnn','flash_attn',"
                "'cutlass'):\n"
                "    try:\n        print(f'  {m:12s}', getattr(importlib.import_module(m), '__version__', 'present'))\n"
                "    except Exception as exc:\n        print(f'  {m:12s} missing: {type(exc).__name__}: {str(exc)[:100]}')")
    run_command(ctx, [ctx.python, "-c", versions], deadline)
    return TIMED_OUT if (out_of_time or timed_out) else status


#: where a wheel too big for one device call travels in parts (docs/gpu.md, "FlashAttention 4"): NAME.whl.part1,
#: NAME.whl.part2, ... and NAME.whl.sha256, in .whl/ or .whl-parts/ (a part carried by an earlier call on the
#: same, still warm, machine stays there: ignored paths are kept between calls)
PART_DIRS = (".whl", ".whl-parts")


def assemble_split_wheels(root: Path, into: Path, *, dry_run: bool = False) -> tuple[list[Path], list[str]]:
    """Wheels carried in parts, put together and checked against their sha256; (wheels, what is missing)."""
    import hashlib

    parts: dict[str, list[Path]] = defaultdict(list)
    sums: dict[str, str] = {}
    for d in PART_DIRS:
        for p in (root / d).glob("*.whl.part*"):
            parts[p.name.rsplit(".part", 1)[0]].append(p)
        for p in (root / d).glob("*.whl.sha256"):
            sums[p.name[:-len(".sha256")]] = p.read_text().split()[0]
    wheels, missing = [], []
    for name, pieces in sorted(parts.items()):
        pieces.sort(key=lambda p: int(p.name.rsplit(".part", 1)[1] or 0))
        numbers = [int(p.name.rsplit(".part", 1)[1] or 0) for p in pieces]
        if numbers != list(range(1, len(numbers) + 1)) or name not in sums:
            missing.append(f"split wheel {name}: parts {numbers} and {'a' if name in sums else 'no'} sha256 here; "
                           f"not installed (docs/gpu.md: carry every part and the .sha256)")
            continue
        data = b"".join(p.read_bytes() for p in pieces)
        if hashlib.sha256(data).hexdigest() != sums[name]:
            missing.append(f"split wheel {name}: the {len(pieces)} parts do not match its sha256; not installed")
            continue
        if not dry_run:
            into.mkdir(parents=True, exist_ok=True)
            (into / name).write_bytes(data)
        wheels.append(into / name)
    return wheels, missing


def use_the_tree(env: dict[str, str]) -> None:
    """Import kbench and its plugins from the working tree: no entry points, so name the plugins."""
    for d in reversed((".", *PLUGIN_DIRS)):
        _prepend(env, "PYTHONPATH", str(ROOT / d))
    env["KBENCH_PLUGINS"] = ",".join(filter(None, ["kbench_cuda.plugin,kbench_torch.plugin,kbench_triton.plugin,kbench_evolve.plugin",
                                                   env.get("KBENCH_PLUGINS")]))
    env["KBENCH_GPU_CHECK_PYTEST_PLUGIN"] = "kbench.testing"  # its pytest11 entry point is not installed either


def _prepend(env: dict[str, str], key: str, value: str) -> None:
    env[key] = value + (os.pathsep + env[key] if env.get(key) else "")


def machine_command() -> list[str]:
    probe = ("import platform, shutil, subprocess, sys\n"
             "print('python', platform.python_version(), sys.executable)\n"
             "smi = shutil.which('nvidia-smi')\n"
             "print(subprocess.run([smi, '--query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,"
             "temperature.gpu,power.draw,power.limit', '--format=csv'], capture_output=True, text=True, timeout=8)"
             ".stdout if smi else 'nvidia-smi not available')")
    return [sys.executable, "-c", probe]


def pytest_command(ctx: Context, group: Sequence[str] = TEST_DIRS) -> list[str]:
    extra = ["-p", ctx.env["KBENCH_GPU_CHECK_PYTEST_PLUGIN"]] if ctx.env.get("KBENCH_GPU_CHECK_PYTEST_PLUGIN") else []
    return [ctx.python, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", *extra, *group]


def run_tests(ctx: Context, deadline: float) -> int:
    """The GPU tests, group by group (``TEST_GROUPS``); commands are made now, after the install stage chose
    the environment. ``KBENCH_INSTAFAIL=1`` makes kbench's pytest plugin print each failure as it happens,
    so a group cut off at the deadline still says what failed."""
    ctx.env["KBENCH_INSTAFAIL"] = "1"
    status = 0
    for group in TEST_GROUPS:
        ctx.say(f"-- pytest -m gpu {' '.join(group)}")
        code, timed_out = run_command(ctx, pytest_command(ctx, group), deadline)
        if timed_out:
            return TIMED_OUT
        status = status or (0 if code == 5 else code or 0)  # 5: nothing collected (every test deselected)
    return status


def summary_command(ctx: Context) -> list[str]:
    return [ctx.python, str(Path(__file__).resolve()), "summarize", str(ctx.result_path), str(ctx.tuning_path),
            str(ctx.training_path), str(ctx.profile_path), str(ctx.engine_path), "--markdown",
            str(ctx.out_dir / "gpu-check-summary.md")]


SUITE = "suites/gpu-check.yaml"
ENGINE_SUITE = "suites/gpu-check-engine.yaml"
#: the untrusted kernel file of the engine stage: the Triton seed genome of evolve (sandboxed like any candidate)
ENGINE_KERNEL_FILE = "plugins/kbench-triton/kbench_triton/seeds/triton_attention_seed.py"
TUNING_SUITE = "suites/gpu-check-tuning.yaml"
TRAINING_SUITE = "suites/gpu-check-training.yaml"
#: ``--evolve SECONDS``: one lineage of the Triton seed, evolved with ``mutate`` on the GPU suite (the NumPy seed on
#: the CPU suite in a dry run), in a device call of its own
EVOLVE_SUITE, EVOLVE_SEED = "suites/evolve-gpu.yaml", "plugins/kbench-triton/kbench_triton/seeds/triton_attention_seed.py"
DRY_EVOLVE_SUITE, DRY_EVOLVE_SEED = "suites/evolve-cpu.yaml", "plugins/kbench-evolve/kbench_evolve/seeds/numpy_attention_seed.py"
#: what the evolve stage keeps for the lineage's last commands (its log) out of its budget
EVOLVE_MARGIN_S = 20.0
#: the records profiled with Nsight Compute: our Hopper kernel and cuDNN at the causal 16k-token head_dim 128 point
PROFILE_SELECTION = ("-b", "triton-hopper", "-b", "cudnn", "-k", "sq=16384 and d=128 and causal")


def dry_run_suite(ctx: Context, name: str = SUITE) -> str:
    """The suite with its cuda grid given to the cpu device too: on a machine without a GPU every record is
    a skip with the backend's reason, and every case of the real grid appears in the summary skeleton."""
    import yaml

    suite = yaml.safe_load((ROOT / name).read_text())
    suite["devices"]["cpu"] = suite["devices"]["cuda"]
    path = ctx.out_dir / f"{Path(name).stem}-dry-run.yaml"
    path.write_text(yaml.safe_dump(suite, sort_keys=False))
    return str(path)


def evolve_command(ctx: Context, seconds: float) -> list[str]:
    """Init lineage ``gpu`` from the seed on the evolve suite, run ``mutate`` for what the budget leaves, print its
    log; the workspace is ``OUT/evolve`` (the lineage's versions, attempts, result files and log come back)."""
    suite, seed = (DRY_EVOLVE_SUITE, DRY_EVOLVE_SEED) if ctx.dry_run else (EVOLVE_SUITE, EVOLVE_SEED)
    device = "cpu" if ctx.dry_run else "cuda"
    workspace = ctx.out_dir / "evolve"
    kb = " ".join(shlex.quote(a) for a in _kbench(ctx, "evolve"))
    ws = shlex.quote(str(workspace))
    # the run is interrupted (SIGINT: it saves its state) when the seconds left after init are spent, so the log
    # always runs; --max-time alone is checked between steps, and a step (screening and duel) can take a minute
    script = (f"set -e; start=$(date +%s); rm -rf {ws}; "
              f"{kb} init gpu --seed {shlex.quote(str(ROOT / seed))} --suite {shlex.quote(str(ROOT / suite))} "
              f"--workspace {ws} --device {device}; "
              f"left=$(( {int(seconds - EVOLVE_MARGIN_S)} - ($(date +%s) - start) )); "
              f"if [ $left -lt 5 ]; then echo 'evolve: no time left after init'; exit 124; fi; "
              f"KBENCH_EVOLVE_DIR={ws} timeout -s INT -k 10 $left {kb} run gpu --operator mutate --iterations 1000 "
              f"--max-time $left --rounds 2 || echo \"evolve run: exit $?\"; "
              f"KBENCH_EVOLVE_DIR={ws} {kb} log gpu --attempts")
    return ["bash", "-c", script]


def plan(ctx: Context, budgets: dict[str, float], skip: Sequence[str] = (), evolve: float = 0.0) -> list[Stage]:
    device = "cpu" if ctx.dry_run else "cuda"
    if evolve:  # a device call of its own: the machine, the install, the lineage
        return [Stage("machine", budgets["machine"], command=machine_command()),
                Stage("install", budgets["install"], func=install),
                Stage("evolve", evolve, command=evolve_command(ctx, evolve))]
    suite, tuning, training, engine = ((dry_run_suite(ctx, name) if ctx.dry_run else name)
                                       for name in (SUITE, TUNING_SUITE, TRAINING_SUITE, ENGINE_SUITE))

    def run(name: str, path: Path, *extra: str) -> list[str]:
        return _kbench(ctx, "run", name, "--device", device, "-o", str(path), "--force", "--no-progress", *extra)

    stages = [
        Stage("machine", budgets["machine"], command=machine_command()),
        Stage("install", budgets["install"], func=install),
        Stage("list", budgets["list"], command=_kbench(ctx, "list")),
        # the measurement stages: the forward table first (what the check is for), then our kernels'
        # configuration candidates, the training step, and two records again under Nsight Compute
        Stage("suite", budgets["suite"], command=run(suite, ctx.result_path)),
        Stage("engine", budgets["engine"], command=run(engine, ctx.engine_path, "-b", "cudnn", "-b", "triton",
                                                       "-b", str(ROOT / ENGINE_KERNEL_FILE))),
        Stage("crosscheck", budgets["crosscheck"],
              command=[ctx.python, str(ROOT / "benchmarks" / "timing_crosscheck.py"), "--device", device,
                       "--rounds", "1"]),
        Stage("tuning", budgets["tuning"], command=run(tuning, ctx.tuning_path)),
        Stage("training", budgets["training"], command=run(training, ctx.training_path)),
        Stage("profile", budgets["profile"], command=run(suite, ctx.profile_path, *PROFILE_SELECTION,
                                                           "--profile", "ncu")),
        Stage("summary", budgets["summary"], command=summary_command(ctx)),
        Stage("tests", budgets["tests"], func=run_tests),
    ]
    return [s for s in stages if s.name not in skip]


# -- the summary -------------------------------------------------------------------------------------

MARK = {"skipped": "-", "failed": "FAIL", "error": "ERR", "crashed": "CRASH", "timeout": "TIME"}


def case_label(p: dict[str, Any]) -> str:
    sq, sk = p["seqlen_q"], p["seqlen_kv"]
    seq = f"s={sq}" if sq == sk else f"sq={sq},sk={sk}"
    heads = f"h={p['heads_q']}" if p["heads_q"] == p["heads_kv"] else f"h={p['heads_q']}/{p['heads_kv']}"
    mode = "" if p.get("mode", "fwd") == "fwd" else f" {p['mode']}"
    return f"b={p['batch']} {seq} {heads} d={p['head_dim']} {'causal' if p['causal'] else 'full'} {p['dtype']}{mode}"


def anchor_text(p: dict[str, Any]) -> str:
    """The FA3 paper's figures for its 16k-token point (bf16, one sequence of 16384, heads x head_dim = 2048)."""
    if not is_fa3_point(p):
        return ""
    found = ANCHORS.get((p["head_dim"], bool(p["causal"])), {})
    return " ".join(f"{k} {v}" for k, v in found.items())


def is_fa3_point(p: dict[str, Any]) -> bool:
    return (p.get("mode", "fwd") == "fwd" and p["dtype"] == "bf16" and p["batch"] == 1 and p["seqlen_q"] == 16384
            and p["seqlen_kv"] == 16384 and p["heads_q"] == p["heads_kv"] and p["heads_q"] * p["head_dim"] == 2048)


def _fmt(value: float | None, spec: str) -> str:
    return "" if value is None else format(value, spec)


def _tflops(r: dict[str, Any]) -> float | None:
    return (r.get("metrics") or {}).get("tflops") if r["status"] == "passed" else None


def cudnn_figures(*datas: dict[str, Any] | None) -> dict[str, float]:
    """case label -> cuDNN's TFLOP/s measured in these result files (the same run's)."""
    return {case_label(r["case"]): _tflops(r) for data in datas if data for r in data.get("records") or []
            if r["backend"] == "cudnn" and _tflops(r)}


def summarize(data: dict[str, Any] | None, cudnn: dict[str, float] | None = None) -> str:
    """The compact text of a (possibly partial) gpu-check result; ``None``: nothing was written. ``cudnn``:
    cuDNN's figures of the same run by case (a file without cudnn records, the tuning one, is set against them)."""
    from tabulate import tabulate

    data = data or {}
    recs = data.get("records") or []
    cudnn = {**(cudnn or {}), **cudnn_figures(data)}
    machine, env = data.get("machine") or {}, data.get("environment") or {}
    state = "complete" if data.get("complete") else (
        f"PARTIAL ({data.get('interrupted') or 'cut off'})" if data else "PARTIAL (no result file was written)")
    head = (f"{machine.get('gpu', machine.get('id', 'unknown machine'))}, driver {machine.get('driver')}, "
            f"torch {env.get('torch')}, triton {env.get('triton')}, cupy {env.get('cupy-cuda13x')}, "
            f"cudnn-frontend {env.get('nvidia-cudnn-frontend')}; {len(recs)} records, {state}")
    backends = sorted({r["backend"] for r in recs})
    cases: list[str] = []
    params: dict[str, dict] = {}
    cells: dict[str, dict[str, str]] = defaultdict(dict)
    for r in recs:
        key = case_label(r["case"])
        if key not in params:
            cases.append(key)
            params[key] = r["case"]
        tf = _tflops(r)
        cells[key][r["backend"]] = f"{tf:.4g}" if tf else MARK.get(r["status"], r["status"])
    shown = [b for b in backends if any(cells[c].get(b) not in (None, "-") for c in cases)] or backends

    def anchors(case: str) -> str:
        here = cudnn.get(case)
        paper = anchor_text(params[case])
        return "; ".join(filter(None, [f"paper (H100): {paper}" if paper else "",
                                       f"cuDNN here: {here:.4g}" if here else ""]))
    rows = [[c, *[cells[c].get(b, "") for b in shown], anchors(c)] for c in cases]
    table = tabulate(rows or [["(no records)", *["" for _ in shown], ""]],
                     headers=["case (TFLOP/s)", *shown, "anchors: FA3 paper, cuDNN measured"], tablefmt="github",
                     disable_numparse=True)
    per = []
    for b in backends:
        mine = [r for r in recs if r["backend"] == b]
        counts: dict[str, int] = defaultdict(int)
        for r in mine:
            counts[r["status"]] += 1
        errs = {status: [e for e in ((r.get("correctness") or {}).get("rel_l2") for r in mine if r["status"] == status)
                         if e is not None] for status in ("passed", "failed")}
        tele = [r.get("telemetry") or {} for r in mine]
        lo = [t["sm_clock_mhz_min"] for t in tele if t.get("sm_clock_mhz_min")]
        hi = [t["sm_clock_mhz_max"] for t in tele if t.get("sm_clock_mhz_max")]
        throttled = sum(len(t.get("throttled_samples") or []) for t in tele)
        energy = [(t.get("energy") or {}) for t in tele]
        joules = [e["joules_per_call"] for e in energy if e.get("joules_per_call") is not None]
        watts = [e["average_w"] for e in energy if e.get("average_w") is not None]
        samples = [len((r.get("timing") or {}).get("samples") or []) for r in mine if r["status"] == "passed"]
        reasons = sorted({(r.get("reason") or "")[:110] for r in mine if r["status"] != "passed"})
        per.append([b, " ".join(f"{v} {k}" for k, v in sorted(counts.items())),
                    _fmt(max(errs["passed"]) if errs["passed"] else None, ".2g"),
                    _fmt(max(errs["failed"]) if errs["failed"] else None, ".3g"),
                    f"{min(samples)}-{max(samples)}" if samples else "",
                    f"{min(lo)}-{max(hi)}" if lo and hi else "", throttled,
                    _fmt(max(watts) if watts else None, ".0f"), _fmt(min(joules) if joules else None, ".3g"),
                    "; ".join(reasons)[:220]])
    status = tabulate(per or [["(none)", "", "", "", "", "", "", "", "", ""]],
                      headers=["backend", "records", "max rel_l2 passed", "max rel_l2 failed", "samples", "SM MHz",
                               "throttled samples", "max W", "min J/call", "why not passed"], tablefmt="github",
                      disable_numparse=True)
    return f"{head}\n\n{table}\n\npublished: {ANCHOR_SOURCE}\n\n{status}\n"


def targets(datas: Sequence[dict[str, Any] | None]) -> str:
    """Our best kernel against cuDNN of the same run where the targets are set (TARGETS): one row per case."""
    from tabulate import tabulate

    recs = [r for data in datas if data for r in data.get("records") or []]
    cudnn = cudnn_figures(*datas)
    rows = []
    for r in recs:
        p = r["case"]
        mode = p.get("mode", "fwd")
        if mode not in TARGETS or p["head_dim"] != TARGETS[mode][0] or p["dtype"] != "bf16":
            continue
        if mode == "fwd" and not is_fa3_point(p):
            continue
        key = case_label(p)
        if any(row[0] == key for row in rows):
            continue
        ours = [(x["backend"], _tflops(x)) for x in recs if case_label(x["case"]) == key
                and x["backend"].startswith(OURS) and _tflops(x)]
        best = max(ours, key=lambda t: t[1]) if ours else None
        base, goal = cudnn.get(key), TARGETS[mode][1]
        ratio = best[1] / base if best and base else None
        rows.append([key, _fmt(base, ".4g"), f"{best[0]} {best[1]:.4g}" if best else "(none passed)",
                     _fmt(ratio, ".3f"), f">= {goal:.2f}",
                     "" if ratio is None else ("met" if ratio >= goal else "NOT met")])
    if not rows:
        return "targets: no record at the target points"
    return "targets (our best kernel / cuDNN, same run):\n" + tabulate(
        rows, headers=["case", "cuDNN TFLOP/s", "our best", "ratio", "target", ""], tablefmt="github",
        disable_numparse=True)


def engine(datas: Sequence[dict[str, Any] | None]) -> str:
    """The measurement engine's figures per backend: samples per record, records below min_samples, the kernel's
    share of each record's wall time (16k-token records apart), the sweep's wall time; sustained-loop energy."""
    from tabulate import tabulate

    rows, energy = [], []
    for data in datas:
        if not data:
            continue
        recs = [r for r in data.get("records") or [] if r["status"] == "passed"]
        wall = sum(r.get("duration") or 0.0 for r in data.get("records") or [])
        for b in sorted({r["backend"] for r in recs}):
            mine = [r for r in recs if r["backend"] == b]
            timing = [r.get("timing") or {} for r in mine]
            n = [len(t.get("samples") or []) for t in timing]
            share = [(t.get("accounting") or {}).get("kernel_fraction") for t in timing]
            big = [f for r, f in zip(mine, share) if f is not None and r["case"].get("seqlen_q", 0) >= 16384]
            below = sum(bool(t.get("below_min_samples")) for t in timing)
            rows.append([data.get("suite", {}).get("name", "?"), b, len(mine), f"{min(n)}-{max(n)}", below,
                         _fmt(sorted(share)[len(share) // 2] if share and None not in share else None, ".2f"),
                         _fmt(min(big) if big else None, ".2f"), f"{wall:.0f}"])
            for r in mine:
                e = (r.get("telemetry") or {}).get("energy") or {}
                if e.get("method") == "sustained loop":
                    energy.append([case_label(r["case"]), b, _fmt(e.get("average_w"), ".0f"),
                                   _fmt(e.get("joules_per_call"), ".3g"), _fmt(e.get("idle_w"), ".0f"),
                                   _fmt(e.get("power_limit_w"), ".0f"), e.get("calls"),
                                   _fmt(e.get("sm_clock_mhz_median"), ".0f"), e.get("flag", "")])
    if not rows:
        return "engine: no records"
    text = "measurement engine (kernel share = sum of timed samples / the record's wall time):\n" + tabulate(
        rows, headers=["suite", "backend", "records", "samples", "below min_samples", "kernel share (median)",
                       "kernel share (16k, min)", "suite records' wall s"], tablefmt="github", disable_numparse=True)
    if energy:
        text += "\n\nsustained loop (energy at synchronised ends; power between idle and the limit):\n" + tabulate(
            energy, headers=["case", "backend", "W", "J/call", "idle W", "limit W", "calls", "SM MHz", "flag"],
            tablefmt="github", disable_numparse=True)
    return text


def profiles(data: dict[str, Any] | None) -> str:
    """The Nsight Compute table of a result file run with ``--profile ncu`` (kbench.profiling)."""
    if not data:
        return "profiles: no result file was written"
    try:
        from kbench.profiling import profile_table
    except ImportError as exc:
        return f"profiles: kbench.profiling not importable ({exc})"
    return "profiles (Nsight Compute, outside the timed samples):\n" + profile_table(data.get("records") or [],
                                                                                     "markdown")


def load_partial(path: Path) -> dict[str, Any] | None:
    """The result file as written so far (kbench writes it atomically after every record), or None."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def stage_table(outcomes: Sequence[Outcome]) -> str:
    width = max([len(o.name) for o in outcomes] + [5])
    lines = [f"{'stage':{width}s}  status   seconds  budget  note"]
    for o in outcomes:
        lines.append(f"{o.name:{width}s}  {o.status:7s}  {o.seconds:7.1f}  {o.budget_s:6g}  {o.note}")
    total = sum(o.seconds for o in outcomes)
    return "\n".join(lines + [f"{'total':{width}s}  {'':7s}  {total:7.1f}  {sum(o.budget_s for o in outcomes):6g}"])


# -- command line --------------------------------------------------------------------------------------

def _budgets(items: Sequence[str]) -> dict[str, float]:
    budgets = dict(BUDGETS)
    for item in items:
        name, _, seconds = item.partition("=")
        if name not in budgets:
            raise SystemExit(f"--budget {item}: unknown stage {name!r}; stages: {', '.join(budgets)}")
        try:
            budgets[name] = float(seconds)
        except ValueError:
            raise SystemExit(f"--budget {item}: give seconds, like {name}=60") from None
    return budgets


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["summarize"]:
        return summarize_main(argv[1:])
    parser = argparse.ArgumentParser(prog="scripts/gpu-check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="every stage's logic on the CPU; installs nothing")
    parser.add_argument("--no-tests", action="store_true", help="skip the GPU tests")
    parser.add_argument("--skip", default="", help="comma-separated stages to leave out")
    parser.add_argument("--budget", action="append", default=[], metavar="STAGE=SECONDS")
    parser.add_argument("--evolve", type=float, default=0.0, metavar="SECONDS",
                        help="instead of the measuring stages: evolve the Triton seed with mutate for SECONDS "
                             "(its own device call; files in OUT/evolve)")
    parser.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "results" / "gpu"),
                        help="output folder (default: $OUT, else results/gpu)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    skip = [s for s in args.skip.split(",") if s] + (["tests"] if args.no_tests else [])
    with open(out / "gpu-check.log", "w") as log:
        ctx = Context(out, args.dry_run, env={**os.environ, "PYTHONUNBUFFERED": "1"}, log=log)
        if not 0 <= args.evolve <= CALL_LIMIT_S - 60:
            raise SystemExit(f"--evolve {args.evolve:g}: give 0 to {CALL_LIMIT_S - 60:g} seconds (one device call "
                             "holds the machine and install stages too)")
        stages = plan(ctx, _budgets(args.budget), skip, evolve=args.evolve)
        ctx.say(f"gpu-check{' --dry-run' if args.dry_run else ''}: {len(stages)} stages, at most "
                f"{sum(s.budget_s for s in stages):g} s plus {GRACE_S:g} s grace per overrun; files in {out}")
        outcomes = run_stages(ctx, stages)
        ctx.say("\n== stages\n" + stage_table(outcomes))
        (out / "gpu-check-stages.json").write_text(json.dumps([vars(o) for o in outcomes], indent=1))
    by_name = {o.name: o for o in outcomes}
    if any(o.status in ("timeout", "error") for o in outcomes):
        return 3
    suite = by_name.get("suite")
    if suite is not None and suite.returncode:
        return suite.returncode
    return max([o.returncode or 0 for o in outcomes] + [0])


def summarize_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="gpu_check.py summarize")
    parser.add_argument("result", nargs="+", help="result files: the forward suite's first (its cuDNN figures are "
                                                  "set against the others'); a file run with --profile adds its "
                                                  "profile table")
    parser.add_argument("--markdown")
    args = parser.parse_args(argv)
    datas = [load_partial(Path(path)) for path in args.result]
    cudnn = cudnn_figures(*datas)
    parts = []
    for path, data in zip(args.result, datas):
        recs = (data or {}).get("records") or []
        if recs and any("profile" in r for r in recs):
            parts.append(f"## {Path(path).name}\n\n{profiles(data)}\n")
        else:
            parts.append(f"## {Path(path).name} {(data or {}).get('id', '')}\n\n{summarize(data, cudnn)}")
    parts.append(targets(datas))
    parts.append(engine(datas))
    text = "\n".join(parts)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(f"# gpu-check\n\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
