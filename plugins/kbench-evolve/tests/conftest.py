"""Fixtures of the kbench-evolve tests: a tiny suite, a deliberately badly tuned seed, a workspace."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from evolve_testlib import BAD_TUNABLES, GQA_SUITE, TINY_SUITE, bad_seed_source  # noqa: E402,F401


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
def pm(kbench_pm):
    """A plugin manager of this test's own (kbench.testing's): a test may register plugins on it."""
    return kbench_pm


@pytest.fixture
def lineage(pm, workspace, tiny_suite, bad_seed):
    """Lineage `t` seeded with the badly tuned kernel (v1), created through the CLI."""
    from click.testing import CliRunner

    from kbench.testing import cli
    from kbench_evolve.store import Lineage

    res = CliRunner().invoke(cli, ["evolve", "init", "t", "--seed", str(bad_seed), "--suite", str(tiny_suite),
                                   "--device", "cpu"])
    assert res.exit_code == 0, res.output
    return Lineage.open(workspace, "t")
