"""Ops: mathematical functions with a parameter space, their inputs, float64 reference and costs."""
from __future__ import annotations

from abc import ABC, abstractmethod
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from kbench.enums import DType

_REQUIRED = object()

#: whether an op may offer a large float64 reference to plugins (``kbench_float64_reference``, e.g. CuPy on a
#: GPU): the judge sets it from its device's ``offloads_reference``, so a CPU run keeps every reference on
#: the host (the machine's GPU, if it has one, is not part of that measurement, and asking costs a CuPy import)
REFERENCE_OFFLOAD: ContextVar[bool] = ContextVar("kbench_reference_offload", default=True)


@dataclass(frozen=True)
class Param:
    """One parameter of an op's space."""

    name: str
    type: type
    default: Any = _REQUIRED
    choices: tuple = ()
    minimum: int | None = None
    short: str = ""        # name used in case ids, e.g. "sq" for seqlen_q
    help: str = ""

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED


@dataclass(frozen=True)
class Case:
    """One point of a suite's grid: an op and fully resolved parameters, with a stable id."""

    op: str
    params: Mapping[str, Any]
    id: str = field(compare=False)

    def __getitem__(self, key: str) -> Any:
        return self.params[key]

    # read like the dict of parameters its docs show: case.get("window_left"), "causal" in case, case.items()
    def get(self, key: str, default: Any = None) -> Any:
        """The parameter ``key``, or ``default`` when the op has no such parameter (``dict.get``)."""
        return self.params.get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self.params

    def keys(self):
        return self.params.keys()

    def items(self):
        return self.params.items()

    def values(self):
        return self.params.values()

    @property
    def dtype(self) -> DType:
        return DType(self.params["dtype"])

    def to_json(self) -> dict[str, Any]:
        return dict(self.params)


class CaseError(ValueError):
    """A parameter combination the op cannot describe; the message says which and why."""


class Op(ABC):
    """Base of every op. Subclasses declare ``name`` and ``parameters`` and the maths."""

    name: str = ""
    description: str = ""
    parameters: tuple[Param, ...] = ()
    #: one name that sets several parameters at once, e.g. ``seqlen`` -> seqlen_q and seqlen_kv
    aliases: Mapping[str, tuple[str, ...]] = {}
    #: suite keys whose value is a list (``window: [left, right]``); a list of such lists is a grid axis
    list_params: frozenset[str] = frozenset()
    #: a parameter that defaults to another one's value when not given, e.g. heads_kv -> heads_q (MHA)
    default_from: Mapping[str, str] = {}
    #: the names of the arrays the backend receives, in call order
    input_names: tuple[str, ...] = ()
    #: whether a case may name a value range (``values``, kbench.ops.inputs.VALUE_RANGES): kept in the case's
    #: parameters and id only when not the default, so a case that names none keeps its id and input keys
    takes_values: bool = False

    # -- parameters and cases ------------------------------------------------------------------

    def make_case(self, raw: Mapping[str, Any]) -> Case:
        """Resolve aliases and defaults, check types and ranges; raise CaseError with the reason."""
        known = {p.name: p for p in self.parameters}
        params: dict[str, Any] = {}
        values = None
        if self.takes_values and "values" in raw:
            from kbench.ops.inputs import DEFAULT_VALUES, value_range

            raw = dict(raw)
            try:
                values = value_range(raw.pop("values")).name
            except ValueError as exc:
                raise CaseError(str(exc)) from None
            values = None if values == DEFAULT_VALUES else values
        for key, value in raw.items():
            if key in self.aliases:
                for target in self.aliases[key]:
                    if target in raw:
                        raise CaseError(f"{key!r} and {target!r} both given; {key!r} sets {target!r}")
                    params[target] = value
            elif key in known:
                params[key] = value
            else:
                names = sorted(list(known) + list(self.aliases))
                raise CaseError(f"unknown parameter {key!r} for op {self.name!r}; known: {', '.join(names)}")
        for target, source in self.default_from.items():
            if target not in params and source in params:
                params[target] = params[source]
        resolved: dict[str, Any] = {}
        for p in self.parameters:
            if p.name not in params:
                if p.required:
                    raise CaseError(f"parameter {p.name!r} of op {self.name!r} is required")
                resolved[p.name] = p.default
                continue
            value = params[p.name]
            if p.type is bool:
                if not isinstance(value, bool):
                    raise CaseError(f"{p.name!r} must be true or false, got {value!r}")
            elif p.type is int:
                if isinstance(value, bool) or not isinstance(value, int):
                    raise CaseError(f"{p.name!r} must be an integer, got {value!r}")
                if p.minimum is not None and value < p.minimum:
                    raise CaseError(f"{p.name!r} must be >= {p.minimum}, got {value}")
            elif p.type is float:
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise CaseError(f"{p.name!r} must be a number, got {value!r}")
                value = float(value)
            elif p.type is str:
                value = str(value)
            if p.choices and value not in p.choices:
                raise CaseError(f"{p.name!r} must be one of {', '.join(map(str, p.choices))}; got {value!r}")
            resolved[p.name] = value
        self.validate(resolved)
        if values is None:
            return Case(self.name, resolved, self.case_id(resolved))
        if resolved.get("dtype") == "fp8_e4m3":
            raise CaseError(f"value range {values!r} with dtype fp8_e4m3: FP8 inputs keep their own per-tensor "
                            f"scale (values: unit)")
        ident = self.case_id(resolved)
        resolved["values"] = values
        return Case(self.name, resolved, f"{ident[:-1]},values={values}]" if ident.endswith("]")
                    else f"{ident},values={values}")

    def validate(self, params: Mapping[str, Any]) -> None:
        """Cross-parameter checks; raise CaseError."""

    def case_id(self, params: Mapping[str, Any]) -> str:
        parts = []
        for p in self.parameters:
            v = params[p.name]
            if p.type is bool:
                parts.append(p.short or p.name if v else f"no{p.short or p.name}")
            elif p.name == "dtype":
                parts.append(str(v))
            else:
                parts.append(f"{p.short or p.name}={v}")
        return f"{self.name}[{','.join(parts)}]"

    def group_key(self, case: Case) -> str:
        """Which cases belong together in a summary (geomean rows, plot panels)."""
        return case.id

    # -- data and maths ------------------------------------------------------------------------

    def input_specs(self, case: Case) -> Mapping[str, Any] | None:
        """How each input of ``case`` is made, in call order: ``{name: kbench.ops.inputs.InputSpec}``.

        Inputs drawn by the counter-based generator are made where the kernel runs and can be recomputed
        element by element by the judge (kbench.ops.inputs). None: the op makes its inputs on the host
        only, with :meth:`make_inputs` (slower on a GPU: every call's inputs cross from the host).
        """
        return None

    def make_inputs(self, case: Case, seed: Any) -> dict[str, np.ndarray]:
        """The inputs of ``case`` for ``seed`` (an input key, bytes or an integer) on the host, in the
        case's dtype, keyed by ``input_names``; from :meth:`input_specs` unless an op overrides it."""
        from kbench.ops.inputs import generate_all, input_key

        specs = self.input_specs(case)
        if specs is None:
            raise NotImplementedError(f"op {self.name!r} defines neither input_specs() nor make_inputs()")
        return generate_all(specs, input_key(seed))

    @abstractmethod
    def output_shape(self, case: Case) -> tuple[int, ...]:
        """Shape of the output array (its dtype is the case's dtype)."""

    @abstractmethod
    def reference(self, case: Case, inputs: Mapping[str, np.ndarray], rows: np.ndarray | None) -> np.ndarray:
        """float64 reference from the exact inputs; restricted to ``rows`` (see ``select``) if given."""

    def sample_rows(self, case: Case, max_rows: int, rng: np.random.Generator) -> np.ndarray | None:
        """Rows to check for large cases (None = check everything)."""
        return None

    def select(self, case: Case, output: np.ndarray, rows: np.ndarray | None) -> np.ndarray:
        """The part of a full output that ``reference(..., rows)`` describes."""
        return output

    @abstractmethod
    def flops(self, case: Case) -> float: ...

    @abstractmethod
    def min_bytes(self, case: Case) -> float:
        """Bytes that must cross DRAM at least once (inputs read, output written)."""

    def footprint(self, case: Case) -> float:
        """Bytes that must be resident in device memory for the case to run."""
        return self.min_bytes(case)

    def kernel_kwargs(self, case: Case) -> dict[str, Any]:
        """Keyword arguments a kernel file's function receives besides the arrays and ``out``."""
        return {}

    def tolerance(self, case: Case) -> float:
        """The dtype's bound, widened for a value range whose scores are larger than unit inputs' (values_bound)."""
        from kbench.ops.inputs import values_bound

        return values_bound(case, case.dtype.default_tolerance)

    # -- several outputs, features, split calls (docs/backward.md) --------------------------------

    def output_names(self, case: Case) -> tuple[str, ...]:
        """The named outputs a backend writes, in call order (``("out", "dq", "dk", "dv")`` for a backward)."""
        return ("out",)

    def output_shapes(self, case: Case) -> dict[str, tuple[int, ...]]:
        """Shape of every output by name; an op with more than one output overrides this."""
        return {"out": tuple(self.output_shape(case))}

    def output_dtype(self, case: Case) -> DType:
        """The dtype of every output buffer (the case's dtype, except e.g. fp8 attention writes bf16)."""
        return case.dtype

    def required_features(self, case: Case) -> frozenset[str]:
        """Features (``Backend.features``) a backend must declare to run ``case``; it is skipped otherwise."""
        return frozenset()

    def backward_inputs(self, case: Case) -> tuple[str, ...]:
        """Inputs only the timed second half of a split call sees (``("do",)`` for attention's mode bwd).

        Non-empty: the prepared kernel is an object whose ``forward(*other inputs) -> saved`` runs untimed
        before every timed ``backward(saved, *these inputs, *outputs)``.
        """
        return ()

    def reference_outputs(self, case: Case, inputs: Mapping[str, np.ndarray], rows: Any) -> dict[str, np.ndarray]:
        """float64 reference of every output on ``rows``; the default is :meth:`reference` as ``out``."""
        return {"out": self.reference(case, inputs, rows)}

    def uniform_outputs(self, case: Case, inputs: Mapping[str, np.ndarray], rows: Any) -> dict[str, np.ndarray]:
        """The reference with ``q = 0`` (every score equal: uniform attention over the visible keys), a trivial
        predictor a correct answer must beat by far (kbench.judge.verify); {} for an op without ``q``."""
        if "q" not in inputs:
            return {}
        return self.reference_outputs(case, {**inputs, "q": np.zeros_like(inputs["q"])}, rows)

    def select_output(self, case: Case, name: str, output: np.ndarray, rows: Any) -> np.ndarray:
        """The part of output ``name`` that ``reference_outputs(..., rows)[name]`` describes."""
        return self.select(case, output, rows)

    def output_tolerance(self, case: Case, name: str) -> float:
        """Bound on the relative L2 error of output ``name`` (gradients have their own)."""
        return self.tolerance(case)

    def output_accumulation(self, case: Case, name: str) -> int:
        """How many terms of rounding noise one element of output ``name`` sums (1 for a normalised output): the
        judge's absolute error floor grows with its square root (kbench.judge.verify.error_floor)."""
        return 1

    def rows_checked(self, rows: Any) -> int | None:
        """How many rows a sample from :meth:`sample_rows` checks (recorded); None when all."""
        return None if rows is None else int(len(rows))
