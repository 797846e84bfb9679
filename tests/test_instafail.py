"""kbench.testing prints a failure as it happens when KBENCH_INSTAFAIL=1 (scripts/gpu-check's test stage)."""
from __future__ import annotations

import os
import subprocess
import sys


def _run(tmp_path, instafail: bool) -> str:
    (tmp_path / "test_sample.py").write_text(
        "import time\n"
        "def test_wrong():\n    assert 2 + 2 == 5, 'the arithmetic is off'\n"
        "def test_after():\n    pass\n")
    env = {k: v for k, v in os.environ.items() if k != "KBENCH_INSTAFAIL"}
    if instafail:
        env["KBENCH_INSTAFAIL"] = "1"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(tmp_path / "test_sample.py")], capture_output=True, text=True, env=env, timeout=120,
                          cwd=tmp_path)
    return done.stdout  # kbench.testing is loaded through its pytest11 entry point


def test_failure_is_printed_before_the_session_ends(tmp_path):
    out = _run(tmp_path, instafail=True)
    assert "--- FAILED test_sample.py::test_wrong (call)" in out
    # printed at once: before the next test's progress dot and the end-of-session FAILURES section
    assert out.index("the arithmetic is off") < out.index("= FAILURES =")
    assert out.index("--- FAILED") < out.index(".")


def test_quiet_without_the_variable(tmp_path):
    assert "--- FAILED" not in _run(tmp_path, instafail=False)
