"""Tests of the example backend with kbench's own pytest fixtures (kbench.testing)."""
import pytest

from kbench_example.backend import EinsumAttention


@pytest.mark.parametrize("params, settings", [
    (dict(seqlen=32, heads=2, head_dim=16), {}),
    (dict(seqlen_q=12, seqlen_kv=40, heads=2, head_dim=16, causal=True), {"chunk_q": 8}),  # a ragged last chunk
    (dict(seqlen=24, heads=2, head_dim=16, dtype="bf16", causal=True), {"chunk_q": 16}),
])
def test_correct_on_the_harness(kbench_case, kbench_check, params, settings):
    backend = EinsumAttention().configure(settings)  # what `-b 'example-einsum[chunk_q=8]'` does
    record = kbench_check(backend, kbench_case(**params))
    assert record["status"] == "passed", record["reason"]
    assert record["backend_info"]["tunables"] == {"chunk_q": settings.get("chunk_q", 0)}


def test_gqa_is_declared_unsupported(kbench_case, kbench_check):
    record = kbench_check(EinsumAttention(), kbench_case(heads_q=4, heads_kv=2))
    assert record["status"] == "skipped"
    assert "GQA" in record["reason"]


def test_registered_through_the_entry_point(kbench_pm):
    assert "example-einsum" in kbench_pm.registry.backends
