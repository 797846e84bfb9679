#!/usr/bin/env python3
"""Is the A/B gate right on a busy machine? And does `regressions --fail` name the slowed backend, not its controls?

Part 1, ``kbench ab``: each try is one A/B run of suites/smoke.yaml (10 cases, ``--rounds`` rounds) through the
code of ``kbench ab`` (kbench.ab.run_sides, kbench.ab.judge), with four sides: OLD, a NumPy attention kernel file;
``same``, a copy of it (same code); ``x1.10`` and ``x1.25``, the same kernel with each call stretched by a busy
wait to 1.10 and 1.25 times its duration. Each NEW side is judged against OLD as ``kbench ab OLD NEW
--fail-on-regression`` judges it. Printed per load: how often the gate fails (exit 1) for each NEW, and how many
case pairs it calls slower. ``same`` failing the gate, or a ``same`` case called slower, is a false alarm.
Loads: idle (what else runs on the machine), and beside ``--busy`` (2) busy loops. The load average is printed
beside every try.

Part 2, ``kbench regressions --fail``: ``--histories`` generated histories (3 backends x 4 cases, 12 runs, the
noise of tests/history_synthetic.py: within-run spread, a slow tail, run-to-run jitter; slow windows of the
machine slow 3-6 records measured one after another 1.3-1.8x (fewer at the end of a run), in 5% of the runs
"idle" and 60% "loaded") whose
newest run holds ``numpy-flash`` 1.3x slower on every case, beside the unchanged ``numpy`` and ``torch-sdpa``.
Each history is judged by the CLI (``kbench regressions DIR --fail``); printed: how often the slowed backend is
named, and how often an unchanged control is.

Usage: python benchmarks/ab_gate.py [--tries 10] [--rounds 10] [--busy 2] [--histories 100] [--threshold 2%]
                                   [--skip-ab] [--skip-regressions]
       python benchmarks/ab_gate.py --analyse DIR     (judge the A/B runs a run left in DIR again)
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

KERNEL = '''"""Attention with NumPy, a head at a time; each call stretched to STRETCH times its duration."""
import time

import numpy as np

SUBSTRATE = "numpy"
OP = "attention"
NAME = "attn"
STRETCH = {stretch}


def attention(q, k, v, out, *, causal, scale):
    start = time.perf_counter()
    batch, sq, hq, _ = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    group = hq // hkv
    for b in range(batch):
        for h in range(hq):
            s = (q[b, :, h].astype(np.float32) @ k[b, :, h // group].astype(np.float32).T) * np.float32(scale)
            if causal:
                s = np.where(np.arange(sk)[None, :] <= np.arange(sq)[:, None] + (sk - sq), s, -np.inf)
            m = s.max(axis=1, keepdims=True)
            p = np.exp(s - np.where(np.isfinite(m), m, 0))
            d = p.sum(axis=1, keepdims=True)
            out[b, :, h] = (p @ v[b, :, h // group].astype(np.float32)) / np.where(d > 0, d, 1)
    until = start + STRETCH * (time.perf_counter() - start)
    while time.perf_counter() < until:
        pass
'''

SIDES = (("old", 1.0), ("same", 1.0), ("x1.10", 1.10), ("x1.25", 1.25))


def loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "?"


def ab_part(tries: int, rounds: int, busy: int) -> None:
    from kbench.ab import judge, run_sides
    from kbench.compare import group_key_for
    from kbench.plugins import get_plugin_manager
    from kbench.suite import load_suite
    from kbench.threads import apply_threads

    apply_threads(None)
    pm = get_plugin_manager()
    suite = load_suite(ROOT / "suites" / "smoke.yaml")
    key = group_key_for(pm.registry)
    work = Path(tempfile.mkdtemp(prefix="kbench-ab-gate-"))
    print(f"A/B result files in {work} (python benchmarks/ab_gate.py --analyse {work})")
    specs = []
    for label, stretch in SIDES:
        path = work / f"{label.replace('.', '_')}.py"
        path.write_text(KERNEL.format(stretch=stretch))
        specs.append((label, str(path)))
    for loops in (0, busy) if busy else (0,):
        procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(loops)]
        gate = {label: 0 for label, _ in SIDES[1:]}
        cases = {label: [0, 0] for label, _ in SIDES[1:]}  # slower, judged
        loads = []
        try:
            if loops:
                time.sleep(5)  # the loops' load shows in the 1-minute average
            for t in range(tries):
                loads.append(loadavg())
                t0 = time.perf_counter()
                run = run_sides(pm, suite, specs, rounds=rounds, output=work / f"ab-{loops}-{t}.json", force=True)
                took = time.perf_counter() - t0
                line = []
                for side in run.sides[1:]:
                    v = judge(run.records, run.old.backend.name, side.backend.name, key)
                    gate[side.label] += bool(v.regressed)
                    cases[side.label][0] += sum(c.verdict == "slower" for c in v.cases)
                    cases[side.label][1] += len(v.cases)
                    ov = v.overall.interval if v.overall else None
                    line.append(f"{side.label} {'FAIL' if v.regressed else 'pass'}"
                                + (f" x{ov.ratio:.3f}" if ov else ""))
                print(f"  busy loops {loops}, try {t + 1}: {took:.0f} s, load average {loads[-1]}; "
                      + "; ".join(line), flush=True)
        finally:
            for p in procs:
                p.kill()
                p.wait()
        print(f"A/B gate, {loops} busy loops beside it, load average {min(loads)}..{max(loads)} "
              f"({tries} runs of {rounds} rounds):")
        for label, _ in SIDES[1:]:
            slower, judged = cases[label]
            what = "false alarms" if label == "same" else "caught"
            print(f"  {label:6s} gate failed {gate[label]}/{tries} ({what}); cases called slower {slower}/{judged}")


def analyse(directory: Path) -> None:
    """Judge the A/B runs a part-1 run left in ``directory`` (ab-LOOPS-TRY.json) again, per load: the gate's
    failures split into a timing verdict (a case, group or all cases slower) and a record that failed its
    checks on NEW's side where OLD's passed (the judge's integrity checks: not a timing verdict)."""
    from kbench.ab import FAILING, SLOWER, judge
    from kbench.compare import group_key_for
    from kbench.plugins import get_plugin_manager
    from kbench.record import records_of
    from kbench.results import load_result

    key = group_key_for(get_plugin_manager().registry)
    files = sorted(directory.glob("ab-*.json"))
    for loops in sorted({f.stem.split("-")[1] for f in files}):
        runs = [f for f in files if f.stem.split("-")[1] == loops]
        print(f"{len(runs)} A/B runs with {loops} busy loops beside them (judged again from {directory}):")
        for label, _ in SIDES[1:]:
            timing = failing = slower_cases = judged = 0
            for f in runs:
                recs = records_of(load_result(f))
                v = judge(recs, "old:attn", f"{label}:attn", key)
                timing += any(c.verdict == SLOWER for c in v.cases) or any(
                    g.verdict == SLOWER for g in v.groups + ([v.overall] if v.overall else []))
                failing += any(c.verdict == FAILING for c in v.cases)
                slower_cases += sum(c.verdict == SLOWER for c in v.cases)
                judged += len(v.cases)
            print(f"  {label:6s} gate failed on timing {timing}/{len(runs)}, on a failing record {failing}/{len(runs)}; "
                  f"cases slower {slower_cases}/{judged}")


def write_history(directory: Path, rng, *, p_window: float, slowed: str, factor: float, runs: int = 12) -> None:
    """``runs`` result files (3 backends x 4 cases each, case-major as kbench measures them) of one machine; in
    a run, with probability ``p_window``, a slow window of the machine slows 3-6 consecutive records 1.3-1.8x;
    the newest run holds ``slowed`` ``factor`` times slower on every case."""
    import datetime as _dt

    import history_synthetic
    import numpy as np
    from history_synthetic import fake_commit, run_samples
    from synthetic_results import CPU_MACHINE, record, result

    # the slow windows are drawn here, over records measured one after another (a window lasts about a second:
    # several records of the smoke suite), never one record alone at random as run_samples would draw them
    history_synthetic.P_SLOW_WINDOW = 0.0

    backends = ("numpy", "numpy-flash", "torch-sdpa")
    cases = [{"batch": 1, "seqlen_q": 32 * (c + 1), "seqlen_kv": 32 * (c + 1), "heads_q": 4, "heads_kv": 4,
              "head_dim": 32, "causal": False, "dtype": "fp32"} for c in range(4)]
    base = {(b, c): rng.uniform(50e-6, 5e-3) for b in backends for c in range(len(cases))}
    start = _dt.datetime(2026, 10, 1, tzinfo=_dt.timezone.utc)
    (directory / CPU_MACHINE["id"]).mkdir(parents=True, exist_ok=True)
    for run in range(runs):
        order = [(c, b) for c in range(len(cases)) for b in backends]
        slow = np.ones(len(order))
        if rng.random() < p_window:
            first, width = int(rng.integers(0, len(order))), int(rng.integers(3, 7))
            slow[first:first + width] = rng.uniform(1.3, 1.8)
        recs = []
        for k, (c, b) in enumerate(order):
            level = base[(b, c)] * slow[k] * (factor if (run == runs - 1 and b == slowed) else 1.0)
            recs.append(record(b, cases[c], run_samples(rng, level)))
        data = result(recs, machine=dict(CPU_MACHINE), name=f"attention-{run:04d}")
        created = start + _dt.timedelta(days=run)
        data["created"] = created.isoformat()
        data["environment"] = {"kbench": "0.1.0", "python": "3.11.7", "git_commit": fake_commit(run),
                               "numpy": "2.4.6"}
        data["suite"]["name"] = "attention"
        (directory / CPU_MACHINE["id"] / f"attention-{run:04d}.json").write_text(json.dumps(data))


def regressions_part(histories: int, threshold: str) -> None:
    import numpy as np
    from click.testing import CliRunner

    from kbench.cli import cli

    runner = CliRunner()
    for name, p_window in (("idle", 0.05), ("loaded", 0.6)):
        named = {"numpy-flash": 0, "numpy": 0, "torch-sdpa": 0}
        failed = any_control = 0
        for h in range(histories):
            rng = np.random.default_rng(1000 * h + int(p_window * 100))
            with tempfile.TemporaryDirectory() as tmp:
                write_history(Path(tmp), rng, p_window=p_window, slowed="numpy-flash", factor=1.3)
                res = runner.invoke(cli, ["regressions", tmp, "--fail", "--no-cache", "-j", "1", "--threshold",
                                            threshold])
            failed += res.exit_code == 1
            message = res.stderr if hasattr(res, "stderr") else res.output
            said = f" {message.split(':', 1)[-1].replace(',', ' ')} "
            for b in named:
                named[b] += f" {b} " in said
            any_control += any(f" {b} " in said for b in ("numpy", "torch-sdpa"))
        print(f"regressions --fail --threshold {threshold}, {histories} generated histories, {name} (slow windows in "
              f"{100 * p_window:g}% of runs), numpy-flash 1.3x slower in the newest run: failed {failed}/{histories}; "
              f"slowed named {named['numpy-flash']}/{histories}; an unchanged control named {any_control}/{histories} "
              f"(numpy {named['numpy']}, torch-sdpa {named['torch-sdpa']})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tries", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--busy", type=int, default=2)
    ap.add_argument("--histories", type=int, default=100)
    ap.add_argument("--threshold", default="2%", help="regressions --threshold (default 2%%, its default)")
    ap.add_argument("--analyse", type=Path, metavar="DIR", help="judge the A/B runs left in DIR again, and stop")
    ap.add_argument("--skip-ab", action="store_true")
    ap.add_argument("--skip-regressions", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    if args.analyse:
        analyse(args.analyse)
        return
    print(f"load average at start {loadavg()} ({os.cpu_count()} CPUs; a shared machine: other work runs beside)")
    if not args.skip_regressions:
        regressions_part(args.histories, args.threshold)
    if not args.skip_ab:
        ab_part(args.tries, args.rounds, args.busy)


if __name__ == "__main__":
    main()
