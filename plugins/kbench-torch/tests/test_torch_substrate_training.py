"""A ``SUBSTRATE = "torch"`` kernel file with a backward: ``attention_forward`` /
``attention_backward`` on torch tensors, judged by kbench (out, dQ, dK, dV each against the float64
reference); gradients written in place or returned as a dict."""
from __future__ import annotations

import pytest

from kbench.testing import kernel_file_backend, skip_reason

#: the softmax backward written out (dS = P * (dP - rowsum(dP * P))), GQA summed over each kv head's group
MANUAL = '''
import torch
SUBSTRATE = "torch"
FEATURES = ["bwd", "fwd_bwd"]


def _heads(q, k, v, causal, scale):
    sq, sk, group = q.shape[1], k.shape[1], q.shape[2] // k.shape[2]
    qh = q.float().transpose(1, 2)
    kh = k.float().transpose(1, 2).repeat_interleave(group, dim=1)
    vh = v.float().transpose(1, 2).repeat_interleave(group, dim=1)
    s = qh @ kh.transpose(-1, -2) * scale
    if causal:
        i = torch.arange(sq)[:, None]
        j = torch.arange(sk)[None, :]
        s = s.masked_fill(j > i + (sk - sq), float("-inf"))
    return qh, kh, vh, torch.nan_to_num(torch.softmax(s, dim=-1))


def attention(q, k, v, out, *, causal, scale):
    _, _, vh, p = _heads(q, k, v, causal, scale)
    out.copy_((p @ vh).transpose(1, 2))


def attention_forward(q, k, v, *, causal, scale):
    qh, kh, vh, p = _heads(q, k, v, causal, scale)
    return qh, kh, vh, p, k.shape[2]


def attention_backward(saved, do, out, dq, dk, dv, *, causal, scale):
    qh, kh, vh, p, hkv = saved
    b, hq, sk, d = kh.shape
    g = do.float().transpose(1, 2)
    dp = g @ vh.transpose(-1, -2)
    ds = p * (dp - (dp * p).sum(dim=-1, keepdim=True))
    per_head = lambda t: t.reshape(b, hkv, hq // hkv, sk, d).sum(dim=2).transpose(1, 2)  # noqa: E731
    out.copy_((p @ vh).transpose(1, 2))
    dq.copy_((ds @ kh * SCALE_DQ * scale).transpose(1, 2))
    dk.copy_(per_head(ds.transpose(-1, -2) @ qh * scale))
    return {"dv": per_head(p.transpose(-1, -2) @ g).to(dv.dtype)}
'''

CASES = [
    dict(seqlen=24, heads_q=4, heads_kv=2, head_dim=16, causal=True, mode="bwd"),
    dict(seqlen_q=12, seqlen_kv=29, heads_q=3, heads_kv=1, head_dim=16, causal=True, mode="fwd_bwd"),
    dict(seqlen=16, heads=2, head_dim=32, mode="bwd", dtype="bf16"),
    dict(seqlen=16, heads=2, head_dim=32, mode="fwd"),
]


def _backend(kbench_pm, tmp_path, text):
    path = tmp_path / "train.py"
    path.write_text(text)
    return kernel_file_backend(kbench_pm, path)


@pytest.mark.parametrize("params", CASES, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
def test_a_torch_kernel_file_with_a_backward_passes(kbench_pm, kbench_case, kbench_check, tmp_path, params):
    backend = _backend(kbench_pm, tmp_path, MANUAL.replace("SCALE_DQ", "1.0"))
    assert backend.features == {"bwd", "fwd_bwd"}
    rec = kbench_check(backend, kbench_case(**params))
    assert rec["status"] == "passed", rec.get("reason")


def test_a_wrong_dq_in_a_torch_kernel_file_fails_naming_dq(kbench_pm, kbench_case, kbench_check, tmp_path):
    rec = kbench_check(_backend(kbench_pm, tmp_path, MANUAL.replace("SCALE_DQ", "1.05")), kbench_case(**CASES[0]))
    assert rec["status"] == "failed" and rec["reason"].startswith("dq"), rec.get("reason")


def test_a_window_case_is_skipped_naming_the_feature(kbench_pm, kbench_case, tmp_path):
    backend = _backend(kbench_pm, tmp_path, MANUAL.replace("SCALE_DQ", "1.0"))
    case = kbench_case(seqlen=16, heads=2, head_dim=16, mode="bwd", window=[4, 0])
    assert skip_reason(kbench_pm, backend, case) == "does not implement window (implements: bwd, fwd_bwd)"
