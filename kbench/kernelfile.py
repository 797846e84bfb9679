"""Single-file kernels as backends: ``kbench run SUITE -b path/to/kernel.py``.

A kernel file is a Python module that defines a function named after the op (``attention``)
with the signature ``attention(q, k, v, out, *, causal, scale, **tunables)``; it writes into
``out`` or returns the result. Optional module globals:

``SUBSTRATE``  which substrate runs it: ``numpy`` (default, CPU), ``triton`` or ``cupy`` (CUDA,
               from the plugins that provide them)
``OP``         the op it implements (default ``attention``)
``TUNABLES``   ``{name: {"default": value, "choices": [values...]}}``, knobs that do not change the
               result; the evolve plugin's ``mutate`` operator perturbs them
``NAME``       backend name (default ``file:<stem>``); never a registered backend's name (``numpy``), nor one
               that reads as it (case, width or a settings suffix aside): refused, so a record never carries a
               trusted name it did not earn; unsafe characters are escaped (:func:`kbench.text.safe_text`)
``FEATURES``   what it implements beyond a plain forward, e.g. ``["bwd", "fwd_bwd", "window", "softcap"]``;
               a case needing a feature not listed is skipped with the reason (docs/backward.md)

A backward (``FEATURES`` with "bwd" / "fwd_bwd") is two more functions, named after the op:
``attention_forward(q, k, v, *, causal, scale, ...) -> saved`` (untimed in mode bwd) and
``attention_backward(saved, do, out, dq, dk, dv, *, causal, scale, ...)`` (timed; writes the forward
output and the three gradients, or returns a dict name -> array). Mode fwd_bwd times both as one call,
or ``attention_fwd_bwd(q, k, v, do, out, dq, dk, dv, *, ...)`` when the file defines it.
"""
from __future__ import annotations

import hashlib
import importlib.util
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from kbench.backends import Backend, TrainingKernel, Tunable
from kbench.errors import BadInput
from kbench.ops import Case
from kbench.selection import name_key
from kbench.source import literal_globals
from kbench.text import safe_text


#: what a kernel file's NAME may hold: ASCII letters, digits and these marks; nothing that can look like another
#: character (Cyrillic "р" in "numрy", a non-breaking hyphen in "numpy‑flash", fullwidth letters, spaces)
NAME_CHARS = re.compile(r"[A-Za-z0-9_.:@\[\]=,-]+")


def kernel_name(name: str, registry, path) -> str:
    """A kernel file's backend name as recorded: escaped to safe text, refused when it is not plain ASCII
    (:data:`NAME_CHARS`: a look-alike of another name), collides with (or reads as) a registered backend's name, or
    holds brackets (the form of a configured backend's settings). The default ``file:<stem>`` is not held to the
    character rule (its prefix keeps it apart from every registered name)."""
    shown = safe_text(str(name))
    if str(name) != f"file:{Path(path).stem}" and not NAME_CHARS.fullmatch(str(name)):
        odd = sorted({c for c in str(name) if not NAME_CHARS.fullmatch(c)})
        where = ", ".join(f"'{safe_text(c)}' (U+{ord(c):04X})" for c in odd[:6])
        raise BadInput(f"kernel file NAME '{shown}' holds characters other than ASCII letters, digits and "
                       f"-_.:@[]=, : {where}; such a name can look like another (numрy with a Cyrillic р reads as "
                       "numpy)", file=str(path), where="NAME",
                       fix=f'write NAME in ASCII letters, digits and -_.:@[]=, (e.g. NAME = "my-kernel"), or leave '
                           f'NAME out (the name is then "file:{Path(path).stem}")')
    if "[" in shown or "]" in shown:
        raise BadInput(f"kernel file NAME {shown!r} holds brackets, the form of a backend's settings "
                       "(name[key=value])", file=str(path), where="NAME",
                       fix="give NAME without brackets; settings go on the command line: -b 'FILE[key=value]'")
    key = name_key(shown)
    for other in getattr(registry, "backends", {}):
        if name_key(other) == key:
            owner = getattr(registry, "owners", {}).get(("backend", other), "a plugin")
            same = "is" if other == shown else "reads as"
            raise BadInput(f"kernel file NAME {shown!r} {same} the registered backend {other!r} (from {owner}): its "
                           "records would pass for that backend's", file=str(path), where="NAME",
                           fix=f'give the kernel file a NAME of its own (e.g. NAME = "my-{other}"), or leave '
                               f'NAME out (the name is then "file:{Path(path).stem}")')
    return shown


class Substrate:
    """How a kernel file's function is run: its device and how arrays are handed to it."""

    name: str = ""
    device: str = "cpu"

    def available(self) -> str | None:
        return None

    def adapt(self, fn: Callable[..., Any], case: Case, kwargs: dict[str, Any]) -> Callable[..., Any]:
        """Wrap the file's function into a backend kernel ``run(**inputs, out=out)``.

        The arrays reach ``fn`` positionally in the order the runner names them: the inputs, then the
        outputs (``out``, and ``dq``, ``dk``, ``dv`` for a backward).
        """
        def run(**arrays):
            return fn(*arrays.values(), **kwargs)
        return run

    def adapt_training(self, forward: Callable[..., Any], backward: Callable[..., Any], case: Case,
                       kwargs: dict[str, Any]) -> TrainingKernel:
        """Wrap a file's forward and backward into a :class:`kbench.api.TrainingKernel` (arrays as given)."""
        return _FileTraining(forward, backward, kwargs)


class _FileTraining(TrainingKernel):
    def __init__(self, forward, backward, kwargs) -> None:
        self._forward, self._backward, self.kwargs = forward, backward, kwargs

    def forward(self, *inputs):
        return self._forward(*inputs, **self.kwargs)

    def backward(self, saved, *arrays):
        return self._backward(saved, *arrays, **self.kwargs)


class NumpySubstrate(Substrate):
    name = "numpy"
    device = "cpu"


@dataclass
class KernelSource:
    path: Path
    text: str
    module: Any

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()


def load_kernel_module(path: str | Path, *, module_name: str | None = None) -> KernelSource:
    path = Path(path)
    if not path.is_file():
        raise BadInput("kernel file not found", file=str(path), fix="give the path of a .py file")
    text = path.read_text(encoding="utf-8")
    name = module_name or f"kbench_kernel_{hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    try:
        sys.modules[name] = module
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - the user's file; say what broke
        sys.modules.pop(name, None)
        raise BadInput(f"kernel file failed to import: {type(exc).__name__}: {exc}", file=str(path),
                       fix="run `python FILE` to see the full traceback") from exc
    return KernelSource(path, text, module)


class KernelFileBackend(Backend):
    """A backend made from one kernel file. Untrusted by default: it runs in a worker when isolated."""

    def __init__(self, path: str | Path, registry, *, name: str | None = None,
                 settings: Mapping[str, Any] | None = None, trusted: bool = False) -> None:
        self.source = load_kernel_module(path)
        module = self.source.module
        self.source_path = str(self.source.path)
        self.op = getattr(module, "OP", "attention")
        self._op = registry.op(self.op)
        # a name given by trusted code (the parent's decision sent to a worker, a plugin's evolved:NAME) is
        # escaped only; a name the file gives itself is also held against the registry
        self.name = safe_text(name) if name else kernel_name(getattr(module, "NAME", None)
                                                             or f"file:{self.source.path.stem}", registry, path)
        sub_name = getattr(module, "SUBSTRATE", "numpy")
        if sub_name not in registry.substrates:
            raise BadInput(f"unknown SUBSTRATE {sub_name!r}", file=str(path),
                           fix=f"use one of: {', '.join(sorted(registry.substrates))} (or install its plugin)")
        self.substrate = registry.substrates[sub_name]
        self.device = self.substrate.device
        self.trusted = trusted
        self.description = (module.__doc__ or "").strip().splitlines()[0] if module.__doc__ else f"kernel file {path}"
        self.fn = getattr(module, self.op, None)
        if not callable(self.fn):
            raise BadInput(f"kernel file defines no function {self.op!r}", file=str(path),
                           fix=f"define `def {self.op}(q, k, v, out, *, causal, scale, **tunables)`")
        self.features = _features(getattr(module, "FEATURES", ()), path)
        self.tunables = {k: _tunable(k, v, path) for k, v in dict(getattr(module, "TUNABLES", {})).items()}
        settings = dict(settings or {})
        unknown = set(settings) - set(self.tunables)
        if unknown:
            raise BadInput(f"unknown tunable(s) {', '.join(sorted(unknown))}", file=str(path),
                           fix=f"declared tunables: {', '.join(sorted(self.tunables)) or 'none'}")
        self.settings = {k: settings.get(k, t.default) for k, t in self.tunables.items()}

    def available(self) -> str | None:
        return self.substrate.available()

    def supports(self, case: Case) -> str | None:
        check = getattr(self.source.module, "supports", None)
        return check(dict(case.params)) if callable(check) else None

    def prepare(self, case: Case):
        kwargs = {**self._op.kernel_kwargs(case), **self.settings}
        if len(self._op.output_names(case)) == 1:
            return self.substrate.adapt(self.fn, case, kwargs)
        module, name = self.source.module, self.op
        whole = getattr(module, f"{name}_fwd_bwd", None)
        if callable(whole) and not self._op.backward_inputs(case):
            return self.substrate.adapt(whole, case, kwargs)
        forward, backward = getattr(module, f"{name}_forward", None), getattr(module, f"{name}_backward", None)
        if not (callable(forward) and callable(backward)):
            raise BadInput(f"kernel file declares a backward (FEATURES) but defines no {name}_forward and "
                           f"{name}_backward", file=self.source_path,
                           fix=f"define `def {name}_forward(q, k, v, *, causal, scale) -> saved` and "
                               f"`def {name}_backward(saved, do, out, dq, dk, dv, *, causal, scale)`")
        return self.substrate.adapt_training(forward, backward, case, kwargs)

    def info(self) -> dict[str, Any]:
        return {"kernel_file": self.source_path, "sha256": self.source.sha256, "substrate": self.substrate.name,
                "tunables": dict(self.settings)}


def _features(spec: Any, path) -> frozenset[str]:
    if isinstance(spec, (list, tuple, set, frozenset)) and all(isinstance(f, str) and f for f in spec):
        return frozenset(spec)
    raise BadInput(f"FEATURES must be a list of feature names, got {spec!r}", file=str(path),
                   fix='FEATURES = ["bwd", "fwd_bwd", "window", "softcap"]')


def _tunable(name: str, spec: Any, path) -> Tunable:
    if isinstance(spec, Mapping) and "default" in spec:
        return Tunable(spec["default"], tuple(spec.get("choices", ())), spec.get("help", ""))
    raise BadInput(f"TUNABLES[{name!r}] must be a mapping with 'default' (and optional 'choices')",
                   file=str(path), fix=f'TUNABLES = {{"{name}": {{"default": 64, "choices": [32, 64, 128]}}}}')


class KernelFileRef(Backend):
    """A kernel file known to the parent only by its text: never imported here, run in a worker.

    ``NAME``, ``OP`` and ``SUBSTRATE`` are read as literals from the source without running it; the
    worker loads the very text read here (so the file cannot change between the check and the run).
    """

    def __init__(self, path: str | Path, registry, *, settings: Mapping[str, Any] | None = None,
                 name: str | None = None, trusted: bool = False) -> None:
        path = Path(path)
        if not path.is_file():
            raise BadInput("kernel file not found", file=str(path), fix="give the path of a .py file")
        try:
            self.source_text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise BadInput(f"cannot read kernel file: {exc}", file=str(path), fix="give a readable UTF-8 file") from None
        meta = literal_globals(self.source_text, ("NAME", "OP", "SUBSTRATE"))
        for key, value in meta.items():
            if not isinstance(value, str):
                raise BadInput(f"{key} must be a string literal", file=str(path), where=key,
                               fix=f'write e.g. {key} = "..." (it is read without running the file)')
        self.op = meta.get("OP", "attention")
        registry.op(self.op)
        sub = meta.get("SUBSTRATE", "numpy")
        if sub not in registry.substrates:
            raise BadInput(f"unknown SUBSTRATE {sub!r}", file=str(path),
                           fix=f"use one of: {', '.join(sorted(registry.substrates))} (or install its plugin)")
        self.substrate = registry.substrates[sub]
        self.device = self.substrate.device
        self.name = safe_text(name) if name else kernel_name(meta.get("NAME") or f"file:{path.stem}", registry, path)
        self.source_path = str(path)
        self.settings = dict(settings or {})
        self.trusted = trusted
        self.description = f"kernel file {path} (runs in a worker)"

    def available(self) -> str | None:
        return self.substrate.available()

    def prepare(self, case: Case):
        raise RuntimeError("a kernel file referenced by text runs only in a worker")

    def info(self) -> dict[str, Any]:
        return {"kernel_file": self.source_path, "sha256": hashlib.sha256(self.source_text.encode()).hexdigest(),
                "substrate": self.substrate.name, "tunables": dict(self.settings)}
