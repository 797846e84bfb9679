"""kbench as the fitness function of external evolvers: score_kernel, OpenEvolve's evaluate, ShinkaEvolve's
evaluate.py, and a real OpenEvolve loop against a scripted OpenAI-compatible server on 127.0.0.1."""
from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from kbench.errors import BadInput
from kbench.evaluators import score_kernel

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "openevolve"
#: the smallest fitness suite: one causal case, a handful of samples
SUITE = {"version": 1, "name": "evaluator-test", "op": "attention", "check": {"seeds": 2},
         "timing": {"warmup_time": 0.0, "min_samples": 5, "min_time": 0.01, "max_time": 0.1, "target_rel_se": 0.05,
                    "rotate": 2},
         "grid": [{"batch": 1, "seqlen": 128, "heads": 2, "head_dim": 32, "causal": True, "dtype": "fp32"}]}


def _sandbox_options() -> dict:
    from kbench.run.sandbox import probe

    return {} if probe().available else {"allow_unsandboxed": True}


# the candidates an LLM might write in place of the seed's EVOLVE-BLOCK (the seed loops over query rows)
VECTORISED = '''def attention(q, k, v, out, *, causal, scale):
    # candidate: every head and row at once
    sq, sk = q.shape[1], k.shape[1]
    group = q.shape[2] // k.shape[2]
    qh = q.astype(np.float32).transpose(0, 2, 1, 3)
    kh = np.repeat(k.astype(np.float32), group, axis=2).transpose(0, 2, 3, 1)
    vh = np.repeat(v.astype(np.float32), group, axis=2).transpose(0, 2, 1, 3)
    s = (qh @ kh) * np.float32(scale)
    if causal:
        s = np.where(np.arange(sk)[None, :] <= np.arange(sq)[:, None] + (sk - sq), s, -np.inf)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - np.where(np.isfinite(m), m, 0))  # a causal row that sees no key (sq > sk) is 0, not NaN
    l = p.sum(-1, keepdims=True)
    out[...] = ((p / np.where(l == 0, 1, l)) @ vh).transpose(0, 2, 1, 3)'''
WRONG = VECTORISED.replace("# candidate: every head and row at once", "# candidate: no scale").replace(
    " * np.float32(scale)", "")
CACHING = '''_RESULTS = {}


def attention(q, k, v, out, *, causal, scale):
    # candidate: remember answers
    key = (q.tobytes(), k.tobytes(), v.tobytes(), causal)
    if key not in _RESULTS:
        sq, sk = q.shape[1], k.shape[1]
        s = np.einsum("bqhd,bkhd->bhqk", q.astype(np.float32), k.astype(np.float32)) * np.float32(scale)
        if causal:
            s = np.where(np.arange(sk)[None, :] <= np.arange(sq)[:, None] + (sk - sq), s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        _RESULTS[key] = np.einsum("bhqk,bkhd->bqhd", p / p.sum(-1, keepdims=True), v.astype(np.float32))
    out[...] = _RESULTS[key]'''


def seed_block(seed: str) -> str:
    start, end = "# EVOLVE-BLOCK-START\n", "\n# EVOLVE-BLOCK-END"
    return seed[seed.index(start) + len(start):seed.index(end)]


def with_block(block: str) -> str:
    seed = (EXAMPLE / "seed.py").read_text()
    return seed.replace(seed_block(seed), block)


# --------------------------------------------------------------------------------------------
# score_kernel and the adapters, without an evolver


def test_a_file_refused_before_it_runs_scores_zero_with_the_reason(tmp_path):
    bad = tmp_path / "cand.py"
    bad.write_text("SUBSTRATE = 'fortran'\n\ndef attention(q, k, v, out, *, causal, scale):\n    pass\n")
    fit = score_kernel(bad, suite=SUITE)
    assert fit.score == 0 and not fit.correct and fit.cases == {}
    assert "unknown SUBSTRATE 'fortran'" in fit.failures["(load)"] and str(bad) in fit.failures["(load)"]
    assert fit.metrics() == {"combined_score": 0.0, "correct": 0.0, "cases_passed": 0.0, "cases": 0.0,
                             "geomean_tflops": 0.0}
    with pytest.raises(BadInput, match="grid"):  # the user's own configuration is checked first: no candidate's 0
        score_kernel(bad, suite={"name": "x"})


def test_with_a_baseline_the_score_is_the_speedup_measured_in_the_same_run(tmp_path, monkeypatch):
    from kbench.evaluators.openevolve import as_evaluation_result

    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")  # see the OpenEvolve loop below
    cand = tmp_path / "cand.py"
    cand.write_text(with_block(VECTORISED))
    # the baseline: the seed's function as a trusted callable (in this process: no second worker to start)
    namespace: dict = {}
    exec(compile((EXAMPLE / "seed.py").read_text(), "seed", "exec"), namespace)
    seed = namespace["attention"]
    fit = score_kernel(cand, suite=SUITE, baseline=seed, results_dir=tmp_path / "kept", **_sandbox_options())
    (case, cell), = fit.cases.items()
    assert fit.correct and fit.score == pytest.approx(cell["speedup"]) and fit.score > 2  # vectorised vs a row loop
    assert fit.score_kind == "geomean speedup over fn:attention" and fit.metrics()["speedup"] == fit.score
    kept = json.loads(Path(fit.result_file).read_text())
    assert Path(fit.result_file).parent.parent == tmp_path / "kept"
    assert sorted(r["backend"] for r in kept["records"]) == ["file:cand", "fn:attention"]
    result = as_evaluation_result(fit)
    metrics = result.metrics if hasattr(result, "metrics") else result
    assert metrics["combined_score"] == fit.score
    if hasattr(result, "artifacts"):
        assert f"{case}: " in result.artifacts["kbench_feedback"] and "x the baseline" in result.artifacts["kbench_feedback"]


def test_a_baseline_that_fails_is_the_harness_problem_not_a_zero(tmp_path):
    from kbench.evaluators import EnvironmentFailure
    from kbench.testing import FunctionBackend

    cand = tmp_path / "cand.py"
    cand.write_text(with_block(CACHING))
    broken = FunctionBackend(lambda q, k, v, out, case: out.fill(0), name="broken-baseline")
    with pytest.raises(EnvironmentFailure, match="the baseline did not pass.*broken-baseline @ attention"):
        score_kernel(cand, suite=SUITE, baseline=broken, device="cpu")


def test_shinka_program_writes_the_files_shinka_reads(tmp_path):
    from kbench.evaluators.shinka import main

    cand = tmp_path / "cand.py"
    cand.write_text(with_block(CACHING))  # refused by the static checks: no worker needed to fail it
    (tmp_path / "s.yaml").write_text(json.dumps(SUITE))  # JSON is YAML
    argv = ["--program_path", str(cand), "--results_dir", str(tmp_path / "out"), "--suite", str(tmp_path / "s.yaml"),
            "--device", "cpu"] + (["--allow_unsandboxed"] if _sandbox_options() else [])
    assert main(argv) == 0
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    correct = json.loads((tmp_path / "out" / "correct.json").read_text())
    assert metrics["combined_score"] == 0.0 and correct["correct"] is False
    assert correct["error"].startswith("attention[b=1,sq=128") and "module-level mutable" in correct["error"]
    assert metrics["public"]["correct"] == 0.0 and metrics["public"]["cases"] == 1.0
    assert "score is 0 until every case passes" in metrics["text_feedback"]


def test_shinka_reads_the_files_with_its_own_reader(tmp_path):
    pytest.importorskip("shinka", reason="ShinkaEvolve is an optional extra (heavy): pip install kbench[shinka]")
    from shinka.utils.general import load_results

    from kbench.evaluators import Fitness
    from kbench.evaluators.shinka import shinka_files, write_results

    fit = Fitness(1.5, True, {}, {"c1": {"status": "passed", "tflops": 2.0, "speedup": 1.5}}, "geomean speedup over x",
                  "file:cand", "x")
    write_results(tmp_path, *shinka_files(fit))
    loaded = load_results(str(tmp_path))
    assert loaded["correct"] == {"correct": True, "error": None} and loaded["metrics"]["combined_score"] == 1.5
    assert loaded["metrics"]["public"]["tflops[c1]"] == 2.0 and "1.5x the baseline" in loaded["metrics"]["text_feedback"]


def test_the_example_evaluator_is_configured_for_the_example_suite():
    spec = importlib.util.spec_from_file_location("example_evaluator", EXAMPLE / "evaluator.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from kbench.api import load_suite
    from kbench.evaluators.openevolve import OpenEvolveEvaluator

    assert isinstance(module.evaluate, OpenEvolveEvaluator) and module.evaluate.options == {"baseline": "numpy-flash"}
    assert load_suite(module.evaluate.suite).op == "attention"
    for seed in ((EXAMPLE / "seed.py").read_text(), (ROOT / "examples/shinka/initial.py").read_text()):
        assert seed.count("# EVOLVE-BLOCK-START") == 1 and seed_block(seed).startswith("def attention(")
    spec = importlib.util.spec_from_file_location("example_shinka_evaluate", ROOT / "examples/shinka/evaluate.py")
    shinka_example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shinka_example)  # main() runs only as a program
    assert load_suite(shinka_example.SUITE).name == "openevolve-example"


def test_the_openevolve_module_is_an_evaluation_file_configured_by_the_environment():
    from kbench.evaluators import openevolve

    ev = openevolve.from_environment({"KBENCH_EVAL_SUITE": "s.yaml", "KBENCH_EVAL_BASELINE": "numpy-flash",
                                      "KBENCH_EVAL_DEVICE": "", "KBENCH_EVAL_RESULTS": "kept"})
    assert ev.suite == "s.yaml" and ev.options == {"baseline": "numpy-flash", "results_dir": "kept"}
    with pytest.raises(BadInput, match="KBENCH_EVAL_SUITE is not set"):
        openevolve.from_environment({})
    assert callable(openevolve.evaluate)


# --------------------------------------------------------------------------------------------
# a real OpenEvolve loop


def _scripted_server():
    spec = importlib.util.spec_from_file_location(
        "kbench_test_openai_server", ROOT / "plugins" / "kbench-evolve" / "tests" / "openai_server.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_openevolve_loop_ranks_right_faster_above_seed_above_wrong_and_caching(tmp_path, monkeypatch):
    pytest.importorskip("openevolve", reason="OpenEvolve is an optional extra: pip install kbench[openevolve]")
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        # one BLAS thread, as suites/evolve-cpu.yaml asks: a pool of spinning BLAS threads on a loaded 2-core
        # machine makes small matmuls slower than the seed's row loop, which is not what this test is about
        monkeypatch.setenv(var, "1")
    import yaml
    from openevolve.config import Config
    from openevolve.controller import OpenEvolve

    server = _scripted_server()
    seed = (EXAMPLE / "seed.py").read_text()
    old = seed_block(seed)
    blocks = [old, VECTORISED, WRONG, CACHING]

    def rewrite(new: str) -> str:
        # the parent OpenEvolve samples may be the seed or an earlier candidate: one SEARCH block for each,
        # of which the one the parent holds applies
        return "".join(f"<<<<<<< SEARCH\n{b}\n=======\n{new}\n>>>>>>> REPLACE\n\n" for b in blocks if b != new)
    script = [server.reply(f"Vectorise.\n{rewrite(VECTORISED)}"), server.reply(f"Drop the scale.\n{rewrite(WRONG)}"),
              server.reply(f"Cache.\n{rewrite(CACHING)}")]
    evaluator = tmp_path / "evaluator.py"
    options = {"device": "cpu", **_sandbox_options()}
    evaluator.write_text("from kbench.evaluators.openevolve import OpenEvolveEvaluator\n"
                         f"evaluate = OpenEvolveEvaluator(suite={SUITE!r}, **{options!r})\n")
    data = yaml.safe_load((EXAMPLE / "config.yaml").read_text())  # the example's settings, a scripted model
    with server.ScriptedOpenAI(script) as llm:
        data["llm"].update(api_base=llm.url, api_key="test-key", models=[{"name": "scripted", "weight": 1.0}],
                           retries=0, retry_delay=0, timeout=30)
        data.update(max_iterations=3, checkpoint_interval=100, log_dir=str(tmp_path / "logs"))
        config = Config.from_dict(data)
        config.llm.update_model_params({"system_message": config.prompt.system_message})
        controller = OpenEvolve(str(EXAMPLE / "seed.py"), str(evaluator), config, output_dir=str(tmp_path / "out"))
        asyncio.run(controller.run(iterations=3))
    assert len(llm.requests) == 3 and "EVOLVE-BLOCK-START" in llm.requests[0]["messages"][-1]["content"]
    programs = list(controller.database.programs.values())

    def metrics_of(marker: str) -> dict:
        found = [p for p in programs if marker in p.code]
        assert len(found) == 1, f"{marker!r} in {len(found)} programs"
        return found[0].metrics

    seed_m = metrics_of("for i in range(sq):")  # the seed's row loop: in no candidate
    fast, wrong, cache = (metrics_of("# candidate: every head"), metrics_of("# candidate: no scale"),
                          metrics_of("# candidate: remember answers"))
    assert fast["correct"] == seed_m["correct"] == 1.0
    assert fast["combined_score"] > 2 * seed_m["combined_score"] > 0  # a real gain, measured, not declared
    assert wrong["combined_score"] == cache["combined_score"] == 0.0 and wrong["correct"] == cache["correct"] == 0.0
    assert controller.database.get_best_program().metrics == fast
    # the reasons reach the evolver (OpenEvolve keeps them as the program's artifacts for the next prompt)
    wrong_id = next(p.id for p in programs if "# candidate: no scale" in p.code)
    cache_id = next(p.id for p in programs if "# candidate: remember answers" in p.code)
    assert "relative L2 error" in controller.database.get_artifacts(wrong_id)["kbench_failures"]
    assert "module-level mutable" in controller.database.get_artifacts(cache_id)["kbench_failures"]
