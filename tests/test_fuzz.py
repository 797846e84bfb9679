"""Fuzzing the suite loader: whatever the file holds, the answer is a suite or a BadInput, never a traceback."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kbench.errors import BadInput
from kbench.plugins import PluginManager
from kbench.run.runner import integrity_settings
from kbench.suite import load_suite, suite_from_data

PM = PluginManager()
OP = PM.registry.op("attention")

KEYS = ["version", "name", "description", "op", "backends", "check", "timing", "grid", "devices", "integrity",
        "seeds", "max_rows", "tolerance", "fp32", "bf16", "warmup_time", "min_samples", "max_time", "rotate",
        "case_timeout", "batch", "seqlen", "seqlen_q,seqlen_kv", "heads", "heads_q,heads_kv", "head_dim", "causal",
        "dtype", "cpu", "cuda", "memory_limit", "static_checks", "forbidden_calls", "cache_ratio", "bogus"]

scalars = (st.none() | st.booleans() | st.integers(-3, 70) | st.floats(allow_nan=True, allow_infinity=True)
           | st.sampled_from(["fp32", "bf16", "fp64", "smoke", "*", "2GiB", "lots", "all", "", "a,b"])
           | st.text(max_size=6))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=4), inner, max_size=4),
                      max_leaves=12)

def mostly(valid, junk=values):
    """Valid values most of the time, anything now and then: finds the paths past the schema."""
    return st.integers(0, 19).flatmap(lambda i: junk if i == 0 else valid)


small = st.integers(1, 9)
seq = st.one_of(st.fixed_dictionaries({"seqlen": mostly(small | st.lists(small, min_size=1, max_size=2))}),
                st.fixed_dictionaries({"seqlen_q,seqlen_kv": mostly(st.lists(st.lists(small, min_size=2, max_size=2),
                                                                             min_size=1, max_size=2))}))
heads = st.one_of(st.fixed_dictionaries({"heads": mostly(st.sampled_from([1, 2, 4]))}),
                  st.fixed_dictionaries({"heads_q,heads_kv": mostly(st.lists(
                      st.tuples(st.sampled_from([2, 3, 4]), st.sampled_from([1, 2])).map(list), min_size=1,
                      max_size=2))}))
rest = st.fixed_dictionaries({"head_dim": mostly(small)}, optional={
    "batch": mostly(small | st.lists(small, min_size=1, max_size=2)),
    "causal": mostly(st.booleans() | st.lists(st.booleans(), min_size=1, max_size=2)),
    "dtype": mostly(st.sampled_from(["fp32", "fp16", "bf16"]))})
grid_entry = st.builds(lambda *parts: {k: v for p in parts for k, v in p.items()}, seq, heads, rest)
timing = st.fixed_dictionaries({}, optional={k: mostly(st.floats(0.001, 5)) for k in
                                             ("warmup_time", "min_time", "max_time", "case_timeout")}
                               | {k: mostly(st.integers(1, 20)) for k in ("min_samples", "rotate", "warmup_calls")})
check = st.fixed_dictionaries({}, optional={"seeds": mostly(st.integers(1, 5)), "max_rows": mostly(st.integers(2, 9)),
                                            "tolerance": mostly(st.dictionaries(st.sampled_from(["fp32", "bf16"]),
                                                                                st.floats(1e-6, 1)))})
integrity = st.fixed_dictionaries({}, optional={
    "static_checks": mostly(st.sampled_from(["untrusted", "all", "none"])),
    "memory_limit": mostly(st.sampled_from(["2GiB", "512MiB", 10**9, "1.5G"])),
    "forbidden_calls": mostly(st.lists(st.text(min_size=1, max_size=5), max_size=2)),
    "extra_forbidden_calls": mostly(st.lists(st.text(min_size=1, max_size=5), max_size=2)),
    "cache_ratio": mostly(st.floats(0, 10)), "forbid_exec": mostly(st.booleans())})
suites = st.fixed_dictionaries(
    {"name": mostly(st.sampled_from(["fuzz", "smoke-2"])), "grid": mostly(st.lists(grid_entry, min_size=1, max_size=3))},
    optional={"check": mostly(check),
              "timing": mostly(timing), "integrity": mostly(integrity), "backends": mostly(st.lists(
                  st.sampled_from(["numpy", "!numpy*", "*"]), max_size=2)),
              "devices": mostly(st.fixed_dictionaries({"cpu": st.fixed_dictionaries(
                  {}, optional={"grid": st.lists(grid_entry, min_size=1, max_size=2), "timing": timing})})),
              "version": mostly(st.just(1)), "op": mostly(st.just("attention"))})


def load_everything(data):
    """Load, plan for the CPU (grid expansion, settings) and read the integrity section, as `kbench run` does."""
    suite = suite_from_data(data, path="fuzz.yaml")
    suite.plan("cpu", OP)
    integrity_settings(suite)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(suites)
def test_structured_suites_load_or_raise_bad_input(data):
    try:
        load_everything(data)
    except BadInput as exc:
        assert exc.file == "fuzz.yaml" and exc.message


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(values)
def test_any_document_loads_or_raises_bad_input(data):
    try:
        load_everything(data)
    except BadInput:
        pass


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.text(alphabet=st.sampled_from(list("name: grid-[]{},'\"\n\t #&*!|>%@`0123456789seqlnhdx")), max_size=120))
def test_any_text_file_loads_or_raises_bad_input(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("fuzz") / "suite.yaml"
    path.write_text(text)
    try:
        load_everything_from(path)
    except BadInput as exc:
        assert exc.file == str(path)


def load_everything_from(path):
    suite = load_suite(path)
    suite.plan("cpu", OP)
    integrity_settings(suite)


@pytest.mark.parametrize("data", [
    {"name": "x", "grid": [{"seqlen": 8, "heads": 1, "head_dim": 4}], "integrity": {"memory_limit": "lots"}},
    {"name": "x", "grid": [{"seqlen": 8, "heads": 1, "head_dim": 4}], "integrity": {"static_checks": "some"}},
    {"name": "x", "grid": [{"seqlen": 8, "heads": 1, "head_dim": 4}], "integrity": {"forbidden_calls": "sdpa"}},
    {"name": "x", "grid": [{"seqlen": 8, "heads": 1, "head_dim": 4}], "timing": {"case_timeout": 0}},
])
def test_bad_integrity_and_timeout_settings_name_the_place(data):
    with pytest.raises(BadInput) as err:
        load_everything(data)
    assert "fuzz.yaml" in str(err.value) and ("integrity" in str(err.value) or "case_timeout" in str(err.value))
