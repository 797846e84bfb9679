"""One results root: `kbench run`'s default output and the calibration file both follow $KBENCH_RESULTS."""
from __future__ import annotations

from kbench.calibrate import calibration_path
from kbench.plugins import PluginManager
from kbench.run.runner import default_output
from kbench.suite import load_suite


def test_run_and_calibrate_share_the_results_root(tmp_path, monkeypatch):
    monkeypatch.setenv("KBENCH_RESULTS", str(tmp_path / "elsewhere"))
    suite = load_suite("suites/smoke.yaml")
    out = default_output("machine-x", suite)
    assert out.parent == tmp_path / "elsewhere" / "machine-x"
    device = PluginManager().registry.device("cpu")
    assert calibration_path(device).parent == tmp_path / "elsewhere" / device.machine_id()


def test_without_the_variable_results_are_in_results(monkeypatch):
    monkeypatch.delenv("KBENCH_RESULTS", raising=False)
    assert default_output("m", load_suite("suites/smoke.yaml")).parts[:2] == ("results", "m")
