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

GQA (heads_q > heads_kv) goes through ``enable_gqa=True``; a forced CUDA implementation that refuses
it gets K and V repeated per query head (``repeat_interleave``, inside the timed call). Whether a
forced CUDA implementation accepts a case is asked of torch itself: a tiny probe call of the same
dtype, head_dim, heads and mask kind (and a backward for training modes), whose refusal warnings
become the ``supports()`` reason.

Training: every SDPA backend implements ``mode: bwd`` and ``fwd_bwd`` through autograd
(:mod:`kbench_torch.training`). Sliding windows (``window: [left, right]``) are an explicit boolean
mask, so only the implementations that take a mask declare ``window``: ``torch-sdpa`` (CPU),
``torch-sdpa-efficient`` and ``torch-sdpa-math``; the flash and cuDNN SDPA kernels take no mask.
``softcap`` (tanh capping of the scores) cannot be expressed through SDPA: no SDPA backend declares it.
"""
from __future__ import annotations

import os
import re
import warnings
from functools import lru_cache
from typing import Any

from kbench.api import Backend, Case, DType, Tunable, as_torch, softmax_scale, to_device_array, torch_dtype
from kbench_torch.common import (case_mode, case_window, empty_rows, torch_cuda_unavailable, torch_device, torch_info,
                                 torch_unavailable, training_features, visible_mask)

#: score-matrix bytes above which the materialising backends (cpu, math) decline a case
MATERIALISE_LIMIT = 48 * 2**30


def mask_kind(case: Case) -> str:
    """``none``, ``square`` (sq == sk: top-left equals bottom-right), ``wide`` (sq < sk), ``tall`` (sq > sk),
    or ``window`` (a sliding window, with or without causal: always an explicit mask)."""
    if case_window(case) is not None:
        return "window"
    if not case["causal"]:
        return "none"
    sq, sk = case["seqlen_q"], case["seqlen_kv"]
    return "square" if sq == sk else ("wide" if sq < sk else "tall")


def bottom_right_mask(sq: int, sk: int, device=None):
    """Boolean (sq, sk) mask, True where the key is visible (causal, bottom-right aligned)."""
    return visible_mask(sq, sk, causal=True, window=None, device=device)


def case_mask(case: Case, *, device=None, impl: str | None = None):
    """The ``mask`` argument of :func:`sdpa_bhsd` for ``case`` (None for kinds ``none`` and ``square``).

    Bottom-right causal for the efficient kernel is torch's ``causal_lower_right`` bias (no score-sized
    tensor); every other masked case is a boolean (sq, sk) tensor from :func:`visible_mask`.
    """
    kind = mask_kind(case)
    if kind in ("none", "square"):
        return None
    sq, sk = case["seqlen_q"], case["seqlen_kv"]
    if kind in ("wide", "tall") and impl == "EFFICIENT_ATTENTION":
        from torch.nn.attention.bias import causal_lower_right

        return causal_lower_right(sq, sk)
    return visible_mask(sq, sk, causal=case["causal"], window=case_window(case), device=device)


def sdpa_bhsd(q, k, v, *, kind: str, scale: float, mask=None, empty: int | None = None, gqa: str = "native"):
    """``F.scaled_dot_product_attention`` on (b, h, s, d) views with kbench's mask conventions.

    ``empty``: how many leading query rows see no key (set to 0, the op's definition); default the
    ``tall`` causal case's ``sq - sk``. ``gqa``: ``native`` (``enable_gqa``) or ``repeat``
    (``repeat_interleave`` of K and V; autograd sums their gradients back per kv head).
    """
    import torch
    import torch.nn.functional as F

    kwargs: dict[str, Any] = {"scale": scale}
    if q.shape[1] != k.shape[1]:
        if gqa == "repeat":
            group = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        else:
            kwargs["enable_gqa"] = True
    if kind == "square":
        kwargs["is_causal"] = True
    elif kind != "none":
        kwargs["attn_mask"] = mask
    o = F.scaled_dot_product_attention(q, k, v, **kwargs)
    if empty is None:
        empty = max(0, q.shape[2] - k.shape[2]) if kind == "tall" else 0
    if empty:  # rows that see no key: 0 by the op's definition
        if o.requires_grad:  # out of place: the kernel's backward may need its output unchanged
            rows = torch.arange(o.shape[2], device=o.device)[:, None] < empty
            o = o.masked_fill(rows, 0.0)
        else:
            o[:, :, :empty] = 0
    return o


def case_empty_rows(case: Case) -> int:
    return empty_rows(case["seqlen_q"], case["seqlen_kv"], causal=case["causal"], window=case_window(case))


def bshd_attention(case: Case, *, impl: str | None = None, device=None, gqa: str = "native"):
    """``attend(q, k, v)`` on (b, s, h, d) torch tensors with ``case``'s scale and masking.

    With ``impl`` (an SDPBackend member name) the call runs inside ``sdpa_kernel([impl])``, which
    also fixes the backward autograd runs: the one of the forward kernel that ran.
    """
    kind, scale, empty = mask_kind(case), softmax_scale(case), case_empty_rows(case)
    mask = case_mask(case, device=device, impl=impl)

    def attend(q, k, v):
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        if impl is None:
            o = sdpa_bhsd(qt, kt, vt, kind=kind, scale=scale, mask=mask, empty=empty, gqa=gqa)
        else:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            with sdpa_kernel([getattr(SDPBackend, impl)]):
                o = sdpa_bhsd(qt, kt, vt, kind=kind, scale=scale, mask=mask, empty=empty, gqa=gqa)
        return o.transpose(1, 2)
    return attend


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

    @property
    def features(self) -> frozenset[str]:  # type: ignore[override]
        """Backward and windows on the attention op; a subclass for another op (varlen) starts from none."""
        return training_features("window") if self.op == "attention" else frozenset()

    def __init__(self, **settings) -> None:
        env = os.environ.get("KBENCH_TORCH_THREADS", "").strip()
        default = int(env) if env.isdigit() else self.tunables["threads"].default
        self.settings = {"threads": int(settings.get("threads", default))}

    def available(self) -> str | None:
        return torch_unavailable()

    def supports(self, case: Case) -> str | None:
        if mask_kind(case) in ("wide", "tall", "window") and _peak_scores(case) > MATERIALISE_LIMIT:
            return "this mask needs an explicit boolean tensor the size of the scores: too large"
        return None

    def prepare(self, case: Case):
        import torch

        dtype = case.dtype
        if self.settings["threads"] > 0:
            torch.set_num_threads(self.settings["threads"])
        attend = bshd_attention(case)
        if case_mode(case) != "fwd":
            from kbench_torch.training import AutogradAttention

            return AutogradAttention(attend, dtype, compute=torch.float32)

        def run(q, k, v, out):
            qt, kt, vt = (as_torch(x, dtype).to(torch.float32) for x in (q, k, v))
            as_torch(out, dtype).copy_(attend(qt, kt, vt))
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
                 refuses=None, materialises: bool = False, takes_mask: bool = True) -> None:
        self.name, self.impl, self.description = name, impl, description
        #: every implementation has an autograd backward; a window needs an attn_mask input
        self.features = training_features("window") if takes_mask else training_features()
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
        return self._gqa(case)[1]

    def _gqa(self, case: Case) -> tuple[str, str | None]:
        """How GQA goes (``native``/``repeat``) and torch's refusal of the case, if any (both probed)."""
        p = case.params
        args = (self.impl, str(case.dtype), p["head_dim"], p["heads_q"], p["heads_kv"], mask_kind(case))
        backward = case_mode(case) != "fwd"
        reason = probe(*args, backward=backward)
        if reason is None or p["heads_q"] == p["heads_kv"]:
            return "native", reason
        if probe(*args, backward=backward, gqa="repeat") is None:
            return "repeat", None
        return "native", reason

    def prepare(self, case: Case):
        from kbench.api import oom_as_memory_error

        attend = bshd_attention(case, impl=self.impl, device=torch_device(), gqa=self._gqa(case)[0])
        dtype = case.dtype
        if case_mode(case) != "fwd":
            from kbench_torch.training import AutogradAttention

            return AutogradAttention(attend, dtype)

        def run(q, k, v, out):
            return to_device_array(attend(*(as_torch(x, dtype) for x in (q, k, v))))
        return oom_as_memory_error(run)

    def info(self) -> dict[str, Any]:
        return {**torch_info(), "sdpa_backend": self.impl}


@lru_cache(maxsize=None)
def probe(impl: str, dtype: str, head_dim: int, heads_q: int, heads_kv: int, kind: str,
          device: str | None = None, *, backward: bool = False, gqa: str = "native") -> str | None:
    """Ask torch whether SDPBackend.``impl`` runs this kind of case: None, or torch's own reasons.

    ``device``: a torch device string; default the GPU of kbench's ``cuda`` device. ``backward``:
    run the backward too (training modes). ``gqa``: as :func:`sdpa_bhsd`.
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
    if kind in ("wide", "tall") and impl == "EFFICIENT_ATTENTION":
        from torch.nn.attention.bias import causal_lower_right

        mask = causal_lower_right(sq, sk)
    elif kind in ("wide", "tall", "window"):
        window = (8, 8) if kind == "window" else None
        mask = visible_mask(sq, sk, causal=kind != "window", window=window, device=dev)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            leaves = [x.requires_grad_(backward) for x in (q, k, v)]
            with sdpa_kernel([getattr(SDPBackend, impl)]):
                o = sdpa_bhsd(*leaves, kind=kind, scale=head_dim ** -0.5, mask=mask, gqa=gqa)
            if backward:
                torch.autograd.grad(o, leaves, grad_outputs=torch.ones_like(o))
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
                      dtypes=half, max_head_dim=256, takes_mask=False,
                      refuses={k: top_left.format(impl="flash") for k in ("wide", "tall")}),
        TorchSDPACuda("torch-sdpa-efficient", "EFFICIENT_ATTENTION",
                      "PyTorch SDPA forced to its memory-efficient kernel; bottom-right causal via causal_lower_right"),
        TorchSDPACuda("torch-sdpa-cudnn", "CUDNN_ATTENTION",
                      "PyTorch SDPA forced to its cuDNN kernel (sdpa_kernel CUDNN_ATTENTION)",
                      dtypes=half, takes_mask=False,
                      refuses={k: top_left.format(impl="cuDNN") for k in ("wide", "tall")}),
        TorchSDPACuda("torch-sdpa-math", "MATH",
                      "PyTorch SDPA forced to its unfused math path (materialises the scores)", materialises=True),
    ]
