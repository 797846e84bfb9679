"""Suite files: schema validation with located messages, grid expansion, per-device plans."""
from __future__ import annotations

import textwrap

import pytest

from kbench.errors import BadInput
from kbench.plugins import PluginManager
from kbench.suite import expand_grid, load_suite


@pytest.fixture(scope="module")
def pm():
    return PluginManager(load_entry_points=False)


@pytest.fixture
def write(tmp_path):
    def _write(text, name="s.yaml"):
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path
    return _write


def test_cartesian_product_and_scalars(pm):
    cases = expand_grid([{"seqlen": [64, 128], "heads": 2, "head_dim": [32, 64], "causal": [False, True]}],
                        pm.registry.op("attention"))
    assert len(cases) == 8
    assert {c["seqlen_q"] for c in cases} == {64, 128}
    assert all(c["seqlen_q"] == c["seqlen_kv"] and c["heads_q"] == c["heads_kv"] == 2 for c in cases)


def test_tied_parameters_move_together(pm):
    grid = [{"batch,seqlen": [[4, 256], [2, 512], [1, 1024]], "heads_q,heads_kv": [[8, 8], [8, 2]], "head_dim": 64}]
    cases = expand_grid(grid, pm.registry.op("attention"))
    assert len(cases) == 6
    assert {c["batch"] * c["seqlen_q"] for c in cases} == {1024}  # total tokens fixed
    assert {(c["heads_q"], c["heads_kv"]) for c in cases} == {(8, 8), (8, 2)}


def test_union_of_entries_deduplicates(pm):
    op = pm.registry.op("attention")
    grid = [{"seqlen": [64, 128], "heads": 2, "head_dim": 32}, {"seqlen": 64, "heads": 2, "head_dim": 32}]
    ids = [c.id for c in expand_grid(grid, op)]
    assert len(ids) == 2 and len(set(ids)) == 2


def test_case_id_is_readable_and_stable(pm):
    case = pm.registry.op("attention").make_case(
        {"batch": 2, "seqlen": 8192, "heads": 16, "head_dim": 128, "causal": True, "dtype": "bf16"})
    assert case.id == "attention[b=2,sq=8192,sk=8192,hq=16,hkv=16,d=128,causal,bf16]"


def test_per_device_grid_and_settings(write, pm):
    path = write("""
        name: t
        timing: {max_time: 2.0, min_samples: 7}
        grid:
          - {seqlen: 64, heads: 2, head_dim: 32}
        devices:
          cpu:
            timing: {max_time: 0.5}
            check: {seeds: 4}
            grid:
              - {seqlen: [16, 32], heads: 1, head_dim: 16}
          cuda:
            backends: ["torch-*"]
    """)
    suite = load_suite(path)
    op = pm.registry.op("attention")
    cpu = suite.plan("cpu", op)
    assert [c["seqlen_q"] for c in cpu.cases] == [16, 32]
    assert cpu.timing.max_time == 0.5 and cpu.timing.min_samples == 7 and cpu.check.seeds == 4
    cuda = suite.plan("cuda", op)
    assert [c["seqlen_q"] for c in cuda.cases] == [64]  # falls back to the top-level grid
    assert cuda.backends == ["torch-*"] and cuda.timing.max_time == 2.0


@pytest.mark.parametrize("text, where, fix", [
    ("name: t\ngrid:\n  - {seqlen: 64, heads: 2, head_dim: 32}\ntimming: {}\n", "line 4", "allowed keys"),
    ("name: t\ngrid:\n  - seqlen: 64\n    heads: 2\n    head_dim: 32\n    causal: [false, true]\ncheck:\n  seeds: 0\n",
     "check.seeds (line 8)", "fresh random inputs"),
    ("name: t\ngrid: []\n", "grid (line 2)", ""),
    ("name: t\n", "(top level)", "add a top-level `grid:`"),
    ("name: t\ngrid:\n  - {seqlen: 64, heads: 2, head_dim: 32\n", "line 4", "indentation"),
])
def test_schema_and_yaml_errors_name_file_place_and_fix(write, text, where, fix):
    path = write(text)
    with pytest.raises(BadInput) as err:
        load_suite(path)
    msg = err.value.format()
    assert str(path) in msg and where in msg and fix in msg
    assert err.value.exit_code == 2


def test_invalid_case_names_the_grid_entry(write, pm):
    path = write("""
        name: t
        grid:
          - {seqlen: 64, heads: 2, head_dim: 32}
          - {seqlen: 64, "heads_q,heads_kv": [[6, 4]], head_dim: 32}
    """)
    with pytest.raises(BadInput) as err:
        load_suite(path).plan("cpu", pm.registry.op("attention"))
    assert "grid[1] (line 5)" in err.value.format() and "not a multiple" in err.value.format()


def test_unknown_parameter_lists_known_ones(write, pm):
    path = write("name: t\ngrid:\n  - {seqlen: 64, heads: 2, head_dim: 32, headdim: 4}\n")
    with pytest.raises(BadInput, match="unknown parameter 'headdim'.*head_dim"):
        load_suite(path).plan("cpu", pm.registry.op("attention"))


def test_tied_row_of_wrong_length(write, pm):
    path = write('name: t\ngrid:\n  - {"batch,seqlen": [[1, 64], [2]], heads: 2, head_dim: 32}\n')
    with pytest.raises(BadInput, match=r"rows of 2 values"):
        load_suite(path).plan("cpu", pm.registry.op("attention"))


def test_newer_suite_version_is_refused(write):
    with pytest.raises(BadInput, match="newer than this kbench"):
        load_suite(write("version: 99\nname: t\ngrid:\n  - {seqlen: 1, heads: 1, head_dim: 1}\n"))


def test_missing_device_grid_says_which_exist(write, pm):
    path = write("name: t\ndevices:\n  cuda:\n    grid:\n      - {seqlen: 64, heads: 2, head_dim: 32}\n")
    with pytest.raises(BadInput, match="(?s)no grid for device 'cpu'.*cuda"):
        load_suite(path).plan("cpu", pm.registry.op("attention"))


@pytest.mark.parametrize("suite", ["suites/smoke.yaml", "suites/attention.yaml"])
def test_shipped_suites_expand(suite, pm):
    s = load_suite(suite)
    plan = s.plan("cpu", pm.registry.op(s.op))
    assert plan.cases and all(c.id.startswith(s.op) for c in plan.cases)
