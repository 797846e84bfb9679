"""Python source read without running it: a thread-safe ``ast.parse`` and a kernel file's literal globals."""
from __future__ import annotations

import ast
import threading
from typing import Any, Iterable

#: CPython 3.11 keeps one recursion counter per interpreter while ast.parse builds its Python objects;
#: two threads parsing at once (evolve --parallel screens candidates in threads) can fail with
#: "SystemError: AST constructor recursion depth mismatch" (python/cpython#106905). kbench parses
#: Python source only through :func:`parse_source`, one parse at a time.
_PARSE_LOCK = threading.Lock()


def parse_source(source: str, filename: str = "<unknown>") -> ast.Module:
    """``ast.parse(source)``, serialised across threads (see ``_PARSE_LOCK``); SyntaxError as ast.parse."""
    with _PARSE_LOCK:
        return ast.parse(source, filename=filename)


def literal_globals(source: str, names: Iterable[str]) -> dict[str, Any]:
    """Module-level ``NAME = <literal>`` values, read without running the file."""
    wanted, found = set(names), {}
    try:
        tree = parse_source(source)
    except SyntaxError:
        return found
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name in wanted:
                try:
                    found[name] = ast.literal_eval(node.value)
                except ValueError:
                    found[name] = ValueError(f"{name} is not a literal")
    return found
