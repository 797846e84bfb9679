"""Test plugin (load with ``-p slow_backend_plugin``, tests/ on PYTHONPATH): a deliberately slowable backend.

``numpy-slowed`` computes exactly what the ``numpy`` backend computes, then busy-waits so that each
call takes ``KBENCH_TEST_SLOWDOWN`` times as long (default 1: no slowdown). It exists to show that
``kbench compare`` reports a real regression as ``slower``; the knob lives here, never in a
production backend.
"""
from __future__ import annotations

import os
import time

import kbench
from kbench.builtin.numpy_backends import NumpyAttention
from kbench.errors import BadInput

KNOB = "KBENCH_TEST_SLOWDOWN"


def slowdown() -> float:
    raw = os.environ.get(KNOB, "1")
    try:
        factor = float(raw)
    except ValueError:
        factor = float("nan")
    if not factor >= 1:
        raise BadInput(f"{KNOB}={raw!r} is not a number >= 1", where=KNOB, fix=f"e.g. {KNOB}=1.5")
    return factor


class SlowedNumpyAttention(NumpyAttention):
    name = "numpy-slowed"
    description = f"the numpy backend, each call stretched to ${KNOB} times its duration (tests only)"

    def prepare(self, case):
        inner = super().prepare(case)
        factor = slowdown()

        def run(q, k, v, out):
            start = time.perf_counter()
            inner(q, k, v, out)
            until = start + factor * (time.perf_counter() - start)
            while time.perf_counter() < until:
                pass
        return run

    def info(self):
        return {**super().info(), "slowdown": slowdown()}


@kbench.hookimpl
def kbench_register_backends(registry):
    registry.add_backend(SlowedNumpyAttention())
