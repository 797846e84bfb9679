"""Sliding windows and softcap: the reference against a direct computation, backends, and the features skip."""
from __future__ import annotations

import math

import numpy as np
import pytest

from kbench.builtin.numpy_backends import NumpyAttention, NumpyFlashAttention
from kbench.builtin.ops import AttentionOp
from kbench.errors import BadInput
from kbench.kernelfile import KernelFileBackend
from kbench.ops import CaseError
from kbench.ops.attention import attention_float64, visible_mask


def _direct(q, k, v, *, causal, scale, window, softcap):
    """One query row, one head at a time, straight from the definition (flash-attn's window_size)."""
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    out = np.zeros((b, sq, hq, d))
    left, right = window
    for bi in range(b):
        for h in range(hq):
            kh = h // (hq // hkv)
            for i in range(sq):
                pos = i + sk - sq
                keys = [j for j in range(sk)
                        if (not causal or j <= pos) and (left < 0 or j >= pos - left) and (right < 0 or j <= pos + right)]
                if not keys:
                    continue
                s = [scale * float(q[bi, i, h] @ k[bi, j, kh]) for j in keys]
                if softcap:
                    s = [softcap * math.tanh(x / softcap) for x in s]
                w = np.exp(np.array(s) - max(s))
                out[bi, i, h] = (w / w.sum()) @ v[bi, keys, kh]
    return out


@pytest.mark.parametrize("causal,window,softcap,sq,sk", [
    (False, (2, 1), 0.0, 6, 6),
    (True, (3, -1), 0.0, 5, 9),       # bottom-right aligned window with causal
    (False, (-1, 0), 0.0, 7, 4),      # right-only bound, seqlen_q > seqlen_kv: some rows see nothing
    (False, (0, 0), 0.0, 4, 4),       # the diagonal only
    (False, (-1, -1), 2.0, 5, 7),     # softcap alone
    (True, (2, 0), 0.5, 6, 8),        # both, a strong cap
])
def test_reference_matches_a_direct_masked_computation(causal, window, softcap, sq, sk):
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal(s) for s in ((2, sq, 4, 3), (2, sk, 2, 3), (2, sk, 2, 3)))
    kw = dict(causal=causal, scale=0.8, window=window, softcap=softcap)
    np.testing.assert_allclose(attention_float64(q, k, v, **kw), _direct(q, k, v, **kw), rtol=1e-12, atol=1e-14)
    rows = np.array([0, sq - 1])
    np.testing.assert_allclose(attention_float64(q[:, rows], k, v, rows=rows, seqlen_q=sq, **kw),
                               _direct(q, k, v, **kw)[:, rows], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("params", [
    dict(seqlen=40, window=[8, 0]),
    dict(seqlen_q=21, seqlen_kv=50, window=[10, 3], causal=True, heads_q=4, heads_kv=2),
    dict(seqlen=33, window=[5, 5], softcap=3.0, dtype="bf16"),
    dict(seqlen=24, softcap=1.0, dtype="fp16"),
])
@pytest.mark.parametrize("backend", [NumpyAttention(), NumpyFlashAttention(block_q=8, block_k=8)])
def test_numpy_backends_pass_window_and_softcap(kbench_case, kbench_check, backend, params):
    rec = kbench_check(backend, kbench_case(**params))
    assert rec["status"] == "passed", rec.get("reason")


def test_a_window_ignored_fails(kbench_case, kbench_check, fake_backend):
    from kbench.builtin.numpy_backends import attention_numpy

    class Unwindowed(type(fake_backend(None))):
        features = frozenset({"window"})  # claims it, does not do it

    def full(q, k, v, out, case):
        attention_numpy(q, k, v, out, causal=case["causal"], scale=0.25)

    rec = kbench_check(Unwindowed(full), kbench_case(seqlen=64, window=[4, 0], head_dim=16))
    assert rec["status"] == "failed" and "relative L2 error" in rec["reason"]


def test_backend_without_the_feature_is_skipped_before_supports(kbench_case, kbench_check, fake_backend):
    asked = []
    backend = fake_backend(lambda *a: None, supports=lambda case: asked.append(case) or None)
    rec = kbench_check(backend, kbench_case(window=[4, 0], softcap=2.0))
    assert rec["status"] == "skipped" and rec["reason"] == "does not implement softcap (implements: forward only)"
    assert asked == []


def test_kernel_file_declaring_window_runs(tmp_path, kbench_pm, kbench_case, kbench_check):
    body = ("from kbench.builtin.numpy_backends import attention_numpy\n{features}\n"
            "def attention(q, k, v, out, *, causal, scale, window=(-1, -1)):\n"
            "    attention_numpy(q, k, v, out, causal=causal, scale=scale, window=window)\n")
    case = kbench_case(seqlen=48, window=[6, 0])
    declared = tmp_path / "windowed.py"
    declared.write_text(body.format(features='FEATURES = ["window"]'))
    rec = kbench_check(KernelFileBackend(declared, kbench_pm.registry, trusted=True), case)
    assert rec["status"] == "passed", rec.get("reason")
    silent = tmp_path / "silent.py"
    silent.write_text(body.format(features=""))
    rec = kbench_check(KernelFileBackend(silent, kbench_pm.registry, trusted=True), case)
    assert rec["status"] == "skipped" and rec["reason"] == "does not implement window (implements: forward only)"


def test_bad_features_global_is_bad_input(tmp_path, kbench_pm):
    path = tmp_path / "bad.py"
    path.write_text("FEATURES = 'window'\ndef attention(q, k, v, out, *, causal, scale):\n    pass\n")
    with pytest.raises(BadInput, match="FEATURES must be a list"):
        KernelFileBackend(path, kbench_pm.registry)


def test_kwargs_carry_window_and_softcap_only_when_set(kbench_case):
    op = AttentionOp()
    assert set(op.kernel_kwargs(kbench_case())) == {"causal", "scale"}
    kw = op.kernel_kwargs(kbench_case(window=[16, 0], softcap=30))
    assert kw["window"] == (16, 0) and kw["softcap"] == 30.0


def test_case_ids_unchanged_at_the_defaults_and_named_otherwise(kbench_case):
    plain = kbench_case(seqlen=64, heads=2, head_dim=16)
    assert plain.id == "attention[b=1,sq=64,sk=64,hq=2,hkv=2,d=16,noncausal,fp32]"
    assert kbench_case(seqlen=64, heads=2, head_dim=16, window=[16, 0], softcap=30, mode="bwd").id == \
        "attention[b=1,sq=64,sk=64,hq=2,hkv=2,d=16,noncausal,fp32,window=16:0,softcap=30,bwd]"
    assert kbench_case(window_left=16, window_right=0).id == kbench_case(window=[16, 0]).id


@pytest.mark.parametrize("params,message", [
    (dict(window=16), "'window' must be \\[left, right\\]"),
    (dict(window=[16, 0], window_left=3), "both given"),
    (dict(softcap=-1.0), "'softcap' must be >= 0"),
    (dict(softcap="big"), "'softcap' must be a number"),
    (dict(window=[-2, 0]), "'window_left' must be >= -1"),
    (dict(mode="train"), "'mode' must be one of"),
])
def test_bad_parameters_say_why(kbench_case, params, message):
    with pytest.raises(CaseError, match=message):
        kbench_case(**params)


@pytest.mark.parametrize("params", [dict(window=[5, 2]), dict(window=[3, -1], causal=True),
                                    dict(window=[-1, 4], seqlen_q=30, seqlen_kv=20), dict(window=[0, 0])])
def test_flops_count_the_visible_pairs(kbench_case, params):
    size = {} if "seqlen_q" in params else {"seqlen": 25}
    case = kbench_case(**{**size, "heads": 2, "head_dim": 8, **params})
    p = case.params
    mask = visible_mask(p["seqlen_q"], p["seqlen_kv"], causal=p["causal"], window=(p["window_left"], p["window_right"]))
    assert AttentionOp().flops(case) == 4.0 * 2 * 8 * mask.sum()


def test_suite_grid_takes_window_pairs(tmp_path):
    from kbench.suite import load_suite

    path = tmp_path / "w.yaml"
    path.write_text("version: 1\nname: w\nop: attention\ngrid:\n  - seqlen: 32\n    heads: 2\n    head_dim: 16\n"
                    "    window: [[8, 0], [4, 4]]\n  - seqlen: 32\n    heads: 2\n    head_dim: 16\n    window: [2, 0]\n")
    suite = load_suite(path)
    from kbench.plugins import PluginManager
    from kbench.suite import expand_grid
    cases = expand_grid(suite.data["grid"], PluginManager().registry.op("attention"), suite)
    assert sorted((c["window_left"], c["window_right"]) for c in cases) == [(2, 0), (4, 4), (8, 0)]
