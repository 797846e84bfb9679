"""Entry point of the kbench-torch plugin (group `kbench`). Imports nothing heavy at import time.

Backends: ``torch-sdpa`` (CPU), ``torch-sdpa-{flash,efficient,cudnn,math}`` (CUDA, each SDPA
implementation forced), ``flash-attn`` / ``flash-attn3`` / ``flash-attn4`` (FlashAttention 2 / 3 / 4) and ``cudnn``
(cuDNN frontend SDPA graph). torch, flash_attn and cudnn are imported when a backend is asked.
"""
from __future__ import annotations

import kbench
from kbench_torch.cudnn_backend import CudnnFrontendSDPA
from kbench_torch.flash import flash_backends
from kbench_torch.flash4 import flash4_backends
from kbench_torch.paged import decode_backends
from kbench_torch.sdpa import TorchSDPA, cuda_backends
from kbench_torch.substrate import TorchCPUSubstrate
from kbench_torch.varlen import varlen_backends


@kbench.hookimpl
def kbench_register_backends(registry):
    registry.add_backend(TorchSDPA())
    for backend in cuda_backends():
        registry.add_backend(backend)
    for backend in (*flash_backends(), *flash4_backends()):
        registry.add_backend(backend)
    registry.add_backend(CudnnFrontendSDPA())
    for backend in decode_backends():  # decode_attention, contiguous and paged caches (kbench_torch.paged)
        registry.add_backend(backend)
    for backend in varlen_backends():  # attention_varlen: torch-sdpa-varlen[-cuda], flash-attn[3]-varlen
        registry.add_backend(backend)


@kbench.hookimpl
def kbench_register_kernel_substrates(registry):
    registry.add_substrate(TorchCPUSubstrate())  # SUBSTRATE = "torch": CPU kernel files in torch ops


@kbench.hookimpl
def kbench_environment():
    import importlib.metadata as md

    out = {}
    for dist in ("torch", "flash-attn", "flash-attn-4", "nvidia-cutlass-dsl", "nvidia-cudnn-frontend", "nvidia-cudnn-cu13", "nvidia-cudnn-cu12"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            continue
    return out
