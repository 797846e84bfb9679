"""The light install (README "Set-up", requirements-light.txt): the core and its CPU NumPy backends without any
first-party plugin. These tests pass in both installs; CI runs them in a fresh light virtual environment too."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from kbench.cli import cli

ROOT = Path(__file__).resolve().parents[1]
#: what makes the full install 3.1 GB (torch 754 MB, triton 1 GB, ray 240 MB, cupy 200 MB; litellm's tree)
HEAVY = ("torch", "triton", "ray", "cupy", "litellm", "nvidia", "flash-attn", "openevolve")


def test_the_light_requirements_are_the_core_with_its_test_tools_and_nothing_heavy():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    lines = [line.split("#")[0].strip() for line in (ROOT / "requirements-light.txt").read_text().splitlines()]
    assert [line for line in lines if line] == ["-e .[test]"]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    needed = project["dependencies"] + project["optional-dependencies"]["test"]
    names = [re.split(r"[<>=!~;\[ ]", dep, maxsplit=1)[0].lower() for dep in needed]
    assert not [n for n in names if n.startswith(HEAVY)], names


def test_a_run_names_the_first_party_plugins_it_lacks(tmp_path, monkeypatch):
    import kbench.commands.run as run

    assert run.missing_plugins() == [f"{name} ({adds})" for name, adds in run.FIRST_PARTY if not _installed(name)]
    monkeypatch.setattr(run, "FIRST_PARTY", (("kbench-not-installed", "what it would add; a library"),))
    res = CliRunner().invoke(cli, ["run", "suites/smoke.yaml", "-b", "numpy", "-k", "sq=64 and hkv=4 and noncausal",
                                   "--no-progress", "--no-isolate", "-o", str(tmp_path / "r.json")])
    assert res.exit_code == 0, res.output
    assert ("kbench: not installed here (the light install): kbench-not-installed (what it would add; a library); "
            "their backends are not in this run") in res.stderr


def _installed(name: str) -> bool:
    import importlib.metadata as md

    try:
        md.version(name)
    except md.PackageNotFoundError:
        return False
    return True
