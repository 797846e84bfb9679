"""Backends of ``attention_varlen`` (packed ragged prefill, FlashAttention's varlen layout).

``torch-sdpa-varlen``       CPU: one ``scaled_dot_product_attention`` per sequence of the packed batch,
                            float32 compute (as ``torch-sdpa``), 1 thread by default (tunable).
``torch-sdpa-varlen-cuda``  CUDA: the same loop on the GPU in the case dtype, torch picking the SDPA
                            kernel per call. What serving without a varlen kernel costs: one launch per
                            sequence, and one device-to-host copy of the offsets per call (a host loop
                            over sequences needs them on the host).
``flash-attn-varlen``       ``flash_attn.flash_attn_varlen_func`` (FlashAttention 2): the whole packed
``flash-attn3-varlen``      batch in one launch; ``flash_attn_interface.flash_attn_varlen_func`` (FA3).

Every backend reads the sequence boundaries from the ``cu_seqlens_q`` / ``cu_seqlens_kv`` inputs at
call time, as a varlen kernel does. Causal masking is bottom-right aligned per sequence (kbench's
convention, and FlashAttention's >= 2.1); the SDPA loops reuse ``torch-sdpa``'s handling of it.
"""
from __future__ import annotations

from typing import Any

from kbench.api import Backend, Case, Unsupported, as_torch, softmax_scale, to_device_array
from kbench_torch.common import torch_cuda_unavailable, torch_info
from kbench_torch.flash import FlashAttention, flash_backends
from kbench_torch.sdpa import TorchSDPA, bottom_right_mask, sdpa_bhsd


def op_kwargs(case: Case) -> dict[str, Any]:
    """The op's kernel keyword arguments (max_seqlen_q, max_seqlen_kv, ...), asked of the registered op."""
    from kbench.api import get_plugin_manager

    return get_plugin_manager().registry.op(case.op).kernel_kwargs(case)


def _kind(causal: bool, sq: int, sk: int) -> str:
    if not causal:
        return "none"
    return "square" if sq == sk else ("wide" if sq < sk else "tall")


def sdpa_loop(q, k, v, out, cu_q: list[int], cu_kv: list[int], *, causal: bool, scale: float, masks: dict) -> None:
    """Per sequence: (s, h, d) slices as (1, h, s, d), SDPA, written into the sequence's rows of ``out``.

    ``masks`` caches the bottom-right boolean masks by (sq, sk) (built on first use, on q's device).
    """
    for i in range(len(cu_q) - 1):
        q0, q1, k0, k1 = cu_q[i], cu_q[i + 1], cu_kv[i], cu_kv[i + 1]
        if q1 == q0 or k1 == k0:  # an empty sequence (legal in the varlen API): no query, or nothing to see
            out[q0:q1] = 0
            continue
        kind = _kind(causal, q1 - q0, k1 - k0)
        mask = None
        if kind in ("wide", "tall"):
            mask = masks.get((q1 - q0, k1 - k0))
            if mask is None:
                mask = masks[(q1 - q0, k1 - k0)] = bottom_right_mask(q1 - q0, k1 - k0, device=q.device)
        qs, ks, vs = (x.transpose(0, 1)[None] for x in (q[q0:q1], k[k0:k1], v[k0:k1]))
        o = sdpa_bhsd(qs, ks, vs, kind=kind, scale=scale, mask=mask)
        out[q0:q1] = o[0].transpose(0, 1)


class TorchSDPAVarlen(TorchSDPA):
    """``torch-sdpa-varlen`` on the CPU: threads as ``torch-sdpa`` (tunable ``threads``)."""

    name = "torch-sdpa-varlen"
    op = "attention_varlen"
    device = "cpu"
    description = ("PyTorch scaled_dot_product_attention once per packed sequence on the CPU; fp16/bf16 "
                   "computed in float32, output rounded to the case dtype; 1 thread by default")

    def supports(self, case: Case) -> str | None:
        return None  # masks are per sequence: at most max_seqlen_q x max_seqlen_kv booleans

    def prepare(self, case: Case):
        import torch

        causal, scale, dtype = case["causal"], softmax_scale(case), case.dtype
        if self.settings["threads"] > 0:
            torch.set_num_threads(self.settings["threads"])
        masks: dict = {}

        def run(q, k, v, cu_seqlens_q, cu_seqlens_kv, out):
            qt, kt, vt = (as_torch(x, dtype).to(torch.float32) for x in (q, k, v))
            o = torch.empty_like(qt)
            sdpa_loop(qt, kt, vt, o, cu_seqlens_q.tolist(), cu_seqlens_kv.tolist(), causal=causal, scale=scale,
                      masks=masks)
            as_torch(out, dtype).copy_(o)
        return run


class TorchSDPAVarlenCuda(Backend):
    name = "torch-sdpa-varlen-cuda"
    op = "attention_varlen"
    device = "cuda"
    description = ("PyTorch scaled_dot_product_attention once per packed sequence on the GPU (torch picks the "
                   "kernel); the baseline a varlen kernel removes: one launch per sequence")

    def available(self) -> str | None:
        return torch_cuda_unavailable()

    def prepare(self, case: Case):
        from kbench.api import oom_as_memory_error

        causal, scale, dtype = case["causal"], softmax_scale(case), case.dtype
        masks: dict = {}

        def run(q, k, v, cu_seqlens_q, cu_seqlens_kv, out):
            qt, kt, vt, ot = (as_torch(x, dtype) for x in (q, k, v, out))
            cu_q, cu_kv = as_torch(cu_seqlens_q).tolist(), as_torch(cu_seqlens_kv).tolist()  # device -> host
            sdpa_loop(qt, kt, vt, ot, cu_q, cu_kv, causal=causal, scale=scale, masks=masks)
        return oom_as_memory_error(run)

    def info(self) -> dict[str, Any]:
        return {**torch_info(), "sdpa_backend": "torch's choice per sequence"}


class FlashAttentionVarlen(FlashAttention):
    """``flash_attn_varlen_func`` of FlashAttention 2 / 3 on the packed layout, in one call."""

    op = "attention_varlen"

    def __init__(self, name: str, module: str, title: str, **kw: Any) -> None:
        super().__init__(name, module, title, **kw)
        self.description = (f"{title} through `{module}.flash_attn_varlen_func` on the packed batch (one launch), "
                            "bottom-right causal per sequence, native GQA")

    def prepare(self, case: Case):
        from kbench.api import oom_as_memory_error

        fn = self._import().flash_attn_varlen_func
        kw = op_kwargs(case)
        causal, scale, max_q, max_kv, dtype = kw["causal"], kw["scale"], kw["max_seqlen_q"], kw["max_seqlen_kv"], case.dtype
        self._probe_varlen(fn, case, max_q, max_kv)

        def run(q, k, v, cu_seqlens_q, cu_seqlens_kv, out):
            o = fn(as_torch(q, dtype), as_torch(k, dtype), as_torch(v, dtype), as_torch(cu_seqlens_q),
                   as_torch(cu_seqlens_kv), max_q, max_kv, softmax_scale=scale, causal=causal)
            if isinstance(o, tuple):  # some FA3 releases return (out, softmax_lse)
                o = o[0]
            return to_device_array(o)
        return oom_as_memory_error(run)

    def _probe_varlen(self, fn, case: Case, max_q: int, max_kv: int) -> None:
        """One call on a small zero packed batch of the case's configuration: the library's refusal, if any."""
        import torch

        from kbench.api import torch_dtype
        from kbench_torch.common import torch_device

        p = case.params
        sq, sk = min(max_q, 128), min(max_kv, 128)
        if max_q > max_kv:  # keep the relation the mask depends on
            sq = max(sq, sk + 1)
        dev = torch_device()
        kw = dict(device=dev, dtype=torch_dtype(case.dtype))
        q = torch.zeros(2 * sq, p["heads_q"], p["head_dim"], **kw)
        k = torch.zeros(2 * sk, p["heads_kv"], p["head_dim"], **kw)
        cu_q = torch.tensor([0, sq, 2 * sq], dtype=torch.int32, device=dev)
        cu_k = torch.tensor([0, sk, 2 * sk], dtype=torch.int32, device=dev)
        try:
            fn(q, k, torch.zeros_like(k), cu_q, cu_k, sq, sk, softmax_scale=softmax_scale(case), causal=p["causal"])
            torch.cuda.synchronize()
        except (RuntimeError, ValueError, NotImplementedError, AssertionError, TypeError) as exc:
            if "out of memory" in str(exc).lower():
                raise
            raise Unsupported(self.title, f"{type(exc).__name__}: {exc}") from exc


def varlen_backends() -> list[Backend]:
    flash = [FlashAttentionVarlen(f"{b.name}-varlen", b.module, b.title, min_capability=b.min_capability,
                                  max_capability=b.max_capability, install=b.install, min_version=b.min_version)
             for b in flash_backends()]
    return [TorchSDPAVarlen(), TorchSDPAVarlenCuda(), *flash]
