"""Selection of what runs: ``-k EXPR`` keyword expressions, and ``-b`` / suite backend patterns with settings."""
from __future__ import annotations

import re
import unicodedata
from typing import Any, Callable, Iterable, Mapping

from kbench.errors import BadInput

_TOKEN = re.compile(r"\(|\)|[^\s()]+")
_OPS = {"and", "or", "not"}


class Keyword:
    """``-k "d=128 and not causal"``: each word is a case-insensitive substring test."""

    def __init__(self, expr: str | None) -> None:
        self.expr = (expr or "").strip()
        self.words: list[str] = []
        parts: list[str] = []
        for tok in _TOKEN.findall(self.expr):
            if tok in _OPS or tok in "()":
                parts.append(tok)
            else:
                parts.append(f"_w[{len(self.words)}]")
                self.words.append(tok.lower())
        self.code = " ".join(parts)
        if self.expr:
            try:
                compile(self.code, "<-k>", "eval")
                self._eval([False] * len(self.words))
            except SyntaxError:
                raise BadInput(f"cannot parse -k expression {self.expr!r}", where="-k",
                               fix='use words joined by and/or/not with parentheses, e.g. -k "d=128 and not causal"'
                               ) from None

    def _eval(self, flags: list[bool]) -> bool:
        return bool(eval(self.code, {"__builtins__": {}}, {"_w": flags}))  # noqa: S307 - only our tokens

    def matches(self, *names: str) -> bool:
        if not self.expr:
            return True
        text = " ".join(names).lower()
        # "causal" must not match inside "noncausal": test whole comma/bracket-separated fields first
        fields = set(re.split(r"[\s\[\],]+", text))
        return self._eval([w in fields or (w not in _FIELD_WORDS and w in text) for w in self.words])


#: words that are whole fields of case ids and would otherwise match inside longer words
_FIELD_WORDS = {"causal"}


# --------------------------------------------------------------------------------------------
# backend patterns with settings: ``-b 'numpy-flash[block_q=64]'`` and suite entries
# ``- {name: numpy-flash, tunables: {block_q: 64}}``

#: ``NAME[key=value,...]``: a body with ``=`` is settings; ``numpy-[ab]*`` stays an fnmatch class
_SETTINGS = re.compile(r"^(?P<base>[^\[\]]+)\[(?P<body>[^\[\]]*=[^\[\]]*)\]$")


class BackendPattern(str):
    """One entry of a backend selection: an fnmatch pattern over backend names, maybe with settings.

    It is the string one would type after ``-b`` (so it compares equal to it) and carries the
    parsed parts: ``settings`` are applied to every backend the pattern matches (validated by
    :meth:`kbench.backends.Backend.configure`); ``file`` and ``where`` say where the entry was
    written, for messages.
    """

    pattern: str
    settings: tuple[tuple[str, Any], ...]
    exclude: bool
    file: str | None
    where: str | None

    def __new__(cls, pattern: str, settings: tuple[tuple[str, Any], ...] = (), exclude: bool = False,
                file: str | None = None, where: str | None = None) -> BackendPattern:
        head = ("!" if exclude else "") + pattern
        self = super().__new__(cls, f"{head}[{format_settings(dict(settings))}]" if settings else head)
        self.pattern, self.settings, self.exclude, self.file, self.where = pattern, tuple(settings), exclude, file, where
        return self

    def __getnewargs__(self) -> tuple:
        return (self.pattern, self.settings, self.exclude, self.file, self.where)

    @classmethod
    def parse(cls, text: str, *, file: str | None = None, where: str | None = "-b") -> BackendPattern:
        """``numpy-flash``, ``!numpy*``, ``numpy-flash[block_q=64,block_k=32]``."""
        if isinstance(text, BackendPattern):
            return text
        text = text.strip()
        exclude = text.startswith("!")
        body = text[1:] if exclude else text
        match = _SETTINGS.match(body)
        if not match:
            return cls(body, (), exclude, file, where)
        settings = []
        for part in (p.strip() for p in match["body"].split(",")):
            key, eq, value = part.partition("=")
            if not eq or not key.strip():
                raise BadInput(f"cannot read the setting {part!r} in {text!r}", file=file, where=where,
                               fix="write settings as NAME[key=value,key=value], e.g. numpy-flash[block_q=64]")
            settings.append((key.strip(), parse_value(value.strip())))
        _refuse_repeats(settings, text, file=file, where=where)
        return cls(match["base"].strip(), tuple(settings), exclude, file, where)

    @classmethod
    def from_entry(cls, entry: str | Mapping[str, Any], *, file: str | None = None,
                   where: str | None = None) -> BackendPattern:
        """A suite's ``backends:`` entry: a pattern string, or ``{name: ..., tunables: {...}}``."""
        if isinstance(entry, str):
            return cls.parse(entry, file=file, where=where)
        base = cls.parse(str(entry["name"]), file=file, where=where)
        extra = tuple((str(k), v) for k, v in (entry.get("tunables") or {}).items())
        _refuse_repeats(base.settings + extra, str(entry["name"]), file=file, where=where)
        return cls(base.pattern, base.settings + extra, base.exclude, file, where)


def _refuse_repeats(settings, text: str, *, file: str | None, where: str | None) -> None:
    """One value per setting: ``[block_q=16,block_q=32]`` would silently keep the last."""
    seen: set[str] = set()
    for key, _ in settings:
        if key in seen:
            raise BadInput(f"the setting {key!r} is given twice in {text!r}", file=file, where=where,
                           fix=f"give {key} once (a backend runs with one value of each setting)")
        seen.add(key)


def parse_value(text: str) -> Any:
    """A setting's value as YAML reads it: ``64`` -> 64, ``true`` -> True, ``fast`` -> 'fast'."""
    from kbench.errors import BadInput
    from kbench.yamlsource import load_yaml_text

    try:  # kbench's one YAML reader: YAML 1.2 numbers (2e-2 is a float), limits
        value = load_yaml_text(text)[0]
    except BadInput:
        return text
    return value if isinstance(value, (int, float, str, bool)) or value is None else text


def format_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else str(value)


def format_settings(settings: Mapping[str, Any]) -> str:
    """``block_q=64,block_k=32``: the part between brackets of a configured backend's name."""
    return ",".join(f"{k}={format_value(v)}" for k, v in settings.items())


def backend_entries(entries: list[Any], *, file: str | None = None,
                    where: Callable[[tuple], str] | None = None, place: tuple = ("backends",)) -> list[BackendPattern]:
    """A suite's ``backends:`` list as patterns, each knowing its file and line for messages."""
    return [BackendPattern.from_entry(e, file=file, where=where(place + (i,)) if where else None)
            for i, e in enumerate(entries)]


# --------------------------------------------------------------------------------------------
# one name, one backend


def name_key(name: str) -> str:
    """What a backend name reads as: NFKC-normalised (full-width and compatibility forms), case-folded,
    settings and surrounding space dropped; two names with the same key are one name to a reader."""
    return unicodedata.normalize("NFKC", name).split("[")[0].strip().casefold()


def refuse_name_collisions(backends: Iterable[Any]) -> None:
    """Bad input when a selected kernel file (a backend with a ``source_path``) reads as the name of another
    selected backend: their records would share resume keys, comparisons and history. Registered backends
    are unique by the registry, and two settings of one (``numpy-flash[block_q=64]``) are distinct names."""
    registered: dict[str, Any] = {}
    files: dict[str, Any] = {}
    exact: dict[str, Any] = {}
    for backend in backends:
        if getattr(backend, "source_path", None):
            continue  # kernel files: below, by what their names read as
        first = exact.setdefault(backend.name, backend)
        if first is not backend:  # two objects, one name (a backend given through the API beside a registered one)
            raise BadInput(f"two selected backends are both named {backend.name!r}: their records could not be told "
                           "apart", where="-b", fix="select one of them, or give the other a name of its own")
        registered.setdefault(name_key(backend.name), backend)
    for backend in backends:
        if not getattr(backend, "source_path", None):
            continue
        key = name_key(backend.name)
        first = files.get(key) or registered.get(key)
        if first is not None and _same_file_variants(first, backend):
            continue  # two settings of one kernel file (a tuning sweep): their full names differ
        if first is not None and first is not backend:
            where = [getattr(b, "source_path", None) or f"backend {b.name!r}" for b in (first, backend)]
            raise BadInput(f"two selected backends read as one name, {first.name!r} and {backend.name!r} "
                           f"({where[0]}; {where[1]}): their records could not be told apart", where="-b",
                           fix='give each kernel file a NAME of its own (NAME = "..."; without NAME a file is '
                               '"file:STEM"), or rename one file')
        files.setdefault(key, backend)


def _same_file_variants(first: Any, backend: Any) -> bool:
    """Two selections of one kernel file under different settings (``triton[BLOCK_N=64]`` beside ``triton``):
    distinct names from one source, which the file earned for both."""
    path = getattr(first, "source_path", None)
    return bool(path) and path == getattr(backend, "source_path", None) and first.name != backend.name
