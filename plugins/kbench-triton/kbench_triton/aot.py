"""Ahead-of-time compilation of the Triton attention kernel for CUDA targets, on a machine without a GPU.

``triton.compile(ASTSource(kernel, signature, constexprs), target=GPUTarget("cuda", arch, 32))`` runs
the whole pipeline (TTIR, TTGIR, LLVM IR, PTX, ptxas) for the target; the ptxas log gives registers,
spills and stack; Triton's metadata gives the shared memory the kernel asks for at launch. A
configuration whose shared memory exceeds the target's per-block limit compiles but cannot launch: it
is reported as ``too-much-smem``. A compile error is ``error``. This is how we know the kernels build
for Hopper (sm_90) and the others without a GPU.

Two forward kernels: ``triton`` (``seeds/triton_attention_seed.py``, FlashAttention-2 algorithm, sm_80+)
and ``triton-hopper`` (``seeds/triton_hopper_seed.py``, TMA tensor descriptors and warp specialisation,
sm_90+); and the ``triton`` backend's two backward kernels ``triton-bwd-dkdv`` and ``triton-bwd-dq``
(``backward.py``; its third, the delta = rowsum(dO * O) reduction, is a two-load sum not compiled here).
The PTX of each compiled configuration states which Hopper features the compiler used: TMA
(``cp.async.bulk.tensor``), ``wgmma`` and register reallocation between warp roles (``setmaxnreg``); the TTGIR whether the loop was warp-specialised (``ttg.warp_specialize``).
``emit_ptx`` writes that PTX to a directory, one file per configuration.

For a warp-specialised kernel the TTGIR also shows how Triton split the work (``analyse_warp_specialization``):
how many consumer warpgroups run ``wgmma`` and how many query rows each one's products have (two
consumers of BLOCK_M / 2 rows each, or two that both compute the whole tile: duplicated work), and whether
a consumer adds its half's row offset twice (a TMA coordinate that the data partitioner shifted and that
also feeds a row index tensor built on a shifted ``tl.arange``: a wrong causal mask, docs/triton.md).
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import inspect
import io
import itertools
import json
import os
import re
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Iterator

#: Largest dynamic shared memory one block may use, in bytes (CUDA C Programming Guide,
#: "Technical Specifications per Compute Capability": 163 KB on 8.0, 227 KB on 9.0 and 10.0).
SMEM_LIMIT = {80: 163 * 1024, 90: 227 * 1024, 100: 227 * 1024}
ARCHS = (80, 90, 100)
#: kbench's dtype names, which are also Triton's signature types
DTYPES = ("bf16", "fp16", "fp32")

#: the kernels' pointer arguments of the input type; fp32 ones (the log-sum-exp and delta of the backward);
#: fp32 scalars; the others are int32 sizes and strides, and constexprs
_POINTERS = ("Q", "K", "V", "O", "DO", "DQ", "DK", "DV")
_FP32_POINTERS = ("LSE", "Delta")
_FP32_SCALARS = ("qk_scale", "sm_scale")
#: PTX instructions that show a Hopper feature in use
PTX_FEATURES = {"tma": "cp.async.bulk.tensor", "wgmma": "wgmma.mma_async", "setmaxnreg": "setmaxnreg"}


@dataclass(frozen=True)
class KernelSpec:
    """One kernel the AOT check compiles: where it lives and what it needs."""

    name: str               # the backend that launches it
    module: str
    function: str
    constexprs: tuple[str, ...]
    min_arch: int
    dtypes: tuple[str, ...]
    #: constexprs with one value here: (name, value) pairs
    fixed: tuple[tuple[str, object], ...] = ()
    #: a backward kernel: its key in ``backward.bwd_config`` ("dkdv" or "dq"); "" for a forward kernel
    config_key: str = ""


KERNELS = {
    # the forward as modes fwd launch it (a training forward also stores one fp32 per row: STORE_LSE)
    "triton": KernelSpec("triton", "kbench_triton.seeds.triton_attention_seed", "attention_fwd_kernel",
                         ("HEAD_DIM", "BLOCK_M", "BLOCK_N", "CAUSAL", "DOT_PRECISION", "STORE_LSE"), 80, DTYPES,
                         fixed=(("STORE_LSE", False),)),
    # key lengths that are multiples of BLOCK_N, as kbench's benchmark shapes are (EVEN_KV: no ragged-key mask)
    "triton-hopper": KernelSpec("triton-hopper", "kbench_triton.seeds.triton_hopper_seed", "attention_hopper_kernel",
                                ("HEAD_DIM", "BLOCK_M", "BLOCK_N", "CAUSAL", "WARP_SPECIALIZE", "EVEN_KV"), 90,
                                ("bf16", "fp16"), fixed=(("EVEN_KV", True),)),
    "triton-bwd-dkdv": KernelSpec("triton", "kbench_triton.backward", "bwd_dkdv_kernel",
                                  ("HEAD_DIM", "BLOCK_M", "BLOCK_N", "CAUSAL", "DOT_PRECISION"), 80, DTYPES,
                                  config_key="dkdv"),
    "triton-bwd-dq": KernelSpec("triton", "kbench_triton.backward", "bwd_dq_kernel",
                                ("HEAD_DIM", "BLOCK_M", "BLOCK_N", "CAUSAL", "DOT_PRECISION"), 80, DTYPES,
                                config_key="dq"),
}
#: the backward kernels (``--kernel triton-bwd``)
BACKWARD = tuple(k for k, spec in KERNELS.items() if spec.config_key)


@dataclass(frozen=True)
class Target:
    arch: int
    head_dim: int
    dtype: str
    causal: bool
    kernel: str = "triton"


@dataclass
class CompileReport:
    """One compiled (target, configuration): what ptxas and Triton say about it."""

    arch: int
    head_dim: int
    dtype: str
    causal: bool
    BLOCK_M: int
    BLOCK_N: int
    num_warps: int
    num_stages: int
    status: str = "ok"          # ok | too-much-smem | error
    registers: int | None = None
    spill_stores: int | None = None
    spill_loads: int | None = None
    stack: int | None = None
    shared: int | None = None
    seconds: float = 0.0
    message: str = ""
    kernel: str = "triton"
    warp_specialize: bool | None = None   # the configuration asked for it (Hopper kernel)
    warp_specialized: bool | None = None  # the TTGIR has a ttg.warp_specialize region
    tma: bool | None = None
    wgmma: bool | None = None
    setmaxnreg: bool | None = None
    #: warp-specialised kernels: the query rows of each consumer warpgroup's products (TTGIR)
    ws_consumer_rows: list[int] | None = None
    #: warp-specialised kernels: TMA coordinates whose shifted value also feeds a shifted row range
    ws_double_shift: list[str] | None = None
    ptx_path: str | None = None
    #: the report came from the compile cache (kbench_triton.aot.sweep)
    cached: bool = False

    @property
    def ws_duplicated(self) -> bool:
        """Every consumer warpgroup computes the whole BLOCK_M-row tile: the same products done twice."""
        rows = self.ws_consumer_rows or []
        return len(rows) > 1 and all(r == self.BLOCK_M for r in rows)

    def as_dict(self) -> dict:
        return asdict(self)


def _kernel_module(kernel: str = "triton"):
    return importlib.import_module(KERNELS[kernel].module)


def _jit_function(kernel: str):
    return getattr(_kernel_module(kernel), KERNELS[kernel].function)


def signature(dtype: str, kernel: str = "triton") -> dict[str, str]:
    """Triton signature of the kernel for inputs of ``dtype`` (int32 strides and sizes)."""
    constexprs = KERNELS[kernel].constexprs
    sig = {}
    for name in _jit_function(kernel).arg_names:
        if name in _POINTERS:
            sig[name] = "*" + dtype
        elif name in _FP32_POINTERS:
            sig[name] = "*fp32"
        elif name in constexprs:
            sig[name] = "constexpr"
        elif name in _FP32_SCALARS:
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    return sig


def divisibility(kernel: str = "triton") -> dict[tuple[int], list]:
    """The specialisation Triton's JIT gives a launch on contiguous tensors with power-of-two lengths:
    pointers, strides and sequence lengths divisible by 16. Without it the compiler cannot prove 16-byte
    alignment, loads are not vectorised and the K/V loads are not software-pipelined."""
    names = _jit_function(kernel).arg_names
    return {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
            if n in _POINTERS or n in _FP32_POINTERS or n.startswith("stride_") or n in ("seqlen_q", "seqlen_kv")}


def supported_archs() -> list[int]:
    """Which of ``ARCHS`` the installed Triton can target (sm_100 needs a recent Triton and ptxas)."""
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.backends.compiler import GPUTarget

    return [a for a in ARCHS if CUDABackend.supports_target(GPUTarget("cuda", a, 32))]


def _parse_ptxas(log: str) -> dict[str, int | None]:
    def grab(pattern: str) -> int | None:
        found = re.findall(pattern, log)
        return int(found[-1]) if found else None

    return {"registers": grab(r"Used (\d+) registers"), "spill_stores": grab(r"(\d+) bytes spill stores"),
            "spill_loads": grab(r"(\d+) bytes spill loads"), "stack": grab(r"(\d+) bytes stack frame")}


def ptx_features(ptx: str) -> dict[str, bool]:
    """Which of TMA, wgmma and setmaxnreg a PTX text uses."""
    return {name: instruction in ptx for name, instruction in PTX_FEATURES.items()}


def ptx_file_name(target: Target, config: dict) -> str:
    mask = "causal" if target.causal else "full"
    ws = f"-ws{int(config['WARP_SPECIALIZE'])}" if "WARP_SPECIALIZE" in config else ""
    return (f"{target.kernel}-sm{target.arch}-d{target.head_dim}-{target.dtype}-{mask}-m{config['BLOCK_M']}"
            f"-n{config['BLOCK_N']}-w{config['num_warps']}-s{config['num_stages']}{ws}.ptx")


def compile_one(target: Target, config: dict, emit_ptx: str | Path | None = None) -> CompileReport:
    """Compile ``target.kernel`` for ``target`` with ``config`` (BLOCK_M, BLOCK_N, num_warps, num_stages and,
    for the Hopper kernel, WARP_SPECIALIZE); with ``emit_ptx`` write its PTX into that directory."""
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    spec, mod = KERNELS[target.kernel], _kernel_module(target.kernel)
    report = CompileReport(target.arch, target.head_dim, target.dtype, target.causal, config["BLOCK_M"],
                           config["BLOCK_N"], config["num_warps"], config["num_stages"], kernel=target.kernel)
    constexprs = dict(HEAD_DIM=target.head_dim, BLOCK_M=config["BLOCK_M"], BLOCK_N=config["BLOCK_N"],
                      CAUSAL=target.causal, **dict(spec.fixed))
    if "DOT_PRECISION" in spec.constexprs:
        # the backward kernels use the forward's choice (3xTF32 for fp32)
        torch_name = {"fp32": "float32"}.get(target.dtype, target.dtype)
        constexprs["DOT_PRECISION"] = _kernel_module("triton").dot_precision(torch_name)
    if "WARP_SPECIALIZE" in spec.constexprs:
        report.warp_specialize = bool(config.get("WARP_SPECIALIZE", 0))
        constexprs["WARP_SPECIALIZE"] = report.warp_specialize
    source = ASTSource(_jit_function(target.kernel), signature(target.dtype, target.kernel), constexprs,
                       attrs=divisibility(target.kernel))
    log = io.StringIO()
    start = time.perf_counter()
    try:
        # compile for real each time (a cache hit has no ptxas log) and keep ptxas's -v output
        with knobs.compilation.scope(), knobs.nvidia.scope(), contextlib.redirect_stdout(log):
            knobs.compilation.always_compile = True
            knobs.nvidia.dump_ptxas_log = True
            compiled = triton.compile(source, target=GPUTarget("cuda", target.arch, 32),
                                      options={"num_warps": config["num_warps"],
                                               "num_stages": config["num_stages"],
                                               # the JIT's default in Triton 3.6-3.9; explicit, so no warning
                                               "enable_fp_fusion": True})
    except Exception as exc:  # noqa: BLE001 - a compile error is the finding, recorded with its message
        report.status, report.message = "error", f"{type(exc).__name__}: {str(exc).strip()[:2000]}"
        return report
    finally:
        report.seconds = time.perf_counter() - start
    for key, value in _parse_ptxas(log.getvalue()).items():
        setattr(report, key, value)
    ptx = compiled.asm.get("ptx", "")
    for key, value in ptx_features(ptx).items():
        setattr(report, key, value)
    ttgir = str(compiled.asm.get("ttgir", ""))
    report.warp_specialized = "ttg.warp_specialize" in ttgir
    if report.warp_specialized:
        ws = analyse_warp_specialization(ttgir)
        report.ws_consumer_rows, report.ws_double_shift = list(ws.consumer_rows), list(ws.double_shift)
    if emit_ptx is not None:
        path = Path(emit_ptx) / ptx_file_name(target, config)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(ptx)
        report.ptx_path = str(path)
    report.shared = int(compiled.metadata.shared)
    limit = SMEM_LIMIT.get(target.arch)
    if limit is not None and report.shared > limit:
        report.status = "too-much-smem"
        report.message = f"{report.shared} bytes of shared memory > {limit} allowed per block on sm_{target.arch}"
    return report


@dataclass(frozen=True)
class WarpSpecialization:
    """How Triton split a warp-specialised kernel, read from its TTGIR."""

    #: per consumer partition (a region that runs ``wgmma``), the rows (M) of its first product
    consumer_rows: tuple[int, ...]
    #: consumer partitions' TMA coordinates that the data partitioner shifted (``%c = arith.addi %x, %cK``)
    #: and that also feed, through ``tt.splat``, an add with a ``tt.make_range`` that does not start at 0:
    #: the half's offset counted twice in a row index
    double_shift: tuple[str, ...]


_REGION = re.compile(r"^\s*(default \{|partition\d+\()", re.M)
_DOT_ROWS = re.compile(r"ttng\.warp_group_dot .*?-> tensor<(\d+)x\d+x")
_TMA_COORD = re.compile(r"ttng\.async_tma_copy_(?:global_to_local|local_to_global) %[\w.#]+\[(%[\w.#]+),")
_DEF = re.compile(r"^\s*(%[\w.#]+) = (\S+) ([^{:]*)", re.M)


def analyse_warp_specialization(ttgir: str) -> WarpSpecialization:
    """The consumer warpgroups of a ``ttg.warp_specialize`` op and the double-shift hazard (see the class)."""
    start = ttgir.find("ttg.warp_specialize(")
    marks = [m.start() for m in _REGION.finditer(ttgir, start if start >= 0 else len(ttgir))]
    regions = [ttgir[a:b] for a, b in zip(marks, marks[1:] + [len(ttgir)])]
    rows, hazards = [], []
    for index, region in enumerate(regions):
        dots = _DOT_ROWS.findall(region)
        if not dots:
            continue
        rows.append(int(dots[0]))
        defs = {name: (op, operands.replace(",", " ").split()) for name, op, operands in _DEF.findall(region)}

        def is_op(name, op):
            return defs.get(name, ("", []))[0] == op

        def shifted_range(name):
            return is_op(name, "tt.make_range") and not re.search(
                rf"^\s*{re.escape(name)} = tt\.make_range \{{[^}}]*start = 0 :", region, re.M)

        shifted = {c for c in _TMA_COORD.findall(region)
                   if is_op(c, "arith.addi") and any(o.startswith("%c") for o in defs[c][1])}
        splats = {name for name, (op, operands) in defs.items() if op == "tt.splat" and operands[:1] and
                  operands[0] in shifted}
        for name, (op, operands) in defs.items():
            if op == "arith.addi" and any(o in splats for o in operands) and any(shifted_range(o) for o in operands):
                coord = defs[next(o for o in operands if o in splats)][1][0]
                hazards.append(f"region {index}: {coord} (a shifted TMA coordinate) + a shifted tl.arange in {name}")
    return WarpSpecialization(tuple(rows), tuple(hazards))


def tunable_space(kernel: str = "triton") -> list[dict]:
    """Every combination of the choices in the kernel's ``TUNABLES`` (the backward's: the forward's)."""
    tunables = _kernel_module("triton" if KERNELS[kernel].config_key else kernel).TUNABLES
    names = list(tunables)
    return [dict(zip(names, values)) for values in itertools.product(*(tunables[n]["choices"] for n in names))]


def shipped_configs(head_dim: int, causal: bool, dtype: str, kernel: str = "triton") -> list[dict]:
    """The configurations the backends launch for a shape: the tuned one, the autotune candidates and the
    kernel file's defaults (16-bit types); the one fp32 configuration for fp32."""
    mod = _kernel_module(kernel)
    if dtype == "fp32":
        return [mod.config_for(head_dim, causal, dtype)]
    configs = [mod.config_for(head_dim, causal, dtype), *getattr(mod, "AUTOTUNE_CONFIGS", {}).get(head_dim, []),
               {k: t["default"] for k, t in mod.TUNABLES.items()}]
    unique = []
    for c in configs:
        if c not in unique:
            unique.append(c)
    return unique


#: which configurations a sweep compiles per target
CONFIG_SETS = ("tuned", "shipped", "every")


def configs_for(which: str, head_dim: int, causal: bool, dtype: str, kernel: str = "triton") -> list[dict]:
    """``tuned``: the one the backend launches; ``shipped``: every one a backend or the kernel file may
    launch; ``every``: every combination of the TUNABLES choices."""
    key = KERNELS[kernel].config_key
    if key and which in ("tuned", "shipped"):
        return [_kernel_module(kernel).bwd_config(head_dim, dtype)[key]]
    if which == "tuned":
        return [_kernel_module(kernel).config_for(head_dim, causal, dtype)]
    if which == "shipped":
        return shipped_configs(head_dim, causal, dtype, kernel)
    if which == "every":
        return tunable_space(kernel)
    raise ValueError(f"unknown configuration set {which!r}; use one of {CONFIG_SETS}")


def plan(archs: Iterable[int], head_dims: Iterable[int], dtypes: Iterable[str], causals: Iterable[bool],
         *, configs: str = "shipped", kernels: Iterable[str] = ("triton",)) -> Iterator[tuple[Target, dict]]:
    """Every (target, configuration) to compile; a kernel is skipped on architectures and dtypes it does not
    target (the Hopper kernel: sm_90+, 16-bit types)."""
    for kernel in kernels:
        spec = KERNELS[kernel]
        for arch, d, dt, causal in itertools.product(archs, head_dims, dtypes, causals):
            if arch < spec.min_arch or dt not in spec.dtypes:
                continue
            for config in configs_for(configs, d, causal, dt, kernel):
                yield Target(arch, d, dt, causal, kernel), config


def failures(reports: list[CompileReport], *, every_config: bool) -> list[CompileReport]:
    """Compile errors and a double-shifted row index (wrong results) always fail; a configuration over the
    shared-memory limit fails only when the backends ship it (in a sweep of every combination it is a
    finding: that corner cannot launch)."""
    return [r for r in reports if r.status == "error" or r.ws_double_shift or
            (r.status == "too-much-smem" and not every_config)]


#: where compile reports are kept between runs (``KBENCH_AOT_CACHE``; an empty value turns the cache off)
CACHE_ENV = "KBENCH_AOT_CACHE"


def cache_dir() -> Path | None:
    value = os.environ.get(CACHE_ENV)
    if value is not None:
        return Path(value) if value else None
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kbench" / "aot"


@functools.lru_cache(maxsize=None)
def toolchain(arch: int) -> str:
    """Triton's version and the ptxas it runs for ``arch``: what else decides a compile's report."""
    import triton

    try:
        from triton.backends.nvidia.compiler import get_ptxas

        ptxas = get_ptxas(arch)
        version = getattr(ptxas, "version", None) or subprocess.run([ptxas.path, "--version"], capture_output=True,
                                                                    text=True, timeout=30).stdout
    except Exception as exc:  # noqa: BLE001 - no ptxas known: the key says so (and compiles would fail anyway)
        version = f"unknown ptxas ({type(exc).__name__})"
    return f"triton {triton.__version__}; {str(version).strip()}"


def cache_key(target: Target, config: dict) -> str:
    """A hash of the kernel's source, the target, the configuration and the toolchain."""
    source = inspect.getsource(_kernel_module(target.kernel))
    text = json.dumps([source, asdict(target), sorted(config.items()), toolchain(target.arch)], default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def sweep(jobs: Iterable[tuple[Target, dict]]) -> list[CompileReport]:
    """The report of every job, from the cache when the same kernel source, target, configuration and
    toolchain were compiled before (a report is what the compile decided; nothing in it depends on the time)."""
    where = cache_dir()
    reports = []
    for target, config in jobs:
        path = where / f"{cache_key(target, config)}.json" if where is not None else None
        if path is not None and path.is_file():
            try:
                reports.append(CompileReport(**{**json.loads(path.read_text()), "cached": True}))
                continue
            except (OSError, ValueError, TypeError):
                pass  # a damaged entry: compile again and replace it
        report = compile_one(target, config)
        if path is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(f".{os.getpid()}.tmp")
                tmp.write_text(json.dumps(report.as_dict()))
                os.replace(tmp, path)
            except OSError:
                pass  # a read-only home: no cache, same reports
        reports.append(report)
    return reports


def _yes_no(value: bool | None) -> str:
    return "" if value is None else ("yes" if value else "no")


def _ws_cell(r: CompileReport) -> str:
    """``asked/yes 2x64`` (two consumers of 64 rows), ``... dup`` (both compute the whole tile), ``... SHIFT``
    (a double-shifted row index: wrong under a causal mask)."""
    if r.warp_specialize is None:
        return ""
    cell = f"{'asked' if r.warp_specialize else 'off'}/{_yes_no(r.warp_specialized)}"
    if r.ws_consumer_rows:
        rows = set(r.ws_consumer_rows)
        cell += f" {len(r.ws_consumer_rows)}x{rows.pop() if len(rows) == 1 else '/'.join(map(str, r.ws_consumer_rows))}"
        cell += " dup" if r.ws_duplicated else ""
    return cell + (" SHIFT" if r.ws_double_shift else "")


def table_rows(reports: list[CompileReport]) -> tuple[tuple[str, ...], list[tuple]]:
    headers = ("kernel", "arch", "d", "dtype", "mask", "BLOCK_M", "BLOCK_N", "warps", "stages", "ws", "regs",
               "spill st/ld", "stack", "smem KiB", "TMA", "wgmma", "setmaxnreg", "s", "status")
    rows = [(r.kernel, f"sm_{r.arch}", r.head_dim, r.dtype, "causal" if r.causal else "full", r.BLOCK_M, r.BLOCK_N,
             r.num_warps, r.num_stages, _ws_cell(r), r.registers,
             "" if r.spill_stores is None else f"{r.spill_stores}/{r.spill_loads}", r.stack,
             "" if r.shared is None else f"{r.shared / 1024:.0f}", _yes_no(r.tma), _yes_no(r.wgmma),
             _yes_no(r.setmaxnreg), f"{r.seconds:.1f}", r.status if not r.message or r.status == "too-much-smem"
             else f"{r.status}: {r.message.splitlines()[0][:80]}") for r in reports]
    return headers, rows
