"""The judge's static policy (kbench.judge.policy): attribute writes on modules and builtins are seen through any
alias, and the judge keeps its own list of what the public names reach. On 6cf3c74 a kernel installed a timer
replacement with ``setattr(o, n, v)`` inside a function and the check saw nothing; and
policy.py took its list from kbench.api, the one import against the protocol / run / judge / worker layout."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from kbench.judge.policy import IntegritySettings, static_check

ROOT = Path(__file__).resolve().parents[1]

#: attack -> (source, the rule that must name it)
WRITES = {
    "setattr through a parameter": ("""
import time

def install(o, n, v):
    setattr(o, n, v)

def attention(q, k, v, out, *, causal, scale):
    install(time, "perf_counter_ns", lambda: 0)
""", "forbid_module_state"),
    "attribute through a parameter": ("""
import time

def install(m):
    m.perf_counter_ns = lambda: 0

install(time)
""", "forbid_module_state"),
    "vars(m)[...]": ("""
import time

def install(m):
    vars(m)["perf_counter_ns"] = lambda: 0
""", "forbid_dynamic_lookup"),
    "m.__dict__[...]": ("""
import time

def install(m):
    m.__dict__["perf_counter_ns"] = lambda: 0
""", "forbid_dynamic_lookup"),
    "an alias by assignment": ("""
import time
clock = time

def attention(q, k, v, out, *, causal, scale):
    clock.perf_counter_ns = lambda: 0
""", "forbid_module_state"),
    "a module from sys.modules": ("""
import sys

def attention(q, k, v, out, *, causal, scale):
    sys.modules["time"].perf_counter_ns = lambda: 0
""", "forbid_module_state"),
    "setattr on a module by a constant name": ("""
import time
setattr(time, "perf_counter_ns", lambda: 0)
""", "forbid_module_state"),
    "setattr passed on": ("""
import time
put = setattr
put(time, "perf_counter_ns", lambda: 0)
""", "forbid_module_state"),
    "object.__setattr__": ("""
import numpy
object.__setattr__(numpy, "einsum", None)
""", "forbid_module_state"),
    "a builtin through __builtins__": ("""
def attention(q, k, v, out, *, causal, scale):
    __builtins__["len"] = lambda x: 0
""", "forbid_module_state"),
    "a builtin through a parameter": ("""
import builtins

def swap(where):
    where.len = lambda x: 0

swap(builtins)
""", "forbid_module_state"),
}


@pytest.mark.parametrize("attack", list(WRITES))
def test_attribute_writes_on_modules_and_builtins_are_seen_through_any_alias(attack):
    source, rule = WRITES[attack]
    found = static_check(source, IntegritySettings())
    assert rule in {v.rule for v in found}, (attack, [str(v) for v in found])


def test_a_kernel_may_change_its_own_objects():
    source = """
class Plan:
    def __init__(self, block):
        self.block = block
        setattr(self, "tiles", 2)
        self.__dict__["extra"] = 1

    def grow(self):
        self.block *= 2

plan = Plan(64)
plan.block = 32
Plan.default = 16


def attention(q, k, v, out, *, causal, scale):
    p = Plan(32)
    p.block = q.shape[1]
    out[...] = 0
"""
    assert static_check(source, IntegritySettings()) == []


def test_the_judge_keeps_its_own_list_equal_to_the_public_surface():
    from kbench.api import SURFACE
    from kbench.judge.policy import API_TARGETS

    public = {name: f"{module}.{attribute}" for name, (module, attribute) in SURFACE.items()}
    missing = sorted(set(public) - set(API_TARGETS))
    stale = sorted(set(API_TARGETS) - set(public))
    assert not missing and not stale, (f"add to kbench.judge.policy.API_TARGETS: {missing}; "
                                       f"remove: {stale}")
    assert API_TARGETS == public


def test_the_judge_does_not_import_the_public_surface():
    for path in (ROOT / "kbench" / "judge").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n == "kbench.api" or n.startswith("kbench.api.") for n in names), (path, node.lineno)
    out = subprocess.run([sys.executable, "-c", "import sys, kbench.judge.policy as p; "
                          "p.static_check('import kbench.api\\nkbench.api.attention_float64', p.IntegritySettings()); "
                          "print('kbench.api' in sys.modules)"], capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.strip() == "False", out.stderr


def test_the_harness_reached_by_its_public_name_is_still_forbidden():
    found = static_check("import kbench.api\ndef attention(q, k, v, out, *, causal, scale):\n"
                         "    out[...] = kbench.api.generate_input(q)\n", IntegritySettings())
    assert any("(= kbench.ops.inputs.generate)" in v.message for v in found), found


CUPY_LAUNCH_SETTINGS = '''
import cupy as cp
from cupy import RawKernel

_big = cp.RawKernel(r"extern \\"C\\" __global__ void f() {}", "f")
_big.max_dynamic_shared_size_bytes = 100 * 1024
_other = RawKernel("...", "g")
_other.preferred_shared_memory_carveout = 100
_module = cp.RawModule(code="...")
_fn = _module.get_function("h")
_fn.max_dynamic_shared_size_bytes = 64 * 1024


def attention(q, k, v, out, *, causal, scale):
    _big((1,), (1,), ())
'''


def test_an_honest_cupy_kernel_may_set_its_launch_settings():
    """A CuPy kernel using more than 48 KB of shared memory must raise max_dynamic_shared_size_bytes on the function
    it made: refused as 'an object the kernel did not make' before policy.LIBRARY_SETTABLE."""
    assert static_check(CUPY_LAUNCH_SETTINGS, IntegritySettings()) == []


@pytest.mark.parametrize("source", [
    # the name is also bound to something else: it may be a module when the write runs
    "import cupy as cp\nimport time\nk = cp.RawKernel('', 'f')\nk = time\nk.max_dynamic_shared_size_bytes = 1\n",
    "import cupy as cp\nimport time\nk, j = cp.RawKernel('', 'f'), time\nk.max_dynamic_shared_size_bytes = 1\n",
    # another attribute than a launch setting
    "import cupy as cp\nk = cp.RawKernel('', 'f')\nk.perf_counter_ns = lambda: 0\n",
    # a parameter of that name
    "def f(k):\n    k.max_dynamic_shared_size_bytes = 1\n",
    # not cupy's constructor
    "class Fake:\n    RawKernel = None\ncp = Fake()\nk = cp.RawKernel()\nk.max_dynamic_shared_size_bytes = 1\n",
    "import time as cupy\nk = cupy.RawKernel('', 'f')\nk.max_dynamic_shared_size_bytes = 1\n",
    # get_function of something not made by cupy.RawModule
    "import time\nfn = time.get_function('h')\nfn.max_dynamic_shared_size_bytes = 1\n",
])
def test_only_those_settings_on_objects_only_ever_made_by_cupy(source):
    assert "forbid_module_state" in {v.rule for v in static_check(source, IntegritySettings())}, source
