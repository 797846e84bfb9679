"""Load time of big suites: a 10,000-case suite (two shapes of it) and a 5 MB suite.

Prints, per suite, the median of REPEATS timings of
  parse   the YAML file to data + line map: the former loader (yaml.compose + yaml.safe_load,
          pure Python, parsed twice; taken from git at BEFORE) and today's (libyaml, parsed once);
  load    today's load_suite: parse + JSON Schema validation;
  plan    today's Suite.plan for the CPU: case-count check + grid expansion into cases.
The old loader is run from its source in git so both are measured side by side in one process.

    python benchmarks/suite_load.py [--repeats 3] [--before bf4d066]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kbench.plugins import PluginManager  # noqa: E402
from kbench.suite import load_suite  # noqa: E402
from kbench.yamlsource import USES_LIBYAML, load_yaml  # noqa: E402


def old_loader(commit: str):
    """``load_yaml`` as it was at ``commit`` (None when git or the commit is unavailable)."""
    try:
        source = subprocess.run(["git", "show", f"{commit}:kbench/yamlsource.py"], cwd=ROOT, capture_output=True,
                                text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    module = types.ModuleType("old_yamlsource")
    exec(compile(source, f"{commit}:kbench/yamlsource.py", "exec"), module.__dict__)  # noqa: S102 - our own file
    return module.load_yaml


HEAD = "name: big\nop: attention\ncheck: {seeds: 1}\ntiming: {max_time: 0.1}\n"


def product_suite() -> str:
    """10,000 cases as a cartesian product of four axes of 10 values (a few lines)."""
    return HEAD + ("grid:\n  - seqlen: [" + ", ".join(str(16 * i) for i in range(1, 11)) + "]\n"
                   "    batch: [" + ", ".join(map(str, range(1, 11))) + "]\n"
                   "    heads: [" + ", ".join(map(str, range(1, 11))) + "]\n"
                   "    head_dim: [" + ", ".join(str(8 * i) for i in range(1, 11)) + "]\n    dtype: fp32\n")


def listed_suite(cases: int) -> str:
    """``cases`` grid entries written out one by one, each a distinct case (how a generated suite looks)."""
    lines = [HEAD, "grid:\n"]
    for i in range(cases):
        lines.append(f"  - {{batch: {1 + i % 8}, seqlen: {16 + i // 8}, heads: {1 + i % 4}, head_dim: 64, "
                     f"causal: {'true' if i % 2 else 'false'}, dtype: fp32}}\n")
    return "".join(lines)


def listed_suite_of_size(megabytes: float) -> tuple[str, int]:
    per = len(listed_suite(1000)) - len(HEAD) - len("grid:\n")
    cases = int(megabytes * 1e6 * 1000 / per)
    return listed_suite(cases), cases


def median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--before", default="bf4d066",
                    help="a commit with the former loader (yaml.compose + yaml.safe_load)")
    args = ap.parse_args()
    old = old_loader(args.before)
    op = PluginManager().registry.op("attention")
    five_mb, five_mb_cases = listed_suite_of_size(5)
    suites = [("10,000 cases, 4 axes of 10", product_suite(), 10_000),
              ("10,000 cases listed", listed_suite(10_000), 10_000),
              (f"5 MB, {five_mb_cases:,} cases listed", five_mb, five_mb_cases)]
    print(f"libyaml: {USES_LIBYAML}; median of {args.repeats}; seconds", flush=True)
    print(f"{'suite':<34} {'bytes':>10} {'parse before':>13} {'parse now':>10} {'ratio':>6} {'load now':>9} "
          f"{'plan now':>9}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for title, text, cases in suites:
            path = Path(tmp) / "suite.yaml"
            path.write_text(text)
            before = median_seconds(lambda: old(path), args.repeats) if old else float("nan")
            now = median_seconds(lambda: load_yaml(path), args.repeats)
            load = median_seconds(lambda: load_suite(path), args.repeats)
            suite = load_suite(path)
            plan = median_seconds(lambda: suite.plan("cpu", op), args.repeats)
            assert len(suite.plan("cpu", op).cases) == cases
            print(f"{title:<34} {len(text):>10,} {before:>13.3f} {now:>10.3f} {before / now:>5.1f}x {load:>9.3f} "
                  f"{plan:>9.3f}", flush=True)


if __name__ == "__main__":
    main()
