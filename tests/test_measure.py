"""kbench.api.measure (the runner of `kbench run` from Python) and the kbench_measure pytest fixture."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import kbench.api as api
from kbench.cli import cli
from kbench.errors import BadInput, KbenchError
from kbench.testing import FunctionBackend, measurement_name

ROOT = Path(__file__).resolve().parents[1]
#: quick settings: a handful of samples, correctness on 2 seeds
QUICK = {"warmup_time": 0.0, "min_samples": 5, "min_time": 0.01, "max_time": 0.1, "target_rel_se": 0.05, "rotate": 2}
CASE = {"seqlen": 64, "heads": 2, "head_dim": 32, "causal": True}


def attention(q, k, v, out, *, causal, scale):
    """Plain NumPy attention, float32."""
    sq, sk = q.shape[1], k.shape[1]
    group = q.shape[2] // k.shape[2]
    kk = np.repeat(k.astype(np.float32), group, axis=2)
    vv = np.repeat(v.astype(np.float32), group, axis=2)
    s = np.einsum("bqhd,bkhd->bhqk", q.astype(np.float32), kk) * np.float32(scale)
    if causal:
        s = np.where(np.arange(sk)[None, :] <= np.arange(sq)[:, None] + (sk - sq), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    out[...] = np.einsum("bhqk,bkhd->bqhd", p / p.sum(-1, keepdims=True), vv)


def attention_8x(q, k, v, out, *, causal, scale):
    """The same result after doing the whole work eight times."""
    for _ in range(8):
        attention(q, k, v, out, causal=causal, scale=scale)


def attention_unscaled(q, k, v, out, *, causal, scale):
    """Wrong: the softmax scale is left out."""
    attention(q, k, v, out, causal=causal, scale=1.0)


def test_callables_are_judged_in_one_run_and_say_they_are_trusted():
    m = api.measure(attention, baseline=attention_8x, cases=[CASE], device="cpu", timing=QUICK)
    assert m.names == ["fn:attention", "fn:attention_8x"] and m.baseline == "fn:attention_8x"
    assert m.subject == "fn:attention" and m.passed and m.failures() == {}
    assert all(isinstance(r, api.Record) for r in m.records) and len(m.records) == 2
    rec = m.record(m.records[0].case_id)
    # the judge of `kbench run`: secret inputs, verification and the clock in the trusted side
    assert {"secret_inputs", "parent_verifies", "parent_clock", "timed_outputs"} <= set(rec.integrity["checks"])
    assert rec.backend_info["trusted"] is True and "no" not in rec.backend_info["callable"]
    assert rec.backend_info["callable"] == f"{__name__}.attention" and "forked child" in rec.backend_info["isolation"]
    assert "worker" not in rec.extra  # judged through the in-process channel (in a forked child): never pickled
    assert m.speedup() > 2  # 8x the work, measured beside it in the same run
    assert m.speedup("fn:attention_8x", over="fn:attention") < 0.5
    assert m.result_file is None and m.header["suite"]["data"]["timing"]["max_time"] == QUICK["max_time"]


def test_a_wrong_answer_fails_with_the_reason_and_no_speedup_is_claimed():
    m = api.measure(attention_unscaled, baseline=FunctionBackend(
        lambda q, k, v, out, case: attention(q, k, v, out, causal=case.params["causal"],
                                             scale=api.softmax_scale(case)), name="honest"),
        cases=[CASE], device="cpu", timing=QUICK, isolate=False)
    assert m.names == ["fn:attention_unscaled", "honest"]
    assert not m.passed and m.of("honest")[0].passed
    (key, why), = m.failures().items()
    assert key.startswith("fn:attention_unscaled @ attention[") and why.startswith("failed: relative L2 error")
    with pytest.raises(AssertionError, match="1 of 2 records did not pass:\n  fn:attention_unscaled @"):
        m.assert_passed()
    with pytest.raises(KbenchError, match="no case where both .* passed: fn:attention_unscaled @ .*relative L2"):
        m.speedup()


def test_kernel_files_are_untrusted_sandboxed_and_statically_checked(tmp_path):
    from kbench.run.sandbox import probe

    honest, cache = ROOT / "tests/redteam/honest_numpy.py", ROOT / "tests/redteam/cache_by_content.py"
    m = api.measure(str(honest), cache, cases=[CASE], device="cpu", timing=QUICK,
                    allow_unsandboxed=not probe().available, output=tmp_path / "run.json")
    assert m.names == ["file:honest_numpy", "file:cache_by_content"]
    ok, cached = m.of("file:honest_numpy")[0], m.of("file:cache_by_content")[0]
    assert ok.passed and ok.extra["worker"]["sandbox"] is probe().available
    assert ok.backend_info["kernel_file"] == str(honest)
    assert cached.status is api.Status.FAILED and "static check" in cached.reason and "mutable default" in cached.reason
    data = json.loads((tmp_path / "run.json").read_text())
    assert m.result_file == tmp_path / "run.json" and data["complete"] is True
    assert [r["backend"] for r in data["records"]] == ["file:honest_numpy", "file:cache_by_content"]


def test_suite_file_suite_dict_and_case_dicts_give_the_same_cases():
    suite_file = ROOT / "suites/smoke.yaml"
    data = api.load_suite(suite_file).data
    only = "bf16"  # one case of the smoke suite's second grid entry
    by_file = api.measure(attention, suite=suite_file, keyword=only, device="cpu", timing=QUICK)
    by_dict = api.measure(attention, suite=data, keyword=only, device="cpu", timing=QUICK, name="smoke-dict")
    by_cases = api.measure(attention, cases=[{**data["grid"][1], "dtype": "bf16"}], device="cpu", timing=QUICK)
    ids = [r.case_id for r in by_file.records]
    assert len(ids) == 1 and ids == [r.case_id for r in by_dict.records] == [r.case_id for r in by_cases.records]
    assert by_dict.suite.name == "smoke-dict" and by_file.suite.name == "smoke" and by_cases.suite.name == "measure"
    assert by_file.suite.data["timing"]["min_time"] == QUICK["min_time"]  # overrides reach the suite's settings
    assert all(r.passed for r in by_cases.records)


def test_bad_calls_are_refused_before_anything_runs(tmp_path):
    with pytest.raises(BadInput, match="not both"):
        api.measure(attention, cases=[CASE], suite=ROOT / "suites/smoke.yaml")
    with pytest.raises(BadInput, match="no cases"):
        api.measure(attention)
    with pytest.raises(BadInput, match="nothing to measure"):
        api.measure(cases=[CASE])
    with pytest.raises(BadInput, match="cannot measure a int"):
        api.measure(42, cases=[CASE])
    with pytest.raises(BadInput, match="kernel file not found"):
        api.measure(tmp_path / "missing.py", cases=[CASE], device="cpu")
    with pytest.raises(BadInput, match="no backend .* matches"):
        api.measure("no-such-backend", cases=[CASE], device="cpu")
    honest = ROOT / "tests/redteam/honest_numpy.py"
    with pytest.raises(BadInput, match="two (targets are both called|selected backends read as one name,) 'file:honest_numpy'"):
        api.measure(honest, str(honest), cases=[CASE], device="cpu", output=tmp_path / "dup.json")
    assert not (tmp_path / "dup.json").exists()
    with pytest.raises(BadInput, match="seqlen"):  # the case itself is validated as a suite's grid is
        api.measure(attention, cases=[{"seqlen": -1, "heads": 2, "head_dim": 32}], device="cpu")


def test_two_lambdas_get_distinct_names():
    same = lambda q, k, v, out, *, causal, scale: attention(q, k, v, out, causal=causal, scale=scale)  # noqa: E731
    other = lambda q, k, v, out, *, causal, scale: attention(q, k, v, out, causal=causal, scale=scale)  # noqa: E731
    m = api.measure(same, other, cases=[CASE], device="cpu", timing=QUICK)
    assert m.names == ["fn:test_two_lambdas_get_distinct_names.<locals>.<lambda>",
                       "fn:test_two_lambdas_get_distinct_names.<locals>.<lambda>#2"] and m.passed


def test_measurement_names_are_valid_suite_names():
    assert measurement_name("tests/test_k.py::test_a[x-1/2]") == "test_k.test_a-x-1-2"
    assert measurement_name("tests/test_k.py::TestK::test_b") == "test_k.TestK.test_b"
    api.suite_from_data({"name": measurement_name("a/b c.py::t[ü]"), "grid": [CASE]})  # the schema accepts it


FIXTURE_TEST = '''
import numpy as np
from kbench.api import softmax_scale

{attention}

def attention_8x(q, k, v, out, *, causal, scale):
    for _ in range(8):
        attention(q, k, v, out, causal=causal, scale=scale)

QUICK = {quick!r}

def test_kernel_is_right_and_faster_than_its_baseline(kbench_measure):
    m = kbench_measure(attention, baseline=attention_8x, cases=[{case!r}], device="cpu", timing=QUICK)
    m.assert_passed()
    assert m.speedup() > 2
    again = kbench_measure(attention, baseline=attention_8x, cases=[{case!r}], device="cpu", timing=QUICK)
    assert again.suite.name == m.suite.name == "test_kbench_fixture.test_kernel_is_right_and_faster_than_its_baseline"
'''


def test_the_fixture_asserts_speed_and_saves_files_compare_and_publish_read(tmp_path):
    import inspect
    import subprocess
    import sys

    source = inspect.getsource(attention)
    (tmp_path / "test_kbench_fixture.py").write_text(FIXTURE_TEST.format(attention=source, quick=QUICK, case=CASE))
    saved = tmp_path / "saved"
    # a pytest of its own (the plugin comes from the kbench entry point, as for any user); not pytester, whose
    # fixture restores sys.modules afterwards: modules first imported meanwhile would be imported anew by later
    # tests, their classes no longer the ones already in use
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--kbench-save", str(saved),
                             "test_kbench_fixture.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "1 passed" in result.stdout, result.stdout + result.stderr
    files = sorted(saved.glob("*/test_kbench_fixture.test_kernel_is_right_and_faster_than_its_baseline-*.json"))
    assert len(files) == 2
    runner = CliRunner()
    compared = runner.invoke(cli, ["compare", str(files[0]), str(files[1]), "--format", "json"])
    assert compared.exit_code == 0, compared.output
    pairs = json.loads(compared.output[compared.output.index("["):])
    assert sorted(p["backend"] for p in pairs) == ["fn:attention", "fn:attention_8x"]
    published = runner.invoke(cli, ["publish", str(saved), "-o", str(tmp_path / "site"), "--no-cache", "-j", "1"])
    assert published.exit_code == 0, published.output
    assert "2 runs" in published.output and (tmp_path / "site" / "index.html").is_file()


# -- a callable cannot hang, end or exhaust its caller ----------------------------------------------------------


def never_returns(q, k, v, out, *, causal, scale):
    while True:
        pass


def exits(q, k, v, out, *, causal, scale):
    import sys

    sys.exit(3)


def allocates_8_gib(q, k, v, out, *, causal, scale):
    np.ones(8 * 2**30, dtype=np.uint8)
    attention(q, k, v, out, causal=causal, scale=scale)


def killed(q, k, v, out, *, causal, scale):
    import os
    import signal

    os.kill(os.getpid(), signal.SIGKILL)


def in_a_thread(fn, limit: float):
    """``fn()``'s value, or AssertionError when it has not returned after ``limit`` seconds (the thread is left)."""
    import threading

    box = []
    thread = threading.Thread(target=lambda: box.append(fn()), daemon=True)
    thread.start()
    thread.join(limit)
    assert box, f"measure() did not return within {limit} s"
    return box[0]


def test_a_callable_that_never_returns_is_a_timeout_within_the_case_timeout_and_stops_its_other_cases():
    import time

    cases = [CASE, {**CASE, "seqlen": 128}]
    start = time.monotonic()
    m = in_a_thread(lambda: api.measure(never_returns, cases=cases, device="cpu", timing=QUICK, case_timeout=1.5), 60)
    took = time.monotonic() - start
    first, second = m.records
    assert first.status == "timeout" and "case timeout of 1.5 s" in first.reason and "killed" in first.reason
    assert second.status == "skipped" and second.reason.startswith("not started: this backend timed out on ")
    assert took < 1.5 + 5 + 5, took  # the timeout plus 5 s, and a run's start-up on a loaded machine


def test_sys_exit_and_a_kill_inside_a_callable_are_records_and_the_caller_goes_on():
    m = api.measure(exits, killed, cases=[CASE], device="cpu", timing=QUICK, case_timeout=30)
    by = {r.backend: r for r in m.records}
    assert by["fn:exits"].status == "error" and "sys.exit(3)" in by["fn:exits"].reason
    assert by["fn:killed"].status == "crashed" and "SIGKILL" in by["fn:killed"].reason
    assert by["fn:killed"].extra.get("signal") == "SIGKILL"


def test_an_8_gib_allocation_meets_the_memory_cap_set_before_the_callable_runs():
    m = api.measure(allocates_8_gib, cases=[CASE], device="cpu", timing=QUICK, case_timeout=60,
                    integrity={"memory_limit": 2 * 2**30})
    (rec,) = m.records
    assert rec.status == "error" and rec.reason.startswith("out of memory") and "8.00 GiB" in rec.reason


def test_a_misspelled_baseline_or_target_is_refused_in_python_terms(tmp_path):
    with pytest.raises(BadInput, match="measure\\(baseline=...\\): no backend of op 'attention' matches 'nope'"):
        api.measure("numpy", baseline="nope", cases=[CASE], device="cpu")
    with pytest.raises(BadInput, match="target 2\\): .*'nump-flash' \\(did you mean 'numpy-flash'\\?\\)"):
        api.measure("numpy", "nump-flash", cases=[CASE], device="cpu")
    taken = tmp_path / "taken.json"
    taken.write_text("{}")
    with pytest.raises(BadInput) as info:
        api.measure("numpy", cases=[CASE], device="cpu", output=taken)
    text = str(info.value)
    assert "measure(output=...)" in text and "force=True" in text and "--force" not in text and " -o" not in text
    with pytest.raises(BadInput) as info:
        api.measure("!*", cases=[CASE], device="cpu")
    assert "-b" not in str(info.value) and "measure(*targets" in str(info.value)


def test_the_fixture_takes_the_same_path(kbench_measure):
    m = kbench_measure(exits, cases=[CASE], device="cpu", timing=QUICK, case_timeout=30)
    assert m.records[0].status == "error" and "sys.exit(3)" in m.records[0].reason
    assert m.suite.name.endswith("test_the_fixture_takes_the_same_path")


# -- the forked child's processes are killed whole; reasons name the real cause ------------------------------

#: where a callable that leaves a process behind writes that process's pid (set by each test)
LEFT_PID_FILE = {"path": None}


def _leave_a_sleeper(detach: bool) -> None:
    """Once per worker: fork a process that sleeps a minute (in a new session with ``detach``) and write its pid."""
    import os
    import time

    if LEFT_PID_FILE.get("done"):
        return
    LEFT_PID_FILE["done"] = True
    pid = os.fork()
    if pid == 0:
        if detach:
            os.setsid()
        time.sleep(60)
        os._exit(0)
    with open(LEFT_PID_FILE["path"], "w") as fh:
        fh.write(str(pid))


def leaves_a_child(q, k, v, out, *, causal, scale):
    _leave_a_sleeper(detach=False)
    attention(q, k, v, out, causal=causal, scale=scale)


def leaves_a_setsid_child(q, k, v, out, *, causal, scale):
    _leave_a_sleeper(detach=True)
    attention(q, k, v, out, causal=causal, scale=scale)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            text = fh.read()
    except OSError:
        return False
    return text[text.rindex(b")") + 2:][:1] != b"Z"


@pytest.mark.parametrize("fn", [leaves_a_child, leaves_a_setsid_child], ids=["child", "setsid-child"])
def test_a_callable_that_leaves_a_process_is_not_held_to_the_case_timeout_and_the_process_is_killed(fn, tmp_path,
                                                                                                   monkeypatch):
    import time

    monkeypatch.setitem(LEFT_PID_FILE, "path", str(tmp_path / "left.pid"))
    start = time.monotonic()
    m = in_a_thread(lambda: api.measure(fn, cases=[CASE], device="cpu", timing=QUICK, case_timeout=30), 60)
    took = time.monotonic() - start
    (rec,) = m.records
    assert rec.status == "passed", rec.reason
    assert took < 15, took  # the record, not the 30 s case timeout (the sleeper holds the pipe a minute)
    left = int((tmp_path / "left.pid").read_text())
    deadline = time.monotonic() + 5
    while _alive(left) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(left), f"the process the callable left ({left}) outlived the call"


def killed_by_a_realtime_signal(q, k, v, out, *, causal, scale):
    import os
    import signal

    os.kill(os.getpid(), signal.SIGRTMIN + 3)


def closes_every_descriptor(q, k, v, out, *, causal, scale):
    import os

    attention(q, k, v, out, causal=causal, scale=scale)
    os.closerange(3, 65536)


def test_crash_reasons_name_real_time_signals_and_closed_descriptors():
    m = api.measure(killed_by_a_realtime_signal, closes_every_descriptor, cases=[CASE], device="cpu", timing=QUICK,
                    case_timeout=30)
    by = {r.backend: r for r in m.records}
    rt = by["fn:killed_by_a_realtime_signal"]
    assert rt.status == "crashed" and "killed by SIGRTMIN+3" in rt.reason and "ValueError" not in rt.reason
    assert rt.extra.get("signal") == "SIGRTMIN+3"
    closed = by["fn:closes_every_descriptor"]
    assert closed.status == "crashed" and "closed or replaced the file descriptor" in closed.reason
    assert "SIGKILL" not in closed.reason and "out of memory" not in closed.reason


def test_signal_names_cover_every_number():
    import signal

    from kbench.run.forked import signal_name

    assert signal_name(int(signal.SIGKILL)) == "SIGKILL"
    assert signal_name(int(signal.SIGRTMIN)) == "SIGRTMIN+0" or signal_name(int(signal.SIGRTMIN)) == "SIGRTMIN"
    assert signal_name(int(signal.SIGRTMAX)) in ("SIGRTMAX", "SIGRTMAX-0")
    assert signal_name(int(signal.SIGRTMAX) - 1) == "SIGRTMAX-1"
    assert signal_name(200) == "signal 200"


CALLER = """
import os, sys, time
sys.path.insert(0, {tests!r})
import test_measure as t
t.LEFT_PID_FILE["path"] = {pid_file!r}
import kbench.api as api
api.measure(t.leaves_a_setsid_child_then_hangs, cases=[t.CASE], device="cpu", timing=t.QUICK, case_timeout=120)
"""


def leaves_a_setsid_child_then_hangs(q, k, v, out, *, causal, scale):
    _leave_a_sleeper(detach=True)
    while True:
        pass


def test_a_caller_killed_with_sigkill_leaves_no_process_of_its_callable(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    pid_file = tmp_path / "left.pid"
    caller = subprocess.Popen([sys.executable, "-c", CALLER.format(tests=str(ROOT / "tests"), pid_file=str(pid_file))],
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
            assert caller.poll() is None, "the caller ended before its callable ran"
            time.sleep(0.1)
        left = int(pid_file.read_text())
        assert _alive(left)
    finally:
        os.kill(caller.pid, signal.SIGKILL)
        caller.wait()
    deadline = time.monotonic() + 5
    while _alive(left) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(left), f"the setsid process the callable left ({left}) outlived its killed caller"


def test_held_out_verdicts_hide_the_shape_as_failures_does_unless_shown():
    from kbench.fuzz.heldout import HeldOut
    from kbench.measurement import Measurement

    secret = "attention[b=3,sq=77,sk=77,hq=6,hkv=2,d=48,causal,fp32]"
    verdict = HeldOut("k", checked=8, failure=(secret, "failed", f"bad at {secret}", 0.5, 1e-5), cases=[secret])
    hidden = Measurement([], ["k"], None, None, "cpu", held_out_verdicts={"k": verdict})
    assert secret not in repr(hidden.held_out) and secret not in str(hidden.failures())
    assert hidden.held_out["k"].failure[0] == "(hidden)" and hidden.held_out["k"].cases == []
    assert not hidden.held_out["k"].passed and "relative L2 error 0.5" in hidden.held_out["k"].reason(True)
    shown = Measurement([], ["k"], None, None, "cpu", held_out_verdicts={"k": verdict}, show_held_out=True)
    assert shown.held_out["k"].failure[0] == secret and secret in shown.failures()["k @ (held-out)"]
