"""The one YAML loader of kbench: every YAML file kbench reads (suites, model and hardware files, its own data)
goes through :func:`load_yaml` / :func:`load_yaml_text`.

Why not ``yaml.safe_load``: it reads YAML 1.1 (``2e-2`` is a string, ``012`` is octal, ``1:30`` is 90),
accepts duplicate keys silently (the last wins), has no size limit, and expands aliases without bound
(a "billion laughs" document of a few hundred bytes takes minutes and gigabytes). This loader parses
once (with the C parser when PyYAML has it), keeps the node tree for line numbers, and refuses:

* files over :data:`MAX_BYTES`;
* alias expansion beyond :data:`MAX_EXPANSION` times the document's own size (counted on the node graph,
  before anything is built, so a bomb is refused in milliseconds);
* a key repeated in one mapping (both lines named);
* ``.nan`` / ``.inf`` (no kbench setting is meaningfully infinite or NaN).

Numbers follow the YAML 1.2 core schema: ``2e-2`` and ``1e5`` are floats, ``012`` is 12, ``0o17`` octal,
``0x1f`` hex; ``1_000`` is still allowed (readable sizes); sexagesimal ``1:30`` is a string.
"""
from __future__ import annotations

import math
import re
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from kbench.errors import BadInput
from kbench.reader import MAX_DEPTH, MAX_INT_DIGITS, check_shape  # the one reader's limits, for YAML too
from kbench.text import safe_strings

#: largest YAML file kbench reads (bytes); a 10,000-case suite is well under 1 MiB
MAX_BYTES = 16 * 2**20
#: alias expansion allowed: nodes after expanding aliases <= MAX_EXPANSION x distinct nodes + EXPANSION_SLACK
MAX_EXPANSION = 10
EXPANSION_SLACK = 10_000

_Base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
#: whether the C (libyaml) parser is used
USES_LIBYAML = _Base is not yaml.SafeLoader

_INT_12 = re.compile(r"^(?:[-+]?[0-9][0-9_]*|0o[0-7_]+|0x[0-9a-fA-F_]+)$")
_FLOAT_12 = re.compile(r"^(?:[-+]?(?:\.[0-9][0-9_]*|[0-9][0-9_]*(?:\.[0-9_]*)?)(?:[eE][-+]?[0-9]+)?"
                       r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$")


class _Loader(_Base):  # type: ignore[misc, valid-type]
    """SafeLoader with YAML 1.2 core numbers, duplicate keys refused and no NaN/Inf."""

    source: str | None = None

    def resolve(self, kind, value, implicit):
        # the (C) parser asks the Python resolver about every scalar; big suites repeat a few values
        # ("64", "fp32", "true") thousands of times, and the regular expressions were the loader's hot spot
        if kind is yaml.ScalarNode and implicit[0]:
            tag = _RESOLVED.get(value)
            if tag is None:
                tag = super().resolve(kind, value, implicit)
                if len(_RESOLVED) < 65536:
                    _RESOLVED[value] = tag
            return tag
        return super().resolve(kind, value, implicit)


#: tag of each plain scalar seen (plain scalars resolve by their text alone in the safe schema)
_RESOLVED: dict[str, str] = {}


# YAML 1.2 numbers: replace the 1.1 int and float resolvers, keep the others (bool, null, timestamp...)
_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
for _ch in "-+0123456789":
    _Loader.add_implicit_resolver("tag:yaml.org,2002:int", _INT_12, [_ch])
for _ch in "-+0123456789.":
    _Loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_12, [_ch])


def _where(node: yaml.Node) -> str:
    return f"line {node.start_mark.line + 1}, column {node.start_mark.column + 1}"


def _construct_int(loader: _Loader, node: yaml.ScalarNode) -> int:
    text = loader.construct_scalar(node).replace("_", "")
    if len(text.lstrip("+-")) > MAX_INT_DIGITS:
        raise BadInput(f"an integer of {len(text.lstrip('+-')):,} digits (at most {MAX_INT_DIGITS})", file=loader.source,
                       where=_where(node), fix="give a realistic number")
    if text.startswith("0o"):
        return int(text[2:], 8)
    if text.startswith("0x"):
        return int(text[2:], 16)
    return int(text, 10)


def _construct_float(loader: _Loader, node: yaml.ScalarNode) -> float:
    text = loader.construct_scalar(node).replace("_", "")
    if len(text) > 400:  # float() of a long text is quadratic-ish, and no setting needs one
        raise BadInput(f"a number written with {len(text):,} characters", file=loader.source, where=_where(node),
                       fix="give a realistic number")
    value = float(text.lower().replace(".inf", "inf").replace(".nan", "nan"))
    if not math.isfinite(value):
        raise BadInput(f"{text!r} is not a finite number", file=loader.source, where=_where(node),
                       fix="give a finite number (kbench has no use for NaN or infinity here)")
    return value


def _construct_mapping(loader: _Loader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, yaml.Node] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        # scalar keys compare by tag and text (no construction: this runs for every mapping of the file)
        key = (key_node.value if key_node.tag == "tag:yaml.org,2002:str"
               else loader.construct_object(key_node, deep=True))
        try:
            first = seen.get(key)
        except TypeError:  # an unhashable key: SafeConstructor reports it
            break
        if first is not None:
            raise BadInput(f"duplicate key {key!r}: first on line {first.start_mark.line + 1}, "
                           f"again on line {key_node.start_mark.line + 1}", file=loader.source, where=_where(key_node),
                           fix="keep one of the two (YAML would silently use the last)")
        seen[key] = key_node
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)
_Loader.add_constructor("tag:yaml.org,2002:float", _construct_float)
_Loader.construct_mapping = _construct_mapping  # type: ignore[method-assign]


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _check_expansion(root: yaml.Node, source: str | None) -> None:
    """Refuse alias bombs and recursive aliases: count the nodes an expansion would build, memoised per
    shared node (linear in the written document, so a bomb is refused before anything is built)."""
    size: dict[int, int] = {id(root): -1}  # -1: being counted
    stack = [(root, iter(_children(root)))]
    while stack:  # iterative post-order: deep documents do not hit Python's recursion limit
        node, pending = stack[-1]
        for child in pending:
            known = size.get(id(child))
            if known is None:
                if len(stack) >= MAX_DEPTH:
                    raise BadInput(f"nested more than {MAX_DEPTH} levels deep", file=source, where=_where(child),
                                   fix="flatten the document (a suite is a few levels deep)")
                size[id(child)] = -1
                stack.append((child, iter(_children(child))))
                break
            if known == -1:
                raise BadInput("recursive alias (a node that contains itself)", file=source, where=_where(child),
                               fix="write the value out; kbench documents are trees")
        else:
            stack.pop()
            size[id(node)] = 1 + sum(size[id(c)] for c in _children(node))
    total, distinct = size[id(root)], len(size)
    limit = MAX_EXPANSION * distinct + EXPANSION_SLACK
    if total > limit:
        raise BadInput(f"aliases expand this document to {total:,} nodes from {distinct:,} written "
                       f"(limit {limit:,}): an alias bomb, or aliases used far beyond sharing a setting",
                       file=source, fix="write the values out, or share fewer levels of aliases")


def _index(root: yaml.Node, lines: dict[tuple, int], source: str | None) -> None:
    """Line of every path; refuses nesting deeper than MAX_DEPTH (aliases have been checked before)."""
    stack: list[tuple[yaml.Node, tuple]] = [(root, ())]
    while stack:
        node, path = stack.pop()
        lines.setdefault(path, node.start_mark.line + 1)
        if len(path) >= MAX_DEPTH and _children(node):
            raise BadInput(f"nested more than {MAX_DEPTH} levels deep", file=source, where=_where(node),
                           fix="flatten the document (a suite is a few levels deep)")
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode):
                    lines[path + (key.value,)] = key.start_mark.line + 1
                    stack.append((value, path + (key.value,)))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, path + (i,)) for i, item in enumerate(node.value))


def load_yaml_text(text: str, *, source: str | None = None) -> tuple[Any, dict[tuple, int]]:
    """Parse ``text`` once: the document and a map from JSON path (tuple of keys/indices) to 1-based lines."""
    if len(text) > MAX_BYTES:
        raise BadInput(f"YAML file of {len(text):,} characters is over the limit of {MAX_BYTES:,}", file=source,
                       fix="split it (one suite per op or device), or use tied keys instead of listing every case")
    loader = _Loader(text)
    loader.source = source
    try:
        node = loader.get_single_node()
        if node is None:
            return None, {}
        if "*" in text:  # no alias without a '*': the common case skips the graph walk
            _check_expansion(node, source)
        lines: dict[tuple, int] = {}
        _index(node, lines, source)  # before construction: refuses deep nesting with its line
        data = loader.construct_document(node)
        problem = check_shape(data)  # the limits every reader applies: strings, arrays (a suite goes into results)
        if problem is not None:
            raise BadInput(problem[0], file=source, where=describe_path(problem[1], lines),
                           fix="shorten it: no suite needs one this long")
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise BadInput(f"malformed YAML: {problem}", file=source, where=where,
                       fix="check indentation and quoting near that line (a key like 'a,b' may need quotes)"
                       ) from None
    except RecursionError:
        raise BadInput("YAML nested too deeply", file=source, fix="flatten the document") from None
    finally:
        loader.dispose()
    return safe_strings(data), lines  # the readers' escape (kbench.text): a "\u202e" in a suite name is shown as such


def load_yaml(path: str | Path) -> tuple[Any, dict[tuple, int]]:
    """The document in the file ``path`` and its line map (see :func:`load_yaml_text`). Read through the one
    reader (:mod:`kbench.reader`): a FIFO, device or directory is refused by its type before it is opened, and
    the size is counted while reading (the size ``stat`` reports is not trusted)."""
    from kbench.reader import read_text

    path = Path(path)
    text = read_text(path, limit=MAX_BYTES, what="YAML file",
                     limit_fix="split it (one suite per op or device), or use tied keys instead of listing every case",
                     fix="give a readable UTF-8 YAML file")
    return load_yaml_text(text, source=str(path))


def load_package_yaml(name: str) -> Any:
    """A YAML data file shipped in kbench/data/ (same loader, same limits)."""
    res = resources.files("kbench").joinpath("data", name)
    return load_yaml_text(res.read_text(encoding="utf-8"), source=str(res))[0]


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


def find_non_finite(data: Any, path: tuple = ()) -> tuple | None:
    """The JSON path of the first NaN or infinite float in ``data`` (dicts and lists), else None."""
    stack: list[tuple[Any, tuple]] = [(data, path)]
    while stack:
        obj, where = stack.pop()
        if isinstance(obj, float) and not math.isfinite(obj):
            return where
        if isinstance(obj, dict):
            stack.extend((v, where + (k,)) for k, v in obj.items())
        elif isinstance(obj, list):
            stack.extend((v, where + (i,)) for i, v in enumerate(obj))
    return None
