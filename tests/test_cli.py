"""The CLI end to end through click's runner: run, show, list, exit codes, clean errors."""
from __future__ import annotations

import json
import textwrap

import pytest
from click.testing import CliRunner

from kbench.cli import cli

FAST = "attention[b=1,sq=64,sk=64,hq=4,hkv=4,d=32"


@pytest.fixture
def runner():
    return CliRunner()


def invoke(runner, *args, **kw):
    return runner.invoke(cli, list(args), catch_exceptions=False, **kw)


def test_run_then_show(runner, tmp_path):
    out = tmp_path / "smoke.json"
    res = invoke(runner, "run", "suites/smoke.yaml", "-b", "numpy*", "-k", "hq=4 and noncausal", "-o", str(out))
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert data["complete"] and {r["status"] for r in data["records"]} == {"passed"}
    assert {r["backend"] for r in data["records"]} == {"numpy", "numpy-flash"}
    assert all("noncausal" in r["case_id"] and "hq=4" in r["case_id"] for r in data["records"])
    assert data["environment"]["kbench"] and data["machine"]["id"].startswith("cpu-")
    shown = invoke(runner, "show", str(out))
    assert shown.exit_code == 0 and "numpy-flash" in shown.output and "TFLOP/s" in shown.output
    for fmt, probe in (("markdown", "| case"), ("csv", "case_id,backend,status"), ("json", '"backend"')):
        res = invoke(runner, "show", str(out), "--format", fmt)
        assert res.exit_code == 0 and probe in res.output


def test_keyword_not_causal_does_not_match_noncausal(runner, tmp_path):
    out = tmp_path / "r.json"
    res = invoke(runner, "run", "suites/smoke.yaml", "-b", "numpy", "-k", "causal and d=64", "-o", str(out))
    assert res.exit_code == 0
    ids = [r["case_id"] for r in json.loads(out.read_text())["records"]]
    assert ids and all(",causal," in i for i in ids)


def test_failing_backend_gives_exit_1_and_run_goes_on(runner, tmp_path, monkeypatch):
    (tmp_path / "kbtest_cli_bad.py").write_text(textwrap.dedent("""
        import kbench
        from kbench.backends import Backend
        class Zero(Backend):
            name = "zeros"
            def prepare(self, case):
                def run(q, k, v, out):
                    out[...] = 0
                return run
        @kbench.hookimpl
        def kbench_register_backends(registry):
            registry.add_backend(Zero())
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "r.json"
    res = invoke(runner, "-p", "kbtest_cli_bad", "run", "suites/smoke.yaml", "-b", "zeros", "-b", "numpy",
                 "-k", "d=64", "-o", str(out))
    assert res.exit_code == 1
    recs = json.loads(out.read_text())["records"]
    by = {(r["backend"], r["status"]) for r in recs}
    assert ("zeros", "failed") in by and ("numpy", "passed") in by


def test_kernel_file_backend(runner, tmp_path):
    kernel = tmp_path / "mykernel.py"
    kernel.write_text(textwrap.dedent('''
        """A kernel file: NumPy, whole score matrix."""
        import numpy as np
        from kbench.builtin.numpy_backends import attention_numpy
        TUNABLES = {"unused": {"default": 1, "choices": [1, 2]}}
        def attention(q, k, v, out, *, causal, scale, unused):
            attention_numpy(q, k, v, out, causal=causal, scale=scale)
    '''))
    out = tmp_path / "r.json"
    res = invoke(runner, "run", "suites/smoke.yaml", "-b", str(kernel), "-k", "d=64", "-o", str(out))
    assert res.exit_code == 0, res.output
    recs = json.loads(out.read_text())["records"]
    assert {r["backend"] for r in recs} == {"file:mykernel"} and {r["status"] for r in recs} == {"passed"}
    assert recs[0]["backend_info"]["tunables"] == {"unused": 1}


@pytest.mark.parametrize("args, message", [
    (["run", "no/such/suite.yaml"], "file not found"),
    (["run", "suites/smoke.yaml", "-b", "nothing-like-this"], "no backend of op 'attention' matches"),
    (["run", "suites/smoke.yaml", "-k", "and or ("], "cannot parse -k"),
    (["run", "suites/smoke.yaml", "--device", "tpu"], "unknown device 'tpu'"),
    (["show", "no/such/result.json"], "result file not found"),
    (["run", "suites/smoke.yaml", "-b", "missing_kernel.py"], "kernel file not found"),
])
def test_bad_input_exit_2_with_clean_message(runner, args, message):
    res = runner.invoke(cli, args)
    assert res.exit_code == 2, res.output
    assert message in res.output and "Traceback" not in res.output
    assert "fix:" in res.output


def test_malformed_suite_names_line(runner, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ngrid:\n  - seqlen: [64\n")
    res = runner.invoke(cli, ["run", str(bad)])
    assert res.exit_code == 2 and str(bad) in res.output and "line" in res.output


def test_list_shows_backends_with_status(runner):
    res = invoke(runner, "list")
    assert res.exit_code == 0
    line = next(l for l in res.output.splitlines() if l.startswith("numpy-flash"))
    assert "available" in line and "kbench.builtin.numpy_backends" in line


def test_a_run_whose_stdout_is_not_a_terminal_prints_a_line_per_record_before_the_table(runner, tmp_path):
    res = invoke(runner, "run", "suites/smoke.yaml", "-b", "numpy", "-k", "sq=64 and hkv=4 and noncausal", "-o",
                 str(tmp_path / "r.json"))
    lines = res.stdout.splitlines()
    assert res.exit_code == 0 and lines[0].startswith("[1/1 0:"), res.stdout
    assert " numpy attention[b=1,sq=64" in lines[0] and " passed " in lines[0]
    assert lines[1].startswith("case ")  # then the table (CSV or JSON on stdout gets no lines)


@pytest.mark.slow
def test_a_run_into_a_pipe_prints_a_line_per_record_while_it_runs(tmp_path):
    """A log: `kbench run ... > log` once printed nothing until the end (525 s on a loaded machine)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    # the numpy record first, then an endless loop the case timeout (3 s) stops: the first line must be in the
    # pipe while the process still runs
    proc = subprocess.Popen([sys.executable, "-m", "kbench.cli", "run", "suites/smoke.yaml", "-b", "numpy", "-b",
                             "tests/redteam/infinite_loop.py", "-k", "sq=64 and hkv=4 and noncausal",
                             "--case-timeout", "3", "--allow-unsandboxed", "-o", str(tmp_path / "r.json")],
                            cwd=root, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        first = proc.stdout.readline()
        running = proc.poll() is None
        rest = proc.stdout.read()
    finally:
        proc.kill() if proc.poll() is None else None
        proc.wait(timeout=60)
    assert first.startswith("[1/2 ") and " numpy attention[b=1,sq=64" in first and " passed " in first, first
    assert running, "the first line came only after the run ended"
    assert rest.startswith("[2/2 ") and "file:infinite_loop" in rest.splitlines()[0] and "timeout" in rest
    assert "case " in rest and "backend" in rest  # the table follows the lines


def test_progress_lines_say_still_measuring_when_a_record_takes_long(monkeypatch):
    import io
    import time

    import kbench.commands.run as run

    monkeypatch.setattr(run, "HEARTBEAT", 0.3)
    out = io.StringIO()
    lines = run._progress_lines(out, 2)
    try:
        deadline = time.monotonic() + 30
        while "still measuring" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.05)
        lines({"backend": "numpy", "case_id": "attention[x]", "status": "passed"}, 1, 2)
    finally:
        lines.stop()
    first, *rest = out.getvalue().splitlines()
    assert first.startswith("[0/2 0:") and first.endswith("] still measuring (0 s since the last record)"), first
    assert rest[-1].startswith("[1/2 0:") and rest[-1].endswith("] numpy attention[x] passed"), rest


def test_show_repro_prints_a_newline_or_control_character_inside_a_repro_escaped_on_its_one_line(runner, tmp_path):
    from tests.synthetic_results import record, result, write

    rec = record("numpy", {"batch": 1, "seqlen": 64, "heads": 4, "head_dim": 32, "causal": False}, [1e-3, 1.1e-3])
    rec["repro"] = "kbench run s.yaml -b numpy\n$ rm -rf /\r\x1b[2K\tdone"
    path = write(tmp_path / "crafted.json", result([rec]))
    res = invoke(runner, "show", path, "--repro")
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert not any(line.lstrip().startswith("$ rm") for line in lines)
    (line,) = [line for line in lines if "kbench run s.yaml" in line]
    assert "\\n$ rm -rf /\\x0d\\x1b[2K\\tdone" in line
