"""Attention backward: the float64 gradient reference, the numpy backward, kernel files, per-output judging."""
from __future__ import annotations

import textwrap

import numpy as np
import pytest

from kbench.api import TrainingKernel
from kbench.builtin.numpy_backends import NumpyAttention, NumpyFlashAttention, attention_backward_numpy
from kbench.kernelfile import KernelFileBackend
from kbench.ops import attention as attention_mod
from kbench.ops.attention import GradientRows, attention_backward_float64, attention_float64


def _inputs(b=1, sq=3, sk=5, hq=4, hkv=2, d=3, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((b, sq, hq, d)), rng.standard_normal((b, sk, hkv, d)),
            rng.standard_normal((b, sk, hkv, d)), rng.standard_normal((b, sq, hq, d)))


def _by_kv_head(grad, b, hkv):
    """(pairs, sk, d) with all pairs -> (b, sk, hkv, d)."""
    return grad.reshape(b, hkv, grad.shape[1], grad.shape[2]).transpose(0, 2, 1, 3)


@pytest.mark.parametrize("causal,window,softcap,shape", [
    (False, (-1, -1), 0.0, dict()),
    (True, (-1, -1), 0.0, dict(sq=5, sk=5)),
    (True, (-1, -1), 0.0, dict(sq=3, sk=6)),          # bottom-right causal
    (False, (1, 1), 0.0, dict()),                     # window, both sides
    (True, (2, -1), 0.0, dict(sq=4, sk=4)),           # causal + left window
    (False, (-1, -1), 1.5, dict()),                   # softcap (tanh derivative)
    (True, (1, 0), 2.0, dict(hq=6, hkv=2)),           # everything with GQA groups of 3
])
def test_gradient_reference_matches_central_differences(causal, window, softcap, shape):
    q, k, v, do = _inputs(**shape)
    kw = dict(causal=causal, scale=0.7, window=window, softcap=softcap)
    grads = attention_backward_float64(q, k, v, do, **kw)

    def loss(q_, k_, v_):  # <O, dO>: its gradient is the backward of dO
        return float((attention_float64(q_, k_, v_, **kw) * do).sum())

    h = 1e-6
    for name, arr, idx in (("dq", q, 0), ("dk", k, 1), ("dv", v, 2)):
        numeric = np.zeros_like(arr)
        for ix in np.ndindex(arr.shape):
            args_p, args_m = [q, k, v], [q, k, v]
            args_p[idx], args_m[idx] = arr.copy(), arr.copy()
            args_p[idx][ix] += h
            args_m[idx][ix] -= h
            numeric[ix] = (loss(*args_p) - loss(*args_m)) / (2 * h)
        got = grads[name] if name == "dq" else _by_kv_head(grads[name], q.shape[0], k.shape[2])
        assert np.abs(numeric).max() > 1e-3  # not a vacuous comparison
        np.testing.assert_allclose(got, numeric, atol=1e-7, rtol=1e-6, err_msg=name)
    np.testing.assert_allclose(grads["out"], attention_float64(q, k, v, **kw), rtol=1e-12, atol=1e-14)


def test_sampled_rows_and_pairs_are_the_full_reference_restricted():
    q, k, v, do = _inputs(b=2, sq=9, sk=11, hq=4, hkv=2, d=4, seed=3)
    kw = dict(causal=True, scale=0.5, window=(4, -1), softcap=3.0)
    full = attention_backward_float64(q, k, v, do, **kw)
    qr, kr, pairs = np.array([0, 4, 8]), np.array([1, 2, 10]), [(1, 0), (0, 1)]
    part = attention_backward_float64(q, k, v, do, q_rows=qr, kv_rows=kr, pairs=pairs, **kw)
    np.testing.assert_allclose(part["out"], full["out"][:, qr], rtol=1e-12)
    np.testing.assert_allclose(part["dq"], full["dq"][:, qr], rtol=1e-12)
    for name in ("dk", "dv"):
        whole = _by_kv_head(full[name], 2, 2)
        expected = np.stack([whole[b, kr, h] for b, h in pairs])
        np.testing.assert_allclose(part[name], expected, rtol=1e-10, atol=1e-13)


def test_numpy_backward_matches_the_reference_in_float32():
    q, k, v, do = (x.astype(np.float32) for x in _inputs(b=2, sq=7, sk=9, hq=4, hkv=2, d=8, seed=5))
    kw = dict(causal=True, scale=0.4, window=(3, -1), softcap=2.5)
    got = attention_backward_numpy(q, k, v, do, **kw)
    ref = attention_backward_float64(q, k, v, do, **kw)
    b, hkv, g, sq, d = got["dq"].shape
    assert np.allclose(got["dq"].transpose(0, 3, 1, 2, 4).reshape(b, sq, hkv * g, d), ref["dq"], atol=1e-5)
    assert np.allclose(got["dk"], _by_kv_head(ref["dk"], 2, 2), atol=1e-5)
    assert np.allclose(got["dv"], _by_kv_head(ref["dv"], 2, 2), atol=1e-5)


@pytest.mark.parametrize("mode", ["bwd", "fwd_bwd"])
@pytest.mark.parametrize("params", [
    dict(dtype="fp32"),
    dict(seqlen_q=13, seqlen_kv=29, heads_q=4, heads_kv=2, causal=True, dtype="bf16"),
    dict(seqlen_q=29, seqlen_kv=13, heads_q=4, heads_kv=2, window=[-1, 0]),   # rows that see no key
    dict(seqlen=24, window=[6, 2], softcap=4.0, dtype="fp16"),
])
@pytest.mark.parametrize("backend", [NumpyAttention(), NumpyFlashAttention(block_q=8, block_k=16)])
def test_numpy_backward_passes_with_every_gradient_judged(kbench_case, kbench_check, backend, mode, params):
    rec = kbench_check(backend, kbench_case(mode=mode, **params))
    assert rec["status"] == "passed", rec.get("reason")
    outputs = rec["correctness"]["outputs"]
    assert set(outputs) == {"out", "dq", "dk", "dv"}
    assert all(0 < o["rel_l2"] <= o["bound"] for o in outputs.values())
    assert outputs["dk"]["bound"] > outputs["out"]["bound"]  # gradients have their own, looser bound


def test_forward_only_backend_is_skipped_with_the_reason(kbench_case, kbench_check, fake_backend):
    class Masks(type(fake_backend(None))):
        features = frozenset({"window", "softcap"})

    rec = kbench_check(Masks(lambda *a: None), kbench_case(mode="bwd"))
    assert rec["status"] == "skipped"
    assert rec["reason"] == "does not implement bwd (implements: softcap, window)"


def test_flash_backward_recomputes_from_the_saved_lse_and_matches_the_reference():
    from kbench.builtin.numpy_backends import FlashTraining

    q, k, v, do = (x.astype(np.float32) for x in _inputs(b=2, sq=37, sk=53, hq=4, hkv=2, d=8, seed=9))
    kw = dict(causal=True, scale=0.4, window=(7, -1), softcap=2.0)
    kernel = FlashTraining(block_q=8, block_k=16, **kw)
    saved = kernel.forward(q, k, v)
    assert saved[-1].shape == (2, 2, 2, 37, 1)  # the forward keeps O and one log-sum-exp per row, not P
    out, dq = np.full(q.shape, np.nan, np.float32), np.full(q.shape, np.nan, np.float32)
    dk, dv = np.full(k.shape, np.nan, np.float32), np.full(k.shape, np.nan, np.float32)
    kernel.backward(saved, do, out, dq, dk, dv)
    ref = attention_backward_float64(q, k, v, do, **kw)
    assert np.allclose(out, ref["out"], atol=2e-6) and np.allclose(dq, ref["dq"], atol=2e-6)
    assert np.allclose(dk, _by_kv_head(ref["dk"], 2, 2), atol=2e-6)
    assert np.allclose(dv, _by_kv_head(ref["dv"], 2, 2), atol=2e-6)


KERNEL = '''
"""numpy training kernel file (test)."""
import numpy as np
from kbench.builtin.numpy_backends import attention_backward_numpy, attention_numpy

FEATURES = ["bwd", "fwd_bwd"]
CALLS = []

def attention(q, k, v, out, *, causal, scale):
    attention_numpy(q, k, v, out, causal=causal, scale=scale)

def attention_forward(q, k, v, *, causal, scale):
    CALLS.append(("forward", len([q, k, v])))
    return q, k, v

def attention_backward(saved, do, out, dq, dk, dv, *, causal, scale):
    q, k, v = saved
    g = attention_backward_numpy(q, k, v, do, causal=causal, scale=scale)
    b, hkv, grp, sq, d = g["out"].shape
    out[...] = g["out"].transpose(0, 3, 1, 2, 4).reshape(b, sq, hkv * grp, d)
    dq[...] = g["dq"].transpose(0, 3, 1, 2, 4).reshape(b, sq, hkv * grp, d)
    dk[...] = g["dk"]
    dv[...] = g["dv"]
    MISTAKE
'''


def _kernel_file(tmp_path, kbench_pm, mistake="pass", name="train.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(KERNEL).replace("MISTAKE", mistake))
    return KernelFileBackend(path, kbench_pm.registry, trusted=True)


@pytest.mark.parametrize("mode", ["bwd", "fwd_bwd"])
def test_kernel_file_backward_passes_and_forward_never_sees_do(tmp_path, kbench_pm, kbench_case, kbench_check, mode):
    backend = _kernel_file(tmp_path, kbench_pm)
    rec = kbench_check(backend, kbench_case(mode=mode, heads_q=4, heads_kv=2, causal=True))
    assert rec["status"] == "passed", rec.get("reason")
    calls = backend.source.module.CALLS
    assert calls and all(c == ("forward", 3) for c in calls)


@pytest.mark.parametrize("mode", ["bwd", "fwd_bwd"])
def test_wrong_dk_fails_naming_the_gradient(tmp_path, kbench_pm, kbench_case, kbench_check, mode):
    # the forward output and dq, dv are right; dk is off by 20%
    backend = _kernel_file(tmp_path, kbench_pm, "dk[...] = dk * 1.2")
    rec = kbench_check(backend, kbench_case(mode=mode, dtype="bf16"))
    assert rec["status"] == "failed"
    assert rec["reason"].startswith("dk: relative L2 error 0.2") and "bf16 bound 0.03" in rec["reason"]
    assert rec["correctness"]["output"] == "dk"


def test_unwritten_gradient_is_caught_by_the_poison(tmp_path, kbench_pm, kbench_case, kbench_check):
    backend = _kernel_file(tmp_path, kbench_pm, "dv[:, -1] = np.nan")
    rec = kbench_check(backend, kbench_case(mode="bwd"))
    assert rec["status"] == "failed" and "'dv' output elements are NaN/Inf" in rec["reason"]


def test_forward_output_is_judged_in_mode_bwd(tmp_path, kbench_pm, kbench_case, kbench_check):
    backend = _kernel_file(tmp_path, kbench_pm, "out[...] = out[:, ::-1]")
    rec = kbench_check(backend, kbench_case(mode="bwd"))
    assert rec["status"] == "failed" and rec["reason"].startswith("out: relative L2 error")


def test_kernel_file_without_backward_functions_is_an_error_naming_them(tmp_path, kbench_pm, kbench_case,
                                                                       kbench_check):
    path = tmp_path / "fwdonly.py"
    path.write_text("FEATURES = ['bwd']\ndef attention(q, k, v, out, *, causal, scale):\n    pass\n")
    rec = kbench_check(KernelFileBackend(path, kbench_pm.registry, trusted=True), kbench_case(mode="bwd"))
    assert rec["status"] == "error" and "attention_forward" in rec["reason"]


def test_gradients_computed_in_forward_are_impossible():
    """forward() receives q, k, v only: the split call gives it no dO to work ahead with."""
    seen = []

    class Probe(TrainingKernel):
        def forward(self, *inputs):
            seen.append(len(inputs))
            return inputs

        def backward(self, saved, *arrays):
            seen.append(len(arrays))

    Probe()(q=1, k=2, v=3, do=4, out=5, dq=6, dk=7, dv=8)
    assert seen == [3, 5]


def test_flops_and_bytes_per_mode(kbench_case):
    from kbench.builtin.ops import AttentionOp
    op = AttentionOp()
    fwd = kbench_case(seqlen=64, heads=4, head_dim=32, causal=True, dtype="bf16")
    bwd = kbench_case(seqlen=64, heads=4, head_dim=32, causal=True, dtype="bf16", mode="bwd")
    both = kbench_case(seqlen=64, heads=4, head_dim=32, causal=True, dtype="bf16", mode="fwd_bwd")
    assert op.flops(bwd) == 2.5 * op.flops(fwd) and op.flops(both) == 3.5 * op.flops(fwd)
    tensor = 64 * 4 * 32 * 2  # one (b, s, h, d) bf16 tensor
    assert op.min_bytes(fwd) == 4 * tensor and op.min_bytes(bwd) == 8 * tensor == op.min_bytes(both)


def test_large_cases_check_a_budgeted_set_of_kv_heads(kbench_case, monkeypatch):
    from kbench.builtin.ops import AttentionOp
    op = AttentionOp()
    case = kbench_case(batch=2, seqlen=64, heads=8, head_dim=16, mode="bwd")
    rng = np.random.default_rng(0)
    assert op.sample_rows(case, 256, rng) is None  # small: everything
    per_pair = 4.0 * 64 * 64 * 16
    monkeypatch.setattr(attention_mod, "LARGE_REFERENCE_FLOPS", 3 * per_pair)
    rows = op.sample_rows(case, 16, rng)
    assert isinstance(rows, GradientRows) and len(rows.pairs) == 3 and len(rows.q) == len(rows.kv) == 16
    assert op.rows_checked(rows) == 16
    monkeypatch.setattr(attention_mod, "LARGE_REFERENCE_FLOPS", per_pair / 2)
    assert len(op.sample_rows(case, 64, rng).pairs) == 1      # a correctness check: at least one
    assert op.sample_rows(case, 32, rng).pairs == ()         # a timed check that cannot afford one: none


def test_features_list_passes_the_static_checks_a_cache_does_not():
    from kbench.judge.policy import IntegritySettings, static_check

    clean = "FEATURES = ['bwd', 'fwd_bwd']\nTUNABLES = {}\ndef attention(q, k, v, out, *, causal, scale):\n    pass\n"
    assert static_check(clean, IntegritySettings()) == []
    found = static_check(clean.replace("FEATURES", "SAVED"), IntegritySettings())
    assert [v.rule for v in found] == ["forbid_module_state"]


def test_training_suite_runs_the_kernel_files_sandboxed_and_names_the_wrong_gradient(tmp_path):
    """A kernel file with a correct forward but a wrong dK fails naming dk, run as `kbench run` runs it."""
    import json
    from pathlib import Path

    from click.testing import CliRunner

    from kbench.cli import cli

    here = Path(__file__).parent / "kernels"
    out = tmp_path / "training.json"
    res = CliRunner().invoke(cli, ["run", "suites/training.yaml", "--device", "cpu", "-b", "numpy*",
                                   "-b", str(here / "numpy_training.py"), "-b", str(here / "numpy_training_wrong_dk.py"),
                                   "-k", "b=4 and noncausal and fwd_bwd", "-o", str(out)], catch_exceptions=False)
    assert res.exit_code == 1, res.output  # a record failed
    records = {r["backend"]: r for r in json.loads(out.read_text())["records"]}
    assert {records[n]["status"] for n in ("numpy", "numpy-flash", "file:numpy_training")} == {"passed"}
    wrong = records["file:numpy_training_wrong_dk"]
    assert wrong["status"] == "failed" and wrong["reason"].startswith("dk: relative L2 error 0.2")
    # the kernel files ran untrusted (statically checked: FEATURES is allowed), recorded with their hash
    assert records["file:numpy_training"]["backend_info"]["kernel_file"].endswith("numpy_training.py")


def test_a_slow_untimed_forward_is_not_mistaken_for_forged_samples(kbench_case, kbench_check, fake_backend):
    """Mode bwd: the forward's time (stamped by the runner, checked by the judge) is explained time."""
    import time

    from kbench.builtin.numpy_backends import NumpyTraining

    class SlowForward(NumpyTraining):
        def forward(self, q, k, v):
            time.sleep(0.01)  # 100x the backward of this tiny case: unaccounted, the samples would explain ~1%
            return super().forward(q, k, v)

    class Backend(type(fake_backend(None))):
        features = frozenset({"bwd"})

        def prepare(self, case):
            return SlowForward(causal=case["causal"], scale=case["head_dim"] ** -0.5)

    rec = kbench_check(Backend(None), kbench_case(seqlen=16, heads=1, head_dim=8, mode="bwd"))
    assert rec["status"] == "passed", rec.get("reason")
    assert rec["stats"]["median"] < 0.005  # the forward's 10 ms are not in the samples
    accounting = rec["timing"]["accounting"]
    assert accounting["parent_seconds"] < 0.5 * 0.01 * len(rec["timing"]["samples"])  # the forwards taken out
