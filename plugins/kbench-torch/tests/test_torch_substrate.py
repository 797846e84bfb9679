"""The ``torch`` kernel-file substrate: torch CPU tensors sharing the harness's memory, the harness's thread
count, fused attention refused by the static policy, results checked against the float64 reference."""
from __future__ import annotations

import pytest
import torch

from kbench.testing import kernel_file_backend, static_violations

NAIVE = '''
import torch
SUBSTRATE = "torch"
OP = "attention"
TUNABLES = {"ret": {"default": False, "choices": [False, True]}}

def attention(q, k, v, out, *, causal, scale, ret=False):
    sq, sk, group = q.shape[1], k.shape[1], q.shape[2] // k.shape[2]
    qh = q.float().transpose(1, 2)
    kh = k.float().transpose(1, 2).repeat_interleave(group, dim=1)
    vh = v.float().transpose(1, 2).repeat_interleave(group, dim=1)
    s = qh @ kh.transpose(-1, -2) * scale
    if causal:
        i = torch.arange(sq)[:, None]
        j = torch.arange(sk)[None, :]
        s = s.masked_fill(j > i + (sk - sq), float("-inf"))
    p = torch.nan_to_num(torch.softmax(s, dim=-1))
    o = (p @ vh).transpose(1, 2)
    if ret:
        return o
    out.copy_(o)
'''


def _backend(kbench_pm, tmp_path, text, **settings):
    path = tmp_path / "k.py"
    path.write_text(text)
    return kernel_file_backend(kbench_pm, path, **settings)


def test_torch_substrate_is_registered_for_the_cpu(kbench_pm):
    sub = kbench_pm.registry.substrates["torch"]
    assert sub.device == "cpu" and sub.available() is None
    assert kbench_pm.registry.owner("substrate", "torch") == "torch"


@pytest.mark.parametrize("ret", [False, True])
@pytest.mark.parametrize("params", [
    dict(seqlen_q=24, seqlen_kv=40, heads_q=4, heads_kv=2, causal=True, dtype="fp32"),
    dict(seqlen_q=40, seqlen_kv=24, heads_q=4, heads_kv=1, causal=True, dtype="fp16"),
    dict(seqlen=32, heads=2, causal=False, dtype="bf16"),
])
def test_a_torch_kernel_file_passes_the_harness_check(kbench_pm, kbench_case, kbench_check, tmp_path, params, ret):
    backend = _backend(kbench_pm, tmp_path, NAIVE, ret=ret)
    assert backend.device == "cpu"
    rec = kbench_check(backend, kbench_case(**params))
    assert rec["status"] == "passed", rec.get("reason")


def test_a_wrong_torch_kernel_fails_the_check(kbench_pm, kbench_case, kbench_check, tmp_path):
    wrong = NAIVE.replace("* scale", "* scale * 1.01")
    rec = kbench_check(_backend(kbench_pm, tmp_path, wrong), kbench_case(seqlen=32, heads=2, causal=False))
    assert rec["status"] != "passed" and "relative L2 error" in rec["reason"]


def test_a_returned_tensor_of_the_wrong_shape_is_an_error(kbench_pm, kbench_case, kbench_check, tmp_path):
    bad = NAIVE.replace("return o", "return o[:, :1]")
    rec = kbench_check(_backend(kbench_pm, tmp_path, bad, ret=True), kbench_case(seqlen=32, heads=2))
    assert rec["status"] == "error" and "must write `out` or return a tensor of shape" in rec["reason"]


@pytest.mark.parametrize("call", ["torch.nn.functional.scaled_dot_product_attention(q, k, v)",
                                  "F.scaled_dot_product_attention(q, k, v)",
                                  "torch.nn.MultiheadAttention(64, 8)"])
def test_fused_attention_is_refused_by_the_static_policy(call):
    source = NAIVE.replace("    if ret:", f"    {call}\n    if ret:").replace(
        "import torch\n", "import torch\nimport torch.nn.functional as F\n", 1)
    found = static_violations(source)
    assert [v.rule for v in found] == ["forbidden_calls"], found
    assert static_violations(NAIVE) == []


def test_threads_are_the_harness_setting_equal_to_torch_sdpa(kbench_pm, kbench_case, tmp_path, monkeypatch):
    from kbench_torch.sdpa import TorchSDPA
    from kbench_torch.substrate import torch_threads

    before = torch.get_num_threads()
    try:
        for value in ("2", "1"):
            monkeypatch.setenv("KBENCH_TORCH_THREADS", value)
            backend = _backend(kbench_pm, tmp_path, NAIVE)
            backend.prepare(kbench_case(seqlen=16, heads=1))
            assert torch.get_num_threads() == torch_threads() == int(value)
            assert TorchSDPA().settings["threads"] == int(value)  # the same rule as torch-sdpa
        monkeypatch.delenv("KBENCH_TORCH_THREADS")
        assert torch_threads() == TorchSDPA().settings["threads"] == 1
    finally:
        torch.set_num_threads(before)
