"""kbench calibrate: measured matmul rates and copy bandwidth, stored per machine, attached to detection."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from kbench.calibrate import (CalibrationSettings, array_module, calibrate, calibration_path, default_settings,
                              load_calibration, matmul_plan, save_calibration, with_calibration)
from kbench.devices.cpu import CPUDevice
from kbench.errors import BadInput
from kbench.plugins import PluginManager
from kbench.testing import check_backend, make_case
from kbench.timing import TimingSettings

FAST = TimingSettings(warmup_calls=1, warmup_time=0.0, min_samples=3, max_samples=5, min_time=0.0, max_time=0.2,
                      target_rel_se=1.0, rotate=1)
SMALL = CalibrationSettings(matmul_size=96, copy_bytes=2**20, timing=FAST)


@pytest.fixture(scope="module")
def doc():
    return calibrate(CPUDevice(), SMALL)


def test_matmul_rates_are_two_n_cubed_over_the_median(doc):
    assert [m["dtype"] for m in doc["matmul"]] == ["fp64", "fp32", "fp16", "bf16"]
    for m in doc["matmul"]:
        assert m["flops"] == 2 * 96 ** 3
        assert m["flops_per_s"] == pytest.approx(2 * 96 ** 3 / m["stats"]["median"])
        assert doc["flops"][m["dtype"]] == m["flops_per_s"] > 0
    # NumPy has no half-precision GEMM: fp16/bf16 are reported at the fp32 GEMM's rate, measured once
    assert doc["flops"]["fp16"] == doc["flops"]["bf16"] == doc["flops"]["fp32"]
    assert "fp32" in doc["matmul"][2]["note"]


def test_copy_counts_bytes_read_and_written(doc):
    c = doc["copy"]
    assert c["buffer_bytes"] == 2**20 and c["bytes_moved"] == 2 * 2**20
    assert doc["bandwidth"] == c["bytes_per_s"] == pytest.approx(2 * 2**20 / c["stats"]["median"])


def test_stored_calibration_reaches_every_run(doc, tmp_path, monkeypatch):
    monkeypatch.setenv("KBENCH_RESULTS", str(tmp_path))
    dev = CPUDevice()
    path = save_calibration(doc, calibration_path(dev))
    assert path == tmp_path / dev.machine_id() / "calibration.json"
    pm = PluginManager(load_entry_points=False)
    hw = pm.detect_hardware(pm.registry.device("cpu"))
    assert hw.name == "cpu" and hw.measured_flops == doc["flops"] and hw.measured_bandwidth == doc["bandwidth"]
    assert str(path) in hw.measured_source
    # a record of a real backend now carries the fraction of the measured roof, by the roofline formula
    rec = check_backend(pm, pm.registry.backends["numpy"], make_case(pm, seqlen=64, heads=2, head_dim=32))
    assert rec["status"] == "passed", rec.get("reason")
    m = rec["metrics"]
    assert m["roof_basis"] == "measured" and m["bound"] in ("compute", "bandwidth")
    attained = m["flops"] / rec["stats"]["median"]
    roof = min(doc["flops"]["fp32"], doc["bandwidth"] * m["intensity"])
    assert m["roof_fraction"] == pytest.approx(attained / roof)
    assert m["measured_roof_fraction"] == m["roof_fraction"]


def test_without_calibration_the_cpu_has_no_roof(tmp_path, monkeypatch):
    monkeypatch.setenv("KBENCH_RESULTS", str(tmp_path))
    pm = PluginManager(load_entry_points=False)
    hw = pm.detect_hardware(pm.registry.device("cpu"))
    assert not hw.has_measured and hw.peak_flops == {}


def test_calibration_of_an_unmatched_device_gives_a_measured_profile(doc, tmp_path):
    dev = CPUDevice()
    save_calibration(doc, calibration_path(dev, tmp_path))
    p = with_calibration(None, dev, tmp_path)
    assert p.measured and p.peak_flops == {} and p.measured_flops == doc["flops"]


def test_damaged_calibration_file_is_bad_input(tmp_path):
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps({"format": "kbench-calibration", "version": 1, "flops": {"fp32": -1}}))
    with pytest.raises(BadInput) as err:
        load_calibration(path)
    assert str(path) in str(err.value) and "kbench calibrate" in str(err.value)
    path.write_text("{not json")
    with pytest.raises(BadInput):
        load_calibration(path)
    assert load_calibration(tmp_path / "absent.json") is None


def fake_cuda_device_class():
    """The cuda device's calibration plan (kbench-cuda's) on host memory: the same code path, minus a GPU."""
    cuda = pytest.importorskip("kbench_cuda.device").CudaDevice
    return type("FakeCudaDevice", (CPUDevice,), {
        "name": "cuda", "index": 0, "calibration_matmul_size": cuda.calibration_matmul_size,
        "calibration_copy_bytes": cuda.calibration_copy_bytes, "calibration_matmuls": cuda.calibration_matmuls,
        "matmul_operands": cuda.matmul_operands})


def test_cuda_plan_runs_through_the_same_code():
    FakeCudaDevice = fake_cuda_device_class()
    plan = {s.dtype: s for s in matmul_plan(FakeCudaDevice())}
    assert plan["fp16"].storage == "float16" and plan["bf16"].library == "torch"
    # the device decides its plan and sizes, not a branch on its name in the core
    assert default_settings(FakeCudaDevice()).matmul_size == 8192
    assert default_settings(CPUDevice()).matmul_size == 2048 and matmul_plan(CPUDevice())[0].library == "xp"
    renamed = type("Renamed", (FakeCudaDevice,), {"name": "accel"})()
    assert matmul_plan(renamed) == matmul_plan(FakeCudaDevice())
    doc = calibrate(FakeCudaDevice(), CalibrationSettings(matmul_size=32, copy_bytes=2**16, timing=FAST))
    assert {m["dtype"] for m in doc["matmul"]} >= {"fp64", "fp32", "fp16"}
    fp16 = next(m for m in doc["matmul"] if m["dtype"] == "fp16")
    assert fp16["storage"] == "float16" and fp16["flops_per_s"] > 0
    # torch's bf16 GEMM needs a CUDA device: here it is recorded as not measured, with the reason
    assert "bf16" in doc["skipped"] or "bf16" in doc["flops"]


def test_array_module_picks_numpy_for_host_arrays():
    assert array_module(np.zeros(2)) is np


def test_unknown_dtype_is_bad_input():
    with pytest.raises(BadInput, match="fp8"):
        calibrate(CPUDevice(), CalibrationSettings(matmul_size=16, copy_bytes=4096, timing=FAST, dtypes=("fp8",)))


def test_cli_reports_rate_and_bandwidth(tmp_path, monkeypatch):
    from kbench.cli import cli

    monkeypatch.setenv("KBENCH_RESULTS", str(tmp_path))
    res = CliRunner().invoke(cli, ["calibrate", "--device", "cpu", "--size", "64", "--copy-mb", "1",
                                   "--max-time", "0.1", "--dtype", "fp32"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "TFLOP/s" in res.output and "GB/s" in res.output and "matmul fp32" in res.output
    stored = json.loads(next(tmp_path.glob("*/calibration.json")).read_text())
    assert set(stored["flops"]) == {"fp32"} and stored["bandwidth"] > 0


def test_any_plugins_detection_gets_the_measured_roof_too(doc, tmp_path, monkeypatch):
    """A datasheet profile from another plugin's detection carries the calibration: both fractions."""
    import kbench
    from kbench.hardware import HardwareProfile
    from kbench.roofline.point import roofline_point

    class SheetPlugin:
        @kbench.hookimpl
        def kbench_detect_hardware(self, device, registry):
            return HardwareProfile(name="sheet", title="Sheet", kind="cpu", peak_flops={"fp32": 1e12},
                                   bandwidth=100e9, capacity=None)

    monkeypatch.setenv("KBENCH_RESULTS", str(tmp_path))
    save_calibration(doc, calibration_path(CPUDevice()))
    pm = PluginManager(load_entry_points=False)
    pm.pm.register(SheetPlugin(), name="sheet-plugin")
    hw = pm.detect_hardware(pm.registry.device("cpu"))
    assert hw.name == "sheet" and hw.measured_flops == doc["flops"]
    m = roofline_point(hw, "fp32", 1e9, 1e8, 0.01)         # intensity 10; 0.1 TFLOP/s attained
    assert m["roof_basis"] == "datasheet"
    assert m["datasheet_roof_fraction"] == pytest.approx(1e11 / min(1e12, 100e9 * 10))
    assert m["measured_roof_fraction"] == pytest.approx(1e11 / min(doc["flops"]["fp32"], doc["bandwidth"] * 10))
