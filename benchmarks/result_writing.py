#!/usr/bin/env python3
"""Time spent writing result files, before (every record rewrites the whole file) and after (the journal).

Records are synthetic but shaped like a real GPU record (the fields of results/cpu-amd-epyc-2c/decode-cpu.json
with SAMPLES timed samples, ~70 KB of JSON at 3,000), written to a temporary directory on the same disk as
./results. Prints, for each run size N:
  * after: a real ResultWriter (kbench.results): N appends and finish, journal fsyncs and checkpoints included;
  * before: the writer as it was before the journal (kept below as FullRewriteWriter: each append validates
    the record with a freshly built validator and rewrites the whole file, indented, with fsync). Its k-th
    append costs a + b*k; a and b are fitted to appends timed at a few file sizes (rewriting 10,000 records
    10,000 times would take days), and the run's total is the sum over k;
  * the share of a realistic run's wall time (N records of RECORD_WALL seconds each: the 84 passed records of
    results/cpu-amd-epyc-2c/attention-20261129-183310.json took 53 s, 0.63 s each; a GPU record whose
    sampling stops at min_time=0.2 s is of that order) and the growth ratio (linear: N2/N1; quadratic: its square).
Then the result schema's validation of one file (load_result's check), before (a validator built per call)
and after (built once, $refs inlined, samples checked in bulk).

Usage: python benchmarks/result_writing.py [--records 1000 10000] [--samples 3000] [--record-wall 0.6]
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np

from kbench.outputs import atomic_write, hold_result_lock, release_result_lock
from kbench.results import (FORMAT, RESULT_VERSION, ResultWriter, _json_default, now_iso, result_schema, sanitize,
                            validate)

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "results/cpu-amd-epyc-2c/attention-20261129-183310.json"


def header() -> dict[str, Any]:
    return {"id": "bench", "machine": {"id": "bench-machine", "hostname": "bench"}, "hardware": None,
            "environment": {"kbench": "0", "python": "3.11"}, "device": "cuda",
            "suite": {"name": "bench", "path": None, "data": {"name": "bench"}}}


def realistic_record(i: int, rng: random.Random, samples: int) -> dict[str, Any]:
    """A passed GPU record: every field a real one has, SAMPLES timing samples around 70 us."""
    times = [7e-5 * (1 + 0.02 * rng.random()) for _ in range(samples)]
    med = sorted(times)[samples // 2]
    case = {"batch": 4, "seqlen_q": 512 * (1 + i % 8), "seqlen_kv": 512 * (1 + i % 8), "heads_q": 32,
            "heads_kv": 8, "head_dim": 128, "causal": bool(i % 2), "dtype": "bf16"}
    return {
        "backend": f"backend-{i % 7}", "op": "attention", "case_id": f"attention[{i}]", "case": case,
        "device": "cuda", "status": "passed", "reason": None, "started": now_iso(),
        "integrity": {"checks": ["harness", "threads", "timed_outputs", "fresh_inputs", "poisoned_output",
                                 "input_fingerprints", "no_aliasing", "late_writes", "degenerate_output", "roofline"],
                      "fresh_call": med * 1.04, "timed_median": med, "fresh_over_timed": 1.04,
                      "threads": {"python": 1, "native": 3}, "parent_wall": 0.6},
        "backend_info": {"flash_attn": "2.7.4", "tunables": {"block_m": 128, "block_n": 64}},
        "correctness": {"rel_l2": 2.1e-3, "bound": 1e-2, "seeds": 2, "rows_checked": 32,
                        "per_seed": [2.1e-3, 1.9e-3], "call_seconds": [0.01, 0.004]},
        "timing": {"samples": times, "stop_reason": "noise_target", "warmup_calls": 40, "warmup_time": 0.05,
                   "sampling_time": sum(times)},
        "stats": {"n": samples, "median": med, "min": min(times), "max": max(times), "mean": sum(times) / samples,
                  "std": 1e-6, "q1": med * 0.99, "q3": med * 1.01, "rel_spread": 0.02, "rel_se": 0.001,
                  "ci_low": med * 0.999, "ci_high": med * 1.001},
        "metrics": {"flops": 1.1e12, "bytes": 6.7e7, "intensity": 16000.0, "tflops": 610.0, "gbps": 950.0,
                    "hardware": "h200", "roof_basis": "datasheet", "bound": "compute", "roof_tflops": 989.0,
                    "roof_fraction": 0.62, "compute_fraction": 0.62, "bandwidth_fraction": 0.2,
                    "impossible": False, "footprint": 6.7e7},
        "telemetry": {"sm_clock_mhz": 1980, "temperature_c": 61, "power_w": 540.0, "throttle": []},
        "duration": 0.6, "worker_seconds": 0.6, "worker": {"pid": 1234, "sandbox": True, "starts": 1},
    }


class FullRewriteWriter:
    """ResultWriter as it was before the journal: each append validates the record (a validator built per
    call, $refs resolved per item) and rewrites the whole file (indented json.dump, fsync, rename)."""

    def __init__(self, path: Path, head: dict[str, Any], records: list[dict[str, Any]] = ()) -> None:
        self.path = Path(path)
        self.data = {"format": FORMAT, "version": RESULT_VERSION, **head, "complete": False, "records": list(records)}
        self.data.setdefault("created", now_iso())
        hold_result_lock(self.path)
        self.flush(full=True)

    def append(self, record: dict[str, Any]) -> None:
        record = sanitize(record)
        schema = {**result_schema()["$defs"]["record"], "$defs": result_schema()["$defs"]}
        error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(record))
        assert error is None, error
        self.data["records"].append(record)
        self.flush()

    def finish(self) -> None:
        self.data["complete"] = True
        self.flush(full=True)
        release_result_lock(self.path)

    def flush(self, *, full: bool = False) -> None:
        self.data["updated"] = now_iso()
        if full:
            error = jsonschema.exceptions.best_match(
                jsonschema.Draft202012Validator(result_schema()).iter_errors(self.data))
            assert error is None, error
        atomic_write(self.path, lambda fh: json.dump(self.data, fh, indent=1, allow_nan=False,
                                                     default=_json_default))


def time_after(n: int, records: list[dict[str, Any]], tmp: Path) -> tuple[float, int]:
    path = tmp / f"after-{n}.json"
    t0 = time.perf_counter()
    writer = ResultWriter(path, header())
    for i in range(n):
        writer.append(records[i % len(records)])
    writer.finish()
    elapsed = time.perf_counter() - t0
    size = path.stat().st_size
    path.unlink()
    return elapsed, size


def time_before_append(k: int, records: list[dict[str, Any]], tmp: Path) -> float:
    """The k-th append of the old writer: the file holds k-1 records and gets one more."""
    path = tmp / f"before-{k}.json"
    writer = FullRewriteWriter(path, header(), [sanitize(records[i % len(records)]) for i in range(k - 1)])
    t0 = time.perf_counter()
    writer.append(records[k % len(records)])
    elapsed = time.perf_counter() - t0
    release_result_lock(path)
    path.unlink()
    return elapsed


def time_validation(path: Path, repeats: int = 3) -> tuple[float, float]:
    data = json.loads(path.read_text())
    before, after = [], []
    validate(data)  # the validators are built on first use: once per process
    for _ in range(repeats):
        t0 = time.perf_counter()
        error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(result_schema()).iter_errors(data))
        before.append(time.perf_counter() - t0)
        assert error is None
        t0 = time.perf_counter()
        validate(data)
        after.append(time.perf_counter() - t0)
    return min(before), min(after)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, nargs="+", default=[1000, 10_000])
    ap.add_argument("--samples", type=int, default=3000, help="timing samples per record")
    ap.add_argument("--record-wall", type=float, default=0.6, help="seconds a realistic record takes to measure")
    ap.add_argument("--before-points", type=int, nargs="+", default=[1, 250, 500, 1000],
                    help="file sizes (records) at which the old writer's append is timed")
    args = ap.parse_args()

    rng = random.Random(0)
    distinct = [realistic_record(i, rng, args.samples) for i in range(50)]  # reused round-robin (memory)
    line = len(json.dumps(distinct[0], separators=(",", ":")))
    print(f"synthetic record: {args.samples} samples, {line / 1024:.0f} KB of JSON; realistic run: "
          f"{args.record_wall:g} s of measuring per record")
    tmp = Path(tempfile.mkdtemp(prefix=".bench-results-", dir=ROOT / "results"))
    try:
        print("\nbefore (whole-file rewrite per record), single appends timed:")
        points = []
        for k in args.before_points:
            points.append((k, time_before_append(k, distinct, tmp)))
            print(f"  append #{k:>6}: {points[-1][1] * 1e3:9.1f} ms")
        slope, intercept = np.polyfit([k for k, _ in points], [t for _, t in points], 1)
        print(f"  fit: {intercept * 1e3:.1f} ms + {slope * 1e3:.2f} ms x records in the file")

        print(f"\n{'records':>8} {'after s':>9} {'ms/rec':>7} {'file MB':>8} {'run share':>10} "
              f"{'before s (fit)':>15} {'run share':>10}")
        after_totals = {}
        for n in args.records:
            after, size = time_after(n, distinct, tmp)
            after_totals[n] = after
            before = n * intercept + slope * n * (n + 1) / 2
            wall = n * args.record_wall
            print(f"{n:>8} {after:>9.2f} {after / n * 1e3:>7.2f} {size / 1e6:>8.1f} {after / (wall + after):>10.2%} "
                  f"{before:>15.0f} {before / (wall + before):>10.2%}")
        if len(args.records) >= 2:
            n1, n2 = args.records[0], args.records[-1]
            print(f"\ngrowth {n1} -> {n2} records: after x{after_totals[n2] / after_totals[n1]:.1f} "
                  f"(linear: x{n2 / n1:g}, quadratic: x{(n2 / n1) ** 2:g})")

        if REFERENCE.exists():
            old, new = time_validation(REFERENCE)
            print(f"\nschema validation of {REFERENCE.relative_to(ROOT)} ({len(json.loads(REFERENCE.read_text())['records'])}"
                  f" records): before {old * 1e3:.0f} ms (validator built per call), after {new * 1e3:.0f} ms")
            heavy = {"format": FORMAT, "version": RESULT_VERSION, **header(), "created": now_iso(), "complete": True,
                     "records": [sanitize(r) for r in distinct[:20]]}
            heavy_path = tmp / "heavy.json"
            heavy_path.write_text(json.dumps(heavy))
            old, new = time_validation(heavy_path, repeats=1)
            print(f"schema validation of 20 records of {args.samples} samples: before {old * 1e3:.0f} ms, "
                  f"after {new * 1e3:.0f} ms")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
