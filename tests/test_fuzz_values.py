"""Value ranges as a dimension of a case (``values=``), long rows in the fuzz space, and the one held-out switch."""
from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from kbench.errors import BadInput
from kbench.ops import CaseError
from kbench.ops.attention import attention_float64, softmax_scale
from kbench.ops.inputs import (UNIT_SCALE, VALUE_RANGES, RegeneratedInputs, generate, input_key, lanes,
                               value_range)
from kbench.plugins import get_plugin_manager
from kbench.suite import suite_from_data

PLANTED = Path(__file__).parent / "kernels" / "planted"
OPS = get_plugin_manager().registry
ATT = OPS.op("attention")
NAMES = list(VALUE_RANGES) + ["std:4", "std:0.25"]
BASE = {"batch": 2, "seqlen_q": 37, "seqlen_kv": 70, "heads_q": 4, "heads_kv": 2, "head_dim": 32, "causal": True}


def case(values=None, **kw):
    raw = {**BASE, **kw}
    if values is not None:
        raw["values"] = values
    return ATT.make_case(raw)


def test_a_case_that_names_no_range_keeps_its_id_params_and_bytes():
    """``values: unit`` (or ``std:1``) is today's case: the same id (so the same input keys from a secret), the same
    parameters in a record, and inputs equal to the generator's definition computed here independently."""
    plain, unit, std1 = case(), case("unit"), case("std:1")
    assert plain.id == unit.id == std1.id and "values" not in plain.params and "values" not in unit.to_json()
    key = input_key(b"0123456789abcdef")
    made = ATT.make_inputs(plain, key)
    for stream, name in enumerate(("q", "k", "v")):
        spec = ATT.input_specs(plain)[name]
        raw = lanes(key, stream, 0, spec.size).view(np.int16).astype(np.float32) * np.float32(UNIT_SCALE)
        assert np.array_equal(made[name], raw.reshape(spec.shape))


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_each_range_is_what_it_says_of_the_unit_draw(dtype):
    """Same key: each range's q, k, v are the unit draw with the documented elements scaled (exactly: powers of
    two) or zeroed; the ids name the range."""
    key = (11, 12)
    unit = {n: a.astype(np.float64) for n, a in ATT.make_inputs(case(dtype=dtype), key).items()}
    d = BASE["head_dim"]
    for name in NAMES:
        got = {n: a.astype(np.float64) for n, a in ATT.make_inputs(case(name, dtype=dtype), key).items()}
        assert case(name).id.endswith(f",values={name}]") or name == "unit"
        vr = value_range(name)
        for role in ("q", "k", "v"):
            want = unit[role] * vr.scale.get(role, 1.0)
            if role in vr.patterns:
                axis, every, offset, factor = vr.patterns[role]
                flat = np.arange(want.size)
                inner = (BASE["heads_q"] if role == "q" else BASE["heads_kv"]) * d
                where = (flat % d) if axis == "channel" else (flat // inner)
                chosen = (where % every == offset).reshape(want.shape)
                want = np.where(chosen, want * factor, want)
            if dtype == "fp32":   # exact: the scaling is a power of two of a float32
                assert np.array_equal(got[role], want), (name, role)
            else:   # scaled before the cast: a bf16 rounding apart at most
                assert np.allclose(got[role], want, rtol=2 ** -8, atol=0), (name, role)


def test_rows_of_a_patterned_input_are_computed_alone_and_match_the_whole():
    """The judge regenerates only the rows it checks: a position-dependent range gives the same rows either way."""
    for name in ("outlier_tokens", "constant_rows", "outlier_channels", "one_hot"):
        c = case(name, seqlen_q=300, seqlen_kv=300)
        specs = ATT.input_specs(c)
        whole = ATT.make_inputs(c, (3, 4))
        rows = np.array([0, 1, 61, 122, 299])
        for n in ("q", "k"):
            regen = RegeneratedInputs(specs, (3, 4))
            assert np.array_equal(regen.rows(n, (slice(None), rows)), whole[n][:, rows])
            assert np.array_equal(generate(specs[n], (3, 4), list(specs).index(n)), whole[n])


def _mp_attention(q, k, v, causal, scale):
    """Attention in 60-digit arithmetic (mpmath), row by row: the independent high-precision reference."""
    import mpmath

    mpmath.mp.dps = 60
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    out = np.zeros(q.shape)
    for bi, h, i in itertools.product(range(b), range(hq), range(sq)):
        g = h // (hq // hkv)
        seen = [j for j in range(sk) if not causal or j <= i + sk - sq]
        s = [mpmath.fsum(mpmath.mpf(float(q[bi, i, h, t])) * mpmath.mpf(float(k[bi, j, g, t])) for t in range(d))
             * mpmath.mpf(scale) for j in seen]
        if not s:
            continue
        m = max(s)
        w = [mpmath.exp(x - m) for x in s]
        z = mpmath.fsum(w)
        for t in range(d):
            out[bi, i, h, t] = float(mpmath.fsum(wj * mpmath.mpf(float(v[bi, j, g, t])) for wj, j in zip(w, seen)) / z)
    return out


@pytest.mark.parametrize("name", NAMES)
def test_the_float64_reference_stays_exact_on_every_range(name):
    """Against 60-digit arithmetic on a small case with long-ish rows: relative error below 1e-13, far under any
    bound (the largest scores, 256 standard deviations, included)."""
    c = ATT.make_case({"batch": 1, "seqlen_q": 3, "seqlen_kv": 70, "heads_q": 2, "heads_kv": 1, "head_dim": 16,
                       "causal": True, "values": name})
    x = ATT.make_inputs(c, (5, 9))
    ours = attention_float64(x["q"], x["k"], x["v"], causal=True, scale=softmax_scale(c))
    exact = _mp_attention(x["q"], x["k"], x["v"], True, softmax_scale(c))
    assert np.linalg.norm(ours - exact) <= 1e-13 * np.linalg.norm(exact)
    assert ATT.reference(c, x, None).shape == exact.shape


def test_constant_rows_have_the_closed_form_mean_of_the_visible_values():
    c = case("constant_rows", dtype="fp16")
    x = ATT.make_inputs(c, (1, 1))
    ref = ATT.reference(c, x, None)
    v = x["v"].astype(np.float64)
    sq, sk = c["seqlen_q"], c["seqlen_kv"]
    checked = 0
    for bi in range(c["batch"]):
        for i in range(sq):
            if (bi * sq + i) % 3 != 1:   # token rows r % 3 == 1, counted across the batch
                continue
            assert not x["q"][bi, i].any()
            checked += 1
            seen = i + sk - sq + 1
            mean = v[bi, :seen].mean(axis=0)   # (heads_kv, d)
            assert np.allclose(ref[bi, i], np.repeat(mean, 2, axis=0), rtol=0, atol=1e-14)
    assert checked == len([r for r in range(c["batch"] * sq) if r % 3 == 1])


def test_bounds_widen_with_the_score_scale_and_only_then():
    assert ATT.tolerance(case()) == 1e-5 and ATT.tolerance(case("constant_rows")) == 1e-5
    assert ATT.tolerance(case("large_scores")) == pytest.approx(256e-5)
    assert ATT.tolerance(case("large_scores", dtype="bf16")) == 1e-2
    assert ATT.tolerance(case("std:0.25", dtype="fp16")) == 1e-3
    assert ATT.output_tolerance(case("std:4", mode="bwd"), "dq") == pytest.approx(1e-4 * 16)


@pytest.mark.parametrize("bad, says", [("outliers", "unknown value range 'outliers'"),
                                       ("std:3", "power of two"), ("std:1000", "power of two")])
def test_a_range_that_does_not_exist_is_a_case_error(bad, says):
    with pytest.raises(CaseError, match=says):
        case(bad)
    with pytest.raises(CaseError, match="fp8_e4m3"):
        case("outlier_tokens", dtype="fp8_e4m3")


def test_decode_paged_and_varlen_take_ranges_too():
    dec = OPS.op("decode_attention").make_case({"batch": 1, "seqlen_q": 2, "seqlen_kv": 130, "heads_q": 2,
                                                "heads_kv": 1, "head_dim": 16, "page_size": 16,
                                                "values": "outlier_tokens"})
    pages = OPS.op("decode_attention").make_inputs(dec, (2, 2))["k_pages"]
    assert np.abs(pages.reshape(-1, 16)[::61]).max() > 4 * np.abs(pages.reshape(-1, 16)[1::61]).max()
    var = OPS.op("attention_varlen").make_case({"seqlens_q": [3, 5], "heads_q": 2, "heads_kv": 2, "head_dim": 8,
                                                "values": "large_scores"})
    assert "values=large_scores" in var.id and np.abs(OPS.op("attention_varlen").make_inputs(var, 1)["q"]).max() > 16


def test_a_suite_asks_for_ranges_by_name_and_a_wrong_name_is_exit_2_with_the_place():
    grid = [{"seqlen": 64, "heads": 2, "head_dim": 32, "causal": [False, True]}]
    suite = suite_from_data({"name": "v", "inputs": ["unit", "one_hot"], "grid": grid})
    ids = [c.id for c in suite.plan("cpu", ATT).cases]
    assert len(ids) == 4 and sum("values=one_hot" in i for i in ids) == 2
    single = suite_from_data({"name": "v", "inputs": "std:0.25", "grid": grid}).plan("cpu", ATT).cases
    assert all(c["values"] == "std:0.25" for c in single)
    with pytest.raises(BadInput) as err:
        suite_from_data({"name": "v", "inputs": ["unit", "outliers"], "grid": grid})
    assert err.value.exit_code == 2 and "inputs" in str(err.value) and "outlier_channels" in err.value.fix
    with pytest.raises(BadInput, match="power of two"):
        suite_from_data({"name": "v", "inputs": "std:3", "grid": grid}).plan("cpu", ATT)


def test_honest_numpy_passes_every_range_and_planted_value_bugs_fail_through_the_judge():
    from kbench.fuzz.checker import Checker
    from kbench.fuzz.engine import fuzz_secret
    from kbench.kernelfile import KernelFileRef

    pm = get_plugin_manager()
    numpy = pm.registry.resolve("numpy")
    clamp = KernelFileRef(PLANTED / "outlier_clamp.py", pm.registry)
    nomax = KernelFileRef(PLANTED / "no_max_fp16.py", pm.registry)
    with Checker(pm, "attention", "cpu", secret=fuzz_secret(2), allow_unsandboxed=True) as checker:
        for name, dtype in itertools.product(NAMES, ("fp32", "fp16", "bf16")):
            rec = checker.check(numpy, case(name, dtype=dtype, seqlen_kv=300))
            assert rec["status"] == "passed", (name, dtype, rec.get("reason"))
        assert checker.check(clamp, case("unit"))["status"] == "passed"
        assert checker.check(clamp, case("outlier_tokens"))["status"] == "failed"
        assert checker.check(nomax, case("unit", dtype="fp16"))["status"] == "passed"
        bad = checker.check(nomax, case("large_scores", dtype="fp16"))
        assert bad["status"] == "failed" and "NaN" in bad["reason"]


def test_the_fuzz_space_reaches_long_rows_past_each_boundary_within_its_cost():
    """In the first 400 draws of a seed: key rows past 1,024, 2,048 and 4,096 and lengths one off a power of two,
    each case within the reference budget, value ranges drawn."""
    from hypothesis import given, seed, settings

    from kbench.fuzz.space import MAX_WORK, Space, reference_work

    for op in ("attention", "decode_attention", "attention_varlen"):
        drawn: list[dict] = []

        @seed(1)
        @settings(max_examples=400, database=None, deadline=None, phases=["generate"])
        @given(Space(op, ("fp32", "bf16"), frozenset({"bwd"})).strategy())
        def collect(params):
            drawn.append(params)
        collect()
        keys = [max(p["seqlens_kv"]) if "seqlens_kv" in p else p.get("seqlen_kv", 0) for p in drawn]
        assert all(any(k > edge for k in keys) for edge in (1024, 2048, 4096)), (op, max(keys))
        assert any(k in (1023, 1025, 2047, 2049, 4095, 4097, 8191, 8193) for k in keys), op
        assert max(keys) <= 8193
        long = [p for p, k in zip(drawn, keys) if k > 2048]
        assert long and all(reference_work(op, p) <= MAX_WORK for p in long), op
        assert any("values" in p for p in drawn) and any("values" not in p for p in drawn)
        assert all(p.get("values") in (None, "unit", "constant_rows") for p in drawn
                   if p.get("mode", "fwd") != "fwd")
        for p in drawn[:50]:
            OPS.op(op).make_case(p)


def test_one_switch_turns_held_out_shapes_off_for_score_kernel_and_the_example_evaluator(tmp_path, monkeypatch):
    import importlib.util

    from kbench.fuzz.heldout import held_out_default

    monkeypatch.setenv("KBENCH_EVAL_HELD_OUT", "0")
    assert held_out_default() == 0 and held_out_default(2) == 2
    monkeypatch.setenv("KBENCH_EVAL_HELD_OUT", "two")
    with pytest.raises(BadInput, match="KBENCH_EVAL_HELD_OUT"):
        held_out_default()
    monkeypatch.delenv("KBENCH_EVAL_HELD_OUT")
    assert held_out_default() == 3
    # the example evaluation file builds its evaluator in code, without a held_out: the switch still reaches it
    from kbench.evaluators import openevolve

    calls = []
    monkeypatch.setattr(openevolve, "score_kernel", lambda path, **kw: calls.append(kw) or _Fit())
    spec = importlib.util.spec_from_file_location("oe_eval", Path(__file__).parents[1] / "examples" / "openevolve"
                                                  / "evaluator.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.evaluate(str(tmp_path / "k.py"))
    assert "held_out" not in calls[0]   # left to score_kernel, which reads the switch


class _Fit:
    failures: dict = {}
    result_file = None

    def feedback(self):
        return ""

    def metrics(self):
        return {"combined_score": 0.0}


@pytest.mark.slow
def test_score_kernel_reads_the_switch(tmp_path, monkeypatch):
    from kbench.evaluators import score_kernel

    suite = {"version": 1, "name": "one", "op": "attention", "check": {"seeds": 1},
             "timing": {"warmup_time": 0.0, "min_samples": 2, "min_time": 0.0, "max_time": 0.01},
             "grid": [{"seqlen": 64, "heads": 4, "head_dim": 32, "dtype": "fp32"}]}
    monkeypatch.setenv("KBENCH_EVAL_HELD_OUT", "0")
    fit = score_kernel(str(PLANTED / "mult16_overfit.py"), suite=suite, allow_unsandboxed=True)
    assert fit.score > 0 and not fit.held_out
    monkeypatch.setenv("KBENCH_EVAL_HELD_OUT", "3")
    fit = score_kernel(str(PLANTED / "batch_past_suite.py"), suite=suite, allow_unsandboxed=True)
    assert fit.held_out and fit.held_out["checked"] >= 1


def test_fuzz_takes_the_value_ranges_asked_for_and_refuses_unknown_ones(tmp_path):
    from click.testing import CliRunner
    from hypothesis import given, settings

    from kbench.cli import cli
    from kbench.fuzz.space import Space

    res = CliRunner().invoke(cli, ["fuzz", "-b", "numpy", "--values", "outliers", "--budget", "2"])
    assert res.exit_code == 2 and "--values" in res.output and "unknown value range 'outliers'" in res.output
    drawn = []

    @settings(max_examples=60, database=None, deadline=None)
    @given(Space("attention", ("fp32",), values=("one_hot",), long_rows=False).strategy())
    def collect(params):
        drawn.append(params)
    collect()
    assert {p.get("values") for p in drawn} == {"one_hot"} and max(p["seqlen_kv"] for p in drawn) <= 320


def test_a_value_range_is_a_summary_group_of_its_own_and_a_plain_case_keeps_its_key():
    assert ATT.group_key(case()) == ATT.group_key(case("unit")) and "values" not in ATT.group_key(case())
    assert ATT.group_key(case("one_hot")).endswith(",values=one_hot")
    dec = OPS.op("decode_attention")
    raw = {"batch": 1, "seqlen_q": 1, "seqlen_kv": 64, "heads_q": 2, "heads_kv": 1, "head_dim": 16}
    assert dec.group_key(dec.make_case({**raw, "values": "std:4"})) != dec.group_key(dec.make_case(raw))
