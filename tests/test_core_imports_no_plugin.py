"""The core never imports a plugin: whatever it needs from one comes through a hook.

A static scan of every module of the ``kbench`` package: ``import kbench_x``, ``from kbench_x import ...``
and ``importlib.import_module("kbench_x...")`` (or ``__import__``) with a literal name are refused, where
``kbench_x`` is any distribution's top-level package other than ``kbench`` itself (the plugins' packages:
kbench_evolve, kbench_ray, kbench_torch, ...).
"""
from __future__ import annotations

import ast
from pathlib import Path

import kbench

CORE = Path(kbench.__file__).resolve().parent


def plugin_imports(path: Path, root: Path = CORE.parent) -> list[str]:
    """``file:line name`` (the file relative to ``root``) of every import of a plugin package in one source file."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                names = [node.args[0].value]
        found += [f"{path.relative_to(root)}:{node.lineno} {name}" for name in names
                  if name.split(".")[0].startswith("kbench_")]
    return found


def test_no_core_module_imports_a_plugin_package():
    sources = sorted(CORE.rglob("*.py"))
    assert len(sources) > 50  # the scan sees the whole package
    offenders = [hit for path in sources for hit in plugin_imports(path)]
    assert offenders == [], "the core imports plugin packages (use a hook instead): " + "; ".join(offenders)


def test_the_scan_finds_each_form_of_import(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("import kbench_evolve.store\nfrom kbench_ray import executor\nimport importlib\n"
                      "importlib.import_module('kbench_torch.interop')\n__import__('kbench_cuda')\n"
                      "from kbench.api import BadInput\nfrom . import kbench_local\nname = 'kbench_register_backends'\n")
    assert plugin_imports(sample, tmp_path) == ["sample.py:1 kbench_evolve.store", "sample.py:2 kbench_ray",
                                                "sample.py:4 kbench_torch.interop", "sample.py:5 kbench_cuda"]
