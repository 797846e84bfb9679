"""Tunables from suites and the CLI: validated by the Backend base class, separate named records."""
from __future__ import annotations

import json
import pickle
import textwrap

import pytest
from click.testing import CliRunner

from kbench.backends import Backend, Tunable
from kbench.cli import cli
from kbench.errors import BadInput
from kbench.plugins import PluginManager
from kbench.selection import BackendPattern, format_settings
from kbench.suite import load_suite, suite_from_data

TINY_GRID = [{"batch": 1, "seqlen": [40], "heads": 2, "head_dim": 16, "causal": [False, True], "dtype": "fp32"}]


@pytest.fixture(scope="module")
def pm():
    return PluginManager(load_entry_points=False)


@pytest.fixture
def flash(pm):
    return pm.registry.backends["numpy-flash"]


# --------------------------------------------------------------------------------------------
# validation in the base class


def test_configure_names_copies_and_records_the_settings(flash):
    configured = flash.configure({"block_k": 32, "block_q": 64})
    assert configured.name == "numpy-flash[block_q=64,block_k=32]"  # declaration order: one name per setting
    assert configured.base_name == "numpy-flash" and configured.setting("block_q") == 64
    assert configured.info()["tunables"] == {"block_q": 64, "block_k": 32}
    assert flash.name == "numpy-flash" and flash.info()["tunables"] == {"block_q": 128, "block_k": 128}
    assert flash.configure({}) is flash
    again = configured.configure({"block_q": 16})  # configuring a configured backend replaces, not appends
    assert again.name == "numpy-flash[block_q=16,block_k=32]"


@pytest.mark.parametrize("settings, message, fix", [
    ({"blok_q": 64}, "backend 'numpy-flash' has no tunable 'blok_q'",
     "its tunables: block_q (one of 16, 32, 64, 128, 256, 512, 1024), block_k"),
    ({"block_q": 48}, "backend 'numpy-flash', tunable 'block_q': 48 is not one of the choices",
     "use one of 16, 32, 64, 128, 256, 512, 1024 (default 128)"),
    ({"block_q": "64"}, "tunable 'block_q': '64' is a str, not one of the choices", "use one of 16, 32"),
    ({"block_q": 64.0}, "tunable 'block_q': 64.0 is a float, not one of the choices", "use one of 16, 32"),
])
def test_bad_settings_name_the_backend_the_tunable_and_the_choices(flash, settings, message, fix):
    with pytest.raises(BadInput) as err:
        flash.configure(settings, file="suite.yaml", where="line 3")
    text = err.value.format()
    assert message in text and fix in text and text.startswith("suite.yaml: line 3:")


def test_a_backend_without_tunables_says_so(pm):
    with pytest.raises(BadInput, match="'numpy' declares no tunables"):
        pm.registry.backends["numpy"].configure({"block_q": 64})


def test_tunables_without_choices_check_the_type():
    class Knob(Backend):
        name = "knob"
        tunables = {"warps": Tunable(4, (), "warps"), "ratio": Tunable(0.5), "mode": Tunable(None)}

        def prepare(self, case):
            raise NotImplementedError

    knob = Knob()
    assert knob.configure({"warps": 8, "ratio": 1, "mode": "x"}).name == "knob[warps=8,ratio=1,mode=x]"
    for bad, said in (({"warps": "8"}, "expects a int, got str 8"), ({"warps": True}, "expects a int, got bool"),
                      ({"ratio": "a"}, "expects a float, got str a")):
        with pytest.raises(BadInput, match=said):
            knob.configure(bad)


def test_constructor_settings_check_names_only():
    from kbench.builtin.numpy_backends import NumpyFlashAttention

    assert NumpyFlashAttention(block_q=8).setting("block_q") == 8  # off-grid values for tests are allowed
    with pytest.raises(TypeError, match="no tunable.*blok"):
        NumpyFlashAttention(blok=8)


# --------------------------------------------------------------------------------------------
# patterns: -b 'name[k=v]' and suite entries


def test_patterns_parse_settings_with_yaml_types():
    p = BackendPattern.parse("numpy-flash[block_q=64, block_k=32]")
    assert (p.pattern, p.settings, p.exclude) == ("numpy-flash", (("block_q", 64), ("block_k", 32)), False)
    assert p == "numpy-flash[block_q=64,block_k=32]"
    assert BackendPattern.parse("x[a=true,b=null,c=fast,d=0.5]").settings == (
        ("a", True), ("b", None), ("c", "fast"), ("d", 0.5))
    # an fnmatch character class is not settings
    assert BackendPattern.parse("numpy-[f]lash").pattern == "numpy-[f]lash"
    assert BackendPattern.parse("!numpy*").exclude
    with pytest.raises(BadInput, match="cannot read the setting '=64'"):
        BackendPattern.parse("numpy-flash[=64]")
    assert format_settings({"a": True, "b": None}) == "a=true,b=null"


def test_several_settings_of_one_backend_are_separate_backends(pm):
    chosen = pm.registry.select_backends("attention", ["numpy-flash[block_q=16]", "numpy-flash[block_q=64]", "numpy"])
    assert [b.name for b in chosen] == ["numpy", "numpy-flash[block_q=16]", "numpy-flash[block_q=64]"]
    assert [b.setting("block_q") for b in chosen[1:]] == [16, 64]
    # an exclusion with settings removes exactly that one; without, every setting of the backend
    some = pm.registry.select_backends("attention", ["numpy-flash[block_q=16]", "numpy-flash[block_q=64]",
                                                     "!numpy-flash[block_q=16]"])
    assert [b.name for b in some] == ["numpy-flash[block_q=64]"]
    assert pm.registry.select_backends("attention", ["numpy-flash[block_q=16]", "!numpy-flash"]) == []
    kept = pm.registry.select_backends("attention", ["numpy", "numpy-flash[block_q=16]", "!numpy*[block_q=16]"])
    assert [b.name for b in kept] == ["numpy"]  # numpy has no block_q: the exclusion passes it by
    with pytest.raises(BadInput, match="no backend of op 'attention' matches 'numpy-flsh'.*did you mean 'numpy-flash'"):
        pm.registry.select_backends("attention", ["numpy-flsh[block_q=16]"])


def test_a_glob_with_settings_configures_the_backends_declaring_them(pm):
    # numpy matches the glob but has no block_q: skipped, not an error
    assert [b.name for b in pm.registry.select_backends("attention", ["numpy*[block_q=32]"])] == \
        ["numpy-flash[block_q=32]"]
    with pytest.raises(BadInput, match="no backend of op 'attention' matching 'numpy\\*' declares threads"):
        pm.registry.select_backends("attention", ["numpy*[threads=4]"])
    with pytest.raises(BadInput, match="'numpy' declares no tunables"):  # an exact name is not a glob
        pm.registry.select_backends("attention", ["numpy[block_q=32]"])


def test_resolve_and_pickle_rebuild_a_configured_backend_by_name(pm):
    backend = pm.registry.resolve("numpy-flash[block_q=64]")
    assert backend.name == "numpy-flash[block_q=64]" and backend.setting("block_q") == 64
    assert pm.registry.resolve(backend.name).settings == backend.settings
    copy = pickle.loads(pickle.dumps(backend))  # how workers receive backends not registered by that name
    assert copy.name == backend.name and copy.info()["tunables"] == {"block_q": 64, "block_k": 128}
    with pytest.raises(BadInput, match="unknown backend 'numpy-flsh'"):
        pm.registry.resolve("numpy-flsh[block_q=64]")


def test_suite_entries_carry_settings_and_their_place(pm, tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent("""\
        name: s
        backends:
          - numpy
          - {name: numpy-flash, tunables: {block_q: 16}}
          - name: numpy-flash
            tunables: {block_q: 48}
        grid:
          - {seqlen: 32, heads: 1, head_dim: 16}
    """))
    suite = load_suite(path)
    plan = suite.plan("cpu", pm.registry.op("attention"))
    assert plan.backends == ["numpy", "numpy-flash[block_q=16]", "numpy-flash[block_q=48]"]
    with pytest.raises(BadInput) as err:
        pm.registry.select_backends("attention", plan.backends)
    text = err.value.format()
    assert str(path) in text and "line 5" in text and "tunable 'block_q': 48 is not one of the choices" in text


def test_the_schema_refuses_a_misspelled_entry_key():
    with pytest.raises(BadInput, match="tunable"):
        suite_from_data({"name": "x", "grid": [{"seqlen": 8}], "backends": [{"name": "numpy", "tunable": {}}]})


# --------------------------------------------------------------------------------------------
# end to end, with workers (the default): the CLI, a suite file, compare


def _tiny_suite(tmp_path, backends=None):
    path = tmp_path / "tiny.yaml"
    data = {"name": "tiny", "op": "attention", "check": {"seeds": 1},
            "timing": {"warmup_time": 0.0, "min_samples": 3, "min_time": 0.0, "max_time": 0.05}, "grid": TINY_GRID}
    if backends is not None:
        data["backends"] = backends
    path.write_text(json.dumps(data))  # JSON is YAML
    return path


def _records(path):
    return json.loads(path.read_text())["records"]


def _check_two_settings(out):
    recs = _records(out)
    assert {(r["backend"], r["status"]) for r in recs} == {
        ("numpy-flash[block_q=16]", "passed"), ("numpy-flash[block_q=64]", "passed")}
    # backend_info comes from info() called where the kernel ran (a worker): the settings got there
    for r in recs:
        assert r["backend_info"]["tunables"]["block_q"] == int(r["backend"].split("=")[1].rstrip("]"))
    assert len(recs) == 4


def test_run_with_two_settings_from_the_cli_then_compare(tmp_path):
    runner = CliRunner()
    out = tmp_path / "r.json"
    res = runner.invoke(cli, ["run", str(_tiny_suite(tmp_path)), "-b", "numpy-flash[block_q=16]",
                              "-b", "numpy-flash[block_q=64]", "-o", str(out)])
    assert res.exit_code == 0, res.output
    _check_two_settings(out)
    assert json.loads(out.read_text())["selection"]["isolate"] is True
    cmp = runner.invoke(cli, ["compare", str(out), "--baseline", "numpy-flash[block_q=16]"])
    assert cmp.exit_code == 0, cmp.output
    assert "numpy-flash[block_q=64] vs numpy-flash[block_q=16]" in cmp.output


def test_run_with_two_settings_from_a_suite_file(tmp_path):
    suite = _tiny_suite(tmp_path, [{"name": "numpy-flash", "tunables": {"block_q": 16}},
                                   {"name": "numpy-flash", "tunables": {"block_q": 64}}])
    out = tmp_path / "r.json"
    res = CliRunner().invoke(cli, ["run", str(suite), "-o", str(out)])
    assert res.exit_code == 0, res.output
    _check_two_settings(out)


def test_a_bad_setting_on_the_command_line_is_exit_2_before_any_measurement(tmp_path):
    out = tmp_path / "r.json"
    res = CliRunner().invoke(cli, ["run", str(_tiny_suite(tmp_path)), "-b", "numpy-flash[block_q=48]",
                                   "-o", str(out)])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "-b: backend 'numpy-flash', tunable 'block_q': 48 is not one of the choices" in res.output
    assert "fix: use one of 16, 32, 64" in res.output and not out.exists()
