"""The one rule of output paths: a regular file or a new path, whatever --force says, for every writer.

Hostile things are made here, in the test's own temporary directory: a character device node made with mknod
from /dev/null's numbers (only as root), a named pipe, a Unix socket, a directory, a dangling symbolic link, and a
path under /proc. Nothing points at the machine's own /dev.
"""
from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from kbench.cli import cli
from kbench.errors import OutputError
from kbench.outputs import atomic_write, check_output_dir, check_output_file, output_target, write_text

ROOT = Path(__file__).resolve().parents[1]
ROOTED = os.geteuid() == 0


def make(kind: str, path: Path) -> None:
    if kind == "device":
        os.mknod(path, 0o666 | stat.S_IFCHR, os.stat("/dev/null").st_rdev)  # our own node
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        sock.close()
    elif kind == "directory":
        path.mkdir()
    elif kind == "dangling":
        os.symlink(path.parent / "missing-target", path)


def fingerprint(path: Path) -> tuple:
    info = os.lstat(path)
    return (stat.S_IFMT(info.st_mode), info.st_ino, info.st_rdev,
            os.readlink(path) if stat.S_ISLNK(info.st_mode) else None)


KINDS = [pytest.param("device", marks=pytest.mark.skipif(not ROOTED, reason="mknod needs root")),
         "fifo", "socket", "directory", "dangling"]


@pytest.mark.parametrize("kind", KINDS)
def test_atomic_write_refuses_what_is_not_a_regular_file_and_leaves_it_as_it_was(kind, tmp_path):
    target = tmp_path / "out.json"
    make(kind, target)
    before = fingerprint(target)
    with pytest.raises(OutputError) as err:
        atomic_write(target, lambda fh: fh.write("{}"))
    assert fingerprint(target) == before and not (tmp_path / "missing-target").exists()
    assert str(target) in str(err.value) and "fix:" in str(err.value)
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []  # no temporary file left


def test_proc_and_sys_are_refused_and_regular_files_new_paths_and_links_to_files_are_written(tmp_path):
    for path in ("/proc/self/kbench-x.json", "/sys/kernel/kbench-x.json"):
        with pytest.raises(OutputError, match="kernel interface"):
            output_target(path)
        with pytest.raises(OutputError, match="kernel interface"):
            check_output_dir(path, option="--plots")
    regular = tmp_path / "regular.json"
    regular.write_text("old")
    atomic_write(regular, lambda fh: fh.write("new"))
    assert regular.read_text() == "new"
    write_text(tmp_path / "sub" / "new.html", "<p>")
    assert (tmp_path / "sub" / "new.html").read_text() == "<p>"
    link = tmp_path / "link.json"
    link.symlink_to(regular)
    atomic_write(link, lambda fh: fh.write("through"))
    assert link.is_symlink() and regular.read_text() == "through"  # the link stays, its file is written


def test_a_name_too_long_for_the_temporary_file_beside_it_is_refused_before_the_work(tmp_path):
    name = "x" * 250 + ".json"  # fits the file system, but not with ".NAME.XXXXXXXX.tmp" beside it
    with pytest.raises(OutputError, match="bytes long"):
        check_output_file(tmp_path / name)


# -- every writer of the CLI --------------------------------------------------------------------------------

def _result(tmp_path: Path) -> str:
    from tests.synthetic_results import record, result, write

    (tmp_path / "results").mkdir(exist_ok=True)
    rec = record("numpy", {"batch": 1, "seqlen": 64, "heads": 4, "head_dim": 32, "causal": False}, [1e-3, 1.1e-3, 9e-4])
    return write(tmp_path / "results" / "r.json", result([rec]))


FILE_WRITERS = {
    "run": ["run", "suites/smoke.yaml", "-b", "numpy", "-k", "hq=4 and noncausal", "-o", "{out}"],
    "run --force": ["run", "suites/smoke.yaml", "-b", "numpy", "-k", "hq=4 and noncausal", "--force", "-o", "{out}"],
    "report": ["report", "{result}", "-o", "{out}"],
    "fuzz": ["fuzz", "-b", "numpy", "--budget", "1", "--seed", "1", "-o", "{out}"],
    "calibrate": ["calibrate", "--device", "cpu", "--size", "16", "--copy-mb", "1", "--max-time", "0.05", "-o", "{out}"],
}
#: writers of a directory: argv, and a name inside it they write
DIR_WRITERS = {
    "report png": (["report", "{result}", "--format", "png", "-o", "{out}"], None),
    "publish": (["publish", "{results}", "-o", "{out}"], "index.html"),
    "roofline --plots": (["roofline", "-m", "llama-3.1-8b", "--hardware", "h100-sxm", "-c", "8k", "--plots", "{out}"],
                         "roofline-quadrants.png"),
    "plan --plots": (["plan", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--isl", "512", "--osl", "64",
                      "--simulate", "0", "--plots", "{out}"], "plan-pareto.png"),
    "evolve init": (["evolve", "init", "lin", "--seed", str(ROOT / "plugins/kbench-evolve/kbench_evolve/seeds/"
                                                             "numpy_attention_seed.py"),
                     "--suite", "suites/evolve-cpu.yaml", "--workspace", "{out}"], "lin"),
}


def _invoke(argv: list[str], **fill: str):
    res = CliRunner().invoke(cli, [a.format(**fill) for a in argv])
    return res, (res.output or "") + (str(res.exception) if res.exception and not isinstance(res.exception,
                                                                                             SystemExit) else "")


@pytest.mark.parametrize("writer", sorted(FILE_WRITERS))
@pytest.mark.parametrize("kind", [pytest.param("device", marks=pytest.mark.skipif(not ROOTED, reason="mknod: root")),
                                  "fifo", "dangling"])
def test_every_file_writer_refuses_a_device_a_fifo_and_a_dangling_link_with_exit_2(writer, kind, tmp_path,
                                                                                   monkeypatch):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "out.json"
    make(kind, out)
    before = fingerprint(out)
    res, text = _invoke(FILE_WRITERS[writer], out=str(out), result=_result(tmp_path))
    assert res.exit_code == 2, text
    assert fingerprint(out) == before and not (tmp_path / "missing-target").exists()
    assert str(out) in text and "Traceback" not in text


@pytest.mark.parametrize("writer", sorted(FILE_WRITERS))
def test_every_file_writer_refuses_a_proc_path(writer, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    res, text = _invoke(FILE_WRITERS[writer], out="/proc/self/kbench-out.json", result=_result(tmp_path))
    assert res.exit_code == 2 and "kernel interface" in text, text


@pytest.mark.parametrize("writer", sorted(DIR_WRITERS))
def test_every_directory_writer_refuses_a_fifo_at_the_directory_or_at_a_name_it_writes(writer, tmp_path,
                                                                                        monkeypatch):
    monkeypatch.chdir(ROOT)
    argv, inner = DIR_WRITERS[writer]
    fill = {"result": _result(tmp_path), "results": str(tmp_path / "results")}
    out = tmp_path / "out"
    make("fifo", out)
    before = fingerprint(out)
    res, text = _invoke(argv, out=str(out), **fill)
    assert res.exit_code == 2 and "not a directory" in text and fingerprint(out) == before, text
    if inner is None:
        return
    out.unlink()
    out.mkdir()
    make("fifo", out / inner)
    before = fingerprint(out / inner)
    res, text = _invoke(argv, out=str(out), **fill)
    assert res.exit_code == 2 and "named pipe" in text or "not a directory" in text, text
    assert fingerprint(out / inner) == before


def test_fuzz_keeps_its_report_when_the_output_turns_into_a_fifo_during_the_search(tmp_path):
    """The path passes the check before the search; a FIFO made there meanwhile is refused at the write, and the
    search's report is printed on stdout instead of being lost."""
    out = tmp_path / "fuzz.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    proc = subprocess.Popen([sys.executable, "-c", "from kbench.cli import main; main()", "fuzz", "-b", "numpy",
                             "--budget", "3", "--seed", "1", "-o", str(out)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stderr.readline()  # "kbench fuzz: numpy (...), seed 1, budget 3 s": the check has passed
    assert "kbench fuzz: numpy" in first, first
    os.mkfifo(out)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 2, stderr
    assert stat.S_ISFIFO(os.lstat(out).st_mode)
    report = json.loads(stdout[stdout.index("{"):stdout.rindex("}") + 1])
    assert report["seed"] == 1 and report["backends"][0]["backend"] == "numpy"
    assert "named pipe" in stderr and "printed on stdout" in stderr and "Traceback" not in stderr


@pytest.mark.nightly
def test_the_hostile_writers_script_replaces_nothing_and_prints_no_traceback():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "writers_hostile.py")], cwd=ROOT,
                          capture_output=True, text=True, timeout=3000)
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["attempts"] >= 50 and summary["replaced"] == 0 and summary["tracebacks"] == 0, proc.stdout
    assert summary["not_exit_2"] == 0 and proc.returncode == 0, proc.stdout


# -- numeric options ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv", [
    ["fuzz", "-b", "numpy", "--budget", "nan"],
    ["fuzz", "-b", "numpy", "--budget", "inf"],
    ["run", "suites/smoke.yaml", "-b", "numpy", "--case-timeout", "nan"],
    ["compare", "a.json", "--factor", "nan"],
    ["compare", "a.json", "--alpha", "inf"],
    ["calibrate", "--max-time", "NaN"],
    ["plan", "--model", "llama-3.1-8b", "--rate", "inf"],
    ["roofline", "--usable", "nan"],
    ["evolve", "run", "x", "--max-time", "nan"],
    ["evolve", "run", "x", "--llm-timeout", "-inf"],
    ["plan", "--model", "llama-3.1-8b", "--isl", "1" + "0" * 400, "--osl", "64"],
    ["evolve", "run", "x", "--max-tokens", "1" + "0" * 400],
])
def test_numeric_options_refuse_nan_and_infinity_with_exit_2(argv, monkeypatch):
    monkeypatch.chdir(ROOT)
    start = time.monotonic()
    res = CliRunner().invoke(cli, argv)
    assert res.exit_code == 2, res.output
    assert "finite number" in res.output or "not in the range" in res.output or "is not in" in res.output, res.output
    assert time.monotonic() - start < 30


def test_a_fifo_planted_as_the_journal_or_the_lock_beside_a_result_file_is_refused_not_waited_on(tmp_path,
                                                                                                 monkeypatch):
    monkeypatch.chdir(ROOT)
    for name in (".r.json.journal", ".r.json.lock"):
        beside = tmp_path / name
        make("fifo", beside)
        res, text = _invoke(FILE_WRITERS["run"], out=str(tmp_path / "r.json"))
        assert res.exit_code == 2 and "named pipe" in text and str(beside) in text, text
        assert stat.S_ISFIFO(os.lstat(beside).st_mode) and not (tmp_path / "r.json").exists()
        beside.unlink()
