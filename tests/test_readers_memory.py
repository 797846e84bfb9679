"""Peak memory of every command that reads result files stays within the bound docs/results.md states:
at most 10 x the input's size above the command's own footprint (measured here: what a warm process holds).

One subprocess imports everything and runs each command once on a small file (imports, plugins, matplotlib);
then each (command, input) runs in a fork of it, and the fork's peak resident set (``ru_maxrss`` from
``wait4``, which counts the pages the fork inherited) minus the parent's resident set at the fork is what
that command took for that input. Inputs put values as long as the reader accepts at the leaves that
readers copy per record, series or chart (reasons, names, hostnames, notes), in many records, plus samples
and a 50 MB string the reader refuses."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DECODE = ROOT / "results" / "cpu-amd-epyc-2c" / "decode-cpu.json"
GPU = ROOT / "results" / "gpu" / "serving-torch-decode-cuda-h200-20261130.json"

#: the backend --baseline divides by: the first of the long-strings records (absent elsewhere: exit 2, still read)
BASELINE = "b00000-" + "n" * 249
#: the bound of docs/results.md: growth above a warm process <= FACTOR x input bytes + SLACK
FACTOR = 10
SLACK = 100 * 2**20

PROBE = r"""
import json, os, sys, time
from click.testing import CliRunner
from kbench.cli import cli

jobs, warm = json.loads(sys.argv[1]), json.loads(sys.argv[2])
runner = CliRunner()
for args in warm:  # imports, plugins, matplotlib: the command's own footprint, before any input
    if args[0] == "resume-check":
        from kbench.plugins import get_plugin_manager
        from kbench.run.runner import resume_request
        resume_request(get_plugin_manager(), args[1])
    else:
        runner.invoke(cli, args)

def resident():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

out = []
for job in jobs:
    start = time.perf_counter()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        os.write(write, str(resident()).encode())  # the fork's own start: inherited anonymous pages, not libraries
        os.close(write)
        if job["args"][0] == "resume-check":  # what `run --resume` reads and checks before running anything
            from kbench.errors import BadInput
            from kbench.plugins import get_plugin_manager
            from kbench.run.runner import resume_request
            try:
                resume_request(get_plugin_manager(), job["args"][1])
                code = 0
            except BadInput:
                code = 2
        else:
            res = runner.invoke(cli, job["args"])
            code = res.exit_code if res.exception is None or isinstance(res.exception, SystemExit) else 99
            if code == 99:
                sys.stderr.write(repr(res.exception) + res.output[-2000:])
        os._exit(code)
    os.close(write)
    with os.fdopen(read) as fh:
        base = int(fh.read() or 0)
    _, status, usage = os.wait4(pid, 0)
    out.append({**job, "base": base, "peak": usage.ru_maxrss * 1024, "exit": os.waitstatus_to_exitcode(status),
                "seconds": time.perf_counter() - start})
print(json.dumps(out))
"""


def _records(data: dict, n: int, *, text: int, name: int, backends: int = 100) -> list[dict]:
    """``n`` passed records of ``backends`` backends (as many series as a report draws) over n / backends cases,
    every string a reader shows as long as accepted: the reason ``text`` characters, backend and case id
    ``name``."""
    template = next(r for r in data["records"] if r["status"] == "passed")
    out = []
    for i in range(n):
        rec = json.loads(json.dumps(template))
        rec["backend"] = f"b{i % backends:05d}-" + "n" * (name - 7)
        case = f"{template['case_id'][:-1]},k={i // backends}]"
        rec["case_id"] = case + "c" * (name - len(case))
        rec["reason"] = "r" * text
        rec["started"] = "2026-11-30T19:30:15+00:00"
        out.append(rec)
    return out


def inputs(tmp_path: Path, *, records: int, samples: int) -> dict[str, Path]:
    base = json.loads(DECODE.read_text())
    long = dict(base)
    long["machine"] = {**base["machine"], "hostname": "h" * 255, "cpu": "c" * 60_000}
    long["hardware"] = {**base["hardware"], "title": "t" * 1000, "notes": "n" * 60_000, "source": "s" * 60_000}
    long["suite"] = {**base["suite"], "data": {**base["suite"]["data"], "description": "d" * 60_000}}
    long["records"] = _records(base, records, text=60_000, name=256)
    heavy = dict(base)
    heavy["records"] = [dict(r, timing=dict(r["timing"], samples=[r["stats"]["median"] * (1 + k * 1e-7)
                                                                 for k in range(samples)]))
                        for r in base["records"][:2]]
    refused = dict(base, machine={**base["machine"], "hostname": "h" * 50_000_000})
    files = {}
    for name, data in (("long-strings", long), ("samples", heavy), ("refused-50MB-hostname", refused)):
        d = tmp_path / name
        d.mkdir()
        files[name] = d / f"{name}.json"
        files[name].write_text(json.dumps(data))
    return files


def commands(path: Path, tmp: Path, *, expensive: bool) -> list[list[str]]:
    p = str(path)
    out = [["show", p], ["compare", p, p], ["compare", p, "--baseline", BASELINE],
           ["plan", "-m", "llama-3.1-8b", "-w", "chat", "--hardware", "cpu", "--results", p],
           ["regressions", str(path.parent), "--no-cache"], ["resume-check", p]]
    if expensive:
        out += [["report", p, "-o", str(tmp / "r.html")], ["publish", str(path.parent), "-o", str(tmp / "site"),
                                                            "--no-cache"]]
    return out


def probe(tmp_path: Path, files: dict[str, Path], *, expensive: bool) -> list[dict]:
    small = str(DECODE)
    warm = [["show", small], ["compare", small, small], ["compare", small, "--baseline", "numpy-decode"],
            ["plan", "-m", "llama-3.1-8b", "-w", "chat", "--hardware", "cpu", "--results", small],
            ["regressions", str(DECODE.parent), "--no-cache"], ["resume-check", small]]
    if expensive:
        warm += [["report", small, "-o", str(tmp_path / "w.html")],
                 ["publish", str(DECODE.parent), "-o", str(tmp_path / "wsite"), "--no-cache"]]
    jobs = [{"input": name, "size": path.stat().st_size, "args": args}
            for name, path in files.items() for args in commands(path, tmp_path, expensive=expensive)
            if expensive or not name.startswith("refused") or args[0] in ("show", "regressions")]
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(jobs), json.dumps(warm)], capture_output=True,
                          text=True, cwd=ROOT, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def check(results: list[dict]) -> None:
    report = []
    for r in results:
        grew = r["peak"] - r["base"]
        report.append(f"{r['args'][0]:<12} {r['input']:<22} {r['size'] / 2**20:7.1f} MB in: +{grew / 2**20:7.1f} MB "
                      f"({grew / r['size']:.1f}x) over {r['base'] / 2**20:.0f} MB, exit {r['exit']}, "
                      f"{r['seconds']:.1f} s")
    print("\n".join(report))  # shown with -s: the figures docs/results.md quotes
    for r, line in zip(results, report):
        assert r["exit"] in (0, 1, 2), line
        assert r["peak"] - r["base"] <= FACTOR * r["size"] + SLACK, line
        if r["input"].startswith("refused"):
            assert r["exit"] == 2, line


def test_reader_commands_stay_within_the_memory_bound(tmp_path):
    check(probe(tmp_path, inputs(tmp_path, records=40, samples=5_000), expensive=False))


@pytest.mark.nightly
def test_every_reader_command_within_the_memory_bound_on_larger_inputs(tmp_path):
    check(probe(tmp_path, inputs(tmp_path, records=1000, samples=200_000), expensive=True))
