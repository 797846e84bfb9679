"""Plugin discovery and the registration contract."""
from __future__ import annotations

import inspect
import sys
import textwrap

import pytest

import kbench
from kbench import hookspecs
from kbench.errors import PluginError
from kbench.plugins import DEFAULT_PLUGINS, PluginManager


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


def test_duplicate_of_a_builtin_is_refused(on_path):
    mod = write_module(on_path, "kbtest_dup_builtin", BACKEND_PLUGIN.format(name="numpy"))
    with pytest.raises(PluginError, match="kbench.builtin.numpy_backends"):
        PluginManager([mod], load_entry_points=False)


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
