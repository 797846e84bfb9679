"""Held-out shapes for everything that scores a kernel, and a repro line per record."""
from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from kbench.cli import cli
from kbench.fuzz.heldout import HeldOut, held_out_cases, near_length
from kbench.plugins import get_plugin_manager
from kbench.results import load_result
from kbench.suite import suite_from_data

PLANTED = Path(__file__).parent / "kernels" / "planted"
HONEST = Path(__file__).parent / "redteam" / "honest_numpy.py"
#: the usual power-of-two shapes; every planted kernel is exact on them
POW2 = {"version": 1, "name": "heldout-test", "op": "attention", "check": {"seeds": 1},
        "timing": {"warmup_time": 0.0, "min_samples": 3, "min_time": 0.0, "max_time": 0.05, "target_rel_se": 1.0},
        "grid": [{"batch": 1, "seqlen": [128], "heads": 4, "head_dim": 32, "causal": [False, True],
                  "dtype": "fp32"}]}


def _sandbox() -> dict:
    from kbench.run.sandbox import probe

    return {} if probe().available else {"allow_unsandboxed": True}


def suite_cases(data=POW2):
    pm = get_plugin_manager()
    return suite_from_data(data).plan("cpu", pm.registry.op(data["op"])).cases


def test_held_out_shapes_cover_the_class_off_the_grid_and_follow_the_secret():
    """Every draw of three: a length that is a multiple of 16 but not a power of two, an odd one, one longer than
    the suite's longest; across draws every free parameter moves (head_dim, odd GQA groups, batch past the suite's,
    causal, value ranges) while the dtype the suite names stays; each within the cost cap."""
    from kbench.fuzz.heldout import domain
    from kbench.fuzz.space import reference_work

    op = get_plugin_manager().registry.op("attention")
    cases = suite_cases()
    a, b = held_out_cases(op, cases, b"s" * 32, 6, suite_data=POW2), held_out_cases(op, cases, b"s" * 32, 6,
                                                                                       suite_data=POW2)
    other = held_out_cases(op, cases, b"t" * 32, 6, suite_data=POW2)
    assert [c.id for c in a] == [c.id for c in b] and [c.id for c in a] != [c.id for c in other]
    suite_ids = {c.id for c in cases}
    dom = domain(op, cases, None, POW2)
    assert dom.pinned == {"dtype": "fp32"}   # named with one value: kept; causal has two values: free
    seen = []
    for i in range(40):
        draw = held_out_cases(op, cases, bytes([i]) * 32, 3, suite_data=POW2)
        assert len(draw) == 3 and not {c.id for c in draw} & suite_ids
        lens = [(c["seqlen_q"], c["seqlen_kv"]) for c in draw]
        assert any(n % 16 == 0 and n & (n - 1) for n in lens[0]), lens
        assert any(n % 2 for n in lens[1]), lens
        assert any(n > 128 for n in lens[2]), lens
        assert all(c["dtype"] == "fp32" and reference_work("attention", c.params) <= dom.max_work for c in draw)
        seen += draw
    assert {c["head_dim"] for c in seen} - {32} and {c["causal"] for c in seen} == {False, True}
    assert any(c["heads_kv"] > 1 and (c["heads_q"] // c["heads_kv"]) in (3, 5, 7) for c in seen)
    assert any(c["batch"] > 1 for c in seen) and any(c["seqlen_q"] != c["seqlen_kv"] for c in seen)
    assert any("values" in c.params for c in seen) and any("values" not in c.params for c in seen)
    assert not any(c["window_left"] != -1 or c["softcap"] or c["mode"] != "fwd" for c in seen)   # none declared
    assert all(near_length(1, __import__("numpy").random.default_rng(i)) in (1, 2, 3) for i in range(5))


def test_held_out_shapes_draw_what_the_kernel_declares(tmp_path):
    """A kernel file's HEAD_DIMS and FEATURES literals: head_dim among the declared ones, windows, softcap and
    the backward drawn (read from the file's text, never run)."""
    from kbench.kernelfile import KernelFileRef

    pm = get_plugin_manager()
    kernel = tmp_path / "k.py"
    kernel.write_text('HEAD_DIMS = (40, 72)\nFEATURES = ("window", "softcap", "bwd")\n'
                      'def attention(q, k, v, out, **kw):\n    pass\n')
    ref = KernelFileRef(kernel, pm.registry)
    op = pm.registry.op("attention")
    seen = [c for i in range(30) for c in held_out_cases(op, suite_cases(), bytes([i]) * 32, 3, backend=ref,
                                                         suite_data=POW2)]
    assert {c["head_dim"] for c in seen} <= {40, 72}
    assert any(c["window_left"] != -1 or c["window_right"] != -1 for c in seen)
    assert any(c["softcap"] for c in seen) and any(c["mode"] != "fwd" for c in seen)
    assert all(c.params.get("values", "unit") in ("unit", "constant_rows") for c in seen
               if c["mode"] != "fwd")


def test_held_out_shapes_of_varlen_and_decode_suites():
    pm = get_plugin_manager()
    varlen = {"version": 1, "name": "v", "op": "attention_varlen",
              "grid": [{"seqlens_q": [[64, 128]], "heads": 2, "head_dim": 16}]}
    decode = {"version": 1, "name": "d", "op": "decode_attention",
              "grid": [{"batch": 2, "seqlen_q": 4, "seqlen_kv": 512, "heads_q": 8, "heads_kv": 2, "head_dim": 64}]}
    vop = pm.registry.op("attention_varlen")
    counts = set()
    for i in range(20):
        draw = held_out_cases(vop, suite_cases(varlen), bytes([i]) * 32, 3, suite_data=varlen)
        lengths = [vop.lengths(c) for c in draw]
        counts |= {len(q) for q, _ in lengths}
        assert any(n > 128 for n in lengths[2][0] + lengths[2][1])   # one longer than the suite's longest
        assert any(n % 16 == 0 and n & (n - 1) for n in lengths[0][0] + lengths[0][1])
    assert counts - {2} and max(counts) <= 4   # sequence counts other than the suite's
    dop = pm.registry.op("decode_attention")
    draw = held_out_cases(dop, suite_cases(decode), b"k" * 32, 3, suite_data=decode)
    assert all(1 <= d["seqlen_q"] <= 5 and d["batch"] <= 4 for d in draw)
    assert draw[0]["seqlen_kv"] % 16 == 0 and draw[1]["seqlen_kv"] % 2 and draw[2]["seqlen_kv"] > 512


def test_a_failing_held_out_shape_is_hidden_unless_shown():
    verdict = HeldOut("k", checked=1, failure=("attention[b=1,sq=77,sk=91,hq=4,hkv=2,d=32,causal,fp32]", "failed",
                                              "relative L2 error 0.5 exceeds ... for shape (1, 77, 4, 32)", 0.5, 1e-5))
    hidden, shown = verdict.reason(), verdict.reason(show=True)
    assert "77" not in hidden and "relative L2 error 0.5" in hidden and not verdict.passed
    assert "sq=77" in shown
    crash = HeldOut("k", checked=1, failure=("attention[sq=77]", "error", "broadcast (1,77,4,32)", None, None))
    assert "77" not in crash.reason() and "error" in crash.reason()


@pytest.mark.slow
def test_score_kernel_zeroes_a_shape_overfitted_kernel_and_scores_an_honest_one():
    """Every planted kernel passes the power-of-two suite (so it scored > 0 on 6cf3c74) and scores 0 now."""
    from kbench.evaluators import score_kernel
    from kbench.evaluators.openevolve import OpenEvolveEvaluator

    for kernel in ("tail_dropped.py", "causal_topleft.py", "pow2_only.py"):
        fit = score_kernel(PLANTED / kernel, suite=POW2, **_sandbox())
        assert fit.score == 0 and not fit.correct and fit.passed_cases == len(fit.cases) == 2, fit.failures
        assert "held-out shape" in fit.failures["(held-out)"] and "sq=" not in fit.failures["(held-out)"]
        off = score_kernel(PLANTED / kernel, suite=POW2, held_out=0, **_sandbox())
        assert off.correct and off.score > 0   # the setting that turns it off: scored as before
    metrics = OpenEvolveEvaluator(POW2, **_sandbox())(str(PLANTED / "gqa_wrong_head.py"))
    metrics = getattr(metrics, "metrics", metrics)
    assert metrics["combined_score"] == 0 and metrics["held_out_passed"] == 0
    honest = OpenEvolveEvaluator(POW2, **_sandbox())(str(HONEST))
    honest = getattr(honest, "metrics", honest)
    assert honest["combined_score"] > 0 and honest["held_out_passed"] == 1


@pytest.mark.slow
def test_measure_checks_kernel_files_on_held_out_shapes(tmp_path):
    from kbench.measurement import measure

    m = measure(str(PLANTED / "causal_topleft.py"), "numpy", suite=POW2, show_held_out=True, **_sandbox())
    assert all(r.passed for r in m.records) and not m.passed
    (key,) = [k for k in m.failures() if "(held-out)" in k]
    assert key.startswith("planted-causal-topleft") and "held-out shape attention[" in m.failures()[key]
    assert list(m.held_out) == ["planted-causal-topleft"]   # the registered backend is not a candidate


@pytest.mark.slow
def test_every_record_carries_its_repro_and_the_repro_measures_that_record_again(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    suite = tmp_path / "s.yaml"
    suite.write_text(__import__("yaml").safe_dump({**POW2, "grid": [{**POW2["grid"][0], "causal": [False, True]}]}))
    runner = CliRunner()
    res = runner.invoke(cli, ["run", str(suite), "-b", "numpy", "-b", str(PLANTED / "pow2_only.py"), "-o",
                              str(tmp_path / "r.json")], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    records = load_result(tmp_path / "r.json")["records"]   # validated against the schema, repro included
    assert len(records) == 4 and all(r["repro"].startswith(f"kbench run {suite} -b ") for r in records)
    shown = runner.invoke(cli, ["show", str(tmp_path / "r.json"), "--repro"], catch_exceptions=False).output
    target = records[3]
    assert f"{target['backend']} @ {target['case_id']} (passed): {target['repro']}" in shown
    argv = shlex.split(target["repro"])[1:] + ["-o", str(tmp_path / "again.json")]
    again = runner.invoke(cli, argv, catch_exceptions=False)
    assert again.exit_code == 0, again.output
    (rec,) = load_result(tmp_path / "again.json")["records"]
    assert (rec["case_id"], rec["backend"], rec["repro"]) == (target["case_id"], target["backend"], target["repro"])


@pytest.mark.slow
def test_evolve_does_not_commit_a_shape_overfitted_candidate_but_commits_the_honest_one(tmp_path, monkeypatch):
    """The seed with faster tiles commits as before; the same with a bug off the suite's shapes (zeros unless the
    key length is a multiple of 64, the suite's is 128) wins its duel and is refused by the held-out shapes."""
    from kbench_evolve import source as src
    from kbench_evolve.engine import Budget, Spent, VariationContext
    from kbench_evolve.fitness import Evaluator
    from kbench_evolve.store import Lineage

    monkeypatch.setenv("KBENCH_EVOLVE_DIR", str(tmp_path / "ws"))
    monkeypatch.chdir(tmp_path)
    sys_path = Path(__file__).resolve().parents[1] / "plugins" / "kbench-evolve" / "tests"
    monkeypatch.syspath_prepend(str(sys_path))
    from evolve_testlib import TINY_SUITE, bad_seed_source

    (tmp_path / "tiny.yaml").write_text(TINY_SUITE)
    (tmp_path / "seed.py").write_text(bad_seed_source())
    res = CliRunner().invoke(cli, ["evolve", "init", "t", "--seed", "seed.py", "--suite", "tiny.yaml", "--device", "cpu"])
    assert res.exit_code == 0, res.output
    lineage = Lineage.open(tmp_path / "ws", "t")
    pm = get_plugin_manager()
    ev = Evaluator(pm, lineage.current_suite(), lineage.scratch("runs"), device="cpu", rounds=1)
    ctx = VariationContext(pm, lineage, ev, Budget(), Spent(), {}, "mutate", echo=lambda s: None)
    fast = src.with_tunables(lineage.champion().source, {"block_q": 64, "block_k": 64})
    overfitted = fast + '''

_exact = attention


def attention(q, k, v, out, **kwargs):
    # overfitted: right only where the suite looks
    if k.shape[1] % 64:
        out[...] = 0
        return
    _exact(q, k, v, out, **kwargs)
'''
    result = ctx.submit(overfitted, rationale="overfitted")
    assert not result.committed and "held-out shape" in result.reason, result.reason
    assert lineage.attempts()[-1]["outcome"] == "rejected" and lineage.champion().number == 1
    result = ctx.submit(fast, rationale="honest")
    assert result.committed, result.reason
    assert lineage.champion().meta["held_out"]["passed"] and "cases" not in lineage.champion().meta["held_out"]
