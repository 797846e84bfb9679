"""Fixtures of the kbench-evolve tests: a tiny suite, a deliberately badly tuned seed, a workspace."""
from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

BAD_TUNABLES = '''TUNABLES = {
    "block_q": {"default": 8, "choices": [8, 16, 32, 64, 128]},
    "block_k": {"default": 8, "choices": [8, 16, 32, 64, 128]},
}'''

TINY_SUITE = """version: 1
name: evolve-tiny
op: attention
check: {seeds: 1, max_rows: 32}
timing: {warmup_calls: 1, warmup_time: 0.0, min_samples: 6, min_time: 0.01, max_time: 0.15,
         target_rel_se: 0.02, rotate: 1}
grid:
  - batch: 1
    seqlen: 128
    "heads_q,heads_kv": [[2, 2]]
    head_dim: 32
    causal: [false, true]
    dtype: fp32
"""

GQA_SUITE = TINY_SUITE.replace("evolve-tiny", "evolve-tiny-gqa").replace("[[2, 2]]", "[[4, 2]]")


def shipped_seed() -> str:
    return resources.files("kbench_evolve").joinpath("seeds/numpy_attention_seed.py").read_text()


def bad_seed_source() -> str:
    text = shipped_seed()
    start = text.index("TUNABLES = {")
    end = text.index("}\n\n\n", start) + 1
    return text[:start] + BAD_TUNABLES + text[end:]


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    ws = tmp_path / "evolve"
    monkeypatch.setenv("KBENCH_EVOLVE_DIR", str(ws))
    monkeypatch.chdir(tmp_path)
    return ws


@pytest.fixture
def tiny_suite(tmp_path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY_SUITE)
    return path


@pytest.fixture
def gqa_suite(tmp_path) -> Path:
    path = tmp_path / "tiny-gqa.yaml"
    path.write_text(GQA_SUITE)
    return path


@pytest.fixture
def bad_seed(tmp_path) -> Path:
    path = tmp_path / "bad_seed.py"
    path.write_text(bad_seed_source())
    return path


@pytest.fixture
def pm():
    from kbench.plugins import PluginManager

    return PluginManager()


@pytest.fixture
def lineage(pm, workspace, tiny_suite, bad_seed):
    """Lineage `t` seeded with the badly tuned kernel (v1), created through the CLI."""
    from click.testing import CliRunner

    from kbench.cli import cli
    from kbench_evolve.store import Lineage

    res = CliRunner().invoke(cli, ["evolve", "init", "t", "--seed", str(bad_seed), "--suite", str(tiny_suite),
                                   "--device", "cpu"])
    assert res.exit_code == 0, res.output
    return Lineage.open(workspace, "t")


def write_script(path: Path, items: list[dict]) -> Path:
    path.write_text(json.dumps(items))
    return path
