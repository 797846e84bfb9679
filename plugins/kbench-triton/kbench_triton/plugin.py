"""Entry point of the kbench-triton plugin (group `kbench`). Imports nothing heavy at import time."""
from __future__ import annotations

import kbench
from kbench_triton import runtime


@kbench.hookimpl
def kbench_register_backends(registry):
    from kbench_triton.backends import TritonAttention, TritonAutotunedAttention, TritonHopperAttention

    registry.add_backend(TritonAttention())
    registry.add_backend(TritonAutotunedAttention())
    registry.add_backend(TritonHopperAttention())


@kbench.hookimpl
def kbench_register_kernel_substrates(registry):
    from kbench_triton.backends import TritonSubstrate

    registry.add_substrate(TritonSubstrate())


@kbench.hookimpl
def kbench_register_commands(cli):
    from kbench_triton.cli import triton_aot

    cli.add_command(triton_aot)


@kbench.hookimpl
def kbench_environment():
    return runtime.environment()
