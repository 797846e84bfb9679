"""Fixtures of kbench-serve's tests (the helpers live in serve_support.py)."""
from __future__ import annotations

import pytest
from serve_support import Server


@pytest.fixture
def server_factory(tmp_path):
    made: list[Server] = []

    def make(*args: str, tokens: bool = True) -> Server:
        s = Server(tmp_path, *args, tokens=tokens)
        made.append(s)
        return s

    yield make
    for s in made:
        s.kill()
