"""``kbench fuzz`` of kbench's Triton kernel in Triton's interpreter, on the CPU (docs/fuzz.md).

``TRITON_INTERPRET=1 python tests/kernels/fuzz_triton_interpreter.py --budget 300 --seed 36 [-o REPORT.json]``

The ``triton`` backend is a ``cuda`` one and refuses to run under the interpreter from the CLI (its numbers would
be meaningless); for correctness this script presents it as a ``cpu`` backend (as
plugins/kbench-triton/tests/interpret_worker.py does), with 16 x 16 tiles so that short cases span several
blocks, and fuzzes it with kbench.fuzz in this process (trusted code, ``isolate=False``: the judge's checks are
the same). The interpreter computes bf16 wrongly (triton issue 11584): fp32 and fp16 are drawn.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from kbench.api import Backend, get_plugin_manager
from kbench.fuzz.checker import Checker
from kbench.fuzz.engine import fuzz, fuzz_secret, write_repro
from kbench.fuzz.space import Space


class OnCpu(Backend):
    """A ``cuda`` backend presented as a ``cpu`` one: the interpreter runs Triton kernels on CPU tensors."""

    def __init__(self, inner: Backend) -> None:
        self.inner, self.name, self.op, self.device = inner, f"{inner.name}-interpreter", inner.op, "cpu"

    def supports(self, case):
        return self.inner.supports(case)

    def prepare(self, case):
        return self.inner.prepare(case)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--budget", type=float, default=300.0)
    parser.add_argument("--seed", type=int, default=36)
    parser.add_argument("-o", "--output", default=None)
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET") != "1":
        print("set TRITON_INTERPRET=1 (before triton is imported)", file=sys.stderr)
        return 2
    from kbench_triton.backends import TritonAttention

    pm = get_plugin_manager()
    backend = OnCpu(TritonAttention(BLOCK_M=16, BLOCK_N=16))
    space = Space("attention", ("fp32", "fp16"), head_dims=(16, 32, 64, 128), max_work=4e6)
    with Checker(pm, "attention", "cpu", secret=fuzz_secret(args.seed), isolate=False) as checker:
        result = fuzz(backend, checker, space, budget=args.budget, seed=args.seed, backend_arg="triton")
    if result.failure is not None:
        write_repro(result, Path(args.output).parent if args.output else Path.cwd())
    report = result.to_json()
    print(json.dumps(report, indent=1))
    if args.output:
        with open(args.output, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=1)
    return 1 if result.failure else 0


if __name__ == "__main__":
    sys.exit(main())
