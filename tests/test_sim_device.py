"""The simulated device (tests/sim_device_plugin.py): host arrays, samples as a GPU's (events on a device clock, read
after one synchronisation), inputs gathered "on the device", a sustained energy loop. So the device-clock branch
of the accounting, the energy loop and the device input generator run in the default tier, and the attack
classes of tests/redteam are tried on a device clock too (slow tier).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
import sim_device_plugin as sim  # noqa: E402

from kbench.ops.inputs import generate, structural, unit_variance  # noqa: E402

HONEST = (HERE / "redteam" / "honest_numpy.py").read_text()
ON_SIM = 'SUBSTRATE = "simgpu"\n'

SUITE = {"name": "sim", "grid": [{"seqlen": 256, "heads": 2, "head_dim": 32, "dtype": "fp32"}],
         "check": {"seeds": 2, "max_rows": 64},
         "timing": {"warmup_time": 0.0, "min_samples": 5, "min_time": 0.0, "max_time": 0.05, "target_rel_se": 1.0,
                    "rotate": 2, "case_timeout": 60, "energy_seconds": 0.03},
         "integrity": {"memory_limit": "2GiB"}}


def run_on_sim(tmp_path: Path, kernels: dict[str, str], *, patterns=(), integrity=None, isolate=True, extra=(),
               seqlen: int = 256):
    """Records of a run of SUITE on the simulated device: the registry ``patterns``, the backend objects
    ``extra`` and the kernel files given by their text (each starting with ``SUBSTRATE = "simgpu"``)."""
    from kbench.plugins import get_plugin_manager
    from kbench.run.runner import RunRequest, plan_run, run_suite
    from kbench.suite import suite_from_data

    files = []
    for name, text in kernels.items():
        path = tmp_path / f"{name}.py"
        path.write_text(text)
        files.append(str(path))
    suite = json.loads(json.dumps(SUITE))
    suite["integrity"].update(integrity or {})
    suite["grid"][0]["seqlen"] = seqlen
    pm = get_plugin_manager(["sim_device_plugin"])
    req = RunRequest(suite=suite_from_data(suite), device="simgpu", kernel_files=files,
                     backend_patterns=list(patterns), backends=list(extra), output=tmp_path / "run.json",
                     isolate=isolate)
    return {r["backend"]: r for r in run_suite(pm, plan_run(pm, req)).records}


# -- the device itself ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float8_e4m3fn"])
def test_inputs_drawn_on_the_device_are_the_judges(dtype):
    """The device's gather from the uploaded table draws exactly what the judge regenerates on the host."""
    device = sim.SimDevice()
    spec = unit_variance((3, 37, 2, 16), dtype)
    array = device.empty(spec.shape, np.dtype(generate(spec, (1, 2), 0).dtype))
    device.generate(array, spec, (1234, 5678), 3)
    expected = generate(spec, (1234, 5678), 3)
    assert array.view(np.uint8).tobytes() == expected.view(np.uint8).tobytes()
    assert device.counts["generated_on_device"] == 1 and device.counts["generated_on_host"] == 0


def test_a_structural_input_is_made_on_the_host_as_on_cuda():
    device = sim.SimDevice()
    spec = structural((5,), "int32", lambda rng: np.sort(rng.integers(0, 100, 5)))
    array = device.empty((5,), np.dtype("int32"))
    device.generate(array, spec, (9, 9), 1)
    assert np.array_equal(array, generate(spec, (9, 9), 1)) and device.counts["generated_on_host"] == 1


def test_events_are_read_only_after_the_synchronisation():
    device = sim.SimDevice()
    clock = device.sample_clock(2)
    for i in range(2):
        clock.start(i)
        clock.stop(i)
    assert clock.host is False and clock.stamps() is None
    with pytest.raises(sim.NotReady):
        clock.seconds()
    device.synchronize()
    assert all(0 <= s < 1 for s in clock.seconds())


ENERGY_CHEAT = ON_SIM + HONEST.replace(
    "def attention(q, k, v, out, *, causal, scale):\n",
    "def attention(q, k, v, out, *, causal, scale):\n"
    "    if not np.isnan(out).any():  # the sustained loop does not poison: skip the work there\n"
    "        return\n")


class LazyInTheLoop(sim.SimAttention):
    """Honest on every poisoned output; the sustained loop does not poison, so it skips its work there."""

    name = "sim-lazy-in-loop"

    def prepare(self, case):
        honest = super().prepare(case)

        def run(q, k, v, out):
            if np.isnan(out).any():
                honest(q, k, v, out)
        return run


def test_a_run_on_the_simulated_device_takes_the_device_branches(tmp_path):
    """One case, in-process (the same call runner and judge as a worker's, without a worker's start): the sim
    backend, and one that is honest when timed but skips its work in the energy loop."""
    records = run_on_sim(tmp_path, {}, patterns=["sim-numpy"], isolate=False, extra=[LazyInTheLoop()], seqlen=64)
    honest = records["sim-numpy"]
    assert honest["status"] == "passed", honest.get("reason")
    counts = honest["telemetry"]["sim"]
    # the device generated the inputs, flushed before each sample, read event pairs after synchronising
    assert counts["generated_on_device"] > 0 and counts["flush"] > 0 and counts["events_read"] > 0
    assert counts["synchronize"] > 0 and counts["sustained_calls"] >= sim.SUSTAIN_SYNC_EVERY
    energy = honest["telemetry"]["energy"]
    assert energy["source"] == "simulated energy counter" and energy["method"] == "sustained loop"
    assert energy["average_w"] == pytest.approx(sim.BUSY_W, rel=0.05) and energy["calls"] == counts["sustained_calls"]
    assert energy["seconds"] <= energy["parent_seconds"]
    assert "before" in honest["telemetry"] and "after" in honest["telemetry"]
    cheat = records["sim-lazy-in-loop"]
    assert cheat["status"] == "failed" and cheat["reason"].startswith("energy loop does not add up"), cheat["reason"]


# -- the attack classes on a device clock (slow: one sandboxed worker each) ------------------------------------

CLOCK_PATCH = ON_SIM + """import sim_device_plugin as sim

_real = sim.elapsed_ms


def _short(a, b):  # the device's elapsed time, reported 20x short
    return _real(a, b) * 0.05


sim.elapsed_ms = _short
""" + HONEST

TIMER_THROUGH_PARAMETER = ON_SIM + """import time

_real = time.perf_counter_ns


def _install(o, n, v):
    setattr(o, n, v)


def _fast():
    return _real() // 2


_install(time, "perf_counter_ns", _fast)
""" + HONEST

THREAD_KILL = ON_SIM + """import os
import threading
""" + HONEST.replace("def attention(q, k, v, out, *, causal, scale):\n",
                     "def attention(q, k, v, out, *, causal, scale):\n"
                     "    t = threading.Thread(target=os.kill, args=(os.getpid(), 0))\n"
                     "    t.start()\n"
                     "    t.join()\n")

TEXT = ON_SIM + '''NAME = "sim-odd"  # a NAME is ASCII (a look-alike is refused at planning: tests/test_kernel_names.py)


def attention(q, k, v, out, *, causal, scale):
    raise ValueError("bad \\ud800 \\x1b[2J \\u202e")
'''

ARENA = ON_SIM + HONEST.replace("def attention(q, k, v, out, *, causal, scale):\n",
                                "def attention(q, k, v, out, *, causal, scale):\n"
                                "    import os\n"
                                "    for n in os.listdir('/proc/self/fd'):\n"
                                "        try:\n"
                                "            link = os.readlink('/proc/self/fd/' + n)\n"
                                "        except OSError:\n"
                                "            continue\n"
                                "        if 'kbench-arena' in link:\n"
                                "            raise RuntimeError('the arena is open: fd ' + n)\n")

#: kernel -> (source, static checks, status, reason pattern)
ATTACKS = {
    # the parent's clock decides an untrusted kernel's time (less the harness twin's cost): passed at its real
    # time (checked below against the honest kernel), or named as tampering
    "clock_patch": (CLOCK_PATCH, "none", ("failed", "passed"), r"harness tampering|^$"),
    "clock_patch_static": (CLOCK_PATCH, "untrusted", "failed", r"static check.*sim_device_plugin.elapsed_ms"),
    "timer_through_parameter": (TIMER_THROUGH_PARAMETER, "untrusted", "failed", r"static check.*setattr"),
    "timer_through_parameter_dynamic": (TIMER_THROUGH_PARAMETER, "none", "failed",
                                        r"harness tampering: time.perf_counter_ns replaced|samples do not add up"),
    "thread_kill": (THREAD_KILL, "untrusted", "failed", r"audit: refused os.kill"),
    "text": (TEXT, "untrusted", "error", r"ValueError: bad \\ud800 \\x1b\[2J \\u202e"),
    "arena": (ARENA, "untrusted", "passed", None),
    "honest": (ON_SIM + HONEST, "untrusted", "passed", None),
    "energy_cheat": (ENERGY_CHEAT, "untrusted", "failed", r"energy loop does not add up"),
}
#: tests/redteam kernels run on the device (static checks off: what the checks at run time say)
REDTEAM = {
    "zero_output": ("failed", r"relative L2 error"),
    "lazy_result": ("failed", r"not a ndarray"),
    "background_thread": ("failed", r"output changed after the kernel returned|threads still running"),
    "timer_patch": ("failed", r"harness tampering: time.perf_counter_ns replaced|samples do not add up"),
    "cache_by_identity": ("failed", r"stale|timed output wrong"),
    "input_modified": ("failed", r"input 'q' was modified"),
}


@pytest.mark.slow
@pytest.mark.parametrize("static", ["untrusted", "none"])
def test_attacks_are_caught_on_a_device_clock(tmp_path, static):
    import re

    kernels = {name: source for name, (source, mode, _, _) in ATTACKS.items() if mode == static}
    if static == "none":
        kernels.update({name: ON_SIM + (HERE / "redteam" / f"{name}.py").read_text() for name in REDTEAM})
    records = run_on_sim(tmp_path, kernels, integrity={"static_checks": static})
    expected = {name: (status, reason) for name, (_, mode, status, reason) in ATTACKS.items() if mode == static}
    if static == "none":
        expected.update(REDTEAM)
    for name, (status, reason) in expected.items():
        rec = records["sim-odd" if name == "text" else f"file:{name}"]
        assert rec["status"] in ((status,) if isinstance(status, str) else status), (name, rec["status"],
                                                                                    rec.get("reason"))
        if reason:
            assert re.search(reason, rec["reason"] or ""), (name, rec["reason"])
    shorted = records.get("file:clock_patch")
    if shorted is not None and shorted["status"] == "passed":  # 20x short on the device clock: not credited
        assert shorted["timing"]["samples_kind"] == "parent"
        assert shorted["timing"]["accounting"]["raised_batches"] == shorted["timing"]["accounting"]["batches"]
