"""ShinkaEvolve's evaluation program, answered by kbench.

ShinkaEvolve (``pip install kbench[shinka]``) evaluates a candidate by running a program of the user's,
``python evaluate.py --program_path CANDIDATE --results_dir DIR`` (plus the job config's ``extra_cmd_args``
as ``--key value``), and reads ``DIR/metrics.json`` (``combined_score``, ``public``, ``private``,
``text_feedback``) and ``DIR/correct.json`` (``correct``, ``error``). This module is such a program::

    python -m kbench.evaluators.shinka --program_path cand.py --results_dir out --suite suite.yaml --baseline numpy-flash

It never imports the candidate (ShinkaEvolve's own ``run_shinka_eval`` would, in the evaluating process):
the candidate runs as an untrusted kernel file through :func:`kbench.evaluators.score_kernel`.
Exit status 0 when the files were written (whatever the score), 1 when the harness could not measure.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Sequence

from kbench.evaluators import EnvironmentFailure, Fitness, score_kernel


def shinka_files(fit: Fitness) -> tuple[dict[str, Any], dict[str, Any]]:
    """(metrics.json, correct.json) as ShinkaEvolve reads them."""
    public = fit.metrics()
    public.pop("combined_score")
    public.update({f"tflops[{case}]": c["tflops"] for case, c in fit.cases.items() if c.get("tflops")})
    metrics = {"combined_score": float(fit.score), "public": public,
               "private": {"result_file": fit.result_file, "score_kind": fit.score_kind, "backend": fit.backend},
               "text_feedback": fit.feedback()}
    error = None if fit.correct else "; ".join(f"{c}: {why}" for c, why in fit.failures.items()) or "no case ran"
    return metrics, {"correct": bool(fit.correct), "error": error}


def write_results(results_dir: str | Path, metrics: dict[str, Any], correct: dict[str, Any]) -> None:
    from kbench.outputs import atomic_write

    out = Path(results_dir)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "metrics.json", lambda fh: fh.write(json.dumps(metrics, indent=2)))
    atomic_write(out / "correct.json", lambda fh: fh.write(json.dumps(correct, indent=2)))


def parser(default_suite: str | None = None, default_baseline: str | None = None) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m kbench.evaluators.shinka",
                                 description="Score a candidate kernel file with kbench, for ShinkaEvolve.")
    ap.add_argument("--program_path", required=True, help="the candidate kernel file")
    ap.add_argument("--results_dir", required=True, help="where metrics.json and correct.json go")
    ap.add_argument("--suite", default=default_suite, required=default_suite is None, help="the suite file")
    ap.add_argument("--baseline", default=default_baseline,
                    help="a registered backend measured in the same run: the score is the speedup over it")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--keyword", default=None, help="-k expression over case ids")
    ap.add_argument("--keep_results", default=None, metavar="DIR", help="keep kbench's result files under DIR")
    ap.add_argument("--allow_unsandboxed", action="store_true",
                    help="where the OS sandbox does not work, run the candidate without it (docs/sandbox.md)")
    ap.add_argument("--held_out", type=int, default=None, metavar="N",
                    help="held-out shapes near the suite's checked per candidate (default 3; 0 for none; docs/fuzz.md)")
    ap.add_argument("--show_held_out", action="store_true",
                    help="name a failing held-out shape in the feedback (hidden by default)")
    return ap


def main(argv: Sequence[str] | None = None, *, default_suite: str | None = None,
         default_baseline: str | None = None) -> int:
    args = parser(default_suite, default_baseline).parse_args(argv)
    try:
        fit = score_kernel(args.program_path, suite=args.suite, baseline=args.baseline, device=args.device,
                           keyword=args.keyword, results_dir=args.keep_results,
                           allow_unsandboxed=args.allow_unsandboxed, held_out=args.held_out,
                           show_held_out=args.show_held_out)
    except EnvironmentFailure as exc:
        write_results(args.results_dir, {"combined_score": 0.0, "public": {}, "private": {},
                                         "text_feedback": f"kbench could not measure: {exc.message}"},
                      {"correct": False, "error": f"kbench could not measure (not the candidate's fault): {exc.message}"})
        print(f"kbench: {exc.format()}", file=sys.stderr)
        return 1
    metrics, correct = shinka_files(fit)
    write_results(args.results_dir, metrics, correct)
    print(fit.feedback())
    return 0


if __name__ == "__main__":
    sys.exit(main())
