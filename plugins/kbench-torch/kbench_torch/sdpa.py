"""PyTorch ``scaled_dot_product_attention`` backends: one on the CPU, one per CUDA implementation.

``torch-sdpa``            CPU; torch picks the implementation. fp16/bf16 inputs are computed in
                          float32 (torch's CPU bf16/fp16 matmuls run at ~1 GFLOP/s on small
                          machines) and the output rounded to the case dtype: it measures the
                          CPU peer of a float32 kernel, said so in its ``info()``.
``torch-sdpa-flash``      CUDA, forced with ``torch.nn.attention.sdpa_kernel`` to FLASH_ATTENTION
``torch-sdpa-efficient``  ... EFFICIENT_ATTENTION (memory-efficient / xFormers-style kernel)
``torch-sdpa-cudnn``      ... CUDNN_ATTENTION
``torch-sdpa-math``       ... MATH (the unfused composite; materialises the score matrix)

Causal masking: kbench's causal mask is aligned bottom-right (query row i sees key j iff
j <= i + seqlen_kv - seqlen_q). torch's ``is_causal`` is aligned top-left, so it is used only when
seqlen_q == seqlen_kv; otherwise the CPU and math backends pass an explicit boolean mask (built
once, outside the timing), the efficient backend passes ``torch.nn.attention.bias.causal_lower_right``,
and flash and cudnn declare the case unsupported. Rows that see no key (seqlen_q > seqlen_kv) are
set to 0, the op's definition, as part of the timed call.

GQA (heads_q > heads_kv) goes through ``enable_gqa=True``. Whether a forced CUDA implementation
accepts a case is asked of torch itself: a tiny probe call of the same dtype, head_dim, heads and
mask kind, whose refusal warnings become the ``supports()`` reason.
"""
from __future__ import annotations

import os
import re
import warnings
from functools import lru_cache
from typing import Any

from kbench.api import Backend, Case, DType, Tunable, as_torch, softmax_scale, to_device_array, torch_dtype
from kbench_torch.common import torch_cuda_unavailable, torch_device, torch_info, torch_unavailable

#: score-matrix bytes above which the materialising backends (cpu, math) decline a case
MATERIALISE_LIMIT = 48 * 2**30


def mask_kind(case: Case) -> str:
    """``none``, ``square`` (sq == sk: top-left equals bottom-right), ``wide`` (sq < sk), ``tall`` (sq > sk)."""
    if not case["causal"]:
        return "none"
    sq, sk = case["seqlen_q"], case["seqlen_kv"]
    return "square" if sq == sk else ("wide" if sq < sk else "tall")


def bottom_right_mask(sq: int, sk: int, device=None):
    """Boolean (sq, sk) mask, True where the key is visible."""
    import torch

    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    return j <= i + (sk - sq)


def sdpa_bhsd(q, k, v, *, kind: str, scale: float, mask=None):
    """``F.scaled_dot_product_attention`` on (b, h, s, d) views with kbench's mask conventions."""
    import torch.nn.functional as F

    kwargs: dict[str, Any] = {"scale": scale}
    if q.shape[1] != k.shape[1]:
        kwargs["enable_gqa"] = True
    if kind == "square":
        kwargs["is_causal"] = True
    elif kind != "none":
        kwargs["attn_mask"] = mask
    o = F.scaled_dot_product_attention(q, k, v, **kwargs)
    if kind == "tall":
        o[:, :, : q.shape[2] - k.shape[2]] = 0  # rows that see no key: 0 by the op's definition
    return o


def _clean(message: str) -> str:
    message = re.sub(r"\s*\(Triggered internally at [^)]*\)", "", message)
    return " ".join(message.split())


def _peak_scores(case: Case) -> int:
    p = case.params
    return 3 * p["batch"] * p["heads_q"] * p["seqlen_q"] * p["seqlen_kv"] * 4


class TorchSDPA(Backend):
    """``torch-sdpa`` on the CPU: whatever implementation torch picks, float32 compute.

    Threads: one by default (tunable ``threads``, or ``KBENCH_TORCH_THREADS``; 0 = torch's default).
    On small shared machines torch's OpenMP barriers cost ~10 ms per call whenever another process
    holds a core, which turns timings into scheduler noise; one thread measures the kernel.
    """

    name = "torch-sdpa"
    op = "attention"
    device = "cpu"
    description = ("PyTorch scaled_dot_product_attention on the CPU (torch picks the kernel); "
                   "fp16/bf16 computed in float32, output rounded to the case dtype; 1 thread by default")
    tunables = {"threads": Tunable(1, (0, 1, 2, 4, 8, 16, 32, 64), "torch intra-op threads (0: torch's default)")}

    def __init__(self, **settings) -> None:
        env = os.environ.get("KBENCH_TORCH_THREADS", "").strip()
        default = int(env) if env.isdigit() else self.tunables["threads"].default
        self.settings = {"threads": int(settings.get("threads", default))}

    def available(self) -> str | None:
        return torch_unavailable()

    def supports(self, case: Case) -> str | None:
        if mask_kind(case) in ("wide", "tall") and _peak_scores(case) > MATERIALISE_LIMIT:
            return "causal with seqlen_q != seqlen_kv needs an explicit mask the size of the scores: too large"
        return None

    def prepare(self, case: Case):
        import torch

        kind, scale, dtype = mask_kind(case), softmax_scale(case), case.dtype
        mask = bottom_right_mask(case["seqlen_q"], case["seqlen_kv"]) if kind in ("wide", "tall") else None
        if self.settings["threads"] > 0:
            torch.set_num_threads(self.settings["threads"])

        def run(q, k, v, out):
            qt, kt, vt = (as_torch(x, dtype).transpose(1, 2).to(torch.float32) for x in (q, k, v))
            o = sdpa_bhsd(qt, kt, vt, kind=kind, scale=scale, mask=mask)
            as_torch(out, dtype).copy_(o.transpose(1, 2))
        return run

    def info(self) -> dict[str, Any]:
        import torch

        return {**torch_info(), "compute": "float32", "tunables": dict(self.settings),
                "threads": self.settings["threads"] or torch.get_num_threads()}


class TorchSDPACuda(Backend):
    """One SDPA implementation on CUDA, forced with ``sdpa_kernel``."""

    op = "attention"
    device = "cuda"
    #: SDPBackend member name
    impl: str = ""
    dtypes: tuple[DType, ...] = (DType.FP32, DType.FP16, DType.BF16)
    max_head_dim: int | None = None
    #: mask kinds this implementation cannot express (see module doc), with the reason
    refuses: dict[str, str] = {}

    def __init__(self, name: str, impl: str, description: str, *, dtypes=None, max_head_dim=None,
                 refuses=None, materialises: bool = False) -> None:
        self.name, self.impl, self.description = name, impl, description
        self.dtypes = tuple(dtypes or self.dtypes)
        self.max_head_dim = max_head_dim
        self.refuses = dict(refuses or {})
        self.materialises = materialises

    def available(self) -> str | None:
        reason = torch_cuda_unavailable()
        if reason:
            return reason
        from torch.nn.attention import SDPBackend

        if not hasattr(SDPBackend, self.impl):
            import torch

            return f"torch {torch.__version__} has no SDPBackend.{self.impl}"
        return None

    def supports(self, case: Case) -> str | None:
        if case.dtype not in self.dtypes:
            return f"torch's {self.impl} kernel takes {'/'.join(map(str, self.dtypes))} only"
        if self.max_head_dim is not None and case["head_dim"] > self.max_head_dim:
            return f"torch's {self.impl} kernel takes head_dim <= {self.max_head_dim}"
        kind = mask_kind(case)
        if kind in self.refuses:
            return self.refuses[kind]
        if self.materialises and _peak_scores(case) > MATERIALISE_LIMIT:
            return (f"materialises the score matrix: ~{_peak_scores(case) / 2**30:.0f} GiB "
                    f"(limit {MATERIALISE_LIMIT / 2**30:.0f} GiB)")
        p = case.params
        return probe(self.impl, str(case.dtype), p["head_dim"], p["heads_q"], p["heads_kv"], kind)

    def _mask(self, case: Case):
        kind = mask_kind(case)
        if kind not in ("wide", "tall"):
            return None
        if self.impl == "EFFICIENT_ATTENTION":
            from torch.nn.attention.bias import causal_lower_right

            return causal_lower_right(case["seqlen_q"], case["seqlen_kv"])
        return bottom_right_mask(case["seqlen_q"], case["seqlen_kv"], device=torch_device())

    def prepare(self, case: Case):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        from kbench.api import oom_as_memory_error

        backend = getattr(SDPBackend, self.impl)
        kind, scale, dtype = mask_kind(case), softmax_scale(case), case.dtype
        mask = self._mask(case)

        def run(q, k, v, out):
            qt, kt, vt = (as_torch(x, dtype).transpose(1, 2) for x in (q, k, v))
            with sdpa_kernel([backend]):
                o = sdpa_bhsd(qt, kt, vt, kind=kind, scale=scale, mask=mask)
            return to_device_array(o.transpose(1, 2))
        return oom_as_memory_error(run)

    def info(self) -> dict[str, Any]:
        return {**torch_info(), "sdpa_backend": self.impl}


@lru_cache(maxsize=None)
def probe(impl: str, dtype: str, head_dim: int, heads_q: int, heads_kv: int, kind: str,
          device: str | None = None) -> str | None:
    """Ask torch whether SDPBackend.``impl`` runs this kind of case: None, or torch's own reasons.

    ``device``: a torch device string; default the GPU of kbench's ``cuda`` device.
    """
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    sq, sk = {"wide": (64, 128), "tall": (128, 64)}.get(kind, (64, 64))
    dev, dt = (torch.device(device) if device else torch_device()), torch_dtype(dtype)
    gen = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(1, sq, heads_q, head_dim, device=dev, dtype=dt, generator=gen).transpose(1, 2)
    k = torch.randn(1, sk, heads_kv, head_dim, device=dev, dtype=dt, generator=gen).transpose(1, 2)
    v = torch.randn(1, sk, heads_kv, head_dim, device=dev, dtype=dt, generator=gen).transpose(1, 2)
    mask = None
    if kind in ("wide", "tall"):
        if impl == "EFFICIENT_ATTENTION":
            from torch.nn.attention.bias import causal_lower_right

            mask = causal_lower_right(sq, sk)
        else:
            mask = bottom_right_mask(sq, sk, device=dev)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with sdpa_kernel([getattr(SDPBackend, impl)]):
                sdpa_bhsd(q, k, v, kind=kind, scale=head_dim ** -0.5, mask=mask)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            return None
        except Exception as exc:  # noqa: BLE001 - any refusal is the reason; never raise from supports()
            notes = [_clean(str(w.message)) for w in caught]
            notes = [n for n in dict.fromkeys(notes) if n]
            text = "; ".join(notes) or _clean(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            return f"torch refuses SDPBackend.{impl} for this case: {text[:400]}"


def cuda_backends() -> list[TorchSDPACuda]:
    top_left = ("torch's {impl} path has only the top-left is_causal and no mask input; kbench's causal "
                "mask with seqlen_q != seqlen_kv is bottom-right")
    half = (DType.FP16, DType.BF16)
    return [
        TorchSDPACuda("torch-sdpa-flash", "FLASH_ATTENTION",
                      "PyTorch SDPA forced to its FlashAttention-2 kernel (sdpa_kernel FLASH_ATTENTION)",
                      dtypes=half, max_head_dim=256,
                      refuses={k: top_left.format(impl="flash") for k in ("wide", "tall")}),
        TorchSDPACuda("torch-sdpa-efficient", "EFFICIENT_ATTENTION",
                      "PyTorch SDPA forced to its memory-efficient kernel; bottom-right causal via causal_lower_right"),
        TorchSDPACuda("torch-sdpa-cudnn", "CUDNN_ATTENTION",
                      "PyTorch SDPA forced to its cuDNN kernel (sdpa_kernel CUDNN_ATTENTION)",
                      dtypes=half, refuses={k: top_left.format(impl="cuDNN") for k in ("wide", "tall")}),
        TorchSDPACuda("torch-sdpa-math", "MATH",
                      "PyTorch SDPA forced to its unfused math path (materialises the scores)", materialises=True),
    ]
