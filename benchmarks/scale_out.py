"""Scale-out: wall time of one suite on 1, 2 and 4 simulated devices, with the local and the ray executor.

Every job is bound by a kernel file that sleeps in each call (``time.sleep``: CPU contention on a small
machine cannot hide the effect, so the ratio shows the executor's own parallelism and overhead). The
local executor runs ``--devices 0``, ``0,1``, ``0,1,2,3`` (CPU slots: independent worker pools); the
ray executor a local cluster with a custom resource ``kdev`` standing in for 4 GPUs. Each run is
timed through the API (``run_suite``: worker and actor start-up included, Ray's own start-up not).
A figure, not a test: it prints, and exits 1 only when a record did not pass.

    python benchmarks/scale_out.py                       # 8 jobs of about 4 s, local and ray
    python benchmarks/scale_out.py --executors local --slots 1,2 --cases 8
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import textwrap
import time
from pathlib import Path

KERNEL = '''
"""Sleeps {sleep} s in each call, then computes the exact answer (NumPy)."""
import time

from kbench.builtin.numpy_backends import attention_numpy

NAME = "sleepy"


def attention(q, k, v, out, *, causal, scale):
    time.sleep({sleep})
    attention_numpy(q, k, v, out, causal=causal, scale=scale)
'''


def suite_data(cases: int) -> dict:
    seqlens = [16 + 8 * i for i in range((cases + 1) // 2)]
    return {"version": 1, "name": "scale-out", "op": "attention", "backends": [],
            "check": {"seeds": 1},
            "timing": {"warmup_time": 0, "min_samples": 3, "min_time": 0, "max_time": 0.05,
                       "target_rel_se": 0.5, "rotate": 1},
            "grid": [{"batch": 1, "seqlen": seqlens, "heads": 1, "head_dim": 16, "causal": [False, True],
                      "dtype": "fp32"}]}


def one_run(pm, kernel: str, cases: int, executor: str, slots: int, out: Path) -> tuple[float, float, list]:
    """(wall time, time to the first record: start-up plus one job, the records)."""
    from kbench.api import RunRequest, plan_run, run_suite, suite_from_data

    req = RunRequest(suite=suite_from_data(suite_data(cases), path="<scale_out>"), device="cpu",
                     kernel_files=[kernel], trust_kernel_files=True, output=out, force=True, executor=executor)
    if executor == "local":
        req.devices = [str(i) for i in range(slots)]
    else:
        req.executor_settings = {"resource": "kdev", "slots": str(slots)}
    planned = plan_run(pm, req)
    first: list[float] = []
    start = time.perf_counter()
    writer = run_suite(pm, planned, on_record=lambda rec, i, n: first or first.append(time.perf_counter() - start))
    return time.perf_counter() - start, first[0], writer.records


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=8, help="jobs per run (even)")
    parser.add_argument("--sleep", type=float, default=1.0, help="seconds each kernel call sleeps (a job makes about 4 calls)")
    parser.add_argument("--slots", default="1,2,4")
    parser.add_argument("--executors", default="local,ray")
    args = parser.parse_args()
    slots = [int(s) for s in args.slots.split(",")]
    from kbench.api import get_plugin_manager

    pm = get_plugin_manager()
    rows = []
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        kernel = Path(tmp) / "sleepy.py"
        kernel.write_text(textwrap.dedent(KERNEL.format(sleep=args.sleep)))
        for executor in args.executors.split(","):
            if executor == "ray":
                import ray
                from kbench_ray.loopback import keep_loopback

                keep_loopback()  # node address 127.0.0.1: the cluster listens on loopback only
                ray.init(num_cpus=os.cpu_count() or 2, resources={"kdev": max(slots)}, include_dashboard=False,
                         log_to_driver=False, logging_level="warning", _node_ip_address="127.0.0.1")
            base = None
            for n in slots:
                wall, first, records = one_run(pm, str(kernel), args.cases, executor, n, Path(tmp) / f"{executor}{n}.json")
                bad = [r for r in records if r["status"] != "passed"]
                failed += len(bad)
                used = sorted({r["placement"].get("slot") for r in records}, key=str)
                base = base or wall
                rows.append((executor, n, len(records), f"{wall:.1f}", f"{first:.1f}", f"{base / wall:.2f}x",
                             f"{base / wall / n:.0%}", ",".join(map(str, used)), len(bad)))
                print(f"{executor} x{n}: {wall:.1f} s", file=sys.stderr, flush=True)
            if executor == "ray":
                ray.shutdown()
    from kbench.api import render_table

    print(render_table(("executor", "devices", "jobs", "wall s", "first record s", "speed-up", "efficiency", "slots used",
                        "not passed"), rows, "table"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
