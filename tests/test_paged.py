"""Paged KV decode: the pool and block table, costs by hand, the reference against a direct computation,
the NumPy and torch paged backends through the judge, and kernels that misuse the block table failing."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from kbench.builtin.numpy_decode import decode_numpy
from kbench.cli import cli
from kbench.ops import CaseError
from kbench.ops.decode import DecodeAttentionOp
from kbench.plugins import PluginManager
from kbench.roofline import builtin_models
from kbench.suite import load_suite
from kbench.testing import FunctionBackend, check_backend, make_case

OP = DecodeAttentionOp()


@pytest.fixture(scope="module")
def pm():
    return PluginManager()


def paged(**kw):
    base = {"batch": 2, "seqlen_q": 3, "seqlen_kv": 37, "heads_q": 4, "heads_kv": 2, "head_dim": 8,
            "page_size": 8, "dtype": "fp32"}
    return OP.make_case({**base, **kw})


def direct_reference(case, x):
    """Token by token through the block table, float64: token t of sequence b is row t % P of page table[b, t // P]."""
    p = case.params
    P, sk, sq, g = p["page_size"], p["seqlen_kv"], p["seqlen_q"], p["heads_q"] // p["heads_kv"]
    out = np.zeros((p["batch"], sq, p["heads_q"], p["head_dim"]))
    for b in range(p["batch"]):
        k = np.stack([x["k_pages"][x["block_table"][b, t // P], t % P] for t in range(sk)]).astype(np.float64)
        v = np.stack([x["v_pages"][x["block_table"][b, t // P], t % P] for t in range(sk)]).astype(np.float64)
        for i in range(sq):
            seen = sk - sq + i + 1
            for h in range(p["heads_q"]):
                s = k[:seen, h // g] @ x["q"][b, i, h].astype(np.float64) / np.sqrt(p["head_dim"])
                w = np.exp(s - s.max())
                out[b, i, h] = w @ v[:seen, h // g] / w.sum()
    return out


def test_contiguous_ids_unchanged_and_paged_ids_say_the_page():
    assert OP.make_case({"seqlen_kv": 100, "heads": 4, "head_dim": 8}).id == \
        "decode_attention[b=1,sq=1,sk=100,hq=4,hkv=4,d=8,fp32]"
    assert paged().id == "decode_attention[b=2,sq=3,sk=37,hq=4,hkv=2,d=8,fp32,page=8]"
    assert paged(pool_factor=3).id.endswith(",page=8,pool=3]")
    assert OP.required_features(paged()) == {"paged"}
    assert OP.required_features(OP.make_case({"seqlen_kv": 100, "heads": 4, "head_dim": 8})) == frozenset()
    with pytest.raises(CaseError, match="page_size > 0"):
        OP.make_case({"seqlen_kv": 100, "heads": 4, "head_dim": 8, "pool_factor": 3})
    with pytest.raises(CaseError, match="'dtype' must be one of fp32, fp16, bf16; got 'fp8_e4m3'"):
        paged(dtype="fp8_e4m3")  # no FP8 KV cache yet: not among the op's choices (docs/suites.md says so)


def test_bytes_count_the_batch_pages_and_the_table_not_the_pool():
    c = paged(dtype="fp16")       # 37 tokens in pages of 8: 5 pages per sequence, 10 for the batch
    assert OP.pages_per_seq(c) == 5 and OP.num_pages(c) == 20
    qo = 2 * 2 * 3 * 4 * 8 * 2
    assert OP.min_bytes(c) == qo + 2 * 10 * 8 * 2 * 8 * 2 + 4 * 10 == 5928
    assert OP.footprint(c) == qo + 2 * 20 * 8 * 2 * 8 * 2 + 4 * 10 == 11048
    assert OP.kernel_kwargs(c) == {"scale": pytest.approx(8 ** -0.5), "page_size": 8, "seqlen_kv": 37}


def test_pool_is_scattered_and_changes_with_the_seed():
    c = paged(pool_factor=3)
    x, y = OP.make_inputs(c, 1), OP.make_inputs(c, 2)
    table = x["block_table"]
    assert table.dtype == np.int32 and table.shape == (2, 5)
    assert x["k_pages"].shape == (30, 8, 2, 8) and len(set(table.ravel())) == 10
    assert table.min() >= 0 and table.max() < 30
    assert not np.array_equal(table, y["block_table"])
    assert not np.array_equal(np.sort(table.ravel()), np.arange(10))   # not the first pages in order
    # the pages outside the batch hold values too (a kernel reading the wrong page reads wrong numbers, never zeros)
    spare = sorted(set(range(30)) - set(table.ravel()))
    used = {x["k_pages"][i].tobytes() for i in table.ravel()}
    assert all(np.any(x["k_pages"][i]) and x["k_pages"][i].tobytes() not in used for i in spare)


@pytest.mark.parametrize("params", [{}, {"seqlen_kv": 40, "page_size": 8}, {"seqlen_q": 1, "page_size": 16},
                                    {"dtype": "bf16", "heads_kv": 1}])
def test_paged_reference_matches_a_direct_computation(params):
    c = paged(**params)
    x = OP.make_inputs(c, 7)
    np.testing.assert_allclose(OP.reference(c, x, None), direct_reference(c, x), rtol=1e-10, atol=1e-12)


def test_paged_reference_equals_the_contiguous_one_on_the_same_logical_cache():
    c = paged()
    x = OP.make_inputs(c, 3)
    k, v = OP.gather_pages(c, x)
    flat = OP.make_case({**c.params, "page_size": 0, "pool_factor": 2})
    np.testing.assert_array_equal(OP.reference(c, x, None), OP.reference(flat, {"q": x["q"], "k": k, "v": v}, None))


@pytest.mark.parametrize("sk, page, block", [(37, 8, 16), (37, 8, 3), (64, 16, 1024), (300, 7, 64)])
def test_numpy_paged_decode_across_page_and_block_edges(sk, page, block):
    c = paged(seqlen_kv=sk, page_size=page)
    x = OP.make_inputs(c, 5)
    out = np.full(OP.output_shape(c), np.nan, dtype=np.float32)
    decode_numpy(x["q"], x["k_pages"], x["v_pages"], out, scale=8 ** -0.5, block_kv=block,
                 block_table=x["block_table"], page_size=page, seqlen_kv=sk)
    ref = OP.reference(c, x, None)
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-5


@pytest.mark.parametrize("backend", ["numpy-decode", "torch-decode"])
@pytest.mark.parametrize("params", [
    {"seqlen_q": 1, "seqlen_kv": 300, "heads_q": 8, "heads_kv": 2, "head_dim": 32, "page_size": 16, "dtype": "fp32"},
    {"batch": 2, "seqlen_q": 4, "seqlen_kv": 250, "heads_q": 4, "heads_kv": 1, "head_dim": 32, "page_size": 32,
     "pool_factor": 3, "dtype": "bf16"},
    {"batch": 2, "seqlen_q": 2, "seqlen_kv": 100, "heads": 4, "head_dim": 16, "dtype": "fp16"},   # contiguous
])
def test_paged_backends_pass_the_judge(pm, backend, params):
    c = make_case(pm, "decode_attention", **params)
    rec = check_backend(pm, pm.registry.backends[backend], c)
    assert rec["status"] == "passed", rec.get("reason")
    assert rec["metrics"]["footprint"] == OP.footprint(c)
    assert rec["metrics"]["gbps"] > 0


def _pool_in_order(q, k_pages, v_pages, block_table, out, case):
    """Wrong: reads the first pages of the pool, in order, as if the table were the identity."""
    pps = block_table.shape[1]
    b = q.shape[0]
    k = k_pages[: b * pps].reshape(b, -1, *k_pages.shape[2:])[:, : case["seqlen_kv"]]
    v = v_pages[: b * pps].reshape(b, -1, *v_pages.shape[2:])[:, : case["seqlen_kv"]]
    decode_numpy(q, k, v, out, scale=case["head_dim"] ** -0.5)


def _whole_last_page(q, k_pages, v_pages, block_table, out, case):
    """Wrong: attends to every row of the last page, past seqlen_kv."""
    decode_numpy(q, k_pages, v_pages, out, scale=case["head_dim"] ** -0.5, block_table=block_table,
                 page_size=case["page_size"], seqlen_kv=block_table.shape[1] * case["page_size"])


def _right(q, k_pages, v_pages, block_table, out, case):
    decode_numpy(q, k_pages, v_pages, out, scale=case["head_dim"] ** -0.5, block_table=block_table,
                 page_size=case["page_size"], seqlen_kv=case["seqlen_kv"])


@pytest.mark.parametrize("fn, passes", [(_right, True), (_pool_in_order, False), (_whole_last_page, False)])
def test_a_kernel_that_misuses_the_block_table_fails(pm, fn, passes):
    c = make_case(pm, "decode_attention", batch=2, seqlen_kv=40, heads_q=4, heads_kv=2, head_dim=16, page_size=16)
    backend = FunctionBackend(fn, op="decode_attention")
    backend.features = frozenset({"paged"})
    rec = check_backend(pm, backend, c)
    if passes:
        assert rec["status"] == "passed", rec.get("reason")
    else:
        assert rec["status"] == "failed" and "relative L2 error" in rec["reason"], rec.get("reason")


def test_a_backend_without_the_paged_feature_is_skipped_with_the_reason(pm):
    c = make_case(pm, "decode_attention", seqlen_kv=40, heads=2, head_dim=16, page_size=16)
    rec = check_backend(pm, FunctionBackend(_right, op="decode_attention"), c)
    assert rec["status"] == "skipped" and "does not implement paged" in rec["reason"]


def test_serving_suite_uses_the_shipped_model_head_layouts():
    suite = load_suite("suites/serving.yaml")
    cpu, cuda = suite.plan("cpu", OP).cases, suite.plan("cuda", OP).cases
    layouts = {(m.heads_q, m.heads_kv, m.head_dim) for m in builtin_models()}
    assert all((c["heads_q"], c["heads_kv"], c["head_dim"]) in layouts for c in cpu + cuda)
    assert all(c["page_size"] for c in cuda) and any(c["page_size"] for c in cpu)
    assert min(c["seqlen_kv"] for c in cuda) == 8192 and max(c["seqlen_kv"] for c in cuda) >= 1_000_000
    assert {16, 256} <= {c["page_size"] for c in cuda}


def test_kbench_run_of_a_paged_suite(tmp_path):
    suite = tmp_path / "paged.yaml"
    suite.write_text(
        "version: 1\nname: paged-tiny\nop: decode_attention\nbackends: [numpy-decode, torch-decode]\n"
        "timing: {min_samples: 3, max_time: 0.05, warmup_time: 0.0}\n"
        "grid:\n  - {seqlen_kv: 200, heads_q: 4, heads_kv: 2, head_dim: 16, page_size: [0, 16], dtype: fp32}\n")
    out = tmp_path / "r.json"
    res = CliRunner().invoke(cli, ["run", str(suite), "-o", str(out)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    records = json.loads(out.read_text())["records"]
    assert {(r["backend"], r["status"]) for r in records} == {("numpy-decode", "passed"), ("torch-decode", "passed")}
    assert sorted(r["case_id"] for r in records if r["backend"] == "numpy-decode") == [
        "decode_attention[b=1,sq=1,sk=200,hq=4,hkv=2,d=16,fp32,page=16]",
        "decode_attention[b=1,sq=1,sk=200,hq=4,hkv=2,d=16,fp32]"]


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["torch-decode-cuda", "flash-attn-decode", "flashinfer-decode"])
@pytest.mark.parametrize("page", [16, 256])
def test_gpu_paged_backends(pm, backend, page):
    c = make_case(pm, "decode_attention", batch=2, seqlen_kv=1000, heads_q=32, heads_kv=8, head_dim=128,
                  page_size=page, dtype="bf16")
    b = pm.registry.backends[backend]
    if b.available():
        pytest.skip(b.available())
    rec = check_backend(pm, b, c)
    if backend == "flash-attn-decode" and page == 16:
        assert rec["status"] in ("passed", "skipped"), rec.get("reason")   # FA2 builds refuse pages of 16
    else:
        assert rec["status"] == "passed", rec.get("reason")


def test_torch_gather_matches_the_op_gather():
    import torch

    from kbench_torch.paged import gather_pages

    c = paged(seqlen_kv=37, page_size=8, pool_factor=3)
    x = OP.make_inputs(c, 11)
    k, _ = OP.gather_pages(c, x)
    got = gather_pages(torch.from_numpy(x["k_pages"]), torch.from_numpy(x["block_table"]), 37)
    np.testing.assert_array_equal(got.numpy(), k)


def test_flashinfer_decode_refuses_what_its_batch_decode_cannot_do(pm):
    b = pm.registry.backends["flashinfer-decode"]
    assert "paged cache" in b.supports(paged(page_size=0, pool_factor=2, seqlen_q=1))
    assert "one query token" in b.supports(paged(seqlen_q=4, dtype="bf16"))
    assert "fp16/bf16" in b.supports(paged(seqlen_q=1))
    assert b.supports(paged(seqlen_q=1, dtype="bf16")) is None
    assert b.features == {"paged"} and pm.registry.backends["flash-attn-decode"].features == {"paged"}
