"""scripts/gpu-check's driver: stages under their own budgets, an overrunning stage stopped and the later
ones still run, a partial result still summarised, and the dry run of every stage on the CPU."""
from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(_spec)
sys.modules["gpu_check"] = gpu_check
_spec.loader.exec_module(gpu_check)

CASE_16K = dict(batch=1, seqlen_q=16384, seqlen_kv=16384, heads_q=16, heads_kv=16, head_dim=128, causal=False,
                dtype="bf16")
CASE_SMALL = dict(batch=2, seqlen_q=256, seqlen_kv=256, heads_q=8, heads_kv=8, head_dim=128, causal=True,
                  dtype="fp16")

#: a suite stage that writes one record the way kbench does (atomically, before going on), then hangs
#: and ignores SIGTERM: the driver must escalate to SIGKILL and move on
HANGING_SUITE = r"""
import json, os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
out, pid_file, case = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
record = {"backend": "triton-hopper", "case": case, "status": "passed", "metrics": {"tflops": 512.25},
          "correctness": {"rel_l2": 0.0041},
          "telemetry": {"sm_clock_mhz_min": 1755, "sm_clock_mhz_max": 1980, "throttled_samples": [3, 4],
                        "energy": {"joules_per_call": 0.0215, "average_w": 612.0}}}
tmp = out + ".tmp"
open(tmp, "w").write(json.dumps({"id": "partial", "complete": False, "records": [record]}))
os.replace(tmp, out)
open(pid_file, "w").write(str(os.getpid()))
print("wrote one record; now hanging", flush=True)
time.sleep(120)
"""


def _context(tmp_path: Path) -> "gpu_check.Context":
    return gpu_check.Context(tmp_path, dry_run=True, log=open(tmp_path / "log.txt", "w"))


def test_an_overrunning_stage_is_stopped_and_the_later_stages_run_on_its_partial_result(tmp_path, capsys):
    ctx = _context(tmp_path)
    pid_file = tmp_path / "suite.pid"
    stages = [
        gpu_check.Stage("suite", 2.0, command=[sys.executable, "-c", HANGING_SUITE, str(ctx.result_path),
                                               str(pid_file), json.dumps(CASE_16K)]),
        gpu_check.Stage("summary", 60.0, command=gpu_check.summary_command(ctx)),
        gpu_check.Stage("tests", 60.0, command=[sys.executable, "-c", "print('tests stage ran')"]),
    ]
    outcomes = gpu_check.run_stages(ctx, stages)
    assert [(o.name, o.status) for o in outcomes] == [("suite", "timeout"), ("summary", "ok"), ("tests", "ok")]
    # the hanging process ignored SIGTERM and was killed: it is gone, long before its 120 s sleep ended
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)
    assert outcomes[0].seconds < 60
    printed = capsys.readouterr().out
    assert "wrote one record" in printed and "tests stage ran" in printed
    assert "1 records, PARTIAL" in printed
    # the record's figures next to the published anchors, clocks, throttling and energy
    row = next(line for line in printed.splitlines() if line.startswith("| b=1 s=16384"))
    assert "512.2" in row and "paper (H100): FA3 648 cuDNN 595" in row
    backend_row = next(line for line in printed.splitlines() if line.startswith("| triton-hopper"))
    assert all(text in backend_row for text in ("1 passed", "0.0041", "1755-1980", "| 2 ", "612", "0.0215"))
    assert (tmp_path / "gpu-check-summary.md").read_text().count("triton-hopper") == 4  # table, status, targets, engine
    table = gpu_check.stage_table(outcomes)
    assert "suite    timeout" in table and "stopped after its budget of 2 s" in table


def test_a_stage_function_that_runs_out_of_time_is_a_timeout_and_sees_the_environment_chosen_before(tmp_path):
    ctx = _context(tmp_path)

    def choose(ctx, deadline):  # what the install stage's fallback does
        ctx.env["KBENCH_GPU_CHECK_PYTEST_PLUGIN"] = "kbench.testing"
        return 0

    seen = []

    def tests(ctx, deadline):
        seen.append(gpu_check.pytest_command(ctx))
        code, timed_out = gpu_check.run_command(ctx, [sys.executable, "-c", "import time; time.sleep(60)"], deadline)
        return gpu_check.TIMED_OUT if timed_out else code

    outcomes = gpu_check.run_stages(ctx, [gpu_check.Stage("install", 5, func=choose),
                                          gpu_check.Stage("tests", 1.0, func=tests)])
    assert [(o.name, o.status) for o in outcomes] == [("install", "ok"), ("tests", "timeout")]
    assert seen[0][seen[0].index("-p", seen[0].index("no:cacheprovider")) + 1] == "kbench.testing"


def test_summary_of_nothing_is_a_skeleton():
    text = gpu_check.summarize(None)
    assert "PARTIAL (no result file was written)" in text and "(no records)" in text and "case (TFLOP/s)" in text


def test_anchors_only_for_the_papers_16k_point_at_hidden_size_2048():
    assert gpu_check.anchor_text(CASE_16K) == "FA3 648 cuDNN 595"
    d64 = {**CASE_16K, "causal": True, "head_dim": 64, "heads_q": 32, "heads_kv": 32}
    assert gpu_check.anchor_text(d64) == "FA3 473 cuDNN 388"
    assert gpu_check.anchor_text({**d64, "heads_q": 16, "heads_kv": 16}) == ""  # not the paper's shape
    assert gpu_check.anchor_text({**CASE_16K, "head_dim": 256, "heads_q": 8, "heads_kv": 8}) == "FA3 756 cuDNN 581"
    assert gpu_check.anchor_text({**CASE_16K, "batch": 4, "seqlen_q": 4096, "seqlen_kv": 4096}) == ""
    assert gpu_check.anchor_text({**CASE_16K, "dtype": "fp16"}) == ""
    assert gpu_check.anchor_text(CASE_SMALL) == ""


def _record(backend, case, status="passed", tflops=None, rel_l2=0.002):
    return {"backend": backend, "case": case, "status": status, "metrics": {"tflops": tflops},
            "correctness": {"rel_l2": rel_l2}, "reason": None if status == "passed" else f"rel L2 {rel_l2}",
            "timing": {"samples": [1e-3] * 12}}


def test_summary_names_both_anchors_the_failed_errors_and_the_targets():
    causal = {**CASE_16K, "causal": True}
    train = {**CASE_16K, "batch": 4, "seqlen_q": 4096, "seqlen_kv": 4096, "mode": "fwd_bwd"}
    forward = {"complete": True, "records": [
        _record("cudnn", CASE_16K, tflops=692.0), _record("cudnn", causal, tflops=635.0),
        _record("triton-hopper", CASE_16K, tflops=640.0),
        _record("triton-hopper", causal, status="failed", rel_l2=0.0986), _record("triton", causal, tflops=517.0)]}
    tuning = {"complete": True, "records": [_record("triton-hopper[WARP_SPECIALIZE=0]", causal, tflops=580.0)]}
    training = {"complete": True, "records": [_record("cudnn", train, tflops=591.0), _record("triton", train, tflops=270.0)]}
    text = gpu_check.summarize(tuning, gpu_check.cudnn_figures(forward))
    row = next(line for line in text.splitlines() if line.startswith("| b=1 s=16384 h=16 d=128 causal"))
    assert "580" in row and "paper (H100): FA3 616; cuDNN here: 635" in row  # cuDNN from the forward file
    own = gpu_check.summarize(forward)
    hopper = next(line for line in own.splitlines() if line.startswith("| triton-hopper "))
    assert "1 failed 1 passed" in hopper and "0.0986" in hopper and "12-12" in hopper
    goals = gpu_check.targets([forward, tuning, training])
    lines = {line.split("|")[1].strip(): line for line in goals.splitlines() if line.startswith("| b=")}
    assert "triton-hopper 640" in lines["b=1 s=16384 h=16 d=128 full bf16"] and "0.925" in lines[
        "b=1 s=16384 h=16 d=128 full bf16"] and "| met" in lines["b=1 s=16384 h=16 d=128 full bf16"]
    assert "triton-hopper[WARP_SPECIALIZE=0] 580" in lines["b=1 s=16384 h=16 d=128 causal bf16"]
    assert "0.913" in lines["b=1 s=16384 h=16 d=128 causal bf16"]
    assert "0.457" in lines["b=4 s=4096 h=16 d=128 full bf16 fwd_bwd"] and "NOT met" in lines[
        "b=4 s=4096 h=16 d=128 full bf16 fwd_bwd"]


def test_split_wheels_are_put_together_and_checked(tmp_path):
    import hashlib

    payload = bytes(range(256)) * 40
    parts = tmp_path / ".whl-parts"
    parts.mkdir()
    (parts / "big-1.0-py3-none-any.whl.part1").write_bytes(payload[:4000])
    (tmp_path / ".whl").mkdir()
    (tmp_path / ".whl" / "big-1.0-py3-none-any.whl.part2").write_bytes(payload[4000:])
    (parts / "big-1.0-py3-none-any.whl.sha256").write_text(hashlib.sha256(payload).hexdigest() + "  big\n")
    wheels, missing = gpu_check.assemble_split_wheels(tmp_path, tmp_path / "out")
    assert missing == [] and [w.name for w in wheels] == ["big-1.0-py3-none-any.whl"]
    assert wheels[0].read_bytes() == payload
    (tmp_path / ".whl" / "big-1.0-py3-none-any.whl.part2").unlink()
    (parts / "big-1.0-py3-none-any.whl.part3").write_bytes(b"x")
    wheels, missing = gpu_check.assemble_split_wheels(tmp_path, tmp_path / "out2")
    assert wheels == [] and "parts [1, 3]" in missing[0]


def test_budgets_fit_one_device_call_and_bad_overrides_are_refused():
    worst = sum(gpu_check.BUDGETS.values()) + gpu_check.GRACE_S * len(gpu_check.BUDGETS)
    assert worst <= gpu_check.CALL_LIMIT_S < 600
    assert gpu_check._budgets(["suite=12"])["suite"] == 12.0
    with pytest.raises(SystemExit, match="unknown stage 'suit'"):
        gpu_check._budgets(["suit=12"])
    with pytest.raises(SystemExit, match="give seconds"):
        gpu_check._budgets(["suite=soon"])


def test_dry_run_runs_every_stage_on_the_cpu(tmp_path, capsys):
    # the real stages (install says what it would run; tests collect-and-skip without a GPU), the suite
    # on the cpu device: every record a skip, every case of the grid in the skeleton
    code = gpu_check.main(["--dry-run", "--out", str(tmp_path), "--skip", "list,tests,crosscheck"])
    printed = capsys.readouterr().out
    stages = json.loads((tmp_path / "gpu-check-stages.json").read_text())
    assert [(s["name"], s["status"]) for s in stages] == [
        ("machine", "ok"), ("install", "ok"), ("suite", "ok"), ("engine", "ok"), ("tuning", "ok"), ("training", "ok"),
        ("profile", "ok"), ("summary", "ok")]
    assert code == 0
    assert "would run (editable)" in printed
    data = json.loads((tmp_path / "gpu-check.json").read_text())
    assert data["complete"] and {r["status"] for r in data["records"]} == {"skipped"}
    cases = {gpu_check.case_label(r["case"]) for r in data["records"]}
    assert len(cases) == 36 + 7  # the FA3 paper's forward sweep and the correctness cases
    # the FA3 paper's shapes: hidden size 2048 at 16k tokens, each row with the paper's figure
    fa3 = [line for line in printed.splitlines() if line.startswith("| b=1 s=16384") and "paper (H100)" in line]
    assert {line.split("|")[1].split(" d=")[1].split()[0] for line in fa3} == {"64", "128", "256"} and len(fa3) >= 6
    training = json.loads((tmp_path / "gpu-check-training.json").read_text())
    assert training["complete"] and {r["case"]["mode"] for r in training["records"]} == {"fwd_bwd"}
    assert "gpu-check-training.json" in printed and "| b=4 s=4096 h=16 d=128 causal bf16 fwd_bwd" in printed
    tuning = json.loads((tmp_path / "gpu-check-tuning.json").read_text())
    assert len({r["backend"] for r in tuning["records"]}) == 4 and len(tuning["records"]) == 16
    # the profile stage asked for Nsight Compute on its two records: skipped on the cpu, with the reason
    profiled = json.loads((tmp_path / "gpu-check-profile.json").read_text())["records"]
    assert sorted(r["backend"] for r in profiled) == ["cudnn", "triton-hopper"]
    assert all(r["profile"]["status"] == "skipped" for r in profiled) and "profiles (Nsight Compute" in printed
    # the engine stage: the kernel file runs untrusted beside cudnn and triton (skipped on the cpu, with why)
    engine = json.loads((tmp_path / "gpu-check-engine.json").read_text())["records"]
    assert sorted({r["backend"] for r in engine}) == ["cudnn", "file:triton_attention_seed", "triton"]
    assert "engine: no records" in printed  # nothing passed here; on a GPU: samples, kernel share, energy


def test_dry_run_with_a_suite_cut_short_still_summarises(tmp_path, capsys):
    code = gpu_check.main(["--dry-run", "--out", str(tmp_path), "--skip", "machine,install,list,engine,crosscheck,tuning,training,profile,tests",
                           "--budget", "suite=0.05"])
    printed = capsys.readouterr().out
    stages = json.loads((tmp_path / "gpu-check-stages.json").read_text())
    assert [(s["name"], s["status"]) for s in stages] == [("suite", "timeout"), ("summary", "ok")]
    assert code == 3 and "PARTIAL" in printed and "case (TFLOP/s)" in printed


def test_the_tree_fallback_names_every_plugin_and_the_pytest_plugin():
    env = {"PYTHONPATH": "/carried", "KBENCH_PLUGINS": "mine.plugin"}
    gpu_check.use_the_tree(env)
    paths = env["PYTHONPATH"].split(os.pathsep)
    assert paths[0] == str(ROOT) and paths[-1] == "/carried"
    assert all(str(ROOT / d) in paths for d in gpu_check.PLUGIN_DIRS)
    assert env["KBENCH_PLUGINS"] == ("kbench_cuda.plugin,kbench_torch.plugin,kbench_triton.plugin,kbench_evolve.plugin,"
                                     "mine.plugin")
    ctx = gpu_check.Context(ROOT, dry_run=False, env=env)
    command = gpu_check.pytest_command(ctx)
    assert command[command.index("kbench.testing") - 1] == "-p"


def test_evolve_mode_is_a_call_of_its_own_on_the_triton_seed(tmp_path):
    """--evolve SECONDS: the machine, the install (the evolve plugin included), then one lineage of the Triton seed
    on the GPU suite, its run interrupted in time for the log; a budget past one device call is refused."""
    ctx = gpu_check.Context(tmp_path, dry_run=False, log=open(tmp_path / "log.txt", "w"))
    stages = gpu_check.plan(ctx, dict(gpu_check.BUDGETS), evolve=400)
    assert [s.name for s in stages] == ["machine", "install", "evolve"] and stages[2].budget_s == 400
    script = stages[2].command[-1]
    assert str(ROOT / gpu_check.EVOLVE_SEED) in script and str(ROOT / "suites/evolve-gpu.yaml") in script
    assert "--device cuda" in script and "timeout -s INT" in script and script.rstrip().endswith("log gpu --attempts")
    assert "plugins/kbench-evolve" in gpu_check.PLUGIN_DIRS
    assert (ROOT / gpu_check.EVOLVE_SEED).exists()
    with pytest.raises(SystemExit, match="--evolve 600"):
        gpu_check.main(["--dry-run", "--evolve", "600", "--out", str(tmp_path)])
