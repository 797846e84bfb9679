"""`kbench fuzz`: the time one check may take follows --budget (half of it, at most the checker's 60 s), so a
hanging kernel found with a small budget ends near that budget, not after a fixed minute."""
from __future__ import annotations

import time
from pathlib import Path

from click.testing import CliRunner

from kbench.cli import cli

HANG = '''
def attention(q, k, v, out, *, causal, scale):
    while True:
        pass
'''


def test_a_hang_found_with_a_small_budget_ends_near_the_budget(tmp_path):
    kernel = tmp_path / "hang.py"
    kernel.write_text(HANG)
    start = time.monotonic()
    res = CliRunner().invoke(cli, ["fuzz", "-b", str(kernel), "--budget", "6", "--seed", "1",
                                   "-o", str(tmp_path / "fuzz.json")])
    took = time.monotonic() - start
    assert res.exit_code == 1, res.output
    assert "timeout: exceeded the case timeout of 3 s" in res.output
    assert took < 45, took  # the budget, the checks' start-up and the shrink: far below one 60 s timeout
    assert Path(tmp_path / "fuzz.json").is_file()
