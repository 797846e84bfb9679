"""Nsight Compute profiles (kbench.profiling) on a machine without a GPU: recorded ncu CSVs, the command line
built but not run against a GPU, a stand-in ``ncu`` executable for the subprocess path, and the CLI surfaces.

The CSVs in tests/data were written in the format ``ncu --csv --page raw --print-units base`` and the details
page print (Nsight Compute CLI manual, "Output Pages" and "--csv"): a header row of fixed columns then metric
names, a units row, one row per kernel launch; ``==PROF==`` lines before it.
"""
from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from kbench import profiling as P

DATA = Path(__file__).parent / "data"
RAW = (DATA / "ncu-raw-triton-fwd-bwd.csv").read_text()
DETAILS = (DATA / "ncu-details-triton-hopper.csv").read_text()
CASE = {"batch": 1, "seqlen_q": 16384, "seqlen_kv": 16384, "heads_q": 16, "heads_kv": 16, "head_dim": 128,
        "causal": True, "dtype": "bf16"}


def test_raw_page_gives_one_launch_per_kernel_in_base_units():
    launches = P.parse_ncu_csv(RAW)
    assert [k["name"] for k in launches] == ["attention_fwd_kernel", "bwd_preprocess_kernel", "bwd_dkdv_kernel",
                                             "bwd_dq_kernel"]
    dkdv = launches[2]
    assert dkdv["duration_ns"] == 1_402_880 and dkdv["registers"] == 250 and dkdv["smem_dynamic_bytes"] == 81_920
    assert dkdv["spill_instructions"] is None  # ncu wrote n/a
    assert dkdv["grid"] == "(32, 16, 1)" and dkdv["block"] == "(256, 1, 1)"
    assert launches[0]["tensor_pct"] == pytest.approx(61.27)


def test_summary_adds_durations_and_takes_the_longest_kernels_figures():
    m = P.summarize(P.parse_ncu_csv(RAW))
    assert m["kernels"] == 4 and m["main_kernel"] == "bwd_dkdv_kernel"
    assert m["duration_ns"] == 512_448 + 18_112 + 1_402_880 + 1_011_232
    assert (m["registers"], m["occupancy_pct"], m["dram_pct"]) == (250, 12.44, 21.36)
    assert m["spill_instructions"] == 0  # the sum of the kernels that reported it


def test_details_page_and_scaled_units_read_the_same_way():
    (k,) = P.parse_ncu_csv(DETAILS)
    assert k["name"] == "attention_hopper_kernel"
    assert k["duration_ns"] == pytest.approx(1.62e6)          # msecond
    assert k["smem_dynamic_bytes"] == pytest.approx(197_110)  # Kbyte
    assert k["tensor_pct"] == pytest.approx(66.84) and k["registers"] == 168


def test_output_without_a_csv_is_an_error_that_quotes_ncu():
    with pytest.raises(P.ProfileError, match="ERR_NVGPUCTRPERM"):
        P.parse_ncu_csv("==PROF== Connected\n==ERROR== ERR_NVGPUCTRPERM - no permission to access counters\n")
    with pytest.raises(P.ProfileError, match="no kernel"):
        P.summarize([])


def test_command_line_asks_for_the_fixed_metrics_in_csv_between_profiler_start_and_stop():
    target = P.Target("triton-hopper[WARP_SPECIALIZE=0]")
    cmd = P.ncu_command("/opt/ncu", P.target_command(target, CASE))
    assert cmd[0] == "/opt/ncu"
    flags = " ".join(cmd[:cmd.index(sys.executable)])
    for flag in ("--csv", "--page raw", "--print-units base", "--profile-from-start off", "--target-processes all",
                 "--clock-control none"):
        assert flag in flags
    assert cmd[cmd.index("--metrics") + 1].split(",") == [m.ncu for m in P.METRICS]
    call = cmd[cmd.index(sys.executable):]
    assert call[1:4] == ["-m", "kbench.profiling", "call"]
    assert call[call.index("--backend") + 1] == "triton-hopper[WARP_SPECIALIZE=0]"
    assert json.loads(call[call.index("--case") + 1]) == CASE
    assert "--kernel-file" not in call
    kf = P.target_command(P.Target("file:k", kernel_file="/k.py", settings={"BLOCK_M": 64}), CASE)
    assert kf[kf.index("--kernel-file") + 1] == "/k.py" and json.loads(kf[kf.index("--settings") + 1]) == {"BLOCK_M": 64}


def test_dry_run_prints_the_command_line(capsys):
    assert P.main(["run", "--backend", "cudnn", "--case", json.dumps(CASE), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "--page raw" in out and "kbench.profiling call --backend cudnn" in out and "gpu__time_duration.sum" in out
    assert P.main(["run", "--backend", "cudnn", "--case", "[1, 2]", "--dry-run"]) == 2


@pytest.fixture
def fake_ncu(tmp_path):
    """An executable standing in for ncu: checks its command line, then prints a recorded CSV or fails. The CSV is
    copied beside it: in the sandbox ncu's installation is readable and the checkout's tests/ is not (it was only
    when an earlier test in the same process had imported the ``tests`` package, so the sandboxed test failed run
    alone)."""
    script = tmp_path / "ncu"
    recorded = tmp_path / "ncu-raw.csv"
    recorded.write_text((DATA / "ncu-raw-triton-fwd-bwd.csv").read_text())
    script.write_text(f"""#!{sys.executable}
import os, sys
args = sys.argv[1:]
assert args[:2] == ["--csv", "--page"] and "kbench.profiling" in args, args
mode = os.environ.get("FAKE_NCU", "ok")
if mode == "fail":
    print("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters")
    sys.exit(1)
if mode == "hang":
    import time; time.sleep(60)
sys.stdout.write(open({str(recorded)!r}).read())
""")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


class Trusted:
    op, trusted = "attention", True


def test_attach_profile_runs_ncu_and_stores_the_figures(fake_ncu, monkeypatch):
    monkeypatch.setenv("FAKE_NCU", "ok")
    record = {"backend": "triton", "op": "attention", "case": CASE, "status": "passed", "stats": {"median": 3e-3}}
    profile = P.attach_profile(record, Trusted(), ncu=fake_ncu)
    assert record["profile"] is profile and profile["status"] == "ok" and not profile["sandboxed"]
    assert profile["metrics"]["kernels"] == 4 and profile["metrics"]["main_kernel"] == "bwd_dkdv_kernel"
    assert [k["name"] for k in profile["kernels"]][0] == "bwd_dkdv_kernel"  # longest first
    assert "kbench.profiling call --backend triton" in profile["command"]
    assert record["stats"] == {"median": 3e-3}  # the measured part is untouched


def test_ncu_failures_and_timeouts_become_the_profiles_reason(fake_ncu, monkeypatch):
    record = {"backend": "triton", "case": CASE, "status": "passed"}
    monkeypatch.setenv("FAKE_NCU", "fail")
    failed = P.attach_profile(record, Trusted(), ncu=fake_ncu)
    assert failed["status"] == "error" and "ERR_NVGPUCTRPERM" in failed["reason"] and "exited with 1" in failed["reason"]
    monkeypatch.setenv("FAKE_NCU", "hang")
    slow = P.attach_profile(record, Trusted(), ncu=fake_ncu, timeout=1.0)
    assert slow["status"] == "error" and "within 1 s" in slow["reason"]


def test_only_passed_cuda_records_with_an_ncu_are_profiled(fake_ncu, monkeypatch):
    failed = P.attach_profile({"backend": "x", "case": CASE, "status": "failed"}, Trusted(), ncu=fake_ncu)
    assert failed["status"] == "skipped" and "failed" in failed["reason"]
    cpu = P.attach_profile({"backend": "x", "case": CASE, "status": "passed"}, Trusted(), device="cpu", ncu=fake_ncu)
    assert cpu["status"] == "skipped" and "'cpu'" in cpu["reason"]
    monkeypatch.setenv("PATH", "")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    if not os.access("/usr/local/cuda/bin/ncu", os.X_OK):
        none = P.attach_profile({"backend": "x", "case": CASE, "status": "passed"}, Trusted())
        assert none["status"] == "skipped" and "not on PATH" in none["reason"]


def test_the_profiled_process_builds_the_backend_and_calls_it(monkeypatch):
    # the `call` entry on the CPU (no profiler range): a real backend, inputs from op.make_inputs
    seen = []
    from kbench.plugins import PluginManager

    real_prepare = PluginManager().registry.backends["numpy"].__class__.prepare

    def prepare(self, case):
        kernel = real_prepare(self, case)

        def counted(**arrays):
            seen.append(sorted(arrays))
            return kernel(**arrays)
        return counted
    monkeypatch.setattr(PluginManager().registry.backends["numpy"].__class__, "prepare", prepare)
    small = {"batch": 1, "seqlen": 16, "heads": 2, "head_dim": 16, "causal": True, "dtype": "fp32"}
    assert P.call("numpy", small, device_name="cpu", warmup=2, calls=1, profiler=False) == 1
    assert seen == [["k", "out", "q", "v"]] * 3
    with pytest.raises(P.ProfileError, match="cudnn cannot run"):
        P.call("cudnn", small, device_name="cpu", profiler=False)
    monkeypatch.undo()
    # a split case: the forward before the profiled range, the backward inside it
    assert P.call("numpy", {**small, "mode": "bwd"}, device_name="cpu", warmup=1, calls=1, profiler=False) == 1


def test_show_and_report_print_the_profiles(tmp_path):
    from kbench.cli import cli

    out = tmp_path / "r.json"
    res = CliRunner().invoke(cli, ["run", "suites/smoke.yaml", "-b", "numpy", "-k", "hq=4 and noncausal and sq=64",
                                   "-o", str(out), "--no-isolate", "--profile", "ncu"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert data["records"] and all(r["profile"]["status"] == "skipped" and "'cpu'" in r["profile"]["reason"]
                                   for r in data["records"])  # the runner asked for every record
    rec = data["records"][0]
    rec["profile"] = {"tool": "ncu", **P.profile_from_output(RAW)}
    out.write_text(json.dumps(data))
    shown = CliRunner().invoke(cli, ["show", str(out), "--profile"], catch_exceptions=False)
    assert shown.exit_code == 0
    row = next(line for line in shown.output.splitlines() if line.startswith(rec["case_id"]) and "bwd_dkdv" in line)
    assert "2.945 ms" in row and "250" in row and "21.4%" in row
    report = tmp_path / "r.html"
    res = CliRunner().invoke(cli, ["report", str(out), "-o", str(report)], catch_exceptions=False)
    assert res.exit_code == 0 and "Nsight Compute profiles" in report.read_text()


def test_summary_line_for_a_brief():
    line = P.profile_summary(P.profile_from_output(DETAILS))
    assert line.startswith("ncu: 1.62 ms in 1 kernel(s)") and "tensor pipe 66.8%" in line and "168 registers" in line
    assert P.profile_summary({"status": "error", "reason": "boom"}) == "no profile (error: boom)"
    assert P.profile_summary(None) == "no profile"


def test_an_untrusted_kernel_file_is_profiled_inside_the_sandbox(fake_ncu, tmp_path):
    from kbench.run import sandbox
    from kbench.api import KernelFileRef
    from kbench.plugins import PluginManager

    if not sandbox.probe().available:
        pytest.skip(f"the sandbox does not work here: {sandbox.probe().describe()}")
    kernel = tmp_path / "kernel.py"
    kernel.write_text('SUBSTRATE = "numpy"\nOP = "attention"\n\ndef attention(q, k, v, out, *, causal, scale):\n'
                      '    raise NotImplementedError\n')
    ref = KernelFileRef(kernel, PluginManager().registry)
    record = {"backend": ref.name, "op": "attention", "case": CASE, "status": "passed"}
    profile = P.attach_profile(record, ref, ncu=fake_ncu)
    assert profile["sandboxed"] and profile["status"] == "ok", profile
    assert f"--kernel-file {kernel}" in profile["command"] and profile["metrics"]["kernels"] == 4
    # the command: bwrap with the workers' options, ncu's installation bound read-only, the allow-listed environment
    argv, env = P.sandboxed(P.ncu_command(fake_ncu, ["true"]), fake_ncu, str(tmp_path / "scratch"))
    assert argv[0] == sandbox.bwrap_binary() and "--unshare-all" in argv and "FAKE_NCU" not in env
    cut = argv.index("--")
    assert argv[cut + 1] == fake_ncu and argv[cut - 3: cut] == ["--ro-bind-try", str(tmp_path.parent),
                                                                  str(tmp_path.parent)]
