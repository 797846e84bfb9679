"""Backends: one implementation of one op on one device. A backend never times itself.

The base class owns the contract every backend shares, so that no plugin re-implements it:
tunables are declared once (``tunables``), validated once (:meth:`Backend.configure`) and recorded
in every record's ``backend_info``; the answers of ``available``/``supports``/``info`` are checked
(a bool where a reason is expected is a plugin bug that must not read as "skipped: True").
"""
from __future__ import annotations

import copy
import functools
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from kbench.errors import BadInput, PluginError
from kbench.ops import Case
from kbench.selection import format_settings, format_value

#: What ``Backend.prepare`` returns: called as ``fn(**inputs, out=out)``; it either writes the
#: result into ``out`` (a poisoned buffer of the output's shape and dtype) and returns None, or
#: returns a fresh array holding the result.
Kernel = Callable[..., Any]


class TrainingKernel(ABC):
    """What ``prepare`` returns for a backward case: ``forward`` untimed, ``backward`` timed (mode bwd).

    ``forward(q, k, v) -> saved`` never sees the output gradient, so it cannot compute gradients ahead
    of time; ``backward(saved, do, out, dq, dk, dv)`` writes the forward output (from ``saved``) and
    the gradients into the poisoned buffers, or returns a dict name -> array. Calling the object runs
    both, timed as one (mode fwd_bwd): ``kernel(q=, k=, v=, do=, out=, dq=, dk=, dv=)``.
    """

    @abstractmethod
    def forward(self, *inputs: Any) -> Any:
        """The untimed forward: whatever the backward needs (the output, the log-sum-exp, ...)."""

    @abstractmethod
    def backward(self, saved: Any, *arrays: Any) -> Any:
        """The timed backward: the backward-only inputs, then the output buffers, in the op's order."""

    #: how many leading arrays of a whole call go to ``forward`` (the rest: backward inputs and outputs)
    forward_arity: int = 3

    def __call__(self, **arrays: Any) -> Any:
        values = list(arrays.values())
        return self.backward(self.forward(*values[:self.forward_arity]), *values[self.forward_arity:])


@dataclass(frozen=True)
class Tunable:
    """A knob of a kernel that does not change its result (block size, warps, stages).

    ``choices`` lists the valid values; when empty, any value of the default's type is valid
    (any value at all when the default is None).
    """

    default: Any
    choices: tuple = ()
    help: str = ""

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is not a valid setting, or None."""
        if self.choices:
            if any(value == c and type(value) is type(c) for c in self.choices):
                return None
            if any(value == c or str(value) == str(c) for c in self.choices):  # "64" or 64.0 for 64: the type
                return f"{value!r} is a {type(value).__name__}, not one of the choices"
            return f"{format_value(value)} is not one of the choices"
        if self.default is None or value is None:
            return None
        expected = type(self.default)
        if isinstance(value, bool) != isinstance(self.default, bool):
            return f"expects a {expected.__name__}, got {type(value).__name__} {format_value(value)}"
        if isinstance(value, expected) or (expected is float and isinstance(value, int)):
            return None
        return f"expects a {expected.__name__}, got {type(value).__name__} {format_value(value)}"

    def describe(self) -> str:
        if self.choices:
            return "one of " + ", ".join(format_value(c) for c in self.choices)
        if self.default is None:
            return "any value"
        return f"a {type(self.default).__name__}"


class Backend(ABC):
    """Base of every backend.

    ``available()`` and ``supports(case)`` return ``None`` for yes and a reason string for no;
    they must not raise (a raise is recorded as an error). ``prepare(case)`` does everything that
    should stay out of the timing (compilation, handles, plans) and returns the kernel to time.

    Tunables: declare them in ``tunables``; read the chosen values in ``prepare`` with
    ``self.setting(name)`` (or ``self.settings``, which holds only the values set explicitly).
    ``configure({...})`` validates settings and returns a copy named ``name[key=value,...]``:
    each setting of one backend is a separate, named record.
    """

    name: str = ""
    op: str = "attention"
    device: str = "cpu"
    description: str = ""
    #: untrusted backends (evolved or third-party kernels) run only in isolated workers
    trusted: bool = True
    tunables: Mapping[str, Tunable] = {}
    #: what this backend implements beyond an op's plain forward ("bwd", "fwd_bwd", "window", "softcap", "fp8",
    #: "paged"...); a case needing a feature it lacks (``Op.required_features``) is skipped before supports()
    features: frozenset[str] = frozenset()
    #: values set explicitly (by the constructor or :meth:`configure`); defaults are not repeated here
    settings: Mapping[str, Any] = {}
    #: source file of the kernel, when there is one (for static integrity checks and lineage)
    source_path: str | None = None
    #: the plugin that registered this backend; set by the registry
    registered_by: str | None = None
    #: the registered name this backend was configured from; None when unconfigured
    base_name: str | None = None
    #: the settings :meth:`configure` applied (those that appear in ``name``)
    configured: Mapping[str, Any] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for method, check in _ANSWER_CHECKS.items():
            fn = cls.__dict__.get(method)
            if callable(fn) and not getattr(fn, "_kbench_checked", False):
                setattr(cls, method, _checked(method, fn, check))

    def __init__(self, **settings: Any) -> None:
        """Programmatic settings (``NumpyFlashAttention(block_q=8)``): names checked, values trusted.

        Settings that come from users (suites, ``-b``) go through :meth:`configure`, which also
        checks values against the choices and names the result.
        """
        unknown = sorted(set(settings) - set(self.tunables))
        if unknown:
            raise TypeError(f"{type(self).__name__} has no tunable(s) {', '.join(unknown)}; "
                            f"declared: {', '.join(self.tunables) or 'none'}")
        if settings:
            self.settings = dict(settings)

    def available(self) -> str | None:
        return None

    def supports(self, case: Case) -> str | None:
        return None

    @abstractmethod
    def prepare(self, case: Case) -> Kernel:
        """Return the callable to check and time for ``case``."""

    def info(self) -> dict[str, Any]:
        """Versions and settings recorded with each of this backend's records.

        The base class adds ``tunables`` (every declared tunable's value) when the backend has any.
        """
        return {}

    # -- tunables ------------------------------------------------------------------------------

    def setting(self, name: str) -> Any:
        """The value of tunable ``name``: set explicitly, else its declared default."""
        if name in self.settings:
            return self.settings[name]
        return self.tunables[name].default

    def effective_settings(self) -> dict[str, Any]:
        """Every declared tunable's value, in declaration order."""
        return {name: self.setting(name) for name in self.tunables}

    def configure(self, settings: Mapping[str, Any], *, file: str | None = None,
                  where: str | None = None) -> Backend:
        """A copy with ``settings`` applied, named ``name[key=value,...]``; self when there are none.

        Raises :class:`BadInput` naming the backend, the tunable and the valid choices for an
        unknown tunable or an invalid value. The copy is shallow: a backend must read its settings
        in ``prepare``, not precompute from them in ``__init__``.
        """
        settings = dict(settings)
        if not settings:
            return self
        who = self.base_name or self.name
        for key, value in settings.items():
            if key not in self.tunables:
                declared = ", ".join(f"{k} ({t.describe()})" for k, t in self.tunables.items())
                raise BadInput(f"backend {who!r} has no tunable {key!r}", file=file, where=where,
                               fix=f"its tunables: {declared}" if declared else f"{who!r} declares no tunables; "
                                   "run it without settings")
            problem = self.tunables[key].problem(value)
            if problem:
                raise BadInput(f"backend {who!r}, tunable {key!r}: {problem}", file=file, where=where,
                               fix=f"use {self.tunables[key].describe()} (default "
                                   f"{format_value(self.tunables[key].default)})")
        chosen = {**self.configured, **settings}
        ordered = {k: chosen[k] for k in self.tunables if k in chosen}  # one canonical name per setting
        configured = copy.copy(self)
        configured.settings = {**self.settings, **ordered}
        configured.configured = ordered
        configured.base_name = who
        configured.name = f"{who}[{format_settings(ordered)}]"
        return configured

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} ({self.op} on {self.device})>"


# --------------------------------------------------------------------------------------------
# the answers of plugin methods, checked where they are produced


def missing_feature(backend: Backend, required) -> str | None:
    """The skip reason when ``backend`` lacks one of the ``required`` features, else None."""
    have = frozenset(getattr(backend, "features", ()) or ())
    missing = sorted(set(required) - have)
    if not missing:
        return None
    return f"does not implement {missing[0]} (implements: {', '.join(sorted(have)) or 'forward only'})"


def _who(backend: Backend) -> str:
    plugin = f" of plugin {backend.registered_by!r}" if backend.registered_by else ""
    return f"backend {backend.name!r}{plugin} ({type(backend).__module__}.{type(backend).__qualname__})"


def _check_reason(backend: Backend, method: str, answer: Any) -> Any:
    if answer is None or (isinstance(answer, str) and answer.strip()):
        return answer
    yes_no = "yes" if method == "available" else "supported"
    raise PluginError(
        f"{_who(backend)}: {method}() returned {answer!r} ({type(answer).__name__}); kbench expects None "
        f"for {yes_no} or a non-empty string saying why not",
        fix=f"return None instead of True, and a reason such as \"needs fp16\" instead of False, from {method}()")


def _check_info(backend: Backend, method: str, answer: Any) -> Any:
    if not isinstance(answer, Mapping):
        raise PluginError(f"{_who(backend)}: info() returned {type(answer).__name__}, not a dict",
                          fix="return a dict of versions and settings (JSON values) from info()")
    answer = dict(answer)
    if backend.tunables and "tunables" not in answer:
        answer["tunables"] = backend.effective_settings()
    return answer


_ANSWER_CHECKS: dict[str, Callable[[Backend, str, Any], Any]] = {
    "available": _check_reason, "supports": _check_reason, "info": _check_info}


def _checked(method: str, fn: Callable[..., Any], check: Callable[[Backend, str, Any], Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(self: Backend, *args: Any, **kwargs: Any) -> Any:
        return check(self, method, fn(self, *args, **kwargs))
    wrapper._kbench_checked = True  # type: ignore[attr-defined]
    return wrapper


for _method, _check in _ANSWER_CHECKS.items():
    setattr(Backend, _method, _checked(_method, Backend.__dict__[_method], _check))
