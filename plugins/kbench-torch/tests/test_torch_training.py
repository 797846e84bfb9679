"""kbench-torch's training modes and variants: backward (modes bwd / fwd_bwd) and sliding windows of the SDPA
backends.

torch-sdpa's gradients are checked against a float64 autograd computation written out densely here
(scores, mask, softmax, P V: no SDPA), on tiny cases: causal, GQA, rows that see no key, windows,
bf16. The mask helpers are checked against the protocol's formula written as a loop.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from kbench.api import Case, DType, attention_float64, causal_mask
from kbench.testing import skip_reason
from kbench_torch.common import empty_rows, visible_mask
from kbench_torch.sdpa import TorchSDPA, cuda_backends, mask_kind


def make_case(**params) -> Case:
    p = dict(batch=1, causal=False, dtype="fp32", mode="bwd", window_left=-1, window_right=-1, softcap=0.0)
    p.update(params)
    p.setdefault("heads_kv", p["heads_q"])
    return Case(op="attention", params=p, id="test")


def protocol_visible(sq, sk, causal, left, right):
    """The protocol's definition, one pair at a time."""
    out = np.zeros((sq, sk), dtype=bool)
    for i in range(sq):
        pos = i + sk - sq
        for j in range(sk):
            ok = True
            if left >= 0:
                ok &= pos - left <= j
            if causal:
                ok &= j <= pos + (0 if right < 0 else min(right, 0))
            elif right >= 0:
                ok &= j <= pos + right
            out[i, j] = ok
    return out


MASKS = [(5, 5, False, 2, 1), (5, 5, True, 2, 3), (3, 8, False, 1, -1), (8, 3, True, -1, -1),
         (8, 3, False, -1, 1), (8, 3, True, 1, -1), (7, 7, False, 0, 0), (6, 9, True, 0, -1), (9, 4, False, 2, 0)]


@pytest.mark.parametrize("sq,sk,causal,left,right", MASKS)
def test_visible_mask_is_the_protocol_definition(sq, sk, causal, left, right):
    window = None if left < 0 and right < 0 else (left, right)
    mask = visible_mask(sq, sk, causal=causal, window=window).numpy()
    assert np.array_equal(mask, protocol_visible(sq, sk, causal, left, right))
    # the leading rows that see nothing, and no other row
    assert empty_rows(sq, sk, causal=causal, window=window) == int((~mask.any(axis=1)).sum())
    assert not (~mask.any(axis=1))[empty_rows(sq, sk, causal=causal, window=window):].any()


def test_causal_mask_without_window_is_the_ops():
    for sq, sk in ((5, 5), (3, 7), (7, 3)):
        assert np.array_equal(visible_mask(sq, sk, causal=True, window=None).numpy(), causal_mask(sq, sk))


def dense_float64(q, k, v, do, *, causal, window, scale, softcap=0.0):
    """out, dq, dk, dv in float64 by autograd of a dense, unfused attention (kbench layout b, s, h, d)."""
    leaves = [torch.from_numpy(np.asarray(x, dtype=np.float64)).requires_grad_(True) for x in (q, k, v)]
    qt, kt, vt = (x.transpose(1, 2) for x in leaves)
    group = qt.shape[1] // kt.shape[1]
    kt, vt = kt.repeat_interleave(group, dim=1), vt.repeat_interleave(group, dim=1)
    s = (qt @ kt.transpose(-1, -2)) * scale
    if softcap:  # before masking, flash-attn's convention
        s = softcap * torch.tanh(s / softcap)
    mask = visible_mask(q.shape[1], k.shape[1], causal=causal, window=window)
    s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # a row that sees nothing: all -inf -> 0
    o = (p @ vt).transpose(1, 2)
    grads = torch.autograd.grad(o, leaves, grad_outputs=torch.from_numpy(np.asarray(do, dtype=np.float64)))
    return [t.detach().numpy() for t in (o, *grads)]


def rel_l2(got, want):
    got = np.asarray(got, dtype=np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


CASES = {
    "mha": dict(seqlen_q=12, seqlen_kv=12, heads_q=2, head_dim=16),
    "causal": dict(seqlen_q=12, seqlen_kv=12, heads_q=2, head_dim=16, causal=True),
    "gqa-causal-wide": dict(seqlen_q=5, seqlen_kv=13, heads_q=4, heads_kv=2, head_dim=8, causal=True),
    "mqa-causal-tall": dict(seqlen_q=11, seqlen_kv=6, heads_q=3, heads_kv=1, head_dim=8, causal=True),
    "window": dict(seqlen_q=10, seqlen_kv=10, heads_q=2, head_dim=8, window_left=3, window_right=1),
    "window-causal-gqa": dict(seqlen_q=9, seqlen_kv=14, heads_q=4, heads_kv=2, head_dim=8, causal=True,
                              window_left=4),
    "window-tall": dict(seqlen_q=9, seqlen_kv=4, heads_q=2, head_dim=8, window_left=1, window_right=1),
    "bf16-gqa-window": dict(seqlen_q=8, seqlen_kv=8, heads_q=4, heads_kv=1, head_dim=16, dtype="bf16",
                            window_left=2, window_right=0),
    "batch2-fp16-causal": dict(batch=2, seqlen_q=7, seqlen_kv=7, heads_q=2, head_dim=8, dtype="fp16", causal=True),
}


def random_inputs(case: Case, seed: int = 0):
    p, dt = case.params, case.dtype.numpy
    rng = np.random.default_rng(seed)
    shapes = {"q": (p["batch"], p["seqlen_q"], p["heads_q"], p["head_dim"]),
              "k": (p["batch"], p["seqlen_kv"], p["heads_kv"], p["head_dim"]),
              "v": (p["batch"], p["seqlen_kv"], p["heads_kv"], p["head_dim"]),
              "do": (p["batch"], p["seqlen_q"], p["heads_q"], p["head_dim"])}
    return {n: rng.standard_normal(s, dtype=np.float32).astype(dt) for n, s in shapes.items()}


def poisoned(case: Case, like):
    return np.full(like.shape, np.nan, dtype=case.dtype.numpy)


def check_against_float64(case: Case, got: dict[str, np.ndarray], x: dict[str, np.ndarray]) -> None:
    window = None if case["window_left"] < 0 and case["window_right"] < 0 else (case["window_left"],
                                                                                 case["window_right"])
    want = dense_float64(x["q"], x["k"], x["v"], x["do"], causal=case["causal"], window=window,
                         scale=case["head_dim"] ** -0.5)
    bound = 1e-5 if case.dtype == DType.FP32 else 1e-2  # float32 compute; half types: rounding of the results
    for name, ref in zip(("out", "dq", "dk", "dv"), want):
        assert got[name].dtype == case.dtype.numpy, name
        assert np.isfinite(np.asarray(got[name], dtype=np.float64)).all(), f"{name} has NaN (poison left)"
        assert rel_l2(got[name], ref) < bound, f"{name}: rel L2 {rel_l2(got[name], ref):.2e} >= {bound}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_torch_sdpa_bwd_matches_float64_autograd(name):
    case = make_case(**CASES[name])
    x = random_inputs(case)
    kernel = TorchSDPA().prepare(case)
    outs = {n: poisoned(case, x["q"] if n in ("out", "dq") else x["k"]) for n in ("out", "dq", "dk", "dv")}
    saved = kernel.forward(x["q"], x["k"], x["v"])  # untimed half: never sees do
    assert kernel.backward(saved, x["do"], outs["out"], outs["dq"], outs["dk"], outs["dv"]) is None
    check_against_float64(case, outs, x)


@pytest.mark.parametrize("name", ["gqa-causal-wide", "window-causal-gqa", "bf16-gqa-window"])
def test_torch_sdpa_fwd_bwd_one_call_matches_float64(name):
    case = make_case(**{**CASES[name], "mode": "fwd_bwd"})
    x = random_inputs(case, seed=3)
    kernel = TorchSDPA().prepare(case)
    outs = {n: poisoned(case, x["q"] if n in ("out", "dq") else x["k"]) for n in ("out", "dq", "dk", "dv")}
    kernel(q=x["q"], k=x["k"], v=x["v"], do=x["do"], **outs)
    check_against_float64(case, outs, x)


def test_forward_with_a_window_matches_the_dense_reference():
    case = make_case(**{**CASES["window-causal-gqa"], "mode": "fwd"})
    x = random_inputs(case, seed=5)
    out = poisoned(case, x["q"])
    TorchSDPA().prepare(case)(q=x["q"], k=x["k"], v=x["v"], out=out)
    want = dense_float64(x["q"], x["k"], x["v"], x["do"], causal=True, window=(4, -1), scale=8 ** -0.5)[0]
    assert rel_l2(out, want) < 1e-5
    # and without the window the same data gives kbench's causal reference, not the windowed one
    plain = make_case(**{**CASES["gqa-causal-wide"], "mode": "fwd"})
    y = random_inputs(plain, seed=5)
    out = poisoned(plain, y["q"])
    TorchSDPA().prepare(plain)(q=y["q"], k=y["k"], v=y["v"], out=out)
    assert rel_l2(out, attention_float64(y["q"], y["k"], y["v"], causal=True, scale=8 ** -0.5)) < 1e-5


def test_a_window_changes_the_gradients():
    """The window reaches the backward: the same data without it gives other dK (so the check can fail)."""
    case = make_case(**CASES["window"])
    x = random_inputs(case)
    bufs = {}
    for label, c in (("window", case), ("none", make_case(**{**CASES["window"], "window_left": -1,
                                                                "window_right": -1}))):
        kernel = TorchSDPA().prepare(c)
        o = {n: poisoned(c, x["q"] if n in ("out", "dq") else x["k"]) for n in ("out", "dq", "dk", "dv")}
        kernel(q=x["q"], k=x["k"], v=x["v"], do=x["do"], **o)
        bufs[label] = o
    assert rel_l2(bufs["none"]["dk"], np.asarray(bufs["window"]["dk"], dtype=np.float64)) > 0.05


def test_features_declared_per_backend():
    assert TorchSDPA().features == {"bwd", "fwd_bwd", "window"}
    by_name = {b.name: b for b in cuda_backends()}
    for name in ("torch-sdpa-efficient", "torch-sdpa-math"):
        assert by_name[name].features == {"bwd", "fwd_bwd", "window"}
    for name in ("torch-sdpa-flash", "torch-sdpa-cudnn"):  # their SDPA kernels take no mask
        assert by_name[name].features == {"bwd", "fwd_bwd"}
    for backend in (TorchSDPA(), *by_name.values()):  # softcap is not expressible through SDPA
        assert not {"softcap", "fp8"} & backend.features


def test_subclasses_for_other_ops_do_not_inherit_the_attention_features(kbench_pm):
    """torch-sdpa-varlen and flash-attn-varlen run attention_varlen: forward only, whatever their base does."""
    reg = kbench_pm.registry
    for name, backend in reg.backends.items():
        if backend.op != "attention" and isinstance(backend, (TorchSDPA, *{type(b) for b in cuda_backends()})):
            assert not {"bwd", "fwd_bwd", "window", "softcap", "fp8"} & set(backend.features), name
    from kbench_torch.flash import FlashAttention

    others = [b for b in reg.backends.values() if isinstance(b, FlashAttention) and b.op != "attention"]
    assert others  # the varlen / decode subclasses are registered
    for backend in others:
        assert not {"bwd", "fwd_bwd", "window", "softcap", "fp8"} & set(backend.features), backend.name


def test_mask_kind_window_wins_over_causal_shapes():
    assert mask_kind(make_case(seqlen_q=4, seqlen_kv=4, heads_q=1, head_dim=8, causal=True)) == "square"
    assert mask_kind(make_case(seqlen_q=4, seqlen_kv=4, heads_q=1, head_dim=8, causal=True, window_left=2)) == "window"


# -- the GPU libraries' arguments, decided without a GPU --------------------------------------------

def cudnn_reference_visible(sq, sk, *, left_bound=None, right_bound=None):
    """cuDNN's bottom-right band as its own reference builds it (cudnn-frontend test/python/test_mhas.py,
    compute_ref): masked where ``triu(diagonal=sk - sq + 1 + right_bound)`` or ``tril(diagonal=sk - sq - left_bound)``."""
    masked = np.zeros((sq, sk), dtype=bool)
    ones = np.ones((sq, sk), dtype=bool)
    if right_bound is not None:
        masked |= np.triu(ones, k=sk - sq + 1 + right_bound)
    if left_bound is not None:
        masked |= np.tril(ones, k=sk - sq - left_bound)
    return ~masked


@pytest.mark.parametrize("sq,sk,causal,left,right", MASKS)
def test_cudnn_band_is_kbench_window(sq, sk, causal, left, right):
    from kbench_torch.cudnn_backend import band

    window = None if left < 0 and right < 0 else (left, right)
    b = band(causal=causal, window=window)
    if b.get("bottom_right_causal"):
        got = cudnn_reference_visible(sq, sk, right_bound=0)
    else:
        got = cudnn_reference_visible(sq, sk, left_bound=b.get("left_bound"), right_bound=b.get("right_bound"))
    want = visible_mask(sq, sk, causal=causal, window=window).numpy()
    # rows that see nothing are 0 either way; compare the visible keys of the rows that see some
    rows = want.any(axis=1)
    assert np.array_equal(got[rows], want[rows])


def test_cudnn_band_keywords():
    from types import SimpleNamespace

    from kbench_torch.cudnn_backend import mask_kwargs

    fake = SimpleNamespace(diagonal_alignment=SimpleNamespace(BOTTOM_RIGHT="BR"))  # the enum's only use here
    assert mask_kwargs(fake, causal=True, window=None) == {"use_causal_mask_bottom_right": True}
    assert mask_kwargs(fake, causal=False, window=None) == {}
    assert mask_kwargs(fake, causal=True, window=(127, -1)) == {
        "diagonal_alignment": "BR", "diagonal_band_left_bound": 128, "diagonal_band_right_bound": 0}
    assert mask_kwargs(fake, causal=False, window=(-1, 3)) == {"diagonal_alignment": "BR",
                                                              "diagonal_band_right_bound": 3}
    # sdpa_fp8's binding names the bounds without the prefix
    assert mask_kwargs(fake, causal=False, window=(4, 3), fp8=True) == {"diagonal_alignment": "BR",
                                                                       "left_bound": 5, "right_bound": 3}


def test_cudnn_declares_and_refuses():
    from kbench_torch.cudnn_backend import CudnnFrontendSDPA

    backend = CudnnFrontendSDPA()
    assert backend.features == {"bwd", "fwd_bwd", "window", "fp8"}
    bf16 = dict(seqlen_q=64, seqlen_kv=64, heads_q=2, head_dim=64, dtype="bf16")
    assert backend.supports(make_case(**bf16)) is None
    assert "forward only" in backend.supports(make_case(**{**bf16, "dtype": "fp8_e4m3"}))
    assert backend.supports(make_case(**{**bf16, "dtype": "fp8_e4m3", "mode": "fwd"})) is None
    assert backend.supports(make_case(**{**bf16, "dtype": "fp32"})) == "cuDNN SDPA takes fp16/bf16 only"


def test_flash_attn_keywords_follow_the_case():
    from kbench_torch.flash import flash_backends

    fa2, fa3 = flash_backends()
    assert fa2.features == {"bwd", "fwd_bwd", "window", "softcap"}
    assert fa3.features == {"bwd", "fwd_bwd", "window", "softcap", "fp8"}
    plain = make_case(seqlen_q=64, seqlen_kv=64, heads_q=2, head_dim=64, dtype="bf16", causal=True)
    assert fa2.call_kwargs(plain) == {"softmax_scale": 0.125, "causal": True}  # older releases see nothing new
    sw = make_case(seqlen_q=64, seqlen_kv=64, heads_q=2, head_dim=64, dtype="bf16", window_left=16,
                   window_right=0, softcap=30.0)
    assert fa2.call_kwargs(sw) == {"softmax_scale": 0.125, "causal": False, "window_size": (16, 0),
                                   "softcap": 30.0}
    fp8_bwd = make_case(seqlen_q=64, seqlen_kv=64, heads_q=2, head_dim=64, dtype="fp8_e4m3")
    assert "forward only" in fa3.supports(fp8_bwd)
    assert fa2.supports(fp8_bwd) == "FlashAttention 2 takes fp16/bf16 only"


# -- on a GPU: each library's backward against the same float64 autograd ------------------------------

GPU_TRAINING = {
    "gqa-causal": dict(seqlen_q=128, seqlen_kv=128, heads_q=4, heads_kv=2, head_dim=64, causal=True),
    "wide-causal": dict(seqlen_q=64, seqlen_kv=192, heads_q=2, head_dim=128, causal=True),
    "window": dict(seqlen_q=128, seqlen_kv=128, heads_q=2, head_dim=64, window_left=32, window_right=8),
    "window-causal-gqa": dict(seqlen_q=96, seqlen_kv=160, heads_q=4, heads_kv=1, head_dim=64, causal=True,
                              window_left=48),
    "softcap-causal": dict(seqlen_q=128, seqlen_kv=128, heads_q=2, head_dim=64, causal=True, softcap=5.0),
}


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["bwd", "fwd_bwd"])
@pytest.mark.parametrize("dtype", ["bf16"])
@pytest.mark.parametrize("case_name", sorted(GPU_TRAINING))
@pytest.mark.parametrize("name", ["torch-sdpa-flash", "torch-sdpa-efficient", "torch-sdpa-cudnn", "torch-sdpa-math",
                                  "flash-attn", "flash-attn3", "cudnn"])
def test_gpu_backward_matches_float64(kbench_pm, name, case_name, dtype, mode):
    backend = kbench_pm.registry.backends[name]
    if backend.available():
        pytest.skip(backend.available())
    case = make_case(**{**GPU_TRAINING[case_name], "dtype": dtype, "mode": mode})
    needed = {"window"} if case["window_left"] >= 0 or case["window_right"] >= 0 else set()
    needed |= {"softcap"} if case["softcap"] else set()
    if needed - backend.features:
        pytest.skip(f"{name} does not implement {sorted(needed - backend.features)}")
    if backend.supports(case):
        pytest.skip(backend.supports(case))
    x = random_inputs(case, seed=1)
    from kbench.api import Unsupported
    from kbench_torch.common import torch_device

    dev = torch_device()
    t = {n: torch.from_numpy(np.asarray(a, dtype=np.float32)).to(dev, getattr(torch, {"bf16": "bfloat16",
                                                                                     "fp16": "float16"}[dtype]))
         for n, a in x.items()}
    outs = {n: torch.full_like(t["q"] if n in ("out", "dq") else t["k"], float("nan")) for n in ("out", "dq", "dk", "dv")}
    try:
        kernel = backend.prepare(case)
    except Unsupported as exc:
        pytest.skip(str(exc))
    if mode == "bwd":
        kernel.backward(kernel.forward(t["q"], t["k"], t["v"]), t["do"], outs["out"], outs["dq"], outs["dk"],
                        outs["dv"])
    else:
        kernel(q=t["q"], k=t["k"], v=t["v"], do=t["do"], **outs)
    torch.cuda.synchronize()
    window = None if not needed & {"window"} else (case["window_left"], case["window_right"])
    rounded = {n: t[n].float().cpu().numpy() for n in ("q", "k", "v", "do")}  # the inputs the GPU saw
    want = dense_float64(rounded["q"], rounded["k"], rounded["v"], rounded["do"], causal=case["causal"],
                         window=window, scale=case["head_dim"] ** -0.5, softcap=case["softcap"])
    for n, ref in zip(("out", "dq", "dk", "dv"), want):
        got = outs[n].float().cpu().numpy()
        assert np.isfinite(got).all(), f"{name} {n}: NaN left (poison)"
        assert rel_l2(got, ref) < 2e-2, f"{name} {n}: rel L2 {rel_l2(got, ref):.3g}"


# -- through kbench's own judge (the attention op's gradient reference and per-output bounds) ----------

JUDGED = [
    dict(seqlen=24, heads_q=4, heads_kv=2, head_dim=16, causal=True, mode="bwd"),
    dict(seqlen_q=20, seqlen_kv=9, heads=2, head_dim=16, causal=True, mode="fwd_bwd", window=[3, 0]),
    dict(seqlen_q=12, seqlen_kv=30, heads_q=3, heads_kv=1, head_dim=16, causal=True, mode="fwd_bwd"),
    dict(seqlen=16, heads=2, head_dim=16, mode="bwd", window=[4, 2], dtype="bf16"),
]


@pytest.mark.parametrize("params", JUDGED, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
def test_torch_sdpa_training_passes_the_judge(kbench_case, kbench_check, params):
    case = kbench_case(**params)
    rec = kbench_check(TorchSDPA(), case)
    assert rec["status"] == "passed", rec.get("reason")
    outputs = rec["correctness"]["outputs"]
    assert set(outputs) == {"out", "dq", "dk", "dv"}
    assert all(o["rel_l2"] <= o["bound"] for o in outputs.values())


class DetachedKeys(TorchSDPA):
    """A wrong backward: K enters the scores detached, so dK is 0 while out, dQ and dV stay right."""

    name = "torch-sdpa-wrong-dk"

    def prepare(self, case):
        from kbench_torch.sdpa import bshd_attention
        from kbench_torch.training import AutogradAttention

        attend = bshd_attention(case)
        wrong = lambda q, k, v: attend(q, k.detach() + 0.0 * k, v)  # noqa: E731 - k in the graph, dK = 0
        return AutogradAttention(wrong, case.dtype, compute=torch.float32)


def test_a_wrong_dk_fails_with_the_gradient_named(kbench_case, kbench_check):
    rec = kbench_check(DetachedKeys(), kbench_case(**JUDGED[0]))
    assert rec["status"] == "failed", rec.get("reason")
    assert rec["reason"].startswith("dk"), rec["reason"]


def test_fp8_inputs_reach_torch_as_float8_views():
    """What the FP8 backends hand the libraries: float8_e4m3fn tensors on the same bytes, same values."""
    import ml_dtypes

    from kbench_torch.common import as_torch_case

    x = (np.random.default_rng(0).standard_normal((2, 5, 3, 8)) * 40).astype(ml_dtypes.float8_e4m3fn)
    t = as_torch_case(x, "fp8_e4m3")
    assert t.dtype == torch.float8_e4m3fn and tuple(t.shape) == x.shape
    assert np.array_equal(t.float().numpy(), x.astype(np.float32))
    x[0, 0, 0, 0] = 1.0  # shares memory: a write to the array is seen by the tensor
    assert float(t[0, 0, 0, 0]) == 1.0
    raw = torch.from_numpy(x.view(np.uint8))  # a device without float8 holds the bytes as uint8
    assert torch.equal(as_torch_case(raw, "fp8_e4m3").float(), t.float())
    assert as_torch_case(np.ones(3, np.float32), "fp32").dtype == torch.float32


def test_gqa_by_repeat_gives_the_same_gradients_as_enable_gqa():
    """The fallback for forced CUDA kernels that refuse enable_gqa, run on the CPU: dK, dV summed back per kv head."""
    from kbench_torch.sdpa import sdpa_bhsd

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, 10, 8, generator=gen, dtype=torch.float64) for h in (6, 2, 2))
    do = torch.randn(1, 6, 10, 8, generator=gen, dtype=torch.float64)
    grads = {}
    for gqa in ("native", "repeat"):
        leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
        o = sdpa_bhsd(*leaves, kind="square", scale=0.3, gqa=gqa)
        grads[gqa] = torch.autograd.grad(o, leaves, grad_outputs=do)
        assert grads[gqa][1].shape == k.shape  # a gradient per kv head, not per query head
    for a, b in zip(grads["native"], grads["repeat"]):
        assert torch.allclose(a, b, atol=1e-12)


def test_probe_runs_the_backward_of_a_window_case_on_the_cpu():
    from kbench_torch.sdpa import probe

    assert probe("MATH", "fp32", 16, 4, 2, "window", "cpu", backward=True) is None
    assert probe("MATH", "fp32", 16, 4, 2, "tall", "cpu", backward=True, gqa="repeat") is None


# -- on a GPU, through the judge: CuPy buffers, poisoning, per-output bounds ----------------------------

CUDA_NAMES = ["torch-sdpa-flash", "torch-sdpa-efficient", "torch-sdpa-cudnn", "torch-sdpa-math", "flash-attn",
              "flash-attn3", "cudnn"]
GPU_JUDGED = [
    dict(seqlen=256, heads_q=8, heads_kv=2, head_dim=128, causal=True, dtype="bf16", mode="fwd_bwd"),
    dict(seqlen_q=128, seqlen_kv=384, heads=4, head_dim=64, causal=True, dtype="fp16", mode="bwd"),
    dict(seqlen=256, heads=4, head_dim=64, dtype="bf16", mode="bwd", window=[64, 0]),
    dict(seqlen=256, heads=4, head_dim=128, causal=True, dtype="bf16", mode="fwd_bwd", softcap=20.0),
    dict(seqlen=512, heads_q=8, heads_kv=2, head_dim=128, causal=True, dtype="fp8_e4m3"),
    dict(seqlen=256, heads=4, head_dim=128, dtype="fp8_e4m3", window=[64, 0]),
]


@pytest.mark.gpu
@pytest.mark.parametrize("params", GPU_JUDGED, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
@pytest.mark.parametrize("name", CUDA_NAMES)
def test_gpu_training_and_fp8_pass_the_judge_or_say_why(kbench_pm, kbench_case, kbench_check, name, params):
    backend = kbench_pm.registry.backends[name]
    case = kbench_case(**params)
    why_not = skip_reason(kbench_pm, backend, case)
    if why_not:
        pytest.skip(why_not)
    rec = kbench_check(backend, case)
    assert rec["status"] in ("passed", "skipped"), rec.get("reason")
    if rec["status"] == "skipped":
        assert rec["reason"]
    else:
        names = {"out", "dq", "dk", "dv"} if case["mode"] != "fwd" else {"out"}
        assert set(rec["correctness"].get("outputs", {"out": None})) == names
