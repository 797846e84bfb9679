"""Hardware profiles: datasheet data, GPU matching by name, profile files, calibrated roofs carried along."""
from __future__ import annotations

import textwrap

import pytest

from kbench.errors import BadInput
from kbench.hardware import HardwareProfile, builtin_profiles, load_profiles, match_profile
from kbench.plugins import PluginManager

REQUIRED = {"a100-80gb-sxm", "h100-sxm", "h100-pcie", "h200", "b200", "gb200", "l40s", "mi300x", "rubin-cpx"}


@pytest.fixture(scope="module")
def registry():
    return PluginManager(load_entry_points=False).registry


@pytest.fixture(scope="module")
def profiles():
    return {p.name: p for p in builtin_profiles()}


def test_builtin_profiles_present_with_sources(profiles, registry):
    assert REQUIRED <= set(profiles)
    assert REQUIRED | {"cpu"} <= set(registry.hardware)
    for p in profiles.values():
        assert p.source and p.bandwidth and p.capacity and p.peak_flops, p.name
        assert p.match, f"{p.name} needs match substrings for NVML detection"


def test_figures_are_dense_and_match_the_facts(profiles):
    # NVIDIA datasheets (dense = sparse / 2): H100 SXM 989 TFLOP/s bf16 dense, 3.35 TB/s, 80 GB; H200 4.8 TB/s, 141 GB;
    # B200 2.25 PFLOP/s, 8 TB/s; GB200 2.5 PFLOP/s, 186 GB; Rubin CPX 30 PFLOP/s NVFP4, 128 GB, ~2 TB/s
    assert profiles["h100-sxm"].peak("bf16") == 989e12
    assert profiles["h100-sxm"].bandwidth == 3.35e12 and profiles["h100-sxm"].capacity == 80e9
    assert profiles["h200"].peak("bf16") == 989e12 and profiles["h200"].bandwidth == 4.8e12
    assert profiles["h200"].capacity == 141e9
    assert profiles["b200"].peak("bf16") == 2.25e15 and profiles["b200"].bandwidth == 8e12
    assert profiles["gb200"].peak("bf16") == 2.5e15 and profiles["gb200"].capacity == 186e9
    assert profiles["rubin-cpx"].peak("fp4") == 30e15 and profiles["rubin-cpx"].capacity == 128e9
    # datasheets print sparse tensor rates; dense = half: H100 SXM fp8 3,958 sparse -> 1,979 dense
    assert profiles["h100-sxm"].peak("fp8") == 1979e12
    # A100 80GB SXM datasheet: 2,039 GB/s, bf16 312 dense; MI300X data sheet: 5.3 TB/s, 192 GB
    assert profiles["a100-80gb-sxm"].bandwidth == 2.039e12 and profiles["a100-80gb-sxm"].peak("bf16") == 312e12
    assert profiles["mi300x"].capacity == 192e9 and profiles["mi300x"].bandwidth == 5.3e12


def test_ridge_point(profiles):
    assert profiles["h200"].ridge("bf16") == pytest.approx(989e12 / 4.8e12)   # 206.04 FLOP/byte
    assert profiles["rubin-cpx"].ridge("bf16") is None


@pytest.mark.parametrize("nvml_name, expected", [
    ("NVIDIA H100 80GB HBM3", "h100-sxm"),
    ("NVIDIA H100 PCIe", "h100-pcie"),
    ("NVIDIA H200", "h200"),
    ("NVIDIA B200", "b200"),
    ("NVIDIA GB200", "gb200"),            # also contains "B200": the longest match wins
    ("NVIDIA A100-SXM4-80GB", "a100-80gb-sxm"),
    ("NVIDIA A100-SXM4-40GB", None),      # a different memory size is not this profile
    ("NVIDIA L40S", "l40s"),
    ("AMD Instinct MI300X", "mi300x"),
    ("NVIDIA GeForce RTX 4090", None),
])
def test_match_profile_by_device_name(registry, nvml_name, expected):
    found = match_profile(registry, nvml_name)
    assert (found.name if found else None) == expected


def _profile(**kw) -> HardwareProfile:
    base = dict(name="x", title="X", kind="gpu", peak_flops={"bf16": 100e12}, bandwidth=1e12, capacity=80e9)
    return HardwareProfile(**{**base, **kw})


def test_json_round_trip_keeps_measured_roofs():
    p = _profile(match=("X1",), sources={"bf16": "sheet"}).with_measured({"bf16": 1.0}, 2.0, "calibrated")
    assert HardwareProfile.from_json(p.to_json()) == p


def test_user_profile_file(tmp_path):
    f = tmp_path / "hw.yaml"
    f.write_text(textwrap.dedent("""
        version: 1
        profiles:
          - name: my-gpu
            title: My GPU
            match: ["My GPU 9000"]
            peak_tflops: {bf16: 500, fp8: 1000}
            bandwidth_tbps: 2.5
            capacity_gb: 96
            source: "my datasheet"
    """))
    (p,) = load_profiles(str(f))
    assert p.peak("fp8") == 1e15 and p.bandwidth == 2.5e12 and p.capacity == 96e9 and p.match == ("My GPU 9000",)


def test_bad_profile_file_names_file_line_and_fix(tmp_path):
    f = tmp_path / "hw.yaml"
    f.write_text("profiles:\n  - name: bad\n    title: Bad\n    peak_tflops: {bf17: 5}\n"
                 "    bandwidth_tbps: 1\n    capacity_gb: 1\n    source: sheet\n")
    with pytest.raises(BadInput) as err:
        load_profiles(str(f))
    text = str(err.value)
    assert str(f) in text and "line 4" in text and "bf17" in text and "fix:" in text


def test_cpu_profile_from_machine_description(registry):
    from kbench.builtin.hardware import cpu_profile
    from kbench.devices.cpu import CPUDevice

    p = cpu_profile(CPUDevice())
    assert p.kind == "cpu" and p.peak_flops == {} and p.bandwidth is None
    assert p.capacity is None or p.capacity > 2**28          # /proc/meminfo MemTotal, in bytes
    assert "cores" in p.title


def test_the_shipped_profiles_match_the_profile_file_schema():
    """Start-up reads kbench/data/hardware.yaml without the schema; this test holds the shipped file to it."""
    from kbench.hardware import builtin_profiles

    assert builtin_profiles(check=True) == builtin_profiles()
