"""The stable surface for plugin authors: import from here (or from ``kbench``), nothing else.

Everything a backend, device, op, substrate, hardware-profile or command plugin needs is named
below; the modules behind these names may move between releases, these names do not. Names are
resolved on first use, so ``import kbench.api`` (or ``import kbench``) stays as light as the
plugin's own import must be: no NumPy kernels, no torch, no CuPy.

Writing a backend::

    import kbench
    from kbench.api import Backend, Case, Tunable, softmax_scale

    class MyAttention(Backend):
        name, op, device = "my-attention", "attention", "cpu"
        tunables = {"block": Tunable(64, (32, 64, 128), "rows per tile")}

        def supports(self, case: Case) -> str | None:     # None: yes; a string: why not
            return None if case.dtype == "fp32" else "fp32 only"

        def prepare(self, case: Case):
            block, scale = self.setting("block"), softmax_scale(case)
            def run(q, k, v, out): ...
            return run

    @kbench.hookimpl
    def kbench_register_backends(registry):
        registry.add_backend(MyAttention())

See docs/writing-a-plugin.md for the whole contract.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: public name -> (module, attribute): the one table of what is stable
SURFACE: dict[str, tuple[str, str]] = {
    # the hook marker and the registry handed to registration hooks
    "hookimpl": ("kbench", "hookimpl"),
    "Registry": ("kbench.registry", "Registry"),
    "KINDS": ("kbench.registry", "KINDS"),
    # the things plugins register
    "Backend": ("kbench.backends", "Backend"),
    "Tunable": ("kbench.backends", "Tunable"),
    "Kernel": ("kbench.backends", "Kernel"),
    "TrainingKernel": ("kbench.backends", "TrainingKernel"),
    "Device": ("kbench.devices", "Device"),
    "Op": ("kbench.ops", "Op"),
    "Case": ("kbench.ops", "Case"),
    "CaseError": ("kbench.ops", "CaseError"),
    "Substrate": ("kbench.kernelfile", "Substrate"),
    # a kernel file registered as a backend, run in a worker (never imported by the parent)
    "KernelFileRef": ("kbench.kernelfile", "KernelFileRef"),
    "HardwareProfile": ("kbench.hardware", "HardwareProfile"),
    "match_profile": ("kbench.hardware", "match_profile"),
    "load_profiles": ("kbench.hardware", "load_profiles"),
    "profiles_from_data": ("kbench.hardware", "profiles_from_data"),
    "PROFILE_FILE_SCHEMA": ("kbench.hardware", "PROFILE_FILE_SCHEMA"),
    # reading result files: loaded (migrated, validated), and their records typed (kbench.record)
    "load_result": ("kbench.results", "load_result"),
    "Record": ("kbench.record", "Record"),
    "records_of": ("kbench.record", "records_of"),
    # lineages handed to the history site (hook kbench_read_lineages)
    "LineageHistory": ("kbench.history.lineages", "LineageHistory"),
    "LineageVersion": ("kbench.history.lineages", "LineageVersion"),
    # one vocabulary for statuses and dtypes
    "DType": ("kbench.enums", "DType"),
    "Status": ("kbench.enums", "Status"),
    # the error family (BadInput: exit 2 with file, place and fix)
    "KbenchError": ("kbench.errors", "KbenchError"),
    "BadInput": ("kbench.errors", "BadInput"),
    "PluginError": ("kbench.errors", "PluginError"),
    "Unsupported": ("kbench.unsupported", "Unsupported"),
    "PluginWarning": ("kbench.plugins", "PluginWarning"),
    "RegistrationWarning": ("kbench.registry", "RegistrationWarning"),
    # op helpers
    "softmax_scale": ("kbench.ops.attention", "softmax_scale"),
    # the attention op's exact reference (what the judge compares with; tests of a backend or of a device's
    # own reference check against it) and its visibility mask, bottom-right aligned
    "attention_float64": ("kbench.ops.attention", "attention_float64"),
    "causal_mask": ("kbench.ops.attention", "causal_mask"),
    # array interop between NumPy, CuPy, torch and DLPack (zero copy; torch/CuPy imported on use)
    "as_torch": ("kbench.devices.interop", "as_torch"),
    "as_numpy": ("kbench.devices.interop", "as_numpy"),
    "as_cupy": ("kbench.devices.interop", "as_cupy"),
    "to_device_array": ("kbench.devices.interop", "to_device_array"),
    "torch_dtype": ("kbench.devices.interop", "torch_dtype"),
    "torch_build": ("kbench.devices.interop", "torch_build"),  # (version, CUDA or None) without importing torch
    "is_out_of_memory": ("kbench.devices.interop", "is_out_of_memory"),
    "oom_as_memory_error": ("kbench.devices.interop", "oom_as_memory_error"),
    # which GPU the cuda device measures on and whether it is usable (CuPy imported on use)
    "cuda_device_index": ("kbench.devices.interop", "cuda_device_index"),
    "cuda_unavailable_reason": ("kbench.devices.interop", "cuda_unavailable_reason"),
    # selection: backend patterns with settings (numpy-flash[block_q=64])
    "BackendPattern": ("kbench.selection", "BackendPattern"),
    # running suites from a command plugin
    "Suite": ("kbench.suite", "Suite"),
    "load_suite": ("kbench.suite", "load_suite"),
    "suite_from_data": ("kbench.suite", "suite_from_data"),
    "RunRequest": ("kbench.run.runner", "RunRequest"),
    "plan_run": ("kbench.run.runner", "plan_run"),
    "run_suite": ("kbench.run.runner", "run_suite"),
    "pick_device": ("kbench.run.runner", "pick_device"),
    "RunInterrupted": ("kbench.run.runner", "RunInterrupted"),  # Ctrl-C/SIGTERM: the file is valid, incomplete
    "resume_request": ("kbench.run.runner", "resume_request"),  # an incomplete file's request and its records
    # measuring from Python (a test, a notebook, an evolver's evaluator): the runner of `kbench run` behind it
    "measure": ("kbench.measurement", "measure"),
    "Measurement": ("kbench.measurement", "Measurement"),
    "CallableBackend": ("kbench.measurement", "CallableBackend"),
    # held-out shapes near a suite's, checked for correctness only (docs/fuzz.md): what scores a kernel uses
    "check_held_out": ("kbench.fuzz.heldout", "check_held_out"),
    # scoring a candidate kernel file as evolvers and `kbench serve` do (docs/evaluators.md), and the static policy
    # a service applies before it starts a worker (docs/integrity.md)
    "score_kernel": ("kbench.evaluators", "score_kernel"),
    "EnvironmentFailure": ("kbench.evaluators", "EnvironmentFailure"),
    "static_check": ("kbench.judge.policy", "static_check"),  # static_check(source, IntegritySettings) -> violations
    "IntegritySettings": ("kbench.judge.policy", "IntegritySettings"),
    # a long-lived service keeps workers started ahead of time (docs/serve.md): pools take them from its source
    "set_worker_source": ("kbench.run.pool", "set_worker_source"),
    "started_worker": ("kbench.run.pool", "started_worker"),
    "executor_kit": ("kbench.run.executors", "PUBLIC"),  # executor plugins: Executor, SlotExecutor, NodeRunner... (docs/scale-out.md)
    "get_plugin_manager": ("kbench.plugins", "get_plugin_manager"),
    # small utilities plugins otherwise re-implement
    "render_table": ("kbench.tables", "render"),
    "atomic_write_json": ("kbench.results", "atomic_write_json"),
    "atomic_write": ("kbench.outputs", "atomic_write"),  # atomic_write(path, lambda fh: fh.write(text))
    "output_target": ("kbench.outputs", "output_target"),  # the one rule of output paths (regular file or new path)
    "check_output_dir": ("kbench.outputs", "check_output_dir"),  # make a directory output, under the same rule
    "FiniteOption": ("kbench.options", "Finite"),  # a click float option type that refuses nan and inf
    "MatmulSpec": ("kbench.calibrate", "MatmulSpec"),  # a device plugin's calibration_matmuls()
    "now_iso": ("kbench.results", "now_iso"),
    # reading files: the one reader's limits and messages (special files refused by type, size, depth,
    # numbers, string and array lengths, duplicate keys; BadInput naming the file, the place and the fix)
    "read_json": ("kbench.reader", "read_json"),
    "read_text": ("kbench.reader", "read_text"),
    "parse_json": ("kbench.reader", "parse_json"),
    "geomean": ("kbench.compare", "geomean"),
    "ratio_test": ("kbench.compare", "ratio_test"),  # ratio_test(base_samples, new_samples): ratio, CI, p-value
    "load_yaml": ("kbench.yamlsource", "load_yaml"),  # (data, {path tuple: line}) with the suite loader's limits
    "profile_summary": ("kbench.profiling", "profile_summary"),  # one line of a record's Nsight Compute profile
    "profile_from_output": ("kbench.profiling", "profile_from_output"),  # record["profile"] from ncu's CSV
    "parse_source": ("kbench.source", "parse_source"),  # ast.parse, safe from several threads
    # what untrusted code may read, and what counts as a secret (an evolver keeps its workspace and the model's text clear)
    "sandbox_readable_roots": ("kbench.run.sandbox", "readable_places"),  # folders and files a sandboxed kernel can read
    "is_secret": ("kbench.run.sandbox", "is_secret"),  # is_secret(name, value): a credential-looking variable
    # the counter-based input generator (kbench.ops.inputs): an op declares its inputs as InputSpecs, a device
    # plugin draws them where they live (Device.generate) and checks its draws against the host's
    "philox_source": ("kbench.ops.inputs", "philox_source"),
    "RegeneratedInputs": ("kbench.ops.inputs", "RegeneratedInputs"),
    "InputSpec": ("kbench.ops.inputs", "InputSpec"),
    "unit_variance_input": ("kbench.ops.inputs", "unit_variance"),  # unit_variance_input(shape, dtype): mean 0, variance 1
    "generate_input": ("kbench.ops.inputs", "generate"),        # generate_input(spec, key, stream): drawn on the host
    "philox_lanes": ("kbench.ops.inputs", "lanes"),             # the 16-bit lanes (table indices) of elements [start, stop)
}

__all__ = sorted(SURFACE)


def __getattr__(name: str) -> Any:
    try:
        module, attribute = SURFACE[name]
    except KeyError:
        raise AttributeError(f"module 'kbench.api' has no attribute {name!r}; the stable names are: "
                             f"{', '.join(__all__)}") from None
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # for type checkers and IDEs: the same names, imported eagerly
    from kbench import hookimpl
    from kbench.backends import Backend, Kernel, TrainingKernel, Tunable
    from kbench.compare import geomean, ratio_test
    from kbench.evaluators import EnvironmentFailure, score_kernel
    from kbench.judge.policy import IntegritySettings, static_check
    from kbench.run.pool import set_worker_source, started_worker
    from kbench.yamlsource import load_yaml
    from kbench.devices import Device
    from kbench.devices.interop import (as_cupy, as_numpy, as_torch, cuda_device_index, cuda_unavailable_reason,
                                        is_out_of_memory, oom_as_memory_error, to_device_array, torch_dtype)
    from kbench.enums import DType, Status
    from kbench.errors import BadInput, KbenchError, PluginError
    from kbench.unsupported import Unsupported
    from kbench.hardware import (PROFILE_FILE_SCHEMA, HardwareProfile, load_profiles, match_profile,
                                 profiles_from_data)
    from kbench.history.lineages import LineageHistory, LineageVersion
    from kbench.kernelfile import Substrate
    from kbench.fuzz.heldout import check_held_out
    from kbench.measurement import CallableBackend, Measurement, measure
    from kbench.ops import Case, CaseError, Op
    from kbench.ops.attention import attention_float64, causal_mask, softmax_scale
    from kbench.ops.inputs import InputSpec, RegeneratedInputs, philox_source
    from kbench.ops.inputs import generate as generate_input
    from kbench.ops.inputs import lanes as philox_lanes
    from kbench.ops.inputs import unit_variance as unit_variance_input
    from kbench.plugins import PluginWarning, get_plugin_manager
    from kbench.record import Record, records_of
    from kbench.registry import KINDS, Registry, RegistrationWarning
    from kbench.source import parse_source
    from kbench.calibrate import MatmulSpec
    from kbench.options import Finite as FiniteOption
    from kbench.outputs import atomic_write, check_output_dir, output_target
    from kbench.results import atomic_write_json, load_result, now_iso
    from kbench.run.runner import RunInterrupted, RunRequest, pick_device, plan_run, resume_request, run_suite
    from kbench.run.sandbox import is_secret
    from kbench.run.sandbox import readable_places as sandbox_readable_roots
    from kbench.selection import BackendPattern
    from kbench.kernelfile import KernelFileRef
    from kbench.suite import Suite, load_suite, suite_from_data
    from kbench.tables import render as render_table
