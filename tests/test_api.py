"""kbench.api: the stable surface for plugin authors, its lightness, and the core's array interop."""
from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import kbench
import kbench.api as api
from kbench.enums import DType
from kbench.testing import imported_by

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------------------------
# the surface


def test_the_names_every_plugin_needs_import_from_kbench_api():
    from kbench.api import Backend, Case, DType, Device, HardwareProfile, Op, Status, Tunable  # noqa: F401
    from kbench.backends import Backend as CoreBackend

    assert Backend is CoreBackend and Tunable(1).default == 1


@pytest.mark.parametrize("name", sorted(api.SURFACE))
def test_every_public_name_is_the_core_object_and_reexported_from_kbench(name):
    module, attribute = api.SURFACE[name]
    expected = getattr(importlib.import_module(module), attribute)
    assert getattr(api, name) is expected
    assert getattr(kbench, name) is expected
    assert name in dir(kbench) and name in api.__all__


def test_an_unknown_name_says_what_exists():
    with pytest.raises(AttributeError, match="stable names are: .*Backend"):
        api.NoSuchThing  # noqa: B018
    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        kbench.NoSuchThing  # noqa: B018


def test_importing_the_api_pulls_in_nothing_heavy():
    heavy = ("torch", "cupy", "triton", "litellm", "scipy", "matplotlib", "kbench.backends", "kbench.run.runner")
    assert imported_by(["kbench", "kbench.api"], heavy) == []
    # resolving the names a backend plugin uses imports no array library but NumPy either
    code = ("import sys; from kbench.api import Backend, Tunable, as_torch, as_cupy, softmax_scale; "
            "print(sorted(m for m in ('torch', 'cupy', 'triton') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --------------------------------------------------------------------------------------------
# what first-party plugins import from the core


def _plugin_packages() -> list[Path]:
    return sorted(ROOT.glob("plugins/kbench-*/kbench_*")) + [ROOT / "examples/kbench-example-backend/kbench_example"]


def _imports(path: Path) -> list[tuple[str, str]]:
    """(module, name) of every absolute import in a file (``name`` is ``*`` for ``import module``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [(node.module, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            found += [(a.name, "*") for a in node.names]
    return found


def _outside(files: list[Path], public: tuple[str, ...], own: set[str]) -> set[str]:
    """``file: module.name`` for each import of a core module not in ``public``, or of a plugin package not in
    ``own``."""
    found = set()
    for path in files:
        for module, name in _imports(path):
            top = module.split(".")[0]
            if (top == "kbench" and module not in public) or (top.startswith("kbench_") and top not in own):
                found.add(f"{path.relative_to(ROOT).as_posix()}: {module}.{name}")
    return found


def core_imports_outside_api() -> list[str]:
    """``file: module.name`` for every import of a core module other than ``kbench``/``kbench.api``,
    and of another plugin's package, by the shipped plugins and the example."""
    found = set()
    for package in _plugin_packages():
        found |= _outside(sorted(package.rglob("*.py")), ("kbench", "kbench.api"), {package.name})
    return sorted(found)


#: plugins whose tests are not held to the rule below (none: every plugin's tests are)
TESTS_NOT_CHECKED: set[str] = set()
#: single imports of another plugin that a plugin's test needs, each with why (a test of two plugins together)
CROSS_PLUGIN_TEST_IMPORTS = {
    "plugins/kbench-evolve/tests/test_evolve_parallel.py: kbench_ray.loopback.keep_loopback":
        "evolve screenings on a Ray cluster the test starts itself, which must listen on loopback only",
}


def core_imports_outside_api_in_plugin_tests() -> list[str]:
    """The same for the plugins' tests: they import the core through ``kbench.api`` and ``kbench.testing`` (the
    pytest plugin) only, as a third party's tests must, and no plugin but their own."""
    found = set()
    for tests in sorted(ROOT.glob("plugins/kbench-*/tests")):
        if tests.parent.name in TESTS_NOT_CHECKED:
            continue
        own = {p.name for p in tests.parent.glob("kbench_*")}
        found |= _outside(sorted(tests.rglob("*.py")), ("kbench", "kbench.api", "kbench.testing"), own)
    return sorted(found - set(CROSS_PLUGIN_TEST_IMPORTS))


#: where an imported name lives in kbench.api when it is not spelled the same
RENAMED = {"kbench.tables.render": "render_table"}
#: imports with no kbench.api equivalent yet (dotted name -> why); empty: every name a plugin imports from
#: the core is public (which GPU and whether it is usable, for instance, is the core's cuda_device_index /
#: cuda_unavailable_reason, which kbench-cuda's runtime re-exports)
NO_API_YET: set[str] = set()


def test_every_core_import_of_a_plugin_has_its_name_in_kbench_api():
    """So that each import can become ``from kbench.api import NAME`` without other change."""
    missing = []
    for entry in core_imports_outside_api():
        dotted = entry.split(": ", 1)[1]
        if dotted in NO_API_YET:
            continue
        module, attribute = dotted.rsplit(".", 1)
        name = RENAMED.get(dotted, attribute)
        if module.startswith("kbench_torch.interop") and name in api.SURFACE:
            continue  # the plugin's own copy of the interop the core now has
        if name not in api.SURFACE:
            missing.append(entry)
        elif module.split(".")[0] == "kbench":
            assert getattr(api, name) is getattr(importlib.import_module(module), attribute), entry
    assert missing == []


def test_plugins_import_the_core_only_through_kbench_api():
    assert core_imports_outside_api() == []


def test_plugin_tests_import_the_core_only_through_kbench_api_and_kbench_testing():
    assert core_imports_outside_api_in_plugin_tests() == []


def test_the_scan_sees_a_core_import_in_a_plugin_test(tmp_path, monkeypatch):
    plugin = tmp_path / "plugins" / "kbench-x"
    (plugin / "kbench_x").mkdir(parents=True)
    (plugin / "tests").mkdir()
    (plugin / "tests" / "test_x.py").write_text(
        "import kbench\nfrom kbench.api import Backend\nfrom kbench.testing import make_case\nfrom kbench_x import y\n"
        "import helper_module\nfrom kbench.ops.attention import causal_mask\nimport kbench.plugins\n"
        "def test_a():\n    from kbench_torch.sdpa import TorchSDPA\n")
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    where = "plugins/kbench-x/tests/test_x.py"
    assert core_imports_outside_api_in_plugin_tests() == [f"{where}: kbench.ops.attention.causal_mask",
                                                         f"{where}: kbench.plugins.*",
                                                         f"{where}: kbench_torch.sdpa.TorchSDPA"]


def test_the_scan_sees_a_core_import_in_a_plugin(tmp_path, monkeypatch):
    pkg = tmp_path / "plugins" / "kbench-x" / "kbench_x"
    pkg.mkdir(parents=True)
    (pkg / "mod.py").write_text("from kbench.api import Backend\nimport kbench\nfrom kbench.ops import Case\n"
                                "from kbench_x.inner import y\nfrom kbench_torch.interop import as_torch\n")
    (tmp_path / "examples/kbench-example-backend/kbench_example").mkdir(parents=True)
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    assert core_imports_outside_api() == ["plugins/kbench-x/kbench_x/mod.py: kbench.ops.Case",
                                          "plugins/kbench-x/kbench_x/mod.py: kbench_torch.interop.as_torch"]


# --------------------------------------------------------------------------------------------
# which GPU and whether it is usable: one answer for the cuda device and the GPU backends


def test_the_cuda_device_index_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("KBENCH_CUDA_DEVICE", raising=False)
    assert api.cuda_device_index() == 0
    monkeypatch.setenv("KBENCH_CUDA_DEVICE", " 3 ")
    assert api.cuda_device_index() == 3
    monkeypatch.setenv("KBENCH_CUDA_DEVICE", "x")  # not a number: the default, as before
    assert api.cuda_device_index() == 0


def test_an_absent_gpu_is_a_reason_and_the_cuda_device_gives_the_same_one():
    reason = api.cuda_unavailable_reason(99)  # no machine has a usable GPU 99
    assert isinstance(reason, str)
    assert reason.startswith(("cupy is not importable", "CUDA runtime:", "KBENCH_CUDA_DEVICE=99 but only")), reason
    runtime = pytest.importorskip("kbench_cuda.runtime")
    assert runtime.unavailable_reason is api.cuda_unavailable_reason
    assert runtime.device_index is api.cuda_device_index
    from kbench_cuda.device import CudaDevice

    assert CudaDevice(index=99).available() == reason


# --------------------------------------------------------------------------------------------
# interop, on the CPU with real torch and NumPy


torch = pytest.importorskip("torch")


@pytest.mark.parametrize("dtype", list(DType))
def test_numpy_and_torch_views_share_memory_both_ways(dtype):
    host = np.random.default_rng(3).standard_normal((2, 5, 3, 4)).astype(dtype.numpy)
    t = api.as_torch(host, dtype)
    assert t.dtype == api.torch_dtype(dtype) and t.data_ptr() == host.ctypes.data
    back = api.as_numpy(t)
    assert back.dtype == dtype.numpy and back.ctypes.data == host.ctypes.data
    t[1, 2, 0, 3] = 5.0  # a write through torch shows in both NumPy views
    assert float(host[1, 2, 0, 3]) == 5.0 and float(back[1, 2, 0, 3]) == 5.0


def test_bf16_bits_are_reinterpreted_not_converted():
    host = np.array([1.0, -2.5, 3.140625, np.inf], dtype=ml_dtypes.bfloat16)
    bits = host.view(np.uint16)                      # the device storage convention
    t = api.as_torch(bits, DType.BF16)
    assert t.dtype == torch.bfloat16 and t.data_ptr() == bits.ctypes.data
    assert t.tolist() == [1.0, -2.5, 3.140625, float("inf")]
    assert api.as_numpy(bits, "bf16").dtype == ml_dtypes.bfloat16
    assert api.as_numpy(bits, "bf16").tolist() == host.tolist()
    assert np.array_equal(api.as_numpy(t).view(np.uint16), bits)


def test_strided_views_stay_views():
    host = np.zeros((2, 6, 4, 8), dtype=np.float16)
    t = api.as_torch(host).transpose(1, 2)
    back = api.as_numpy(t)
    back[1, 2, 3, 4] = 1.5
    assert float(host[1, 3, 2, 4]) == 1.5 and back.strides != host.strides


def test_dlpack_producers_are_viewed():
    t = torch.arange(6, dtype=torch.float32)
    assert api.as_numpy(t).ctypes.data == t.data_ptr()

    class Producer:  # any object speaking DLPack (as JAX or a vendor library would)
        def __init__(self, tensor):
            self.tensor = tensor

        def __dlpack__(self, *args, **kwargs):
            return self.tensor.__dlpack__(*args, **kwargs)

        def __dlpack_device__(self):
            return self.tensor.__dlpack_device__()

    assert api.as_torch(Producer(t)).data_ptr() == t.data_ptr()
    assert api.as_numpy(Producer(t)).ctypes.data == t.data_ptr()


def test_views_that_would_need_a_copy_are_refused_by_name():
    with pytest.raises(TypeError, match="NumPy array is host memory: pass allow_copy=True"):
        api.as_cupy(np.zeros(3, np.float32))
    with pytest.raises(TypeError, match="torch CPU tensor is host memory"):
        api.as_cupy(torch.zeros(3))
    with pytest.raises(TypeError, match="cannot view a builtins.list"):
        api.as_torch([1.0, 2.0])
    with pytest.raises(TypeError, match="cannot view a builtins.list"):
        api.as_numpy([1.0, 2.0])


def test_torch_tensors_pass_through():
    x = torch.arange(4, dtype=torch.int16)
    assert api.as_torch(x) is x and api.as_torch(x, DType.BF16).dtype == torch.bfloat16


def test_cupy_is_reached_only_when_asked():
    cupy = pytest.importorskip("cupy")
    # a host array with allow_copy goes to CuPy: without a GPU CuPy's own CUDA error comes back
    try:
        arr = api.as_cupy(np.array([1.0, 2.0], dtype=ml_dtypes.bfloat16), allow_copy=True)
    except cupy.cuda.runtime.CUDARuntimeError:
        pass
    else:  # on a GPU machine: bf16 arrives as uint16 bit patterns
        assert arr.dtype == cupy.uint16 and arr.get().view(ml_dtypes.bfloat16).tolist() == [1.0, 2.0]


def test_oom_errors_of_array_libraries_become_memory_error():
    class OutOfMemoryError(RuntimeError):
        pass

    def kernel(x):
        raise OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    with pytest.raises(MemoryError, match="Tried to allocate"):
        api.oom_as_memory_error(kernel)(1)

    def wrong(x):
        raise ValueError("shape mismatch")

    with pytest.raises(ValueError, match="shape mismatch"):
        api.oom_as_memory_error(wrong)(1)
