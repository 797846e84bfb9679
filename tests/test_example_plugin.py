"""The third-party plugin example in docs/writing-a-plugin.md works as documented."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "kbench-example-backend"


def test_example_plugin_installs_by_entry_point_and_its_tests_pass(tmp_path):
    # what `pip install -e examples/kbench-example-backend` does for discovery: a dist-info with the entry point
    dist = tmp_path / "kbench_example_backend-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: kbench-example-backend\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text("[kbench]\nexample = kbench_example.plugin\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(EXAMPLE)])}
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(EXAMPLE / "tests")],
                         env=env, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "5 passed" in res.stdout
    listed = subprocess.run([sys.executable, "-m", "kbench.cli", "list"], env=env, capture_output=True, text=True,
                            cwd=tmp_path, timeout=300)
    line = next(l for l in listed.stdout.splitlines() if l.startswith("example-einsum"))
    assert "example" in line and "available" in line
