"""``flash-attn4``: FlashAttention 4 (PyPI ``flash-attn-4``, module ``flash_attn.cute``), written in NVIDIA's CuTe
DSL and compiled just in time: the other anchor of the AVO paper (Blackwell) next to cuDNN, also built for Hopper.

It needs, besides torch, the CuTe DSL (``nvidia-cutlass-dsl``, module ``cutlass``, with its CUDA library wheel,
``nvidia-cutlass-dsl-libs-cu13`` for CUDA 13), ``quack-kernels`` (``quack``), ``apache-tvm-ffi`` (``tvm_ffi``) and
``einops``: ``available()`` names the first one missing, with the install line. Same calling convention as
FlashAttention 2/3 (:mod:`kbench_torch.flash`): kbench's (batch, seqlen, heads, head_dim) layout, native GQA,
bottom-right causal alignment, ``(out, lse)`` returned; an unbounded window side is ``None`` here (``-1`` in
kbench and FlashAttention 2/3). The first call of a shape compiles the kernel (seconds): ``prepare``'s probe
call on small tensors takes the JIT for the case's configuration out of the timed calls, and turns the
library's refusal (an assertion on head sizes or architecture, a DSL compile error) into a skip with its message.

What the library accepts (``flash_attn/cute/interface.py`` of 4.0.0b36, checked here before any call so that
the refusal is clear): compute capability 8.x-12.x; fp16/bf16 (its FP8 forward runs on SM100 only and is not
wired in here); head_dim 8-256 and a multiple of 8 on SM90, 8-128 (or 256) on SM100/SM110.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
from typing import Any

from kbench.api import Case, DType
from kbench_torch.common import cuda_capability
from kbench_torch.flash import FlashAttention

INSTALL = "pip install flash-attn-4 'nvidia-cutlass-dsl[cu13]'"
#: the modules FlashAttention 4 imports, each with the distribution that provides it, in the order to install
REQUIREMENTS = (("cutlass", "nvidia-cutlass-dsl (the CuTe DSL; its CUDA libraries: nvidia-cutlass-dsl-libs-cu13)"),
                ("quack", "quack-kernels"), ("tvm_ffi", "apache-tvm-ffi"), ("einops", "einops"))


def cute_installed() -> bool:
    """Whether ``flash_attn/cute`` is on the path, found without importing ``flash_attn`` (FlashAttention 2's
    ``__init__`` would load its CUDA extension) nor the DSL."""
    spec = importlib.util.find_spec("flash_attn")
    return spec is not None and any(os.path.isfile(os.path.join(p, "cute", "interface.py"))
                                    for p in (spec.submodule_search_locations or ()))


class FlashAttention4(FlashAttention):
    """FlashAttention 4 through ``flash_attn.cute.flash_attn_func``; ``capability`` fixes the GPU's compute
    capability for ``supports`` (default: asked of the GPU when needed)."""

    def __init__(self, *, capability: tuple[int, int] | None = None) -> None:
        super().__init__("flash-attn4", "flash_attn.cute", "FlashAttention 4", min_capability=(8, 0),
                         max_capability=(12, 9), install=INSTALL)
        self.capability = capability
        self.description = ("FlashAttention 4 (CuTe DSL, JIT) through `flash_attn.cute.flash_attn_func`, "
                            "bottom-right causal, native GQA")

    def available(self) -> str | None:
        if not cute_installed():
            return f"flash_attn.cute is not installed (FlashAttention 4): {INSTALL}"
        for module, dist in REQUIREMENTS:
            if importlib.util.find_spec(module) is None:
                return f"{module} is not installed, which FlashAttention 4 needs: pip install {dist.split(' ')[0]} ({dist})"
        return super().available()

    def _capability(self) -> tuple[int, int]:
        return self.capability if self.capability is not None else cuda_capability()

    def supports(self, case: Case) -> str | None:
        # FP8 cases never get here: the backend does not declare the fp8 feature (FA4's FP8 forward runs on
        # SM100 only, which kbench has not measured)
        if case.dtype not in (DType.FP16, DType.BF16):
            return "FlashAttention 4 takes fp16/bf16 here (its FP8 forward is SM100-only and not wired in)"
        major, d = self._capability()[0], case["head_dim"]
        if d % 8:
            return f"FlashAttention 4 needs head_dim a multiple of 8 (got {d})"
        if major == 9 and not 8 <= d <= 256:
            return f"FlashAttention 4 on SM90 takes head_dim 8-256 (got {d})"
        if major in (10, 11) and not (8 <= d <= 128 or d == 256):
            return f"FlashAttention 4 on SM100/SM110 takes head_dim 8-128 or 256 (got {d})"
        return None

    def call_kwargs(self, case: Case, *, batch: int | None = None) -> dict[str, Any]:
        kw = super().call_kwargs(case, batch=batch)
        if "window_size" in kw:  # FA4 spells an unbounded side None, FlashAttention 2/3 and kbench -1
            kw["window_size"] = tuple(None if w < 0 else w for w in kw["window_size"])
        return kw

    def _import(self):
        return importlib.import_module("flash_attn.cute")

    def info(self) -> dict[str, Any]:
        import importlib.metadata as md

        info = super().info()
        for dist in ("flash-attn-4", "nvidia-cutlass-dsl"):
            try:
                info[dist] = md.version(dist)
            except md.PackageNotFoundError:
                continue
        return info


def flash4_backends() -> list[FlashAttention4]:
    return [FlashAttention4()]
