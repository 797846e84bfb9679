"""`kbench plan` beside NVIDIA's aiconfigurator on the validation grid (docs/plan.md, "Validation").

    python benchmarks/plan_aiconfigurator.py                 # kbench plan vs the recorded aiconfigurator answers
    python benchmarks/plan_aiconfigurator.py --aiconfigurator  # re-run aiconfigurator too (30-120 s a scenario)
    python benchmarks/plan_aiconfigurator.py --json out.json --scenario 70b-h200-8k

Prints a markdown table: best output tokens/s per GPU at the SLO per mode, TTFT, TPOT, parallelism, the
verdict, and the summary the target is judged on (within +-20% in at least 80% of scenarios, the same verdict
wherever aiconfigurator's margin exceeds 10%).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kbench.plan.validation import (GRID, HELD_OUT, RECORDED, Row, aiconfigurator_missing,  # noqa: E402
                                    recorded, run_aiconfigurator, run_kbench_json)


def _cell(entry, key="tokens_s_gpu", scale=1.0, fmt="{:.0f}") -> str:
    if not entry or entry.get(key) is None:
        return "-"
    return fmt.format(entry[key] * scale)


def _like(like, row, ratios) -> str:
    """kbench's figure under aiconfigurator's definitions (--like aiconfigurator), per mode, and its best over
    aiconfigurator's best."""
    tok = {m: (e or {}).get("tokens_s_gpu") for m, e in like.items()}
    best = max((v for v in tok.values() if v), default=None)
    if best is None:
        return "-"
    ratios.append(best / row.best("aic")[1])
    cells = " / ".join("-" if not tok.get(m) else f"{tok[m]:.0f}" for m in ("agg", "disagg"))
    return f"{cells} ({ratios[-1]:.2f})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--aiconfigurator", action="store_true", help="re-run aiconfigurator instead of its recorded answers")
    ap.add_argument("--scenario", action="append", help="only these scenarios (names in kbench/plan/validation.py)")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--held-out", action="store_true", help="the held-out scenarios instead of the grid")
    args = ap.parse_args()
    if args.aiconfigurator and aiconfigurator_missing():
        print(aiconfigurator_missing(), file=sys.stderr)
        return 2
    rows, likes = [], []
    for sc in HELD_OUT if args.held_out else GRID:
        if args.scenario and sc.name not in args.scenario:
            continue
        if not args.aiconfigurator and sc.name not in RECORDED:
            print(f"{sc.name}: no recorded aiconfigurator answer (run with --aiconfigurator)", file=sys.stderr)
            continue
        t0 = time.time()
        aic = run_aiconfigurator(sc) if args.aiconfigurator else recorded(sc.name)
        t1 = time.time()
        kb, data = run_kbench_json(sc, ["--like", "aiconfigurator"])
        t2 = time.time()
        rows.append(Row(sc, aic, kb))
        likes.append(data.get("like_aiconfigurator") or {})
        print(f"{sc.name}: aiconfigurator {t1 - t0:.0f} s, kbench plan {t2 - t1:.1f} s", file=sys.stderr)
    print("| scenario | aic agg tok/s/GPU | kbench agg | aic disagg | kbench disagg | ratio | aic TTFT / TPOT | "
          "kbench TTFT p50/p90 / TPOT p50/p90 | aic parallel | kbench parallel | verdict aic / kbench (aic margin) | "
          "kbench like aic agg / disagg (ratio) |")
    print("| --- " * 12 + "|")
    like_ratios = []
    for r, like in zip(rows, likes):
        am, _ = r.best("aic")
        km, _ = r.best("kbench")
        a, k = r.aic.get(am) or {}, r.kbench.get(km) or {}
        print(f"| {r.scenario.name} | {_cell(r.aic.get('agg'))} | {_cell(r.kbench.get('agg'))} | "
              f"{_cell(r.aic.get('disagg'))} | {_cell(r.kbench.get('disagg'))} | {r.ratio:.2f} | "
              f"{_cell(a, 'ttft_s', fmt='{:.2f}')} s / {_cell(a, 'tpot_s', 1e3, '{:.1f}')} ms | "
              f"{_cell(k, 'ttft_s', fmt='{:.2f}')}/{_cell(k, 'ttft_p90_s', fmt='{:.2f}')} s / "
              f"{_cell(k, 'tpot_s', 1e3, '{:.1f}')}/{_cell(k, 'tpot_p90_s', 1e3, '{:.1f}')} ms | "
              f"{a.get('parallel', '-')} bs {a.get('batch', '-')} | {k.get('parallel', '-')} bs {k.get('batch', '-')} | "
              f"{am} / {km} ({100 * r.aic_margin:.0f}%) | {_like(like, r, like_ratios)} |")
    within = sum(r.within for r in rows)
    within15 = sum(abs(r.ratio - 1) <= 0.15 for r in rows)
    print(f"\nwithin +-15%: {within15} of {len(rows)}; like-for-like (aiconfigurator's definitions) within +-20%: "
          f"{sum(abs(x - 1) <= 0.2 for x in like_ratios)} of {len(like_ratios)}")
    needed = [r for r in rows if r.verdict_required]
    print(f"\nwithin +-20%: {within} of {len(rows)}; same verdict where aiconfigurator's margin > 10%: "
          f"{sum(r.same_verdict for r in needed)} of {len(needed)}; same verdict overall: "
          f"{sum(r.same_verdict for r in rows)} of {len(rows)}")
    if args.json:
        Path(args.json).write_text(json.dumps([{"scenario": r.scenario.name, "aiconfigurator": r.aic,
                                                "kbench": r.kbench, "ratio": r.ratio} for r in rows], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
