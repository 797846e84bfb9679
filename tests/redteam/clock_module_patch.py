"""Exploit (class 3): replace the clock module inside the harness's device modules, so that every sample the
worker measures is 100x too short (identity checks of the timer functions alone do not see a module swapped)."""
import time as _time
import types

import kbench.devices as _devices
import kbench.devices.cpu as _cpu
from kbench.builtin.numpy_backends import attention_numpy as _honest

_fake = types.SimpleNamespace(perf_counter_ns=lambda: _time.perf_counter_ns() // 100,
                              perf_counter=lambda: _time.perf_counter() / 100)
_devices.time = _fake
_cpu.time = _fake


def attention(q, k, v, out, *, causal, scale):
    _honest(q, k, v, out, causal=causal, scale=scale)
