"""YAML with line numbers: load a document and map each JSON path to the line it came from."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from kbench.errors import BadInput


def _index(node: yaml.Node, path: tuple, lines: dict[tuple, int]) -> None:
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            k = key.value
            lines[path + (k,)] = key.start_mark.line + 1
            _index(value, path + (k,), lines)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _index(item, path + (i,), lines)


def load_yaml(path: str | Path) -> tuple[Any, dict[tuple, int]]:
    """The document and a map from JSON path (tuple of keys/indices) to 1-based line numbers."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BadInput("file not found", file=str(path), fix="check the path") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"cannot read: {exc}", file=str(path), fix="give a readable UTF-8 YAML file") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise BadInput(f"malformed YAML: {problem}", file=str(path), where=where,
                       fix="check indentation and quoting near that line (a key like 'a,b' may need quotes)"
                       ) from None
    lines: dict[tuple, int] = {}
    if node is not None:
        _index(node, (), lines)
    return data, lines


def describe_path(path: tuple, lines: dict[tuple, int]) -> str:
    """``grid[0].head_dim (line 12)`` for a JSON path."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    text = text or "(top level)"
    probe = tuple(path)
    while probe and probe not in lines:
        probe = probe[:-1]
    line = lines.get(probe)
    return f"{text} (line {line})" if line else text
