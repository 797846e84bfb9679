"""attention_varlen: packed layout, block-diagonal reference, costs per sequence, backends, the suite."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from kbench.builtin.numpy_varlen import varlen_numpy
from kbench.cli import cli
from kbench.ops import CaseError
from kbench.ops.attention import AttentionOp
from kbench.ops.varlen import VarlenAttentionOp, visible_pairs
from kbench.plugins import PluginManager
from kbench.suite import load_suite
from kbench.testing import FunctionBackend, check_backend
from kbench.yamlsource import load_yaml

OP = VarlenAttentionOp()
SMALL = {"heads_q": 4, "heads_kv": 2, "head_dim": 16}


@pytest.fixture(scope="module")
def pm():
    return PluginManager()


def case(**kw):
    return OP.make_case({**SMALL, **kw})


def dense_block_diagonal(inputs, q_lens, kv_lens, causal: bool, scale: float) -> np.ndarray:
    """Attention over all packed tokens at once with a (total_q, total_kv) mask: a query sees a key only
    in its own sequence (and, causal, bottom-right aligned within it). Independent of the op's loop."""
    q, k, v = (inputs[n].astype(np.float64) for n in ("q", "k", "v"))
    seq_q, seq_k = np.repeat(np.arange(len(q_lens)), q_lens), np.repeat(np.arange(len(kv_lens)), kv_lens)
    pos_q = np.concatenate([np.arange(n) for n in q_lens])
    pos_k = np.concatenate([np.arange(n) for n in kv_lens])
    shift = (np.asarray(kv_lens) - np.asarray(q_lens))[seq_q]
    visible = seq_q[:, None] == seq_k[None, :]
    if causal:
        visible &= pos_k[None, :] <= (pos_q + shift)[:, None]
    group = q.shape[1] // k.shape[1]
    out = np.zeros((q.shape[0], q.shape[1], v.shape[2]))
    for h in range(q.shape[1]):
        s = np.where(visible, q[:, h] @ k[:, h // group].T * scale, -np.inf)
        seen = visible.any(axis=1)
        p = np.exp(s[seen] - s[seen].max(axis=1, keepdims=True))
        out[seen, h] = (p / p.sum(axis=1, keepdims=True)) @ v[:, h // group]
    return out


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("q_lens, kv_lens", [((5, 17, 1, 40), (5, 17, 1, 40)),
                                             ((5, 17, 1, 40), (9, 30, 3, 40)),   # queries after a prefix
                                             ((12, 3), (4, 3))])                  # sq > sk: rows that see nothing
def test_reference_equals_a_dense_block_diagonal_computation(q_lens, kv_lens, causal):
    c = case(seqlens_q=",".join(map(str, q_lens)), seqlens_kv=",".join(map(str, kv_lens)), causal=causal)
    x = OP.make_inputs(c, 3)
    want = dense_block_diagonal(x, q_lens, kv_lens, causal, 1 / 4)
    np.testing.assert_allclose(OP.reference(c, x, None), want, rtol=1e-10, atol=1e-12)
    rows = np.array([0, 4, 5, 21, 22, sum(q_lens) - 1])
    rows = rows[rows < sum(q_lens)]
    np.testing.assert_allclose(OP.reference(c, x, rows), want[rows], rtol=1e-10, atol=1e-12)
    if causal and q_lens[0] > kv_lens[0]:
        assert np.all(want[: q_lens[0] - kv_lens[0]] == 0)  # the op's definition: no key, output 0


def test_inputs_are_packed_with_int32_offsets_fixed_by_the_case():
    c = case(seqlens_q="3,1,6", seqlens_kv="4,2,6", dtype="bf16")
    a, b = OP.make_inputs(c, 1), OP.make_inputs(c, 2)
    assert list(a) == list(OP.input_names)
    assert a["q"].shape == (10, 4, 16) and a["k"].shape == a["v"].shape == (12, 2, 16)
    assert str(a["q"].dtype) == "bfloat16"
    for name, want in (("cu_seqlens_q", [0, 3, 4, 10]), ("cu_seqlens_kv", [0, 4, 6, 12])):
        assert a[name].dtype == np.int32 and a[name].tolist() == want == b[name].tolist()
    assert not np.array_equal(a["q"], b["q"])  # contents follow the seed, the layout does not
    assert OP.output_shape(c) == (10, 4, 16)
    assert OP.kernel_kwargs(c) == {"causal": False, "scale": 0.25, "max_seqlen_q": 6, "max_seqlen_kv": 6}


def test_sampled_lengths_are_seeded_by_the_case_and_follow_the_distribution():
    big = {"batch": 4000, "seqlen_max": 8192}
    logn = OP.lengths(case(seqlen_dist="lognormal", seqlen_mean=1024, **big))[0]
    assert OP.lengths(case(seqlen_dist="lognormal", seqlen_mean=1024, **big))[0] == logn
    assert min(logn) >= 1 and max(logn) <= 8192
    assert 900 < np.mean(logn) < 1100   # mean 1024 before clipping at 8192 (a ~0.5% tail)
    assert np.median(logn) < 0.7 * np.mean(logn)  # skewed: median = mean * exp(-sigma^2 / 2)
    uni = OP.lengths(case(seqlen_min=100, **big))[0]
    assert min(uni) >= 100 and max(uni) <= 8192 and abs(np.mean(uni) - 4146) < 150
    other = OP.lengths(case(seqlen_min=100, seqlen_seed=1, **big))[0]
    assert other != uni and case(seqlen_min=100, **big).id != case(seqlen_min=100, seqlen_seed=1, **big).id


def test_case_ids_are_short_stable_and_round_trip():
    c = case(seqlens_q="5,17,1,40", seqlens_kv="9,17,3,30", causal=True)
    assert c.id == "attention_varlen[b=4,sq=5/17/1/40,sk=9/17/3/30,hq=4,hkv=2,d=16,causal,fp32]"
    assert case(seqlens_q=[5, 17, 1, 40], seqlens_kv="9,17,3,30", causal=True).id == c.id  # a list from Python
    long = case(seqlens_q=",".join(str(100 + i) for i in range(64)))
    assert long["batch"] == 64 and len(long.id) < 90
    assert "sq=tot8416/max163/" in long.id
    assert case(seqlens_q=",".join(str(100 + i) for i in range(63)) + ",99").id != long.id
    sampled = case(batch=8, seqlen_dist="lognormal", seqlen_mean=512, seqlen_max=4096, dtype="bf16")
    total = sum(OP.lengths(sampled)[0])
    assert sampled.id == (f"attention_varlen[b=8,sq=lognormal/mean512/max4096/seed0/tot{total},hq=4,hkv=2,d=16,"
                          f"noncausal,bf16]")
    for c in (c, long, sampled):  # a result file's case parameters rebuild the same case
        again = OP.make_case(c.to_json())
        assert again.id == c.id and OP.lengths(again) == OP.lengths(c)


@pytest.mark.parametrize("bad, why", [
    ({"seqlens_q": "4,x"}, "'x' is not an integer"),
    ({"seqlens_q": [4, 2.5]}, "2.5 is not an integer"),
    ({"seqlens_q": "4,0"}, "at least one token"),
    ({"seqlens_q": "4,5", "batch": 3}, "batch=3 but seqlens_q lists 2"),
    ({"seqlens_q": "4,5", "seqlens_kv": "4"}, "one per sequence"),
    ({"seqlens_q": "4,5", "seqlen_max": 100}, "either listed or sampled"),
    ({"seqlens_kv": "4,5", "batch": 2}, "without seqlens_q"),
    ({"batch": 2}, "give the lengths"),
    ({"batch": 2, "seqlen_dist": "lognormal", "seqlen_max": 100}, "seqlen_mean in"),
    ({"batch": 2, "seqlen_mean": 50, "seqlen_max": 100}, "seqlen_mean is for lognormal"),
    ({"batch": 2, "seqlen_min": 200, "seqlen_max": 100}, "seqlen_min=200 > seqlen_max=100"),
    ({"seqlens_q": "4", "heads_q": 6, "heads_kv": 4}, "multiple"),
])
def test_invalid_cases_say_why(bad, why):
    with pytest.raises(CaseError, match=why):
        case(**bad)


def test_flops_and_bytes_per_sequence_by_hand():
    q_lens, kv_lens = (5, 17, 1, 40), (9, 17, 3, 30)
    c = case(seqlens_q="5,17,1,40", seqlens_kv="9,17,3,30", causal=True, dtype="fp16")
    # causal pairs: sk >= sq: sq*sk - sq(sq-1)/2 -> 45-10=35, 289-136=153, 3; sk < sq (40 q, 30 k): 30*31/2=465
    assert [visible_pairs(a, b, True) for a, b in zip(q_lens, kv_lens)] == [35, 153, 3, 465]
    for a, b in zip(q_lens, kv_lens):  # against a direct count of the mask
        assert visible_pairs(a, b, True) == int(np.sum(np.arange(b)[None, :] <= np.arange(a)[:, None] + b - a))
    assert OP.flops(c) == 4 * 4 * 16 * (35 + 153 + 3 + 465)
    assert OP.flops(case(seqlens_q="5,17,1,40", seqlens_kv="9,17,3,30")) == 4 * 4 * 16 * (45 + 289 + 3 + 1200)
    # Q and O: 2 * 63 tokens * 4 heads * 16; K and V: 2 * 59 * 2 * 16; fp16; two int32 offset arrays of 5
    assert OP.min_bytes(c) == (2 * 63 * 4 * 16 + 2 * 59 * 2 * 16) * 2 + 2 * 5 * 4
    # one sequence without a mask is the dense op's case
    one = case(seqlens_q="300", seqlens_kv="500")
    dense = AttentionOp().make_case({"seqlen_q": 300, "seqlen_kv": 500, **SMALL})
    assert OP.flops(one) == AttentionOp().flops(dense)


def test_sampled_rows_hold_every_sequence_edge_and_stay_in_range():
    c = case(seqlens_q="50,1,70,30")
    rows = OP.sample_rows(c, 32, np.random.default_rng(0))
    assert len(rows) == 32 and np.all(np.diff(rows) > 0) and rows[-1] < 151
    assert {0, 49, 50, 51, 120, 121, 150} <= set(rows.tolist())
    many = case(seqlens_q=",".join(["3"] * 100))  # 200 edges, budget 64: half the budget are edges
    rows = OP.sample_rows(many, 64, np.random.default_rng(1))
    assert len(rows) == 64 and len(np.unique(rows)) == 64 and rows.max() < 300
    assert OP.sample_rows(case(seqlens_q="10,20"), 64, np.random.default_rng(0)) is None


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("block", [1, 4, 256])
def test_numpy_varlen_matches_the_reference_across_block_edges(causal, block):
    c = case(seqlens_q="5,17,1,40,12", seqlens_kv="9,17,3,30,4", causal=causal, heads_q=6, heads_kv=2)
    x = OP.make_inputs(c, 5)
    out = np.full(OP.output_shape(c), np.nan, dtype=np.float32)
    varlen_numpy(**x, out=out, causal=causal, scale=0.25, block_q=block)
    ref = OP.reference(c, x, None)
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-5


def test_cpu_kernels_take_empty_sequences_in_the_offsets():
    """Zero-length sequences are legal in FlashAttention's varlen API (repeated offsets): no rows, or rows
    that see nothing (output 0). The op never makes them, but a kernel must not break on them."""
    torch_varlen = pytest.importorskip("kbench_torch.varlen")
    torch = pytest.importorskip("torch")
    q_lens, kv_lens = (3, 0, 4, 2), (0, 4, 5, 2)
    rng = np.random.default_rng(0)
    x = {"q": rng.standard_normal((9, 4, 16), dtype=np.float32),
         "k": rng.standard_normal((11, 2, 16), dtype=np.float32), "v": rng.standard_normal((11, 2, 16), dtype=np.float32),
         "cu_seqlens_q": np.array([0, 3, 3, 7, 9], np.int32), "cu_seqlens_kv": np.array([0, 0, 4, 9, 11], np.int32)}
    for causal in (True, False):
        want = dense_block_diagonal(x, q_lens, kv_lens, causal, 0.25)
        assert np.all(want[:3] == 0) and np.all(np.isfinite(want))
        out = np.full((9, 4, 16), np.nan, np.float32)
        varlen_numpy(**x, out=out, causal=causal, scale=0.25)
        np.testing.assert_allclose(out, want, atol=1e-5)
        got = torch.full((9, 4, 16), float("nan"))
        torch_varlen.sdpa_loop(*(torch.from_numpy(x[n]) for n in ("q", "k", "v")), got, x["cu_seqlens_q"].tolist(),
                               x["cu_seqlens_kv"].tolist(), causal=causal, scale=0.25, masks={})
        np.testing.assert_allclose(got.numpy(), want, atol=1e-5)


PARAMS = [{"seqlens_q": "5,70,1,40", "seqlens_kv": "9,70,3,30", "causal": True, "dtype": "bf16"},
          {"batch": 6, "seqlen_dist": "lognormal", "seqlen_mean": 40, "seqlen_max": 200, "causal": True},
          {"seqlens_q": "33,7", "causal": False, "dtype": "fp16", "heads_q": 4, "heads_kv": 4}]


@pytest.mark.parametrize("backend", ["numpy-varlen", "torch-sdpa-varlen"])
@pytest.mark.parametrize("params", PARAMS)
def test_cpu_backends_pass_the_harness(pm, backend, params):
    if backend.startswith("torch"):
        pytest.importorskip("torch")
    c = case(**params)
    rec = check_backend(pm, pm.registry.backends[backend], c)
    assert rec["status"] == "passed", rec.get("reason")
    assert rec["metrics"]["footprint"] == OP.min_bytes(c)


def test_a_kernel_that_ignores_sequence_boundaries_fails(pm):
    """Causal attention over the whole packed batch as one sequence: right for the first sequence only."""
    from kbench.builtin.numpy_backends import attention_numpy

    def one_sequence(q, k, v, cu_q, cu_kv, out, case):
        attention_numpy(q[None], k[None], v[None], out[None], causal=True, scale=case["head_dim"] ** -0.5)

    rec = check_backend(pm, FunctionBackend(one_sequence, op="attention_varlen"), case(seqlens_q="20,30,25",
                                                                                       causal=True))
    assert rec["status"] == "failed" and "relative L2 error" in rec["reason"]


def test_a_kernel_that_writes_its_offsets_fails(pm):
    def scribbler(q, k, v, cu_q, cu_kv, out, case):
        varlen_numpy(q, k, v, cu_q, cu_kv, out, causal=False, scale=0.25)
        cu_q[1] += 1

    rec = check_backend(pm, FunctionBackend(scribbler, op="attention_varlen"), case(seqlens_q="20,30"))
    assert rec["status"] == "failed" and "input 'cu_seqlens_q' was modified" in rec["reason"]


def test_suite_has_cpu_and_cuda_grids_with_shipped_head_layouts():
    suite = load_suite("suites/serving-prefill.yaml")
    cpu, cuda = suite.plan("cpu", OP).cases, suite.plan("cuda", OP).cases
    assert suite.op == "attention_varlen" and cpu and cuda
    models, _ = load_yaml("kbench/data/models.yaml")
    layouts = {(m["heads_q"], m["heads_kv"], m["head_dim"]) for m in models["models"]}
    for c in cpu + cuda:
        assert (c["heads_q"], c["heads_kv"], c["head_dim"]) in layouts and c["causal"]
    assert {c["dtype"] for c in cuda} == {"bf16"}
    longest = max(max(OP.lengths(c)[1]) for c in cuda)
    assert 4096 < longest <= 8192
    assert max(max(OP.lengths(c)[1]) for c in cpu) <= 2048
    assert any(len(set(OP.lengths(c)[0])) > 1 for c in cpu)  # ragged, not one length repeated


def test_a_list_in_a_suite_is_one_case_and_a_list_of_lists_a_sweep(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("name: s\nop: attention_varlen\ngrid:\n"
                    "  - {seqlens_q: [3, 5], seqlens_kv: [4, 5], heads: 2, head_dim: 8}\n"
                    "  - {seqlens_q: [[8, 8], [4, 12, 1]], heads: 2, head_dim: 8}\n")
    cases = load_suite(str(path)).plan("cpu", OP).cases
    assert [OP.lengths(c) for c in cases] == [((3, 5), (4, 5)), ((8, 8), (8, 8)), ((4, 12, 1), (4, 12, 1))]
    assert [c["batch"] for c in cases] == [2, 2, 3]


KERNEL_FILE = '''"""Per-sequence dense attention over a packed batch, in NumPy (a user's kernel file)."""
import numpy as np

OP = "attention_varlen"


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_kv, out, *, causal, scale, max_seqlen_q, max_seqlen_kv):
    group = q.shape[1] // k.shape[1]
    for i in range(len(cu_seqlens_q) - 1):
        q0, q1 = int(cu_seqlens_q[i]), int(cu_seqlens_q[i + 1])
        k0, k1 = int(cu_seqlens_kv[i]), int(cu_seqlens_kv[i + 1])
        if k1 == k0:  # an empty sequence (legal in the varlen API): nothing to see
            out[q0:q1] = 0
            continue
        qs = q[q0:q1].astype(np.float32).transpose(1, 0, 2)
        ks = np.repeat(k[k0:k1].astype(np.float32).transpose(1, 0, 2), group, axis=0)
        vs = np.repeat(v[k0:k1].astype(np.float32).transpose(1, 0, 2), group, axis=0)
        s = qs @ ks.transpose(0, 2, 1) * np.float32(scale)
        if causal:
            sq, sk = q1 - q0, k1 - k0
            s = np.where(np.arange(sk)[None, :] <= np.arange(sq)[:, None] + sk - sq, s, -np.inf)
        m = np.max(s, axis=-1, keepdims=True)
        p = np.exp(s - np.where(np.isfinite(m), m, 0))
        den = p.sum(axis=-1, keepdims=True)
        out[q0:q1] = (p @ vs / np.where(den == 0, 1, den)).transpose(1, 0, 2)
'''


def test_kbench_run_with_a_kernel_file_in_the_sandbox_and_the_cpu_backends(tmp_path):
    """The whole path: suite lists, int32 offsets through the worker's arena, an untrusted kernel file."""
    (tmp_path / "varlen_kernel.py").write_text(KERNEL_FILE)
    suite = tmp_path / "tiny.yaml"
    suite.write_text("version: 1\nname: tiny-varlen\nop: attention_varlen\nbackends: [numpy-varlen, torch-sdpa-varlen]\n"
                     "timing: {min_samples: 3, max_time: 0.05}\n"
                     "grid:\n  - {seqlens_q: [5, 40, 17], seqlens_kv: [9, 40, 3], heads_q: 4, heads_kv: 2, head_dim: 16,"
                     " causal: true, dtype: bf16}\n")
    out = tmp_path / "r.json"
    res = CliRunner().invoke(cli, ["run", str(suite), "-b", "numpy-varlen", "-b", "torch-sdpa-varlen",
                                   "-b", str(tmp_path / "varlen_kernel.py"), "--device", "cpu", "-o", str(out)],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    records = json.loads(out.read_text())["records"]
    assert {(r["backend"], r["status"]) for r in records} == {
        ("numpy-varlen", "passed"), ("torch-sdpa-varlen", "passed"), ("file:varlen_kernel", "passed")}
    assert {r["case_id"] for r in records} == {"attention_varlen[b=3,sq=5/40/17,sk=9/40/3,hq=4,hkv=2,d=16,causal,bf16]"}


def test_flash_varlen_backends_skip_with_a_reason_without_a_gpu(pm):
    for name in ("flash-attn-varlen", "flash-attn3-varlen", "torch-sdpa-varlen-cuda"):
        b = pm.registry.backends[name]
        assert b.op == "attention_varlen" and b.device == "cuda"
        reason = b.available()
        if reason is not None:
            assert "not installed" in reason or "CUDA" in reason or "GPU" in reason


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["torch-sdpa-varlen-cuda", "flash-attn-varlen", "flash-attn3-varlen"])
def test_gpu_backends_pass_the_harness(pm, backend):
    b = pm.registry.backends[backend]
    if b.available() is not None:
        pytest.skip(b.available())
    for params in ({"seqlens_q": "100,700,33,1500", "seqlens_kv": "100,900,33,1500", "causal": True},
                   {"batch": 8, "seqlen_dist": "lognormal", "seqlen_mean": 512, "seqlen_max": 4096, "causal": True}):
        c = OP.make_case({"heads_q": 32, "heads_kv": 8, "head_dim": 128, "dtype": "bf16", **params})
        rec = check_backend(pm, b, c, device="cuda")
        assert rec["status"] == "passed", rec.get("reason")
