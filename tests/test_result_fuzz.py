"""Fuzzing the result loader: whatever a result file holds, `load_result` gives a result that `show` can print,
or a BadInput, never a traceback. Like tests/test_fuzz.py for suites."""
from __future__ import annotations

import copy
import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kbench.compare import Settings, compare_runs
from kbench.errors import BadInput
from kbench.results import load_result
from kbench.tables import records_table, status_summary

ROOT = Path(__file__).resolve().parent.parent


def _reference() -> dict:
    """A real result file (the committed CPU reference run), cut to a few records of each status."""
    path = next(p for p in sorted((ROOT / "results").glob("*/*.json")) if p.name != "calibration.json")
    data = json.loads(path.read_text())
    by_status: dict[str, list] = {}
    for rec in data["records"]:
        by_status.setdefault(rec["status"], []).append(rec)
    data["records"] = [r for recs in by_status.values() for r in recs[:2]]
    return data


REFERENCE = _reference()

json_scalars = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True, allow_infinity=True)
                | st.text(max_size=8) | st.sampled_from(["passed", "failed", "fast", "noise_target", "kbench-result"]))
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=10)


def leaf_paths(obj, path=()):
    """Every path in ``obj`` (to dict entries and list items), leaves and inner nodes alike."""
    yield path
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from leaf_paths(v, path + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from leaf_paths(v, path + (i,))


PATHS = [p for p in leaf_paths(REFERENCE) if p and not (len(p) > 3 and p[0] == "suite")]


def mutate(data, path, how, value):
    parent = data
    for part in path[:-1]:
        parent = parent[part]
    key = path[-1]
    if how == "replace":
        parent[key] = value
    elif how == "delete":
        if isinstance(parent, dict):
            del parent[key]
        else:
            parent.pop(key)
    elif how == "nest":
        parent[key] = [[[[[[[[[[[[parent[key]]]]]]]]]]]]]


def load_and_show(path: Path) -> None:
    try:
        data = load_result(path)
    except BadInput as exc:
        assert exc.file == str(path) and exc.message and exc.exit_code == 2
        return
    # a loaded result is one `show` and `compare` can use
    for fmt in ("table", "csv", "json"):
        records_table(data["records"], fmt)
    status_summary(data["records"])
    compare_runs(data, data, Settings())


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.sampled_from(PATHS), st.sampled_from(["replace", "replace", "replace", "delete", "nest"]), json_values)
def test_near_valid_result_files_load_or_raise_bad_input(tmp_path_factory, path, how, value):
    data = copy.deepcopy(REFERENCE)
    mutate(data, path, how, value)
    out = tmp_path_factory.mktemp("fuzz") / "r.json"
    out.write_text(json.dumps(data))  # NaN and Infinity go in as the literals Python's json writes
    load_and_show(out)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(json_values | st.fixed_dictionaries({"format": st.just("kbench-result"), "version": st.sampled_from([1, 2])},
                                           optional={k: json_values for k in REFERENCE if k not in ("format", "version")}))
def test_any_json_loads_or_raises_bad_input(tmp_path_factory, value):
    out = tmp_path_factory.mktemp("fuzz") / "r.json"
    out.write_text(json.dumps(value))
    load_and_show(out)


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.binary(max_size=200) | st.text(alphabet=st.sampled_from(list('{}[]":,0123456789.eE-NaIfinty truefalsn\\')),
                                         max_size=200))
def test_any_bytes_load_or_raise_bad_input(tmp_path_factory, content):
    out = tmp_path_factory.mktemp("fuzz") / "r.json"
    (out.write_bytes if isinstance(content, bytes) else out.write_text)(content)
    load_and_show(out)


def test_the_reference_itself_loads(tmp_path):
    # the fuzz above starts from a valid file: mutations, not a broken start, are what it tests
    path = tmp_path / "ref.json"
    path.write_text(json.dumps(REFERENCE))
    assert len(load_result(path)["records"]) == len(REFERENCE["records"]) >= 2
