"""The knowledge base the LLM operators read: shipped notes plus user folders of .md/.txt/.py files.

User folders come from ``--knowledge DIR`` (repeatable) and ``KBENCH_EVOLVE_KNOWLEDGE``
(``os.pathsep``-separated). A user document with the same name as a shipped one replaces it.
"""
from __future__ import annotations

import os
from importlib import resources
from pathlib import Path
from typing import Iterable

SUFFIXES = (".md", ".txt", ".py", ".cu", ".cuh")


class KnowledgeBase:
    def __init__(self, extra_dirs: Iterable[str | Path] = (), *, builtin: bool = True) -> None:
        self.docs: dict[str, Path | resources.abc.Traversable] = {}
        if builtin:
            for entry in sorted(resources.files("kbench_evolve").joinpath("knowledge").iterdir(), key=lambda e: e.name):
                if entry.name.endswith(SUFFIXES):
                    self.docs[entry.name] = entry
        env = [p for p in os.environ.get("KBENCH_EVOLVE_KNOWLEDGE", "").split(os.pathsep) if p]
        for folder in list(extra_dirs) + env:
            for path in sorted(Path(folder).expanduser().rglob("*")):
                if path.is_file() and path.suffix in SUFFIXES:
                    self.docs[str(path.relative_to(folder)) if path.parent != Path(folder) else path.name] = path

    def names(self) -> list[str]:
        return sorted(self.docs)

    def title(self, name: str) -> str:
        for line in self.read(name).splitlines():
            if line.strip():
                return line.lstrip("#\"' ").strip()[:100]
        return name

    def read(self, name: str) -> str:
        if name not in self.docs:
            raise KeyError(f"no knowledge document {name!r}; documents: {', '.join(self.names())}")
        return self.docs[name].read_text(encoding="utf-8")

    def index(self) -> str:
        return "\n".join(f"- {n}: {self.title(n)}" for n in self.names())
