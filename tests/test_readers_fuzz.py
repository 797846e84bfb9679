"""Mutated real result files x every command that reads them: each answer is the command's output or one clean
message (exit 2, naming the file), never a traceback or a hang.

Every leaf of two committed result files (the CPU reference run cut to a few records, and the GPU serving run)
is replaced by values of other types, deleted, nested, lengthened. The reader refuses most of them at once, with
the message form it always uses; the ones it accepts go through show, compare (two runs, and --baseline),
plan --results, regressions, publish, report and --resume, in process (click's CliRunner). The default tier
takes a deterministic sample (~1/29) through the cheap commands and a few through the expensive ones;
``-m slow`` takes every mutation (~6,000) through the reader and the history commands, a fifth of the accepted
ones through show and compare, 200 through report and --resume."""
from __future__ import annotations

import copy
import itertools
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kbench.cli import cli
from kbench.errors import BadInput
from kbench.results import load_result

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [ROOT / "results" / "cpu-amd-epyc-2c" / "attention-20261129-183310.json",
           ROOT / "results" / "gpu" / "serving-torch-decode-cuda-h200-20261130.json"]


def _base(path: Path, per_status: int = 2) -> dict:
    data = json.loads(path.read_text())
    by_status: dict[str, list] = {}
    for rec in data["records"]:
        by_status.setdefault(rec["status"], []).append(rec)
    data["records"] = [r for recs in by_status.values() for r in recs[:per_status]]
    for rec in data["records"]:  # a few samples keep compare's bootstrap cheap; the shape is what is fuzzed
        if rec.get("timing"):
            rec["timing"]["samples"] = rec["timing"]["samples"][:12]
    return data


BASES = [_base(p) for p in SOURCES]

VALUES = {"null": None, "true": True, "negative": -1, "zero": 0, "huge": 1e308, "text": "x", "empty": "",
          "list": [], "object": {}, "list-of-null": [None], "long-text": "s" * 70_000}
HOW = [*VALUES, "delete", "nest", "repeat"]


def leaf_paths(obj, path=()):
    yield path
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from leaf_paths(v, path + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:3]):  # three items of an array (samples) stand for all
            yield from leaf_paths(v, path + (i,))


def _pattern(data, path) -> tuple:
    """A path with array indices generalised, except the record's status, so each kind of record is fuzzed."""
    out = []
    for i, part in enumerate(path):
        if isinstance(part, int) and path[:i] == ("records",):
            out.append(data["records"][part]["status"])
        elif isinstance(part, int):
            out.append("*")
        elif out[:1] == ["suite"] and len(out) > 2:  # the suite inside a result: its own fuzzing (test_fuzz)
            return tuple(out)
        else:
            out.append(part)
    return tuple(out)


def _paths(data) -> list[tuple]:
    seen, out = set(), []
    for p in leaf_paths(data):
        key = _pattern(data, p)
        if p and key not in seen:
            seen.add(key)
            out.append(p)
    return out


def mutate(data, path, how):
    data = copy.deepcopy(data)
    parent = data
    for part in path[:-1]:
        parent = parent[part]
    key = path[-1]
    if how == "delete":
        del parent[key]
    elif how == "nest":
        parent[key] = [[parent[key]]]
    elif how == "repeat":  # the value twice as long (a list), or twice over (a string)
        value = parent[key]
        parent[key] = value * 2 if isinstance(value, (list, str)) else [value, value]
    else:
        parent[key] = copy.deepcopy(VALUES[how])
    return data


CASES = [(b, path, how) for b, base in enumerate(BASES) for path in _paths(base) for how in HOW]
#: the default tier: a deterministic sample, every mutation and most kinds of path represented (~1/29)
DEFAULT = CASES[::29]


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def _no_traceback(res, args):
    assert res.exit_code in (0, 1, 2), (args, res.exit_code, res.output[-2000:])
    assert res.exception is None or isinstance(res.exception, SystemExit), (args, repr(res.exception), res.output[-2000:])


def run_readers(tmp_path: Path, cases, *, every_command: bool, each: int = 1, expensive: int | None = None
                ) -> tuple[int, int]:
    """Load every mutation; run the commands on the ones the reader accepts (the per-file commands on every
    ``each``-th of them, the many-file commands on all; report and --resume on the first ``expensive``, default
    all). Returns (refused, accepted)."""
    from kbench.plugins import get_plugin_manager
    from kbench.run.runner import resume_request

    accepted: list[tuple[Path, int]] = []
    refused = 0
    runs = tmp_path / "history"
    runs.mkdir()
    for n, (b, path, how) in enumerate(cases):
        out = runs / f"m{n}.json"
        out.write_text(json.dumps(mutate(BASES[b], path, how)))
        try:
            load_result(out)
        except BadInput as exc:
            refused += 1
            assert exc.file == str(out) and exc.message and exc.fix and exc.exit_code == 2, (path, how, exc)
            assert len(exc.format()) < 1500, (path, how)  # a 70,000-character value is not repeated back
            continue
        accepted.append((out, b))
    reference = {b: tmp_path / f"base{b}.json" for b in range(len(BASES))}
    for b, p in reference.items():
        p.write_text(json.dumps(BASES[b]))
    for out, b in accepted[::each]:
        for args in (("show", out), ("compare", reference[b], out, "--allow-different-machines",
                                     "--allow-different-suites"), ("compare", out, "--baseline", "numpy")):
            _no_traceback(invoke(*args), args)
    # the readers of many files read them all in one command: history and plan --results
    for args in (("regressions", runs, "--no-cache"),
                 ("plan", "-m", "llama-3.1-8b", "-w", "chat", "--hardware", "cpu",
                  *itertools.chain.from_iterable(("--results", p) for p, _ in accepted))):
        _no_traceback(invoke(*args), args)
    if every_command:
        _no_traceback(invoke("publish", runs, "-o", tmp_path / "site", "--no-cache"), "publish")
        pm = get_plugin_manager()
        some = accepted[:expensive]
        for group in range(0, len(some), 20):  # a report of several runs reads them as report RESULT... does
            args = ("report", *(p for p, _ in some[group:group + 20]), "-o", tmp_path / "r.html")
            _no_traceback(invoke(*args), args)
        for out, _ in some:
            try:  # what --resume reads and checks before it runs anything (running the rest is test_resume's)
                resume_request(pm, out)
            except BadInput as exc:
                assert exc.file and exc.message and exc.fix, exc
    return refused, len(accepted)


def test_mutated_result_files_are_read_or_refused_cleanly_by_the_cheap_commands(tmp_path):
    refused, accepted = run_readers(tmp_path, DEFAULT, every_command=False, each=3)
    assert refused > 60 and accepted > 40  # both sides of the reader are exercised


@pytest.mark.nightly
def test_every_mutation_through_every_command(tmp_path):
    refused, accepted = run_readers(tmp_path, CASES, every_command=True, each=5, expensive=200)
    assert refused and accepted


def test_publish_report_and_resume_read_what_the_reader_accepts(tmp_path):
    """The expensive commands on a few accepted mutations (every leaf through them: the slow test above)."""
    picks = [(1, ("records", 0, "placement"), "null"), (0, ("records", 2, "stats", "q1"), "null"),
             (1, ("records", 0, "telemetry"), "delete"), (0, ("records", 0, "reason"), "long-text")]
    refused, accepted = run_readers(tmp_path, picks, every_command=True, expensive=1)
    assert (refused, accepted) == (1, 3)  # the long reason is refused, the rest read by every command
