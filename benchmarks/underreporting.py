#!/usr/bin/env python3
"""The bound on under-reporting: what share of its real time a kernel that hides work wherever it can still gets
credited, on the CPU reference sweep's shapes, idle and beside busy loops.

Every kernel below computes the same honest NumPy attention (kbench.builtin's); all but the first (``honest``,
that function called inline) try to have part or all of it not
counted. They run as untrusted kernel files with ``static_checks: none`` and ``check_harness: false``, so that
only the parent's clock and the run-time checks that do not look inside the worker stand between them and a
better time (the worker is assumed compromised). For each shape it prints each kernel's status and its median
over the honest kernel's: a kernel that passes with a ratio r under 1 hid a share 1 - r of its time.

* ``finalizer``: all of a call's work in the finalizer of the array it returned (let go by the harness);
* ``shaved``: a ``timeit`` finalizer (laundered past the audit hook) replaces the runner's ``batch`` on the
  instance with one that reports every timed sample at 30%;
* ``late``: zeros, and a raw thread writes the answer 2 ms later (between batches, if it were allowed to run);
* ``honest_again``: the baseline again under another name: its ratio is the measurement's own noise.

Each record is measured in ``--rounds`` rounds spread over the run and the whole run made ``--repeats`` times; each
kernel's quickest median is compared (on a shared machine a moment of load otherwise decides the ratio).

Usage: python benchmarks/underreporting.py [--busy 2] [--seqlen 256 512 1024] [--heads 8] [--rounds 3] [--repeats 2]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REDTEAM = ROOT / "tests/redteam"
KERNELS = {"honest": None, "honest_again": None, "finalizer": None, "shaved": REDTEAM / "laundered_runner_patch.py",
           "late": REDTEAM / "late_finisher.py"}

#: the same maths as every hiding kernel here, called inline: the baseline
HONEST = '''
from kbench.builtin.numpy_backends import attention_numpy as _honest


def attention(q, k, v, out, *, causal, scale):
    _honest(q, k, v, out, causal=causal, scale=scale)
'''

#: the finalizer route, as on 54db9a9 it won (every head computed by the finalizer of the previous answer)
FINALIZER = '''
import weakref
import numpy as np

from kbench.builtin.numpy_backends import attention_numpy as _honest


class _Pending:
    calls = {}


def _fill(key):
    item = _Pending.calls.get(key)
    if item is not None:
        q, k, v, causal, scale, res = item
        _honest(q, k, v, res, causal=causal, scale=scale)


def attention(q, k, v, out, *, causal, scale):
    res = np.empty_like(out)
    first = id(q) not in _Pending.calls
    _Pending.calls[id(q)] = (q, k, v, causal, scale, res)
    if first:
        _honest(q, k, v, res, causal=causal, scale=scale)
    weakref.finalize(res, _fill, id(q))
    return res
'''


def run(seqlens: list[int], heads: int, tmp: Path, rounds: int) -> list[dict]:
    from kbench.plugins import PluginManager
    from kbench.run.runner import RunRequest, plan_run, run_suite
    from kbench.suite import suite_from_data

    files = []
    for name, path in KERNELS.items():
        target = tmp / f"{name}.py"
        target.write_text({"honest": HONEST, "honest_again": HONEST, "finalizer": FINALIZER}.get(name)
                          or path.read_text())
        files.append(str(target))
    data = {"name": "underreporting", "op": "attention", "check": {"seeds": 2, "max_rows": 64},
            "timing": {"warmup_time": 0.02, "min_samples": 5, "min_time": 0.1, "max_time": 1.0,
                       "target_rel_se": 0.01, "case_timeout": 300, "rounds": rounds},
            "integrity": {"static_checks": "none", "check_harness": False},
            "grid": [{"batch": 1, "seqlen": seqlens, "heads": heads, "head_dim": 64, "causal": False,
                      "dtype": "fp32"}]}
    pm = PluginManager()
    req = RunRequest(suite=suite_from_data(data), device="cpu", backend_patterns=[], kernel_files=files,
                     output=tmp / "r.json")
    return list(run_suite(pm, plan_run(pm, req)).records)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--busy", type=int, default=0, help="processes spinning beside the run (default 0)")
    ap.add_argument("--seqlen", type=int, nargs="+", default=[256, 512, 1024])
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds per record, spread over the run (a moment of load meets every kernel alike)")
    ap.add_argument("--repeats", type=int, default=2, help="whole runs; each kernel's quickest median is compared")
    args = ap.parse_args()
    hogs = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(args.busy)]
    try:
        t0 = time.perf_counter()
        records = []
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory() as tmp:
                records += run(args.seqlen, args.heads, Path(tmp), args.rounds)
        wall = time.perf_counter() - t0
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    print(f"busy loops: {args.busy}; load average {os.getloadavg()[0]:.1f} at the end; {wall:.0f} s")
    by_case: dict[str, dict[str, dict]] = {}
    for rec in records:  # per (case, kernel): a passed record with the quickest median over the repeats
        name = rec["backend"].removeprefix("file:")
        kept = by_case.setdefault(rec["case_id"], {}).get(name)
        if kept is None or (rec["status"] == "passed" and (kept["status"] != "passed"
                                                            or rec["stats"]["median"] < kept["stats"]["median"])):
            by_case[rec["case_id"]][name] = rec
    hidden = []
    for case, recs in by_case.items():
        medians = [(recs.get(n, {}).get("stats") or {}).get("median") for n in ("honest", "honest_again")]
        medians = [m for m in medians if m]
        base = min(medians) if medians else None   # the quicker of the two honest copies
        noise = max(medians) / min(medians) - 1 if len(medians) == 2 else None
        print(case + (f"  (the two honest copies differ by {noise:.0%}: the noise of this moment)"
                      if noise is not None else ""))
        for name in KERNELS:
            rec = recs.get(name, {})
            median = (rec.get("stats") or {}).get("median")
            ratio = median / base if median and base else None
            if rec.get("status") == "passed" and ratio is not None and name not in ("honest", "honest_again"):
                hidden.append(max(0.0, 1.0 - ratio))
            shown = f"{ratio:.2f}x the quicker honest copy" if ratio is not None else "-"
            why = "" if rec.get("status") == "passed" else f"  ({str(rec.get('reason'))[:110]})"
            print(f"  {name:10s} {str(rec.get('status')):8s} median {median or 0:.3g} s  {shown}{why}")
    if hidden:
        print(f"largest share hidden by a kernel that passed: {max(hidden):.1%} "
              f"(median over those records {statistics.median(hidden):.1%})")
    else:
        print("no hiding kernel passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
