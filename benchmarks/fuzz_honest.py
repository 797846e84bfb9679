"""Fuzz every honest CPU backend with the value ranges and long rows (kbench fuzz's default space); goal: 0 failures.

``python benchmarks/fuzz_honest.py [--budget 300] [--seed 36] [--backends numpy ...]`` runs
``kbench fuzz -b BACKEND --budget B --seed S`` (forward, and the backward where the backend declares it; decode
contiguous and paged; varlen) one backend after the other, and prints per backend the cases checked, skipped
and passed over, how many had long rows (past 320 keys; past 2,048 for decode) and a value range other than
``unit``, and the failure if any (its minimal case, reason and repro line). The machine's load average is printed
beside the table: on a shared machine fewer cases fit in the budget.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: the backends of the CPU device that kbench ships, one per op family
HONEST = ("numpy", "torch-sdpa", "numpy-flash", "numpy-decode", "torch-decode", "numpy-varlen", "torch-sdpa-varlen")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget", type=float, default=300.0, help="seconds of fuzzing per backend")
    ap.add_argument("--seed", type=int, default=36)
    ap.add_argument("--backends", nargs="*", default=list(HONEST))
    args = ap.parse_args()
    from tabulate import tabulate

    out = Path(tempfile.mkdtemp(prefix="fuzz-honest-"))
    rows, failures = [], 0
    for backend in args.backends:
        report = out / f"{backend}.json"
        log = out / f"{backend}.cases"
        start = time.monotonic()
        proc = subprocess.run([sys.executable, "-c", _DRIVER, backend, str(args.budget), str(args.seed), str(report),
                               str(log)], capture_output=True, text=True)
        wall = time.monotonic() - start
        try:
            entry = json.loads(report.read_text())
        except (OSError, ValueError):
            rows.append((backend, "ERROR", "", "", "", "", proc.stderr.strip()[-300:]))
            failures += 1
            continue
        cases = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        long = sum(c["long"] for c in cases)
        ranged = sum(c["values"] != "unit" for c in cases)
        failure = entry["failure"]
        failures += failure is not None
        what = "none" if failure is None else (f"{failure['case_id']}: {failure['reason'][:160]} "
                                               f"(repro: {entry['repro']})")
        rows.append((backend, entry["checked"], entry["skipped"], entry["passed_over"], long, ranged, what))
        print(" | ".join(map(str, rows[-1])), f"({wall:.0f} s)", flush=True)
    print(f"\nload average {open('/proc/loadavg').read().split()[:3]}; budget {args.budget:g} s per backend, "
          f"seed {args.seed} (a shared machine: fewer cases fit)")
    print(tabulate(rows, headers=["backend", "checked", "skipped", "passed over", "long rows", "value range",
                                  "failure"], tablefmt="github"))
    print(f"\n{failures} failure(s)")
    sys.exit(1 if failures else 0)


#: one backend's fuzz in a process of its own, every checked case logged (whether it had long rows, its range)
_DRIVER = r"""
import json, sys
from kbench.fuzz.checker import Checker
from kbench.fuzz.engine import fuzz, fuzz_secret, write_repro
from kbench.fuzz.space import MAX_CACHE, MAX_LEN, Space, DEFAULT_DTYPES
from kbench.plugins import get_plugin_manager

name, budget, seed, report, log = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
pm = get_plugin_manager()
backend = pm.registry.resolve(name)
op = pm.registry.op(backend.op)
space = Space(backend.op, DEFAULT_DTYPES, frozenset(getattr(backend, "features", ()) or ()))
edge = MAX_CACHE if backend.op == "decode_attention" else MAX_LEN
with open(log, "w") as fh:
    def on_case(case_id, record):
        case = record.get("case") or {}
        kv = case.get("seqlen_kv") or max(op.lengths(op.make_case(case))[1], default=0)
        fh.write(json.dumps({"long": kv > edge, "values": case.get("values", "unit")}) + "\n")
    with Checker(pm, backend.op, "cpu", secret=fuzz_secret(seed)) as checker:
        result = fuzz(backend, checker, space, budget=budget, seed=seed, on_case=on_case)
if result.failure is not None:
    import pathlib
    write_repro(result, pathlib.Path(report).parent)
open(report, "w").write(json.dumps(result.to_json()))
"""


if __name__ == "__main__":
    main()
