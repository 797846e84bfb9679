"""The judge's static policy: the suite's ``integrity:`` settings and the checks of a kernel's source.

The static checks (forbidden calls, computed lookups on modules, ``exec``, module-level state) run in the
parent before any candidate code is loaded (docs/integrity.md). What a worker watches at run time lives
on the worker side (kbench.worker.watches); the verdict is the judge's.
"""
from __future__ import annotations

import ast
import fnmatch
import re
from dataclasses import dataclass, fields
from typing import Any, Iterable, Mapping

from kbench.run.sandbox import SCRATCH_LIMIT
from kbench.source import parse_source

# --------------------------------------------------------------------------------------------
# settings


#: calls a candidate kernel may not make: the libraries it competes with, and the harness itself
DEFAULT_FORBIDDEN_CALLS: tuple[str, ...] = (
    "*scaled_dot_product_attention*",
    "torch.nn.functional.*attention*",
    "torch.nn.MultiheadAttention",
    "flash_attn", "flash_attn.*", "*flash_attn_*",
    "*cudnn*",
    "xformers", "xformers.*",
    # the harness: its float64 reference, its timer and checks, the objects it keeps in memory
    "*attention_float64*",
    "kbench.ops*", "kbench.judge*", "kbench.worker*", "kbench.run*", "kbench.protocol*", "kbench.timing*",
    "kbench.results*", "kbench.devices*", "kbench.stats*", "kbench.testing*", "kbench.source*", "kbench.fuzz*",
    "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._getframe", "inspect.*frame*",
    "inspect.stack", "inspect.trace",
    # every loaded module by name, without an import the audit hook sees (sys.modules["_thread"]); threading's
    # internals (the audit hook's thread gate wraps threading._start_new_thread)
    "sys.modules", "sys.modules.*", "threading._*",
)

#: dynamic code, which would hide any call from the static check, and child processes
EXEC_CALLS: tuple[str, ...] = (
    "exec", "eval", "compile", "__import__", "importlib", "importlib.*", "runpy.*", "marshal.loads",
    "pickle.loads", "types.FunctionType", "types.CodeType", "subprocess", "subprocess.*", "os.system",
    "os.popen", "os.exec*", "os.spawn*", "os.fork*", "multiprocessing", "multiprocessing.*",
)

#: builtins that look an attribute up by name (refused on modules when the name is computed)
DYNAMIC_LOOKUPS = frozenset({"getattr", "hasattr", "setattr", "delattr", "object.__getattribute__"})

#: torch operators (as the dispatcher names them) an untrusted kernel may not reach at run time, however
#: the Python call is spelled: the library attention it competes with
FORBIDDEN_OPS: tuple[str, ...] = ("aten.*scaled_dot_product*", "aten.*flash_attention*", "aten.*efficient_attention*",
                                  "aten.*cudnn_attention*", "aten._fused_sdp*", "aten.*_mha_*",
                                  "aten._native_multi_head_attention*")

#: module globals a kernel file may define as mutable containers (metadata, not state)
ALLOWED_MODULE_CONTAINERS = frozenset({"TUNABLES", "FEATURES", "__all__"})

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)


def parse_size(value: Any) -> int | None:
    """``4GiB``, ``512M``, ``1000000`` -> bytes (binary units); None stays None."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return int(value)
    m = _SIZE.match(str(value))
    if not m:
        raise ValueError(f"not a size: {value!r} (write e.g. 4GiB, 512MiB or a number of bytes)")
    power = {"": 0, "B": 0, "K": 1, "M": 2, "G": 3, "T": 4}[(m.group(2) or "").upper()[:1]]
    return int(float(m.group(1)) * 1024 ** power)


@dataclass(frozen=True)
class IntegritySettings:
    """The suite's ``integrity:`` section (every key optional; see the suite schema)."""

    static_checks: str = "untrusted"          # which backends' source is checked: untrusted | all | none
    forbidden_calls: tuple[str, ...] = DEFAULT_FORBIDDEN_CALLS
    allowed_calls: tuple[str, ...] = ()       # exceptions to forbidden_calls
    forbid_exec: bool = True
    forbid_module_state: bool = True
    forbid_dynamic_lookup: bool = True        # getattr(module, <computed>), vars(module), module.__dict__[...]
    check_threads: bool = True
    check_harness: bool = True                # timers and harness functions captured and verified
    verify_timed_outputs: bool = True
    cache_ratio: float = 4.0                  # timed median this many times faster than fresh calls: cached
    memory_limit: int | None = None           # RLIMIT_AS of sandboxed workers (None: half the RAM, CPU only)
    file_size_limit: int | None = 64 * 2**20  # RLIMIT_FSIZE of sandboxed workers
    scratch_limit: int = SCRATCH_LIMIT        # size of each writable tmpfs of a sandboxed worker (scratch, /tmp, /dev/shm)
    cpu_time_factor: float = 4.0              # RLIMIT_CPU per case = factor * case timeout * cores

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None) -> IntegritySettings:
        data = dict(data or {})
        values: dict[str, Any] = {}
        names = {f.name for f in fields(cls)}
        for key, value in data.items():
            if key not in names:
                continue  # the schema refuses unknown keys; nothing else reaches here
            if key in ("memory_limit", "file_size_limit", "scratch_limit"):
                value = parse_size(value)
            elif key in ("forbidden_calls", "allowed_calls"):
                value = tuple(value)
            values[key] = value
        extra = tuple(data.get("extra_forbidden_calls", ()))
        if extra:
            values["forbidden_calls"] = tuple(values.get("forbidden_calls", DEFAULT_FORBIDDEN_CALLS)) + extra
        return cls(**values)

    def static_applies(self, trusted: bool) -> bool:
        return self.static_checks == "all" or (self.static_checks == "untrusted" and not trusted)


# --------------------------------------------------------------------------------------------
# static checks of a kernel's source


@dataclass(frozen=True)
class Violation:
    line: int
    rule: str          # forbidden_calls | forbid_exec | forbid_module_state
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message} (integrity.{self.rule})"


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


#: what each public name of ``kbench.api`` (and ``kbench.NAME``) stands for, as ``module.attribute``: the judge's own
#: list, so a kernel cannot reach the harness by its public names either (``kbench.api.attention_float64`` is
#: ``kbench.ops.attention.attention_float64``, forbidden). Kept here, not imported: the judge does not depend on the
#: public surface; tests/test_policy.py holds it equal to ``kbench.api.SURFACE``, so a name added there fails
#: that test until it is added here.
API_TARGETS: dict[str, str] = {
    "hookimpl": "kbench.hookimpl", "Registry": "kbench.registry.Registry", "KINDS": "kbench.registry.KINDS",
    "Backend": "kbench.backends.Backend", "Tunable": "kbench.backends.Tunable", "Kernel": "kbench.backends.Kernel",
    "TrainingKernel": "kbench.backends.TrainingKernel", "Device": "kbench.devices.Device", "Op": "kbench.ops.Op",
    "Case": "kbench.ops.Case", "CaseError": "kbench.ops.CaseError", "Substrate": "kbench.kernelfile.Substrate",
    "KernelFileRef": "kbench.kernelfile.KernelFileRef", "HardwareProfile": "kbench.hardware.HardwareProfile",
    "match_profile": "kbench.hardware.match_profile", "load_profiles": "kbench.hardware.load_profiles",
    "profiles_from_data": "kbench.hardware.profiles_from_data",
    "PROFILE_FILE_SCHEMA": "kbench.hardware.PROFILE_FILE_SCHEMA", "load_result": "kbench.results.load_result",
    "Record": "kbench.record.Record", "records_of": "kbench.record.records_of",
    "LineageHistory": "kbench.history.lineages.LineageHistory",
    "LineageVersion": "kbench.history.lineages.LineageVersion", "DType": "kbench.enums.DType",
    "Status": "kbench.enums.Status", "KbenchError": "kbench.errors.KbenchError",
    "BadInput": "kbench.errors.BadInput", "PluginError": "kbench.errors.PluginError",
    "Unsupported": "kbench.unsupported.Unsupported", "PluginWarning": "kbench.plugins.PluginWarning",
    "RegistrationWarning": "kbench.registry.RegistrationWarning",
    "softmax_scale": "kbench.ops.attention.softmax_scale",
    "attention_float64": "kbench.ops.attention.attention_float64", "causal_mask": "kbench.ops.attention.causal_mask",
    "as_torch": "kbench.devices.interop.as_torch", "as_numpy": "kbench.devices.interop.as_numpy",
    "as_cupy": "kbench.devices.interop.as_cupy", "to_device_array": "kbench.devices.interop.to_device_array",
    "torch_dtype": "kbench.devices.interop.torch_dtype", "torch_build": "kbench.devices.interop.torch_build",
    "is_out_of_memory": "kbench.devices.interop.is_out_of_memory",
    "oom_as_memory_error": "kbench.devices.interop.oom_as_memory_error",
    "cuda_device_index": "kbench.devices.interop.cuda_device_index",
    "cuda_unavailable_reason": "kbench.devices.interop.cuda_unavailable_reason",
    "BackendPattern": "kbench.selection.BackendPattern", "Suite": "kbench.suite.Suite",
    "load_suite": "kbench.suite.load_suite", "suite_from_data": "kbench.suite.suite_from_data",
    "RunRequest": "kbench.run.runner.RunRequest", "plan_run": "kbench.run.runner.plan_run",
    "run_suite": "kbench.run.runner.run_suite", "pick_device": "kbench.run.runner.pick_device",
    "RunInterrupted": "kbench.run.runner.RunInterrupted", "resume_request": "kbench.run.runner.resume_request",
    "measure": "kbench.measurement.measure", "Measurement": "kbench.measurement.Measurement",
    "CallableBackend": "kbench.measurement.CallableBackend", "executor_kit": "kbench.run.executors.PUBLIC",
    "get_plugin_manager": "kbench.plugins.get_plugin_manager", "render_table": "kbench.tables.render",
    "atomic_write_json": "kbench.results.atomic_write_json", "atomic_write": "kbench.outputs.atomic_write",
    "MatmulSpec": "kbench.calibrate.MatmulSpec", "now_iso": "kbench.results.now_iso",
    "read_json": "kbench.reader.read_json", "read_text": "kbench.reader.read_text",
    "parse_json": "kbench.reader.parse_json", "geomean": "kbench.compare.geomean",
    "profile_summary": "kbench.profiling.profile_summary",
    "profile_from_output": "kbench.profiling.profile_from_output", "parse_source": "kbench.source.parse_source",
    "check_held_out": "kbench.fuzz.heldout.check_held_out",
    "sandbox_readable_roots": "kbench.run.sandbox.readable_places", "is_secret": "kbench.run.sandbox.is_secret",
    "philox_source": "kbench.ops.inputs.philox_source", "RegeneratedInputs": "kbench.ops.inputs.RegeneratedInputs",
    "InputSpec": "kbench.ops.inputs.InputSpec", "unit_variance_input": "kbench.ops.inputs.unit_variance",
    "generate_input": "kbench.ops.inputs.generate", "philox_lanes": "kbench.ops.inputs.lanes",
    "score_kernel": "kbench.evaluators.score_kernel", "EnvironmentFailure": "kbench.evaluators.EnvironmentFailure",
    "static_check": "kbench.judge.policy.static_check", "IntegritySettings": "kbench.judge.policy.IntegritySettings",
    "set_worker_source": "kbench.run.pool.set_worker_source", "started_worker": "kbench.run.pool.started_worker",
    "ratio_test": "kbench.compare.ratio_test", "load_yaml": "kbench.yamlsource.load_yaml",
    "output_target": "kbench.outputs.output_target", "check_output_dir": "kbench.outputs.check_output_dir",
    "FiniteOption": "kbench.options.Finite",
}


def _through_the_api(name: str) -> str | None:
    """What a ``kbench.api.X`` (or ``kbench.X``) name stands for (``module.attribute``, :data:`API_TARGETS`), so the
    harness's own objects cannot be reached by their public names either; None for anything else."""
    for prefix in ("kbench.api.", "kbench."):
        if name.startswith(prefix):
            head, _, rest = name[len(prefix):].partition(".")
            if head in API_TARGETS:
                return API_TARGETS[head] + (f".{rest}" if rest else "")
    return None


def _matches(name: str, patterns: Iterable[str]) -> str | None:
    low = name.lower()
    for pat in patterns:
        if fnmatch.fnmatchcase(low, pat.lower()):
            return pat
    return None


#: calls that set or delete an attribute named by a string: their first argument is the object changed
SETTERS = frozenset({"setattr", "delattr", "builtins.setattr", "builtins.delattr", "object.__setattr__",
                     "object.__delattr__", "type.__setattr__", "type.__delattr__"})
#: names that stand for the kernel's own object inside its methods
_SELF = frozenset({"self", "cls"})


def _root(node: ast.AST) -> ast.AST:
    """The object an attribute chain or subscript starts from (``a`` of ``a.b[0].c``)."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node


#: objects a kernel makes with a library's constructor, and the attributes of them it may set: a CUDA function's
#: launch settings (a CuPy kernel that uses more than 48 KB of shared memory must raise the first). A name counts
#: when every assignment to it is such a call (``cupy.RawKernel(...)``, or ``.get_function(...)`` of a name made
#: by ``cupy.RawModule(...)``), resolved through the file's import aliases; any other write stays refused.
LIBRARY_SETTABLE = {
    "cupy.RawKernel": frozenset({"max_dynamic_shared_size_bytes", "preferred_shared_memory_carveout"}),
    "cupy.RawModule.get_function": frozenset({"max_dynamic_shared_size_bytes", "preferred_shared_memory_carveout"}),
}


def _made_by_calls(tree: ast.AST) -> dict[str, list[ast.expr | None]]:
    """Each simply assigned name and the callee of every value assigned to it (None: not a call), for names that
    are never also a parameter, a loop variable or an import."""
    values: dict[str, list[ast.expr | None]] = {}
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AnnAssign, ast.AugAssign, ast.NamedExpr)) else []
        value = getattr(node, "value", None)
        callee = value.func if isinstance(value, ast.Call) and not isinstance(node, ast.AugAssign) else None
        for target in targets:
            if isinstance(target, ast.Name):
                values.setdefault(target.id, []).append(callee)
            elif isinstance(target, (ast.Tuple, ast.List, ast.Starred)):  # unpacked: what each name gets is unknown
                for name in ast.walk(target):
                    if isinstance(name, ast.Name) and isinstance(name.ctx, ast.Store):
                        values.setdefault(name.id, []).append(None)
    for node in ast.walk(tree):
        if isinstance(node, ast.arg):
            values[node.arg] = [None]
        elif isinstance(node, (ast.For, ast.comprehension, ast.With, ast.AsyncFor, ast.AsyncWith)):
            for name in ast.walk(getattr(node, "target", node)):
                if isinstance(name, ast.Name) and isinstance(node, (ast.For, ast.comprehension, ast.AsyncFor)):
                    values[name.id] = [None]
            for item in getattr(node, "items", ()):
                for name in ast.walk(item.optional_vars) if item.optional_vars is not None else ():
                    if isinstance(name, ast.Name):
                        values[name.id] = [None]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                values[(a.asname or a.name).split(".")[0]] = [None]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            values[node.name] = [None]
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            for name in node.names:
                values[name] = [None]
    return values


def _own_objects(tree: ast.AST, made_by: dict[str, list[ast.expr | None]]) -> frozenset[str]:
    """Names the file binds only to objects it makes itself: its classes, and names every assignment of which
    (``made_by``, :func:`_made_by_calls`) is a call of one of its classes. An attribute written on anything else
    may be a module's or a builtin's."""
    classes = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    made = {name for name, callees in made_by.items()
            if all(isinstance(c, ast.Name) and c.id in classes for c in callees)}
    return frozenset(classes | made)


class _Checker(ast.NodeVisitor):
    def __init__(self, settings: IntegritySettings, own: frozenset[str] = frozenset()) -> None:
        self.s = settings
        self.aliases: dict[str, str] = {}      # local name -> module path it stands for
        self.found: list[Violation] = []
        self.depth = 0                         # 0 at module level
        self.own = own | _SELF                 # names of the kernel's own objects (_own_objects)
        self.made_by: dict[str, list[ast.expr | None]] = {}  # name -> callees of its values (_made_by_calls)
        self._called: set[int] = set()         # the function nodes of calls (a setter used otherwise is an alias)

    def _setter_as_value(self, node: ast.AST, name: str) -> None:
        if id(node) not in self._called and self.s.forbid_module_state:
            self.found.append(Violation(node.lineno, "forbid_module_state",
                                        f"{name} used as a value (passed or aliased, its calls escape the check)"))

    def _own(self, node: ast.AST) -> bool:
        root = _root(node)
        return isinstance(root, ast.Name) and root.id in self.own and root.id not in self.aliases

    def _library_kind(self, name: str, depth: int = 0) -> str | None:
        """The :data:`LIBRARY_SETTABLE` constructor every value of ``name`` comes from, or None."""
        callees = self.made_by.get(name)
        if not callees or depth > 2 or name in self.aliases:
            return None
        kinds = set()
        for callee in callees:
            if callee is None:
                return None
            if isinstance(callee, ast.Attribute) and callee.attr == "get_function" and isinstance(callee.value, ast.Name):
                base = self._library_kind(callee.value.id, depth + 1)
                kinds.add(f"{base}.get_function" if base == "cupy.RawModule" else None)
                continue
            dotted = _dotted(callee)
            kinds.add(self._resolve(dotted) if dotted else None)
        if len(kinds) != 1:
            return None
        kind = kinds.pop()
        return kind if kind in LIBRARY_SETTABLE or kind == "cupy.RawModule" else None

    def _library_setting(self, dotted: str) -> bool:
        """``name.attr`` where ``name`` is only ever a library object that lets ``attr`` be set."""
        head, _, attr = dotted.partition(".")
        if not attr or "." in attr:
            return False
        kind = self._library_kind(head)
        return kind in LIBRARY_SETTABLE and attr in LIBRARY_SETTABLE[kind]

    def _resolve(self, dotted: str) -> str:
        head, _, rest = dotted.partition(".")
        base = self.aliases.get(head, head)
        return f"{base}.{rest}" if rest else base

    def _check_name(self, node: ast.AST, name: str, what: str = "use of") -> None:
        if _matches(name, self.s.allowed_calls):
            return
        pat = _matches(name, self.s.forbidden_calls)
        target = _through_the_api(name)
        if pat is None and target is not None and not _matches(target, self.s.allowed_calls):
            pat = _matches(target, self.s.forbidden_calls)
            name = f"{name}" if pat is None else f"{name} (= {target})"
        if pat:
            self.found.append(Violation(node.lineno, "forbidden_calls", f"{what} forbidden {name!r} (matches {pat!r})"))
            return
        if self.s.forbid_exec:
            pat = _matches(name, EXEC_CALLS)
            if pat:
                self.found.append(Violation(node.lineno, "forbid_exec",
                                            f"{what} {name!r}: dynamic code or child processes are not allowed"))

    # imports bind aliases and are themselves uses of the module
    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            self.aliases[(a.asname or a.name).split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
            self._check_name(node, a.name, "import of")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        mod = ("." * node.level) + (node.module or "")
        for a in node.names:
            full = f"{mod}.{a.name}" if mod else a.name
            self.aliases[a.asname or a.name] = full
            self._check_name(node, full, "import of")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in ("__setattr__", "__delattr__") and isinstance(node.ctx, ast.Load):
            self._setter_as_value(node, node.attr)
        dotted = _dotted(node)
        if dotted is not None:
            self._check_name(node, self._resolve(dotted))
            if self.s.forbid_dynamic_lookup and node.attr in ("__dict__", "__getattribute__", "__getattr__") \
                    and (self._module_expr(node.value) is not None
                         or (node.attr == "__dict__" and not self._own(node.value))):
                self.found.append(Violation(node.lineno, "forbid_dynamic_lookup",
                                            f"{self._resolve(dotted)}: a module's namespace reached by name at run "
                                            f"time (write the attribute out)"))
            if isinstance(node.ctx, (ast.Store, ast.Del)) and self.s.forbid_module_state:
                head = dotted.split(".")[0]
                if head in self.aliases:
                    self.found.append(Violation(node.lineno, "forbid_module_state",
                                                f"assignment to {self._resolve(dotted)!r}: a kernel may not "
                                                f"change other modules (monkey-patching)"))
                elif not self._own(node) and not self._library_setting(dotted):
                    self._foreign_write(node, dotted)
            return  # the chain is checked as a whole
        if isinstance(node.ctx, (ast.Store, ast.Del)) and self.s.forbid_module_state and not self._own(node):
            self._foreign_write(node, f"<computed>.{node.attr}")
        if self.s.forbid_dynamic_lookup and node.attr == "__dict__" and not self._own(node.value):
            self.found.append(Violation(node.lineno, "forbid_dynamic_lookup",
                                        f"<computed>.__dict__: a namespace reached as a dictionary"))
        self.generic_visit(node)

    def _foreign_write(self, node: ast.AST, what: str) -> None:
        """An attribute written on an object the file did not make: through a parameter, an alias or a computed
        object it may be a module's or a builtin's (``def f(m): m.perf_counter_ns = fake``, ``f(time)``)."""
        self.found.append(Violation(node.lineno, "forbid_module_state",
                                    f"assignment to {what!r}: an attribute of an object the kernel did not make "
                                    f"(a parameter, an alias or a computed object may be a module or a builtin); "
                                    f"a kernel changes only its own objects (self, instances of its classes)"))

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            self._check_name(node, self._resolve(node.id))
            if node.id in ("setattr", "delattr") and node.id not in self.aliases:
                self._setter_as_value(node, node.id)
            if node.id == "__builtins__" and self.s.forbid_module_state:
                self.found.append(Violation(node.lineno, "forbid_module_state",
                                            "`__builtins__`: the builtins' namespace, where a kernel could replace "
                                            "any builtin"))

    def _module_expr(self, node: ast.AST) -> str | None:
        """The module path an expression stands for when it starts at an imported name, else None."""
        dotted = _dotted(node)
        if dotted is None or dotted.split(".")[0] not in self.aliases:
            return None
        return self._resolve(dotted)

    def visit_Call(self, node: ast.Call) -> None:
        """Lookups on modules by computed names hide any call from the rules above: refused outright."""
        name = _dotted(node.func) or ""
        target = self._module_expr(node.args[0]) if node.args else None
        if self.s.forbid_dynamic_lookup and target is not None:
            if name in DYNAMIC_LOOKUPS and len(node.args) > 1:
                attr = node.args[1]
                if isinstance(attr, ast.Constant) and isinstance(attr.value, str):
                    self._check_name(node, f"{target}.{attr.value}")
                else:
                    self.found.append(Violation(node.lineno, "forbid_dynamic_lookup",
                                                f"{name}({target}, <computed name>): attribute of a module looked up "
                                                f"by a computed name (write the name out)"))
            elif name == "vars":
                self.found.append(Violation(node.lineno, "forbid_dynamic_lookup",
                                            f"vars({target}): a module's namespace read as a dictionary"))
        elif self.s.forbid_dynamic_lookup and name == "vars" and node.args and not self._own(node.args[0]):
            self.found.append(Violation(node.lineno, "forbid_dynamic_lookup",
                                        "vars(<not the kernel's own object>): a namespace (maybe a module's) read "
                                        "as a dictionary"))
        if self.s.forbid_module_state:
            resolved = self._resolve(name) if name else ""
            setter = name in SETTERS or resolved in SETTERS or (
                isinstance(node.func, ast.Attribute) and node.func.attr in ("__setattr__", "__delattr__"))
            changed = node.args[0] if name in SETTERS or resolved in SETTERS else (
                node.func.value if isinstance(node.func, ast.Attribute) else None)
            if setter and (changed is None or not self._own(changed)):
                self.found.append(Violation(node.lineno, "forbid_module_state",
                                            f"{name or '<computed>'}(...) on an object the kernel did not make (a "
                                            f"parameter or alias may be a module or a builtin): a kernel changes "
                                            f"only its own objects"))
            if name == "globals" and not node.args:
                self.found.append(Violation(node.lineno, "forbid_module_state",
                                            "globals(): the module's namespace as a dictionary (state kept between "
                                            "calls, names the check does not see)"))
        self._called.add(id(node.func))
        if self.s.forbid_dynamic_lookup and name in ("operator.attrgetter", "operator.methodcaller") or \
                self._resolve(name) in ("operator.attrgetter", "operator.methodcaller"):
            self.found.append(Violation(node.lineno, "forbid_dynamic_lookup",
                                        f"{self._resolve(name)}: attribute lookup by a string at run time"))
        self.generic_visit(node)

    def visit_Global(self, node: ast.Global) -> None:
        if self.s.forbid_module_state:
            self.found.append(Violation(node.lineno, "forbid_module_state",
                                        f"`global {', '.join(node.names)}`: state kept between calls"))

    def visit_Nonlocal(self, node: ast.Nonlocal) -> None:
        if self.s.forbid_module_state:
            self.found.append(Violation(node.lineno, "forbid_module_state",
                                        f"`nonlocal {', '.join(node.names)}`: state kept between calls"))

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        if self.s.forbid_module_state:
            for dec in node.decorator_list:
                name = _dotted(dec.func if isinstance(dec, ast.Call) else dec) or ""
                if "cache" in name.lower() or "memo" in name.lower():
                    self.found.append(Violation(dec.lineno, "forbid_module_state",
                                                f"decorator {name!r} caches results between calls"))
            for default in node.args.defaults + [d for d in node.args.kw_defaults if d is not None]:
                if _is_mutable(default):
                    self.found.append(Violation(default.lineno, "forbid_module_state",
                                                f"mutable default argument of {node.name!r}: state kept between calls"))
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = _function
    visit_AsyncFunctionDef = _function

    def visit_Assign(self, node: ast.Assign) -> None:
        if self.depth == 0 and self.s.forbid_module_state and _is_mutable(node.value):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            bad = [n for n in names if n not in ALLOWED_MODULE_CONTAINERS]
            if bad:
                self.found.append(Violation(node.lineno, "forbid_module_state",
                                            f"module-level mutable {', '.join(bad)}: state (a cache?) kept between calls"))
        self.generic_visit(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1


_MUTABLE_CALLS = {"dict", "list", "set", "bytearray", "defaultdict", "OrderedDict", "deque", "Counter",
                  "collections.defaultdict", "collections.OrderedDict", "collections.deque", "collections.Counter",
                  "weakref.WeakValueDictionary", "weakref.WeakKeyDictionary"}


def _is_mutable(node: ast.AST) -> bool:
    if isinstance(node, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)):
        return True
    return isinstance(node, ast.Call) and (_dotted(node.func) or "") in _MUTABLE_CALLS


def static_check(source: str, settings: IntegritySettings, *, filename: str = "<kernel>") -> list[Violation]:
    """Violations of the suite's static rules in a kernel's source (empty: clean)."""
    try:
        tree = parse_source(source, filename)
    except SyntaxError as exc:
        return [Violation(exc.lineno or 0, "syntax", f"syntax error: {exc.msg}")]
    made_by = _made_by_calls(tree)
    checker = _Checker(settings, _own_objects(tree, made_by))
    checker.made_by = made_by
    checker.visit(tree)
    seen, unique = set(), []
    for v in checker.found:
        if (v.line, v.message) not in seen:
            seen.add((v.line, v.message))
            unique.append(v)
    return unique


def backend_source(backend: Any) -> str | None:
    """The source text a backend was loaded from (kept in memory by kernel files), else read from disk."""
    for holder in (backend, getattr(backend, "source", None)):
        text = getattr(holder, "text", None) if holder is not backend else getattr(backend, "source_text", None)
        if isinstance(text, str):
            return text
    try:
        with open(backend.source_path, encoding="utf-8") as fh:
            return fh.read()
    except (OSError, TypeError, UnicodeDecodeError):
        return None


def static_failure(settings: IntegritySettings, backend: Any) -> str | None:
    """The reason a backend's source fails the suite's static checks, or None (clean or not checked)."""
    if not getattr(backend, "source_path", None) or not settings.static_applies(getattr(backend, "trusted", True)):
        return None
    text = backend_source(backend)
    if text is None:
        return f"static check: cannot read the source {backend.source_path}"
    found = static_check(text, settings, filename=str(backend.source_path))
    if not found:
        return None
    more = f"; and {len(found) - 3} more" if len(found) > 3 else ""
    return f"static check of {backend.source_path}: " + "; ".join(map(str, found[:3])) + more
