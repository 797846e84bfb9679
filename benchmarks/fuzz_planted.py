"""The planted-bug corpus (tests/kernels/planted/) against ``kbench fuzz`` and the held-out shapes.

``python benchmarks/fuzz_planted.py find [--budget 90] [--seeds 1 2 3] [--kernels K ...]``: runs
``kbench fuzz -b KERNEL --budget B --seed S`` per planted kernel and seed (one process each, as a user would) and
prints a table: found or not, after how many seconds and cases, the minimal case.

``python benchmarks/fuzz_planted.py score [--evaluations 10] [--kernels K ...]``: scores each kernel with
``kbench.evaluators.score_kernel`` on tests/kernels/planted/pow2.yaml (a suite every one of them passes) with the
defaults, ``--evaluations`` times (a new held-out secret each call), and prints how often each scored 0 and the
held-out checks' share of the evaluation's wall time.

``python benchmarks/fuzz_planted.py table [--secrets 1000]``: the probability that the three held-out shapes of
one evaluation on pow2.yaml hit each bug class (docs/fuzz.md), computed by drawing the shapes with that many
secrets: a structural bug's failing domain is its predicate (:data:`DOMAINS`, each checked against the kernel on
the first ``--verify`` secrets' shapes), a value-range bug's is the kernel run against the float64 reference.

Timings on a shared machine are noisy: quote the load average beside them (printed).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLANTED = ROOT / "tests" / "kernels" / "planted"
POW2 = PLANTED / "pow2.yaml"


def kernels(names: list[str] | None) -> list[Path]:
    found = sorted(PLANTED.glob("*.py"))
    return [k for k in found if not names or k.stem in names]


def _pow2(n: int) -> bool:
    return n & (n - 1) == 0


#: where each structural planted bug is wrong (a case's parameters -> bool); value-range bugs are run instead
DOMAINS = {
    "tail_dropped": lambda p: p["seqlen_kv"] % 64 != 0,
    "causal_topleft": lambda p: p["causal"] and p["seqlen_q"] != p["seqlen_kv"],
    "gqa_wrong_head": lambda p: 1 < p["heads_kv"] < p["heads_q"],
    "pow2_only": lambda p: not _pow2(p["seqlen_kv"]),
    "head_dim_chunks": lambda p: p["head_dim"] % 32 != 0,
    "long_row_reset": lambda p: p["seqlen_kv"] > 1024,
    "split_2k_average": lambda p: p["seqlen_kv"] > 2048,
    "split_4k_dropped": lambda p: p["seqlen_kv"] > 4096,
    "mult16_overfit": lambda p: p["seqlen_kv"] % 16 == 0 and not _pow2(p["seqlen_kv"]),
    "odd_gqa": lambda p: p["heads_kv"] > 1 and not _pow2(p["heads_q"] // p["heads_kv"]),
    "head_dim_past_suite": lambda p: p["head_dim"] > 64 and p["head_dim"] % 64 != 0,
    "batch_past_suite": lambda p: p["batch"] > 2,
    "bf16_causal_positions": lambda p: (p["causal"] and p["dtype"] == "bf16" and p["seqlen_kv"] > 256),
}
#: bugs of the values, not the shape: their failing domain is found by running the kernel
RUN = ("no_max_fp16", "outlier_clamp", "bf16_causal_positions")


def find(args) -> None:
    rows = []
    out = Path(tempfile.mkdtemp(prefix="fuzz-planted-"))
    for kernel in kernels(args.kernels):
        for seed in args.seeds:
            report = out / f"{kernel.stem}-{seed}.json"
            start = time.monotonic()
            proc = subprocess.run([sys.executable, "-m", "kbench.cli", "fuzz", "-b", str(kernel), "--budget",
                                   str(args.budget), "--seed", str(seed), "-o", str(report)],
                                  capture_output=True, text=True)
            wall = time.monotonic() - start
            try:
                result = json.loads(report.read_text())["backends"][0]
            except (OSError, ValueError, KeyError, IndexError):
                rows.append((kernel.stem, seed, "ERROR", proc.stderr.strip()[-200:], "", "", f"{wall:.0f}"))
                continue
            failure = result["failure"]
            if failure is None:
                rows.append((kernel.stem, seed, "not found", "", result["checked"], "", f"{wall:.0f}"))
            else:
                rows.append((kernel.stem, seed, "found", f"{failure['found_after_seconds']:.1f}", result["checked"],
                             failure["case_id"], f"{wall:.0f}"))
            print(" | ".join(map(str, rows[-1])), flush=True)
    from tabulate import tabulate

    print(f"\nload average {open('/proc/loadavg').read().split()[:3]} (a shared machine: times are noisy)")
    print(tabulate(rows, headers=["kernel", "seed", "verdict", "found after (s)", "cases checked", "minimal case",
                                  "command (s)"], tablefmt="github"))
    found = sum(r[2] == "found" for r in rows)
    print(f"\nfound {found} of {len(rows)} (kernel, seed) runs within {args.budget:g} s each")


def score(args) -> None:
    from kbench.evaluators import score_kernel

    rows = []
    for kernel in kernels(args.kernels):
        zeros, by_held_out, walls, held, other = 0, 0, [], [], []
        for _ in range(args.evaluations):
            start = time.perf_counter()
            fit = score_kernel(str(kernel), suite=str(POW2))
            walls.append(time.perf_counter() - start)
            held.append((fit.held_out or {}).get("seconds", 0.0))
            zeros += fit.score == 0
            by_held_out += fit.score == 0 and "(held-out)" in fit.failures
            other += [why[:120] for case, why in fit.failures.items() if case != "(held-out)"]
        share = sum(held) / sum(walls)
        rows.append((kernel.stem, f"{zeros}/{args.evaluations}", f"{by_held_out}/{args.evaluations}",
                     f"{statistics.median(walls):.1f}", f"{100 * share:.0f}%", "; ".join(sorted(set(other)))[:200]))
        print(" | ".join(rows[-1]), flush=True)
    from tabulate import tabulate

    print(f"\nload average {open('/proc/loadavg').read().split()[:3]} (a shared machine: times are noisy)")
    print(tabulate(rows, headers=["kernel", "scored 0", "by a held-out shape", "median evaluation (s)",
                                  "held-out share of wall time", "other failures (not held-out)"],
                   tablefmt="github"))


def _run_kernel(module, op, case, seed) -> bool:
    """Whether the planted kernel ``module`` is wrong on ``case`` (its dtype's bound, NaN included)."""
    import numpy as np

    from kbench.ops.attention import attention_float64, softmax_scale

    x = op.make_inputs(case, seed)
    out = np.zeros(op.output_shape(case), dtype=x["q"].dtype)
    module.attention(x["q"], x["k"], x["v"], out, causal=case["causal"], scale=softmax_scale(case))
    got = out.astype(np.float64)
    if not np.isfinite(got).all():
        return True
    ref = attention_float64(x["q"], x["k"], x["v"], causal=case["causal"], scale=softmax_scale(case))
    return float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30)) > op.tolerance(case)


def table(args) -> None:
    import importlib.util

    from kbench.fuzz.heldout import held_out_cases
    from kbench.plugins import get_plugin_manager
    from kbench.suite import load_suite

    pm = get_plugin_manager()
    suite = load_suite(POW2)
    op = pm.registry.op("attention")
    cases = suite.plan("cpu", op).cases
    draws = [held_out_cases(op, cases, i.to_bytes(8, "little") * 4, 3) for i in range(args.secrets)]
    modules = {}
    for k in kernels(None):
        spec = importlib.util.spec_from_file_location(k.stem, k)
        modules[k.stem] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(modules[k.stem])
    rows = []
    for name, module in modules.items():
        runs = name in RUN
        n = min(args.secrets, args.run_secrets) if runs else args.secrets
        hits = 0
        for i, shapes in enumerate(draws[:n]):
            if runs:
                bad = [_run_kernel(module, op, c, (i, j)) for j, c in enumerate(shapes)]
            else:
                bad = [DOMAINS[name](c.params) for c in shapes]
                if i < args.verify:   # the predicate checked against the kernel itself
                    ran = [_run_kernel(module, op, c, (i, j)) for j, c in enumerate(shapes)]
                    if ran != bad:
                        print(f"warning: {name}'s predicate disagrees with the kernel on "
                              f"{[c.id for c in shapes]}: {bad} vs {ran}", file=sys.stderr)
            hits += any(bad)
        rows.append((name, f"{hits / n:.1%}", n, "run" if runs else "predicate"))
    from tabulate import tabulate

    print(tabulate(rows, headers=["planted kernel", "P(three held-out shapes hit it)", "secrets", "domain"],
                   tablefmt="github"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    f = sub.add_parser("find")
    f.add_argument("--budget", type=float, default=90.0)
    f.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    f.add_argument("--kernels", nargs="*")
    s = sub.add_parser("score")
    s.add_argument("--evaluations", type=int, default=10)
    s.add_argument("--kernels", nargs="*")
    t = sub.add_parser("table")
    t.add_argument("--secrets", type=int, default=1000)
    t.add_argument("--run-secrets", type=int, default=200)
    t.add_argument("--verify", type=int, default=20)
    args = ap.parse_args()
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    {"find": find, "score": score, "table": table}[args.what](args)


if __name__ == "__main__":
    main()
