#!/usr/bin/env python3
"""kbench's medians against the standard timers on the same work: ``timeit`` on the CPU (target within 2%),
``triton.testing.do_bench`` on a CUDA GPU (within 3%).

CPU: one fixed workload (NumPy attention, b=1 s=512 h=8 d=64 fp32, compute-bound), measured by kbench as a
user runs it (``kbench run`` in a worker, new inputs before every call) and by ``timeit.repeat`` on fixed
inputs in this process, alternately, ``--rounds`` times; prints both medians and their ratio. BLAS runs one
thread on both sides (``--threads``): with two threads on a 2-vCPU VM both timers' medians wander by +-15% from
one minute to the next, which hides any difference between them.

GPU (``--device cuda``): the 16k-token cases of the FlashAttention-3 sweep (b=1, h=16, d=128, bf16, causal and
not) for the cuda backends installed; kbench's median (events per call, L2 flushed outside each sample) against
do_bench's (``return_mode="median"``, its own 256 MB cache clear between calls) on inputs made once.

Usage: python benchmarks/timing_crosscheck.py [--device cpu|cuda] [--rounds 7] [--threads 1]
"""
from __future__ import annotations

import os
import sys

if "--threads" in sys.argv:  # before NumPy loads its BLAS (the kbench run below inherits the environment)
    _threads = sys.argv[sys.argv.index("--threads") + 1]
else:
    _threads = "1"
for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, _threads)

import argparse
import json
import statistics
import subprocess
import tempfile
import timeit
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CPU_CASE = {"batch": 1, "seqlen": 512, "heads": 8, "head_dim": 64, "causal": False, "dtype": "fp32"}
GPU_CASES = [{"batch": 1, "seqlen": 16384, "heads": 16, "head_dim": 128, "causal": c, "dtype": "bf16"} for c in (False, True)]
GPU_BACKENDS = ("cudnn", "torch-sdpa-flash", "torch-sdpa-cudnn", "triton", "triton-hopper")


def kbench_medians(device: str, cases: list[dict], backends: list[str], timing: dict) -> dict:
    import yaml

    suite = {"version": 1, "name": "crosscheck", "op": "attention", "backends": backends,
             "check": {"seeds": 1, "max_rows": 32}, "timing": timing, "grid": [{k: [v] for k, v in c.items()} for c in cases]}
    with tempfile.TemporaryDirectory() as tmp:
        path, out = Path(tmp) / "suite.yaml", Path(tmp) / "r.json"
        path.write_text(yaml.safe_dump(suite))
        subprocess.run([sys.executable, "-m", "kbench.cli", "run", str(path), "--device", device, "-o", str(out),
                        "--no-progress"], capture_output=True, cwd=ROOT)
        data = json.loads(out.read_text())
    return {(r["case_id"], r["backend"]): r["stats"]["median"] for r in data["records"] if r["status"] == "passed"}


def cpu(rounds: int) -> None:
    from kbench.builtin.numpy_backends import attention_numpy
    from kbench.ops.attention import AttentionOp, softmax_scale

    op = AttentionOp()
    case = op.make_case(CPU_CASE)
    x = op.make_inputs(case, 1)
    out = np.empty(op.output_shape(case), dtype=np.float32)
    fn = lambda: attention_numpy(x["q"], x["k"], x["v"], out, causal=False, scale=softmax_scale(case))  # noqa: E731
    ours, theirs = [], []
    for _ in range(rounds):
        got = kbench_medians("cpu", [CPU_CASE], ["numpy"], {"warmup_time": 0.2, "min_samples": 30, "min_time": 1.0,
                                                            "max_time": 3.0, "target_rel_se": 0.002})
        ours.append(next(iter(got.values())))
        theirs.append(statistics.median(timeit.repeat(fn, number=1, repeat=60)))
    a, b = statistics.median(ours), statistics.median(theirs)
    ratios = sorted(x / y for x, y in zip(ours, theirs))
    print(f"numpy attention {CPU_CASE}: kbench median {a * 1e3:.3f} ms, timeit median {b * 1e3:.3f} ms, "
          f"ratio of medians {a / b:.4f} ({a / b - 1:+.2%}), median of the {rounds} rounds' ratios "
          f"{statistics.median(ratios):.4f}; rounds: kbench {[f'{v * 1e3:.3f}' for v in ours]} ms, "
          f"timeit {[f'{v * 1e3:.3f}' for v in theirs]} ms")


def cuda(rounds: int) -> None:
    import torch
    import triton.testing

    from kbench.api import get_plugin_manager

    pm = get_plugin_manager()
    backends = [b for b in GPU_BACKENDS if b in pm.registry.backends and pm.registry.backends[b].available() is None]
    op, dev = pm.registry.op("attention"), pm.registry.device("cuda")
    got = kbench_medians("cuda", GPU_CASES, backends, {"warmup_time": 0.2, "min_samples": 30, "min_time": 0.3,
                                                       "max_time": 3.0, "target_rel_se": 0.003})
    def do_bench(kernel, arrays) -> float:
        return triton.testing.do_bench(lambda: kernel(**arrays), warmup=200, rep=2000, return_mode="median") * 1e-3

    for params in GPU_CASES:
        case = op.make_case(params)
        arrays = {k: dev.from_host(v) for k, v in op.make_inputs(case, 7).items()}
        arrays["out"] = dev.poisoned(op.output_shape(case), case.dtype)
        for name in backends:
            backend = pm.registry.backends[name]
            if backend.supports(case):
                continue
            theirs = do_bench(backend.prepare(case), arrays)
            ours = got.get((case.id, name))
            ratio = f"{ours / theirs:.4f} ({ours / theirs - 1:+.2%})" if ours else "kbench record not passed"
            print(f"{case.id} {name}: kbench {ours * 1e3 if ours else float('nan'):.4f} ms, do_bench "
                  f"{theirs * 1e3:.4f} ms, ratio {ratio}")
        arrays.clear()
        torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", default="1", help="BLAS/OpenMP threads of the CPU workload (both timers)")
    args = ap.parse_args()
    (cpu if args.device == "cpu" else cuda)(args.rounds)


if __name__ == "__main__":
    main()
