"""The core's imports run one way: no import cycle in ``kbench/`` (docs/architecture.md, "Layers").

Every ``import`` / ``from ... import`` statement anywhere in a module counts: at the top, inside a function
(a lazy import), under ``if TYPE_CHECKING:``. A lazy or type-only import still means the lower module knows
the higher one; a higher thing passed down is typed in the lower module with a Protocol or left ``Any``.

What is an edge, decided explicitly:

- ``import a.b.c`` and ``from a.b import c`` where ``a.b.c`` is a module: an edge to ``a.b.c`` only.
  Python runs the package ``__init__`` of ``a`` and ``a.b`` first, but that is not counted: every module of a
  package would otherwise depend on its own ``__init__``, and an ``__init__`` that re-exports its submodules
  would be in a cycle with each of them.
- ``from a.b import name`` where ``name`` is not a submodule (a name the ``__init__`` defines or re-exports):
  an edge to the package ``a.b``, also from a module inside ``a.b``. So a submodule never takes its own
  package's re-exports: it imports the name from the submodule that defines it.
- ``from a.b.c import name`` for a class, function or constant: an edge to ``a.b.c``.
- Imports by name at run time (``importlib.import_module("kbench....")``: ``kbench.__getattr__``, the lazy
  table of ``kbench.api``, the registry's class checks, the plugin manager's ``DEFAULT_PLUGINS``) are not
  statements and are not counted: that is how plugins (the core's own too) are loaded.

Only ``kbench/`` is scanned: ``plugins/`` are separate packages that import ``kbench.api``.
"""
from __future__ import annotations

import ast
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "kbench"


def module_names(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under ``root`` (a package ``__init__`` is the package's name)."""
    out = {}
    for f in sorted(root.rglob("*.py")):
        parts = f.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def import_graph(root: Path) -> dict[str, dict[str, list[str]]]:
    """module -> {imported module -> ["file:line", ...]}, every import statement counted (see the docstring)."""
    mods = module_names(root)
    top = root.name
    graph: dict[str, dict[str, list[str]]] = {m: {} for m in mods}

    def owner(name: str) -> str | None:  # the longest module prefix of a dotted name
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [owner(a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([base] if base else []))
                # a submodule taken from a package is an edge to the submodule; any other name, to the module
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else owner(base) for a in node.names]
            else:
                continue
            for target in targets:
                if target and target != mod and (target == top or target.startswith(top + ".")):
                    where = f"{path.relative_to(root.parent)}:{node.lineno}"
                    places = graph[mod].setdefault(target, [])
                    if where not in places:
                        places.append(where)
    return graph


def cycles(graph: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), biggest first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph) + 100))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(found, key=lambda c: (-len(c), c))


def describe(graph: dict[str, dict[str, list[str]]], component: list[str]) -> str:
    inside = set(component)
    lines = [f"{len(component)} modules in an import cycle: {', '.join(component)}", "edges:"]
    for a in component:
        for b in sorted(set(graph[a]) & inside):
            lines.append(f"  {a} -> {b}  ({', '.join(graph[a][b])})")
    return "\n".join(lines)


def test_kbench_has_no_import_cycle():
    graph = import_graph(ROOT)
    assert len(graph) > 100 and sum(map(len, graph.values())) > 300  # the scan found the package
    found = cycles(graph)
    assert not found, ("the core's imports must run one way (docs/architecture.md, \"Layers\"); cut the edge "
                       "that points up (a Protocol or Any in the lower module, or the caller passes the object "
                       "in):\n" + "\n\n".join(describe(graph, c) for c in found))


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "kbench"
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    return root


def test_lazy_and_type_checking_imports_make_a_cycle(tmp_path):
    """The scan sees imports inside functions and under TYPE_CHECKING, relative ones too, and names the lines."""
    root = _package(tmp_path, {
        "__init__.py": "",
        "low.py": """\
            from typing import TYPE_CHECKING
            if TYPE_CHECKING:
                from kbench.high import High
            """,
        "high.py": """\
            def f():
                from .low import g
            """,
        "other.py": "import json\n",
    })
    graph = import_graph(root)
    assert cycles(graph) == [["kbench.high", "kbench.low"]]
    text = describe(graph, cycles(graph)[0])
    assert "kbench.low -> kbench.high  (kbench/low.py:3)" in text and "kbench.high -> kbench.low  (kbench/high.py:2)" in text


def test_package_init_edges(tmp_path):
    """A submodule taken from its package is no edge to the package's ``__init__``; a re-exported name is."""
    files = {
        "__init__.py": "",
        "pkg/__init__.py": "from kbench.pkg.a import A\n",
        "pkg/a.py": "class A: pass\n",
        "pkg/b.py": "from kbench.pkg import a\nimport kbench.pkg.a as a2\n",
    }
    assert cycles(import_graph(_package(tmp_path / "one", files))) == []
    files["pkg/b.py"] = "from kbench.pkg import A\n"
    files["pkg/a.py"] = "class A: pass\ndef f():\n    from kbench.pkg.b import x\n"
    graph = import_graph(_package(tmp_path / "two", files))
    assert graph["kbench.pkg.b"] == {"kbench.pkg": ["kbench/pkg/b.py:1"]}
    assert cycles(graph) == [["kbench.pkg", "kbench.pkg.a", "kbench.pkg.b"]]
