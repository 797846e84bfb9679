"""Plugin discovery and the registration contract."""
from __future__ import annotations

import inspect
import json
import sys
import textwrap

import pytest

import kbench
from kbench import hookspecs
from kbench.errors import PluginError
from kbench.plugins import (DEFAULT_PLUGINS, PluginManager, PluginWarning, format_plugin_report, looks_like_kbench_group,
                            plugin_report)
from kbench.registry import RegistrationWarning


def write_module(tmp_path, name, body):
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
    return name


BACKEND_PLUGIN = """
    import kbench
    from kbench.backends import Backend

    class Copy(Backend):
        name = "{name}"
        def prepare(self, case):
            def run(q, k, v, out):
                out[...] = q
            return run

    @kbench.hookimpl
    def kbench_register_backends(registry):
        registry.add_backend(Copy())
"""


@pytest.fixture
def on_path(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for mod in [m for m in sys.modules if m.startswith("kbtest_")]:
        del sys.modules[mod]


def test_default_plugins_register_through_hooks():
    pm = PluginManager(load_entry_points=False)
    assert [i.module for i in pm.infos] == list(DEFAULT_PLUGINS)
    assert {"numpy", "numpy-flash"} <= set(pm.registry.backends)
    assert pm.registry.owner("backend", "numpy") == "kbench.builtin.numpy_backends"
    assert "attention" in pm.registry.ops and "cpu" in pm.registry.devices


def test_dash_p_module_adds_backend(on_path):
    mod = write_module(on_path, "kbtest_extra", BACKEND_PLUGIN.format(name="extra-copy"))
    pm = PluginManager([mod], load_entry_points=False)
    assert pm.registry.owner("backend", "extra-copy") == "kbtest_extra"


def test_kbench_plugins_env(on_path, monkeypatch):
    mod = write_module(on_path, "kbtest_env", BACKEND_PLUGIN.format(name="env-copy"))
    monkeypatch.setenv("KBENCH_PLUGINS", mod)
    pm = PluginManager(load_entry_points=False)
    assert "env-copy" in pm.registry.backends


def test_entry_point_discovery_and_disable(on_path, monkeypatch):
    write_module(on_path, "kbtest_ep", BACKEND_PLUGIN.format(name="ep-copy"))
    dist = on_path / "kbtest_ep_dist-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: kbtest-ep-dist\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[kbench]\nepname = kbtest_ep\n")
    pm = PluginManager()
    assert pm.registry.owner("backend", "ep-copy") == "epname"
    info = next(i for i in pm.infos if i.name == "epname")
    assert "kbtest-ep-dist" in info.source
    monkeypatch.setenv("KBENCH_DISABLE_PLUGINS", "epname")
    assert "ep-copy" not in PluginManager().registry.backends


def test_broken_plugin_names_itself_and_the_cause(on_path):
    mod = write_module(on_path, "kbtest_broken", "import module_that_does_not_exist_xyz\n")
    with pytest.raises(PluginError) as err:
        PluginManager([mod], load_entry_points=False)
    text = err.value.format()
    assert "kbtest_broken" in text and "module_that_does_not_exist_xyz" in text
    assert "KBENCH_DISABLE_PLUGINS=kbtest_broken" in text


def test_duplicate_backend_names_both_plugins(on_path):
    a = write_module(on_path, "kbtest_dup_a", BACKEND_PLUGIN.format(name="twin"))
    b = write_module(on_path, "kbtest_dup_b", BACKEND_PLUGIN.format(name="twin"))
    with pytest.raises(PluginError) as err:
        PluginManager([a, b], load_entry_points=False)
    assert "kbtest_dup_a" in str(err.value) and "kbtest_dup_b" in str(err.value)


def test_duplicate_of_a_builtin_blames_the_later_plugin(on_path):
    mod = write_module(on_path, "kbtest_dup_builtin", BACKEND_PLUGIN.format(name="numpy"))
    with pytest.raises(PluginError) as err:
        PluginManager([mod], load_entry_points=False)
    text = err.value.format()
    # plugins register in the documented order: built-ins first, so the -p plugin is the duplicate
    assert "registered by plugin 'kbench.builtin.numpy_backends' and again by plugin 'kbtest_dup_builtin'" in text
    assert "KBENCH_DISABLE_PLUGINS=kbtest_dup_builtin" in text


def test_registration_hooks_run_in_plugin_order(on_path):
    a = write_module(on_path, "kbtest_order_a", BACKEND_PLUGIN.format(name="first"))
    b = write_module(on_path, "kbtest_order_b", BACKEND_PLUGIN.format(name="second"))
    pm = PluginManager([a, b], load_entry_points=False)
    names = list(pm.registry.backends)
    assert [i.name for i in pm.infos][-2:] == [a, b]
    assert names.index("numpy") < names.index("first") < names.index("second")


def test_plugin_raising_in_a_hook_is_named(on_path):
    mod = write_module(on_path, "kbtest_raiser", """
        import kbench
        @kbench.hookimpl
        def kbench_register_backends(registry):
            raise RuntimeError("boom")
    """)
    with pytest.raises(PluginError, match="kbtest_raiser.*kbench_register_backends.*boom"):
        PluginManager([mod], load_entry_points=False)


def test_unknown_hook_name_is_rejected(on_path):
    mod = write_module(on_path, "kbtest_typo", """
        import kbench
        @kbench.hookimpl
        def kbench_register_backend(registry):
            pass
    """)
    with pytest.raises(PluginError, match="kbtest_typo"):
        PluginManager([mod], load_entry_points=False)


def _hookspecs():
    return [(n, f) for n, f in inspect.getmembers(hookspecs, inspect.isfunction) if n.startswith("kbench_")]


def test_every_hook_is_documented():
    specs = _hookspecs()
    assert len(specs) >= 7
    for name, fn in specs:
        assert fn.__doc__ and len(fn.__doc__.strip()) > 40, f"{name} needs a docstring"
        assert name.startswith("kbench_")


def test_every_hook_has_a_shipped_implementation():
    pm = PluginManager()
    implemented = {name for name, _ in _hookspecs() if getattr(pm.hook, name).get_hookimpls()}
    # every hook the core defines has at least one real implementation shipped with kbench or its plugins
    assert implemented == {name for name, _ in _hookspecs()}


def test_firstresult_detection_prefers_later_plugins(on_path):
    mod = write_module(on_path, "kbtest_detect", """
        import kbench
        from kbench.hardware import HardwareProfile
        @kbench.hookimpl
        def kbench_detect_hardware(device, registry):
            return HardwareProfile(name="mine", title="Mine", kind="cpu", peak_flops={"fp32": 1e12},
                                   bandwidth=1e11, capacity=1e9)
    """)
    pm = PluginManager([mod], load_entry_points=False)
    assert pm.detect_hardware(pm.registry.devices["cpu"]).name == "mine"
    assert PluginManager(load_entry_points=False).detect_hardware(pm.registry.devices["cpu"]).name != "mine"


def test_hookimpl_marker_is_public():
    assert kbench.hookimpl.project_name == "kbench"


def test_imported_by_sees_what_an_import_pulls_in():
    from kbench.testing import imported_by

    # kbench.cli imports click, never torch: the helper must tell the two apart
    assert imported_by(["kbench.cli"], ("click", "torch")) == ["click"]
    assert imported_by(["kbench.builtin.numpy_backends"], ("torch", "cupy", "triton", "litellm")) == []


# --------------------------------------------------------------------------------------------
# mistakes that used to pass in silence, each with its message


def test_module_without_hookimpl_warns_naming_the_functions(on_path):
    mod = write_module(on_path, "kbtest_nomark", BACKEND_PLUGIN.format(name="nomark").replace("    @kbench.hookimpl\n", ""))
    with pytest.warns(PluginWarning, match="'kbtest_nomark'.*kbench_register_backends is not decorated with "
                                           "@kbench.hookimpl, so kbench ignores it"):
        pm = PluginManager([mod], load_entry_points=False)
    assert "nomark" not in pm.registry.backends


def test_module_with_no_hooks_at_all_warns(on_path):
    mod = write_module(on_path, "kbtest_empty", "X = 1\n")
    with pytest.warns(PluginWarning, match="'kbtest_empty'.*implements no kbench hook: it registers nothing"):
        PluginManager([mod], load_entry_points=False)


def test_entry_point_in_a_mistyped_group_is_reported(on_path):
    write_module(on_path, "kbtest_group", BACKEND_PLUGIN.format(name="grouped"))
    dist = on_path / "kbtest_group_dist-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: kbtest-group-dist\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[kbench.plugins]\nmine = kbtest_group\n")
    with pytest.warns(PluginWarning, match="entry point mine = kbtest_group \\(distribution kbtest-group-dist 1.0\\) "
                                           "is in group 'kbench.plugins', which kbench does not read"):
        pm = PluginManager()
    assert "grouped" not in pm.registry.backends
    report = plugin_report(pm)
    assert {"group": "kbench.plugins", "name": "mine", "value": "kbtest_group",
            "where": "distribution kbtest-group-dist 1.0"} in report["misplaced"]
    numpy = next(p for p in report["plugins"] if p["name"] == "kbench.builtin.numpy_backends")
    assert numpy["source"] == "default" and numpy["hooks"] == ["kbench_register_backends"]
    assert numpy["registered"] == {"backend": ["numpy", "numpy-flash"]}
    text = format_plugin_report(report)  # what `kbench list --plugins` prints
    assert ("NOT LOADED: entry point mine = kbtest_group (distribution kbtest-group-dist 1.0) is in group "
            "'kbench.plugins'; kbench reads group 'kbench'") in text
    row = next(line for line in text.splitlines() if line.startswith("kbench.builtin.numpy_backends"))
    assert "default" in row and "backend: numpy, numpy-flash" in row
    assert json.loads(format_plugin_report(report, "json")) == report


@pytest.mark.parametrize("group, typo", [("kbench.plugins", True), ("kbench-plugins", True), ("Kbench", True),
                                         ("kbnech", True), ("kbench", False), ("kbench_evolve.operators", False),
                                         ("pytest11", False), ("console_scripts", False)])
def test_group_typo_detection(group, typo):
    assert looks_like_kbench_group(group) is typo


#: a backend plugin with class attributes or methods of the test's choosing in place of ``{attrs}``
ODD_BACKEND = BACKEND_PLUGIN.replace('name = "{name}"', 'name = "odd"\n        {attrs}')


@pytest.mark.parametrize("attrs, message", [
    ('op = "attenton"', "plugin 'kbtest_odd', backend 'odd': unknown op 'attenton' \\(did you mean 'attention'\\?\\)"
                        ".*fix: set `op` to one of: attention, attention_varlen, decode_attention"),
    ('device = "CPU"', "plugin 'kbtest_odd', backend 'odd': device 'CPU' is not a device name \\(did you mean "
                       "'cpu'\\?\\).*fix: device names are lowercase; known devices: cpu"),
    ("def supports(self, case) -> bool:\n            return True",
     "backend 'odd': supports\\(\\) is declared to return bool.*returns None for yes and a reason string"),
])
def test_registration_checks_name_plugin_backend_and_known_names(on_path, attrs, message):
    mod = write_module(on_path, "kbtest_odd", ODD_BACKEND.replace("{attrs}", attrs))
    with pytest.raises(PluginError, match=f"(?s){message}"):
        PluginManager([mod], load_entry_points=False)


def test_a_device_no_plugin_provides_warns_and_is_kept(on_path):
    mod = write_module(on_path, "kbtest_odd", ODD_BACKEND.replace("{attrs}", 'device = "tpu"'))
    with pytest.warns(RegistrationWarning, match="backend 'odd': device 'tpu' is not registered by any plugin"):
        pm = PluginManager([mod], load_entry_points=False)
    assert pm.registry.backends["odd"].device == "tpu"


@pytest.mark.parametrize("method, answer, said", [
    ("supports(self, case)", "True", "supports() returned True (bool)"),
    ("supports(self, case)", "False", "supports() returned False (bool)"),
    ("available(self)", "True", "available() returned True (bool)"),
    ("available(self)", '""', "available() returned '' (str)"),
    ("info(self)", '"v1"', "info() returned str, not a dict"),
])
def test_bool_answers_are_errors_naming_the_plugin_never_skips(on_path, method, answer, said):
    from kbench.testing import check_backend, make_case

    mod = write_module(on_path, "kbtest_bool", ODD_BACKEND.replace(
        "{attrs}", f"def {method}:\n            return {answer}"))
    pm = PluginManager([mod], load_entry_points=False)
    rec = check_backend(pm, pm.registry.backends["odd"], make_case(pm))
    assert rec["status"] == "error", rec  # never "skipped: True", never counted as supported
    assert said in rec["reason"] and "backend 'odd' of plugin 'kbtest_bool'" in rec["reason"]


def test_error_records_point_at_their_traceback(on_path, tmp_path):
    import json

    from click.testing import CliRunner

    from kbench.cli import cli
    from kbench.hints import traceback_hint

    body = ODD_BACKEND.replace("out[...] = q", "raise ValueError('bad tile')").replace("{attrs}", "")
    mod = write_module(on_path, "kbtest_raise", body)
    out = tmp_path / "r.json"
    res = CliRunner().invoke(cli, ["-p", mod, "run", "suites/smoke.yaml", "-b", "odd", "-k", "d=64",
                                   "-o", str(out)])
    assert res.exit_code == 1, res.output
    records = json.loads(out.read_text())["records"]
    assert {r["status"] for r in records} == {"error"} and all("bad tile" in r["traceback"] for r in records)
    hint = traceback_hint(records, out)
    assert hint.startswith(f"kbench: 2 records ended with an error; the tracebacks are in {out}")
    assert "First: odd on attention[b=2," in hint and "ValueError: bad tile" in hint
    assert f"kbench show {out} --format json -k odd" in hint
    shown = CliRunner().invoke(cli, ["show", str(out), "--format", "json", "-k", "odd"])
    assert "bad tile" in shown.output  # the command the hint gives does show the traceback
    assert traceback_hint([r for r in records if False], out) is None


@pytest.mark.parametrize("fields, message", [
    ('kind="GPU"', "hardware profile 'mine': kind 'GPU' is not one of gpu, cpu, accelerator"),
    ('peak_flops={"float16": 1e15}', "hardware profile 'mine': peak_flops has unknown dtype\\(s\\) float16.*fix: key the rates by: fp64, fp32"),
    ('peak_flops={"bf16": 989}', "hardware profile 'mine': peak_flops\\['bf16'\\] = 989 FLOP/s looks like TFLOP/s.*multiply by 1e12"),
])
def test_hardware_profiles_are_checked_at_registration(on_path, fields, message):
    base = {"kind": 'kind="gpu"', "peak": 'peak_flops={"bf16": 9.89e14}'}
    key = "kind" if fields.startswith("kind") else "peak"
    args = ", ".join({**base, key: fields}.values())
    mod = write_module(on_path, "kbtest_hw", f"""
        import kbench
        from kbench.api import HardwareProfile
        @kbench.hookimpl
        def kbench_register_hardware(registry):
            registry.add_hardware(HardwareProfile(name="mine", title="Mine", {args}, bandwidth=3.35e12,
                                                  capacity=8e10))
    """)
    with pytest.raises(PluginError, match=f"(?s)plugin 'kbtest_hw', {message}"):
        PluginManager([mod], load_entry_points=False)


def test_registering_the_wrong_type_is_named(on_path):
    mod = write_module(on_path, "kbtest_type", """
        import kbench
        @kbench.hookimpl
        def kbench_register_backends(registry):
            registry.add_backend("numpy-flash")
    """)
    with pytest.raises(PluginError, match="(?s)plugin 'kbtest_type' passed str to add_backend.*subclass of kbench.api.Backend"):
        PluginManager([mod], load_entry_points=False)


def test_the_documented_hardware_profile_file_loads_and_registers(on_path):
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "writing-a-plugin.md").read_text()
    (on_path / "hw.yaml").write_text(re.search(r"```yaml\n(version: 1\n.*?)```", doc, re.S).group(1))
    mod = write_module(on_path, "kbtest_hwfile", f"""
        import kbench
        from kbench.api import load_profiles
        @kbench.hookimpl
        def kbench_register_hardware(registry):
            for profile in load_profiles({str(on_path / "hw.yaml")!r}):
                registry.add_hardware(profile)
    """)
    profile = PluginManager([mod], load_entry_points=False).registry.hardware["my-gpu"]
    assert profile.peak_flops["bf16"] == 990e12 and profile.bandwidth == 3.35e12 and profile.kind == "gpu"


def test_plugin_warnings_print_plainly(on_path, monkeypatch, capsys):
    import warnings

    from kbench.plugins import show_plugin_warnings_plainly

    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)  # restored after the test
    show_plugin_warnings_plainly()
    show_plugin_warnings_plainly()  # idempotent: one line per warning, not two
    mod = write_module(on_path, "kbtest_plain", "X = 1\n")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        PluginManager([mod], load_entry_points=False)
    err = capsys.readouterr().err
    assert err.startswith("kbench: warning: plugin 'kbtest_plain' (kbtest_plain) implements no kbench hook")
    assert err.count("kbench: warning:") == 1 and "warnings.warn" not in err and "plugins.py" not in err
