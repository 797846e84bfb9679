"""kbench roofline: model shapes -> parameters, KV cache, intensity, fits and walls, checked by hand; and
where a measured record sits on its profile's datasheet and measured roofs (kbench.roofline.point)."""
from __future__ import annotations

import json
import math
import textwrap

import pytest
from click.testing import CliRunner

from kbench.cli import cli
from kbench.errors import BadInput
from kbench.hardware import HardwareProfile, builtin_profiles
from kbench.roofline import (analyze, attention_flops_per_pair, attention_params, builtin_models, decode,
                             kv_bytes_per_token, load_models, param_count, parse_context, prefill, weights_touched)
from kbench.roofline.point import roofline_point

MODELS = {m.name: m for m in builtin_models()}
HW = {p.name: p for p in builtin_profiles()}


def invoke(*args):
    return CliRunner().invoke(cli, ["roofline", *args], catch_exceptions=False)


def test_kv_cache_per_token_by_hand():
    # Llama-3.1-70B config.json: 2 * 80 * 8 * 128 * 2 = 327,680 B/token; DeepSeek-V3 MLA 61 * (512 + 64) * 2 = 70,272
    assert kv_bytes_per_token(MODELS["llama-3.1-70b"]) == 327_680
    assert kv_bytes_per_token(MODELS["llama-3.1-70b"]) * 1_000_000 == 327.68e9
    assert kv_bytes_per_token(MODELS["deepseek-v3"]) == 70_272
    assert kv_bytes_per_token(MODELS["llama-3.1-8b"]) == 2 * 32 * 8 * 128 * 2
    assert kv_bytes_per_token(MODELS["qwen3-30b-a3b"]) == 2 * 48 * 4 * 128 * 2
    assert kv_bytes_per_token(MODELS["llama-3.1-70b"], "fp8") == 163_840
    assert kv_bytes_per_token(MODELS["llama-3.1-70b"].as_mha()) == 8 * 327_680   # 64 KV heads instead of 8


def test_attention_kinds():
    assert [MODELS[n].attention for n in ("llama-3.1-8b", "deepseek-v3")] == ["gqa", "mla"]
    assert MODELS["llama-3.1-8b"].as_mha().attention == "mha"


def test_llama_70b_layer_by_hand():
    # q and o: 8192 x 64*128 each; k and v: 8192 x 8*128 each
    assert attention_params(MODELS["llama-3.1-70b"]) == 2 * 8192 * 8192 + 2 * 8192 * 1024 == 150_994_944


@pytest.mark.parametrize("name", sorted(MODELS))
def test_parameter_count_from_shapes_matches_the_published_total(name):
    m = MODELS[name]
    pc = param_count(m)
    assert pc.total == pytest.approx(m.params, rel=0.01)
    if m.active_params:
        assert pc.active == pytest.approx(m.active_params, rel=0.03)
    else:
        assert pc.active == pc.total


def test_moe_weights_touched_grow_with_the_batch():
    m = MODELS["qwen3-30b-a3b"]
    pc = param_count(m)
    assert weights_touched(m, pc, 1) == pytest.approx(pc.active)      # 8 of 128 experts
    # two tokens: 128 * (1 - (120/128)^2) = 15.5 distinct experts per layer
    two = pc.total - 48 * (128 - 128 * (1 - (120 / 128) ** 2)) * pc.expert
    assert weights_touched(m, pc, 2) == pytest.approx(two)
    assert weights_touched(m, pc, 100_000) == pytest.approx(pc.total)
    dense = MODELS["llama-3.1-8b"]
    assert weights_touched(dense, param_count(dense), 1) == param_count(dense).total


def test_decode_and_prefill_costs_by_hand():
    m = MODELS["llama-3.1-8b"]
    pc = param_count(m)
    per_key = 2 * 32 * 32 * (128 + 128)          # QK^T and PV over 32 layers, 32 heads
    assert attention_flops_per_pair(m, "decode") == per_key == 524_288
    d = decode(m, 8192)
    assert d.flops == 2 * pc.matmul + per_key * 8192
    assert d.bytes == pc.total * 2 + 8192 * 131_072
    assert d.intensity == pytest.approx(1.127, abs=0.002)
    p = prefill(m, 1000)
    assert p.flops == 2 * pc.matmul * 1000 + per_key * 1000 * 1001 / 2
    # MLA decodes against the latent (576 / 512 dims), prefills expanded (192 / 128)
    assert attention_flops_per_pair(MODELS["deepseek-v3"], "decode") == 2 * 61 * 128 * (576 + 512)
    assert attention_flops_per_pair(MODELS["deepseek-v3"], "prefill") == 2 * 61 * 128 * (192 + 128)


def test_llama_70b_at_one_million_tokens_by_hand():
    # docs/roofline.md: weights 70.55e9 params * 2 B = 141.1 GB; KV 327.68 GB; one request 468.8 GB
    m = MODELS["llama-3.1-70b"]
    w = param_count(m).total * 2
    assert w == pytest.approx(141.1e9, rel=1e-3)
    h200 = analyze(m, 1_000_000, HW["h200"])
    assert h200.kv_bytes_per_request == 327.68e9
    assert h200.one_request_bytes == pytest.approx(w + 327.68e9)
    assert h200.devices_per_request == math.ceil((w + 327.68e9) / 141e9) == 4
    assert h200.requests_per_device == 0                     # the weights alone exceed 141 GB
    assert h200.requests_on_group == math.floor((4 * 141e9 - w) / 327.68e9) == 1
    assert h200.wall == "capacity" and h200.group_bound == "bandwidth"
    # spread over 4 devices, a decode step reads 468.8 GB at 4 * 4.8 TB/s: 24.4 ms, 41 tokens/s
    assert h200.decode_tokens_per_s == pytest.approx(4 * 4.8e12 / (w + 327.68e9))
    b200 = analyze(m, 1_000_000, HW["b200"])
    assert b200.devices_per_request == math.ceil((w + 327.68e9) / 180e9) == 3
    assert b200.wall == "capacity"


def test_short_context_small_model_is_bandwidth_bound():
    m = MODELS["llama-3.1-8b"]
    r = analyze(m, 8192, HW["h200"])
    w = param_count(m).total * 2
    assert r.devices_per_request == 1
    assert r.requests_per_device == math.floor((141e9 - w) / (8192 * 131_072)) == 116
    assert r.wall == "bandwidth" and r.prefill_bound == "compute"
    assert r.batch_intensity < r.ridge


def test_usable_fraction_shrinks_what_fits():
    m = MODELS["llama-3.1-8b"]
    assert analyze(m, 8192, HW["h200"], usable=0.5).requests_per_device < 116


@pytest.mark.parametrize("text, tokens", [("1000000", 1_000_000), ("1M", 1_000_000), ("128k", 128_000),
                                          ("128Ki", 131_072), ("1Mi", 1_048_576), ("1_000_000", 1_000_000)])
def test_parse_context(text, tokens):
    assert parse_context(text) == tokens


@pytest.mark.parametrize("bad", ["0", "-5", "1.5", "abc", "k"])
def test_bad_context_is_bad_input(bad):
    with pytest.raises(BadInput, match="--context"):
        parse_context(bad)


def test_must_show_command():
    res = invoke("--model", "llama-3.1-70b", "--context", "1000000", "--hardware", "h200,b200")
    assert res.exit_code == 0, res.output
    lines = [line.split() for line in res.output.splitlines() if line.startswith("llama-3.1-70b")]
    assert [(row[2], row[5], row[10]) for row in lines] == [("h200", "327.68", "4"), ("b200", "327.68", "3")]
    assert "capacity" in res.output


def test_json_output_and_precisions():
    res = invoke("-m", "llama-3.1-70b", "-c", "1M", "--hardware", "b200", "--weights", "fp8", "--kv", "fp8",
                 "--format", "json")
    (row,) = json.loads(res.output)
    assert row["kv_bytes_per_request"] == 163.84e9 and row["weight_bytes"] == pytest.approx(70.55e9, rel=1e-3)
    assert row["devices_per_request"] == 2      # 70.55 + 163.84 = 234.4 GB on 180 GB devices


def test_plots_are_written(tmp_path):
    res = invoke("-m", "llama-3.1-8b,deepseek-v3", "-c", "8k,1M", "--hardware", "h200,b200", "--plots", str(tmp_path))
    assert res.exit_code == 0, res.output
    import matplotlib.image

    for name in ("roofline-quadrants.png", "footprint-vs-context.png"):
        img = matplotlib.image.imread(tmp_path / name)
        assert img.shape[0] > 400 and img.shape[1] > 600 and img.std() > 0.01   # a picture, not a blank canvas


def test_user_model_file(tmp_path):
    f = tmp_path / "models.yaml"
    f.write_text(textwrap.dedent("""
        models:
          - name: tiny-mha
            layers: 2
            hidden: 256
            heads_q: 4
            heads_kv: 4
            head_dim: 64
            ffn: 1024
            vocab: 1000
    """))
    (m,) = load_models(str(f))
    assert m.attention == "mha" and kv_bytes_per_token(m) == 2 * 2 * 4 * 64 * 2
    res = invoke("--model-file", str(f), "-c", "4096", "--hardware", "h200", "--format", "csv")
    assert res.exit_code == 0 and "tiny-mha,\"4,096\",h200" in res.output


def test_bad_model_file_names_file_place_and_fix(tmp_path):
    f = tmp_path / "models.yaml"
    f.write_text("models:\n  - name: odd\n    layers: 2\n    hidden: 64\n    heads_q: 6\n    heads_kv: 4\n"
                 "    head_dim: 16\n    ffn: 128\n    vocab: 10\n")
    with pytest.raises(BadInput) as err:
        load_models(str(f))
    assert str(f) in str(err.value) and "line 2" in str(err.value) and "fix:" in str(err.value)
    f.write_text("models:\n  - name: x\n    layers: two\n    hidden: 64\n    heads_q: 4\n    heads_kv: 4\n"
                 "    head_dim: 16\n    ffn: 128\n    vocab: 10\n")
    with pytest.raises(BadInput, match=r"models\[0\]\.layers \(line 3\).*'two'"):
        load_models(str(f))


def test_unknown_names_exit_2():
    res = invoke("--model", "gpt-9", "--hardware", "h200")
    assert res.exit_code == 2 and "llama-3.1-70b" in res.output
    res = invoke("--model", "llama-3.1-8b", "--hardware", "tpu-v9")
    assert res.exit_code == 2 and "h200" in res.output


def test_calibrated_profile_without_datasheet_uses_measured_roofs():
    cpu = HardwareProfile(name="cpu", title="CPU", kind="cpu", peak_flops={}, bandwidth=None,
                          capacity=24e9).with_measured({"bf16": 0.06e12}, 16e9, "test")
    r = analyze(MODELS["llama-3.1-8b"], 8192, cpu)
    assert r.ridge == pytest.approx(0.06e12 / 16e9)
    assert r.requests_per_device == math.floor((24e9 - param_count(MODELS["llama-3.1-8b"]).total * 2) / (8192 * 131_072))
    assert r.wall in ("compute", "bandwidth") and r.decode_tokens_per_s > 0


def test_no_figures_at_all_gives_an_unknown_wall():
    bare = HardwareProfile(name="bare", title="Bare", kind="cpu", peak_flops={}, bandwidth=None, capacity=24e9)
    r = analyze(MODELS["llama-3.1-8b"], 8192, bare)
    assert r.wall == "unknown" and r.decode_tokens_per_s is None and "neither" in r.notes


# --------------------------------------------------------------------------------------------
# a measured record against its profile's roofs


def _profile(**kw) -> HardwareProfile:
    base = dict(name="x", title="X", kind="gpu", peak_flops={"bf16": 100e12}, bandwidth=1e12, capacity=80e9)
    return HardwareProfile(**{**base, **kw})


def test_roofline_point_bandwidth_bound_by_hand():
    # intensity 1e12 / 1e11 = 10 FLOP/B < ridge 100: bandwidth roof = 1 TB/s * 10 = 10 TFLOP/s.
    # 0.2 s -> 5 TFLOP/s attained = 50% of the roof; 1e11 B / 0.2 s = 0.5 TB/s = 50% of bandwidth; 5% of compute.
    m = roofline_point(_profile(), "bf16", 1e12, 1e11, 0.2)
    assert m["intensity"] == 10 and m["bound"] == "bandwidth" and m["roof_basis"] == "datasheet"
    assert m["roof_tflops"] == pytest.approx(10)
    assert m["roof_fraction"] == pytest.approx(0.5)
    assert m["bandwidth_fraction"] == pytest.approx(0.5)
    assert m["compute_fraction"] == pytest.approx(0.05)
    assert m["tflops"] == pytest.approx(5) and m["gbps"] == pytest.approx(500)
    assert m["impossible"] is False


def test_roofline_point_compute_bound_and_impossible():
    # intensity 1000 > ridge 100: compute roof 100 TFLOP/s. 1e12 FLOP in 0.005 s = 200 TFLOP/s: impossible.
    m = roofline_point(_profile(), "bf16", 1e12, 1e9, 0.005)
    assert m["bound"] == "compute" and m["roof_fraction"] == pytest.approx(2.0) and m["impossible"] is True


def test_roofline_point_reports_datasheet_and_measured():
    # measured roofs: 50 TFLOP/s and 0.5 TB/s. Intensity 10: measured bandwidth roof 5 TFLOP/s.
    p = _profile().with_measured({"bf16": 50e12}, 0.5e12, "test")
    m = roofline_point(p, "bf16", 1e12, 1e11, 0.4)   # 2.5 TFLOP/s attained
    assert m["roof_basis"] == "datasheet" and m["roof_fraction"] == pytest.approx(0.25)
    assert m["datasheet_roof_fraction"] == pytest.approx(0.25)
    assert m["measured_roof_fraction"] == pytest.approx(0.5) and m["measured_bound"] == "bandwidth"
    assert m["measured"]["bandwidth_fraction"] == pytest.approx(0.5)


def test_measured_only_profile_is_the_roof_and_never_flags():
    p = _profile(peak_flops={}, bandwidth=None).with_measured({"fp32": 0.1e12}, 10e9, "test")
    m = roofline_point(p, "fp32", 1e9, 1e6, 0.005)   # 0.2 TFLOP/s: twice the measured GEMM
    assert m["roof_basis"] == "measured" and m["bound"] == "compute"
    assert m["roof_fraction"] == pytest.approx(2.0) and m["impossible"] is False
    assert "datasheet" not in m


def test_no_figures_no_roof():
    m = roofline_point(_profile(peak_flops={}, bandwidth=None), "fp32", 1e9, 1e6, 0.01)
    assert "roof_fraction" not in m and m["tflops"] == pytest.approx(1e9 / 0.01 / 1e12)
