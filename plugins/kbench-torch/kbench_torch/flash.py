"""FlashAttention backends: ``flash-attn`` (FlashAttention 2, package ``flash_attn``) and
``flash-attn3`` (FlashAttention 3 for Hopper, module ``flash_attn_interface``), when installed.

Both take kbench's layout (batch, seqlen, heads, head_dim) directly, GQA natively (heads_q a
multiple of heads_kv) and align the causal mask bottom-right (FlashAttention >= 2.1), exactly
kbench's convention, so no adaptation happens inside the timed call.

The libraries check a call's shapes, types and GPU themselves (head sizes a build was not compiled
for, GQA ratios, architectures) and raise. ``prepare`` makes one call on small zero tensors with the
case's head counts, head_dim, dtype and masking (and a backward for the training modes): a refusal
there becomes :class:`kbench.unsupported.Unsupported` with the library's message (a skip), before any
checked call. A release too old for a keyword (``window_size`` before FA 2.3, ``softcap`` before 2.6)
raises ``TypeError`` there, which is the same kind of refusal.

Training and variants: both implement ``mode: bwd`` / ``fwd_bwd`` through autograd (``flash_attn_func`` is an
autograd function; :mod:`kbench_torch.training`), ``window: [left, right]`` as ``window_size=(left,
right)`` (the same bottom-right convention as kbench's) and ``softcap`` as ``softcap=``. FlashAttention 3
also takes ``dtype: fp8_e4m3`` in the forward: inputs in float8_e4m3fn with per-tensor descales passed as
``q_descale``/``k_descale``/``v_descale`` tensors of shape (batch, heads_kv), output in bf16.
"""
from __future__ import annotations

import importlib
import importlib.util
from typing import Any

from kbench.api import Backend, Case, DType, Unsupported, softmax_scale, to_device_array
from kbench_torch.common import (as_torch_case, case_mode, case_softcap, case_window, cuda_capability, fp8_descales,
                                 is_fp8, torch_cuda_unavailable, torch_info, training_features)


class FlashAttention(Backend):
    op = "attention"
    device = "cuda"

    def __init__(self, name: str, module: str, title: str, *, min_capability: tuple[int, int],
                 max_capability: tuple[int, int] | None, install: str, min_version: str | None = None,
                 fp8: bool = False) -> None:
        self.name, self.module, self.title = name, module, title
        self.fp8 = fp8
        # the attention op's features; a subclass for another op (varlen, decode) starts from none
        self.features = (training_features("window", "softcap", *(("fp8",) if fp8 else ()))
                         if self.op == "attention" else frozenset())
        self.min_capability, self.max_capability = min_capability, max_capability
        self.install, self.min_version = install, min_version
        self.description = f"{title} through `{module}.flash_attn_func`, bottom-right causal, native GQA"

    def _import(self):
        return importlib.import_module(self.module)

    def available(self) -> str | None:
        if importlib.util.find_spec(self.module) is None:  # say the missing package first: it is the fix
            return f"{self.module} is not installed ({self.title}): {self.install}"
        reason = torch_cuda_unavailable()
        if reason:
            return reason
        try:
            mod = self._import()
        except Exception as exc:  # noqa: BLE001 - not installed, or built for another torch/CUDA
            if isinstance(exc, ModuleNotFoundError) and exc.name == self.module:
                return f"{self.module} is not installed ({self.title}): {self.install}"
            return f"{self.module} failed to import: {type(exc).__name__}: {exc}"
        version = getattr(mod, "__version__", None)
        if self.min_version and version and _version_tuple(version) < _version_tuple(self.min_version):
            return f"{self.module} {version} aligns causal masks top-left; need >= {self.min_version}"
        cap = cuda_capability()
        if cap < self.min_capability or (self.max_capability and cap > self.max_capability):
            want = ".".join(map(str, self.min_capability))
            if self.max_capability:
                want = f"{want}..{'.'.join(map(str, self.max_capability))}"
            return f"{self.title} needs compute capability {want}; this GPU is {cap[0]}.{cap[1]}"
        return None

    def supports(self, case: Case) -> str | None:
        if is_fp8(case) and self.fp8:
            if case_mode(case) != "fwd":
                return f"{self.title}'s FP8 path is forward only (no FP8 backward)"
        elif case.dtype not in (DType.FP16, DType.BF16):
            return f"{self.title} takes fp16/bf16{' (and fp8_e4m3 forward)' if self.fp8 else ''} only"
        d = case["head_dim"]
        if d > 256:
            return f"{self.title} takes head_dim <= 256"
        if d % 8:
            return f"{self.title} needs head_dim a multiple of 8 (got {d})"
        return None

    def call_kwargs(self, case: Case, *, batch: int | None = None) -> dict[str, Any]:
        """Keywords of ``flash_attn_func`` for ``case``; only what the case sets beyond scale and causal.

        ``batch``: the batch size of the FP8 descale tensors (default the case's).
        """
        kw: dict[str, Any] = {"softmax_scale": softmax_scale(case), "causal": case["causal"]}
        window = case_window(case)
        if window is not None:
            kw["window_size"] = window  # flash-attn's (left, right), -1 unbounded: kbench's own convention
        if case_softcap(case):
            kw["softcap"] = case_softcap(case)
        if is_fp8(case):
            import torch

            from kbench_torch.common import torch_device

            shape = (case["batch"] if batch is None else batch, case["heads_kv"])
            for name, value in zip(("q_descale", "k_descale", "v_descale"), fp8_descales(case)):
                kw[name] = torch.full(shape, value, dtype=torch.float32, device=torch_device())
        return kw

    def prepare(self, case: Case):
        from kbench.api import oom_as_memory_error

        fn = self._import().flash_attn_func
        kw, dtype = self.call_kwargs(case), case.dtype
        self._probe(fn, case)

        def attend(q, k, v):
            o = fn(q, k, v, **kw)
            return o[0] if isinstance(o, tuple) else o  # some FA3 releases return (out, softmax_lse)

        if case_mode(case) != "fwd":
            from kbench_torch.training import AutogradAttention

            return AutogradAttention(attend, dtype)

        def run(q, k, v, out):
            return to_device_array(attend(*(as_torch_case(x, dtype) for x in (q, k, v))))
        return oom_as_memory_error(run)

    def _probe(self, fn, case: Case) -> None:
        """One call on small zero tensors of the case's configuration: the library's refusal, if any."""
        import torch

        from kbench.api import torch_dtype
        from kbench_torch.common import torch_device

        p = case.params
        rows_q, rows_kv = min(p["seqlen_q"], 128), min(p["seqlen_kv"], 128)
        if p["seqlen_q"] > p["seqlen_kv"]:  # keep the relation the mask depends on
            rows_q = max(rows_q, rows_kv + 1)
        kw = dict(device=torch_device(), dtype=torch_dtype(case.dtype))
        train = case_mode(case) != "fwd"
        q = torch.zeros(1, rows_q, p["heads_q"], p["head_dim"], **kw).requires_grad_(train)
        k = torch.zeros(1, rows_kv, p["heads_kv"], p["head_dim"], **kw).requires_grad_(train)
        v = torch.zeros_like(k).requires_grad_(train)
        try:
            o = fn(q, k, v, **self.call_kwargs(case, batch=1))
            o = o[0] if isinstance(o, tuple) else o
            if train:
                torch.autograd.grad(o, (q, k, v), grad_outputs=torch.ones_like(o))
            torch.cuda.synchronize()
        except (RuntimeError, ValueError, NotImplementedError, AssertionError, TypeError) as exc:
            if "out of memory" in str(exc).lower():
                raise
            raise Unsupported(self.title, f"{type(exc).__name__}: {exc}") from exc

    def info(self) -> dict[str, Any]:
        mod = self._import()
        return {**torch_info(), self.module: getattr(mod, "__version__", None)}


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def flash_backends() -> list[FlashAttention]:
    return [
        FlashAttention("flash-attn", "flash_attn", "FlashAttention 2", min_capability=(8, 0), max_capability=None,
                       install="pip install flash-attn --no-build-isolation", min_version="2.1"),
        FlashAttention("flash-attn3", "flash_attn_interface", "FlashAttention 3", min_capability=(9, 0),
                       max_capability=(9, 0), install="build `hopper/` of the flash-attention repository", fp8=True),
    ]
