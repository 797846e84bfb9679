"""Shared data of the kbench-evolve tests (imported by conftest and the tests; unique module name)."""
from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

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


def write_script(path: Path, items: list[dict]) -> Path:
    path.write_text(json.dumps(items))
    return path


def init_bad_seed_lineage(base: Path) -> Path:
    """Lineage `t` of the badly tuned seed (:func:`bad_seed_source`) on :data:`TINY_SUITE`, measured once under
    ``base``; returns its folder. Load is noise, never a verdict: an honest seed is measured once, with no retry."""
    from click.testing import CliRunner

    from kbench.testing import cli

    (base / "tiny.yaml").write_text(TINY_SUITE)
    (base / "bad_seed.py").write_text(bad_seed_source())
    res = CliRunner().invoke(cli, ["evolve", "init", "t", "--seed", str(base / "bad_seed.py"), "--suite",
                                   str(base / "tiny.yaml"), "--workspace", str(base / "evolve"), "--device", "cpu"])
    assert res.exit_code == 0, res.output
    return base / "evolve" / "t"
