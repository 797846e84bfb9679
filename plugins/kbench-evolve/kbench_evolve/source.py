"""Reading and editing kernel-file source without executing it (candidates are untrusted).

``TUNABLES``, ``SUBSTRATE`` and ``OP`` are read with :mod:`ast` from literal assignments; the
``mutate`` operator rewrites the ``TUNABLES`` literal in place; the LLM operators' edits arrive as
SEARCH/REPLACE blocks applied here.
"""
from __future__ import annotations

import ast
import hashlib
import re
from dataclasses import dataclass
from typing import Any

from kbench.api import BadInput, parse_source


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _literal_assignments(source: str) -> dict[str, tuple[ast.Assign, Any]]:
    tree = parse_source(source)
    found: dict[str, tuple[ast.Assign, Any]] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                found[node.targets[0].id] = (node, ast.literal_eval(node.value))
            except (ValueError, SyntaxError, TypeError):
                continue
    return found


def module_globals(source: str) -> dict[str, Any]:
    """The literal globals a kernel file declares (TUNABLES, SUBSTRATE, OP, NAME)."""
    return {k: v for k, (_, v) in _literal_assignments(source).items()
            if k in ("TUNABLES", "SUBSTRATE", "OP", "NAME")}


def tunables(source: str) -> dict[str, dict[str, Any]]:
    found = _literal_assignments(source).get("TUNABLES")
    return dict(found[1]) if found else {}


def with_tunables(source: str, settings: dict[str, Any]) -> str:
    """``source`` with the defaults of TUNABLES set to ``settings``; only those literals change, so
    the file keeps its formatting and a diff shows exactly the values that moved."""
    found = _literal_assignments(source).get("TUNABLES")
    if not found or not isinstance(found[0].value, ast.Dict):
        raise BadInput("kernel declares no literal TUNABLES", fix='add TUNABLES = {"block_q": {"default": 64, ...}}')
    offsets = [0]
    for line in source.splitlines(keepends=True):
        offsets.append(offsets[-1] + len(line))

    def span(node: ast.AST) -> tuple[int, int]:
        return offsets[node.lineno - 1] + node.col_offset, offsets[node.end_lineno - 1] + node.end_col_offset

    edits = []
    for key, spec in zip(found[0].value.keys, found[0].value.values):
        name = ast.literal_eval(key) if key is not None else None
        if name not in settings or not isinstance(spec, ast.Dict):
            continue
        for k, v in zip(spec.keys, spec.values):
            if k is not None and ast.literal_eval(k) == "default":
                edits.append((*span(v), repr(settings[name])))
    out = source
    for a, b, text in sorted(edits, reverse=True):
        out = out[:a] + text + out[b:]
    return out


def check_syntax(source: str) -> str | None:
    try:
        parse_source(source)
    except SyntaxError as exc:
        return f"syntax error at line {exc.lineno}: {exc.msg}"
    return None


# -- SEARCH/REPLACE patches ---------------------------------------------------------------------

PATCH_RE = re.compile(r"<{5,9} SEARCH\n(.*?)\n?={5,9}\n(.*?)\n?>{5,9} REPLACE", re.S)


@dataclass
class PatchError(Exception):
    message: str

    def __str__(self) -> str:
        return self.message


def parse_patch(text: str) -> list[tuple[str, str]]:
    blocks = [(m.group(1), m.group(2)) for m in PATCH_RE.finditer(text)]
    if not blocks:
        raise PatchError("no SEARCH/REPLACE block found: write\n<<<<<<< SEARCH\nold lines\n=======\n"
                         "new lines\n>>>>>>> REPLACE")
    return blocks


def apply_patch(source: str, patch: str) -> str:
    """Apply every block in order; each SEARCH text must occur exactly once in the current text."""
    out = source
    for i, (search, replace) in enumerate(parse_patch(patch)):
        count = out.count(search)
        if count != 1:
            where = "does not occur" if count == 0 else f"occurs {count} times"
            raise PatchError(f"block {i + 1}: the SEARCH text {where} in the kernel; copy it exactly "
                             f"(whitespace included) and make it unique")
        out = out.replace(search, replace, 1)
    return out
