"""The GPU lineage's loop on the CPU: the Triton seed evolved with `mutate` under Triton's interpreter.

Timings under ``TRITON_INTERPRET=1`` mean nothing; what is real is everything else: the Triton seed as a
lineage's v1, candidates rewritten in its TUNABLES, each run untrusted in sandboxed workers (which receive
``TRITON_*``), checked against the float64 reference on fp16 and fp32 cases, and the commit rule.
The one change to the seed: ``SUBSTRATE = "torch"`` (the kbench-triton substrate declares itself
unavailable under the interpreter; the torch substrate hands the same torch tensors, on the CPU). The suite
keeps the default integrity rules: the seed's config tables are read-only, so forbid_module_state holds.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from click.testing import CliRunner

from kbench.testing import cli
from kbench_evolve import source as src
from kbench_evolve.store import Lineage

pytest.importorskip("triton")
pytest.importorskip("torch")

SUITE = """version: 1
name: evolve-triton-interpreted
op: attention
check: {seeds: 1, max_rows: 16}
timing: {warmup_calls: 1, warmup_time: 0.0, min_samples: 2, min_time: 0.0, max_time: 0.05, target_rel_se: 1.0,
         rotate: 1}
grid:
  - batch: 1
    seqlen: 64
    heads: 2
    head_dim: 32
    causal: [false, true]
    dtype: [fp16, fp32]
"""


def triton_seed_on_cpu() -> str:
    spec = importlib.util.find_spec("kbench_triton")
    text = (Path(spec.origin).parent / "seeds" / "triton_attention_seed.py").read_text()
    assert 'SUBSTRATE = "triton"' in text
    return text.replace('SUBSTRATE = "triton"', 'SUBSTRATE = "torch"', 1)


@pytest.mark.nightly
def test_triton_seed_lineage_mutates_under_the_interpreter(workspace, tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # reaches the sandboxed workers (TRITON_* is allowed)
    seed = tmp_path / "triton_seed_cpu.py"
    seed.write_text(triton_seed_on_cpu())
    suite = tmp_path / "triton.yaml"
    suite.write_text(SUITE)
    res = CliRunner().invoke(cli, ["evolve", "init", "tri", "--seed", str(seed), "--suite", str(suite),
                                   "--device", "cpu"])
    assert res.exit_code == 0, res.output
    lineage = Lineage.open(workspace, "tri")
    v1 = lineage.champion()
    assert len(v1.scores) == 4 and all(s > 0 for s in v1.scores.values())  # fp16 and fp32, causal and not

    res = CliRunner().invoke(cli, ["evolve", "run", "tri", "--operator", "mutate", "--iterations", "1",
                                   "--max-steps", "2", "--rounds", "1", "--device", "cpu"])
    assert res.exit_code == 0, res.output
    tried = [a for a in lineage.attempts() if a["operator"] == "mutate"]
    assert len(tried) >= 1
    for a in tried:
        # each candidate moved one of the Triton knobs, ran correct on every case, and was judged on speed
        moved = {k for k, v in a["tunables"].items() if v != src.tunables(v1.source)[k]["default"]}
        assert moved and moved <= {"BLOCK_M", "BLOCK_N", "num_warps", "num_stages"}
        assert a["outcome"] in ("committed", "rejected") and "speedup" in a["reason"], a
    for v in lineage.versions()[1:]:  # a commit only with the interval above 1
        assert v.meta["decision"]["ci"][0] > 1.0 and 'SUBSTRATE = "torch"' in v.source
