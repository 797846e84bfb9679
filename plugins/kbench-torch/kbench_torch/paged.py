"""Decode attention backends for contiguous and paged KV caches (the ``decode_attention`` op).

``torch-decode``        CPU: gather the pages through the block table (one ``index`` of the pool),
                        then ``F.scaled_dot_product_attention``; fp16/bf16 computed in float32 as
                        ``torch-sdpa`` does; 1 thread by default (tunable ``threads``).
``torch-decode-cuda``   the same on the GPU in the case dtype (torch picks the SDPA implementation).
``flash-attn-decode``   ``flash_attn.flash_attn_with_kvcache`` (FlashAttention 2): ``block_table=`` for a
                        paged cache, ``cache_seqlens`` for the sequence length; FA2 takes pages of a
                        multiple of 256 tokens only (``Paged KV cache block size must be divisible by
                        256``): the library's refusal, found by a probe call in ``prepare``, is the skip.
``flash-attn3-decode``  ``flash_attn_interface.flash_attn_with_kvcache`` (FlashAttention 3, Hopper),
                        ``page_table=``.
``flashinfer-decode``   FlashInfer's ``BatchDecodeWithPagedKVCacheWrapper`` (NHD layout), one query
                        token per sequence. ``plan()`` runs once in ``prepare`` with the batch's
                        shape (page counts, last-page lengths: the same for every call of a case);
                        the wrapper is built in CUDA-graph mode with its own indices buffer, and each
                        timed call copies the call's block table into it (a device-to-device copy of
                        ``batch * pages_per_seq`` int32, timed) before ``run()``, as a serving engine
                        does when the page table changes between steps.

The gather + SDPA backends read the batch's pages once to gather them and the gathered copy once
more: they are the baseline a paged kernel (which reads each page where it lies) should beat.
Causal masking of several query tokens is bottom-right (see :mod:`kbench.ops.decode`); flash-attn
aligns it so natively; SDPA gets the explicit mask ``kbench_torch.sdpa`` builds.
"""
from __future__ import annotations

import importlib
import importlib.util
from typing import Any

from kbench.api import Backend, Case, DType, Unsupported, as_torch, softmax_scale, to_device_array
from kbench_torch.common import torch_cuda_unavailable, torch_info
from kbench_torch.flash import FlashAttention
from kbench_torch.sdpa import TorchSDPA, bottom_right_mask, sdpa_bhsd

PAGED = frozenset({"paged"})


def decode_mask_kind(case: Case) -> str:
    """The ``kbench_torch.sdpa`` mask kind of a decode case: its queries are the cache's last tokens."""
    sq, sk = case["seqlen_q"], case["seqlen_kv"]
    return "none" if sq == 1 else ("square" if sq == sk else "wide")


def gather_pages(pages, table, seqlen_kv: int):
    """``(batch, seqlen_kv, heads_kv, head_dim)`` from a pool ``(num_pages, page_size, heads_kv, head_dim)``."""
    b = table.shape[0]
    return pages[table].reshape(b, -1, *pages.shape[2:])[:, :seqlen_kv]


def sdpa_decode(case: Case, compute_dtype=None, device=None):
    """``run(q, k, v, out)`` or ``run(q, k_pages, v_pages, block_table, out)``: gather, then SDPA."""
    kind, scale, dtype, sk = decode_mask_kind(case), softmax_scale(case), case.dtype, case["seqlen_kv"]
    mask = bottom_right_mask(case["seqlen_q"], sk, device=device) if kind == "wide" else None

    def attend(q, k, v, out):
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        if compute_dtype is not None:
            qt, kt, vt = (x.to(compute_dtype) for x in (qt, kt, vt))
        o = sdpa_bhsd(qt, kt, vt, kind=kind, scale=scale, mask=mask)
        as_torch(out, dtype).copy_(o.transpose(1, 2))

    if case["page_size"]:
        def run_paged(q, k_pages, v_pages, block_table, out):
            table = as_torch(block_table)
            k, v = (gather_pages(as_torch(x, dtype), table, sk) for x in (k_pages, v_pages))
            attend(as_torch(q, dtype), k, v, out)
        return run_paged

    def run(q, k, v, out):
        attend(as_torch(q, dtype), as_torch(k, dtype), as_torch(v, dtype), out)
    return run


class TorchDecode(TorchSDPA):
    """``torch-decode``: gather + SDPA on the CPU, float32 compute (threads as ``torch-sdpa``)."""

    name = "torch-decode"
    op = "decode_attention"
    features = PAGED
    description = ("PyTorch on the CPU: a paged cache gathered through the block table, then "
                   "scaled_dot_product_attention; fp16/bf16 computed in float32; 1 thread by default")

    def supports(self, case: Case) -> str | None:
        return None

    def prepare(self, case: Case):
        import torch

        if self.settings["threads"] > 0:
            torch.set_num_threads(self.settings["threads"])
        return sdpa_decode(case, compute_dtype=torch.float32)


class TorchDecodeCuda(Backend):
    """``torch-decode-cuda``: gather + SDPA on the GPU in the case dtype."""

    name = "torch-decode-cuda"
    op = "decode_attention"
    device = "cuda"
    features = PAGED
    description = ("PyTorch on CUDA: a paged cache gathered through the block table, then "
                   "scaled_dot_product_attention in the case dtype (torch picks the implementation)")

    def available(self) -> str | None:
        return torch_cuda_unavailable()

    def prepare(self, case: Case):
        from kbench.api import oom_as_memory_error
        from kbench_torch.common import torch_device

        return oom_as_memory_error(sdpa_decode(case, device=torch_device()))

    def info(self) -> dict[str, Any]:
        return torch_info()


class FlashAttentionDecode(FlashAttention):
    """``flash_attn_with_kvcache`` of FlashAttention 2 or 3 on a contiguous or paged cache."""

    op = "decode_attention"
    features = PAGED

    def __init__(self, name: str, module: str, title: str, *, table_arg: str, **kw) -> None:
        super().__init__(name, module, title, **kw)
        self.features = PAGED  # not the attention op's training features of the base class
        self.table_arg = table_arg
        self.description = (f"{title} through `{module}.flash_attn_with_kvcache` (`{table_arg}=` for a paged "
                            "cache), bottom-right causal, native GQA")

    def prepare(self, case: Case):
        import torch

        from kbench.api import oom_as_memory_error
        from kbench_torch.common import torch_device

        fn = self._import().flash_attn_with_kvcache
        scale, dtype, b, sk = softmax_scale(case), case.dtype, case["batch"], case["seqlen_kv"]
        self._probe_kvcache(fn, case)
        # made once, outside the timed call: every sequence holds seqlen_kv tokens
        seqlens = torch.full((b,), sk, dtype=torch.int32, device=torch_device())
        if case["page_size"]:
            arg = self.table_arg

            def run_paged(q, k_pages, v_pages, block_table, out):
                o = fn(as_torch(q, dtype), as_torch(k_pages, dtype), as_torch(v_pages, dtype), cache_seqlens=seqlens,
                       softmax_scale=scale, causal=True, **{arg: as_torch(block_table)})
                return to_device_array(o[0] if isinstance(o, tuple) else o)
            return oom_as_memory_error(run_paged)

        def run(q, k, v, out):
            o = fn(as_torch(q, dtype), as_torch(k, dtype), as_torch(v, dtype), cache_seqlens=seqlens,
                   softmax_scale=scale, causal=True)
            return to_device_array(o[0] if isinstance(o, tuple) else o)
        return oom_as_memory_error(run)

    def _probe_kvcache(self, fn, case: Case) -> None:
        """One call on small zero tensors with the case's heads, head_dim, dtype and page size."""
        import torch

        from kbench.api import torch_dtype
        from kbench_torch.common import torch_device

        p, dev = case.params, torch_device()
        kw = dict(device=dev, dtype=torch_dtype(case.dtype))
        rows = p["page_size"] or min(p["seqlen_kv"], 128)
        q = torch.zeros(1, min(p["seqlen_q"], rows), p["heads_q"], p["head_dim"], **kw)
        k = torch.zeros(2 if p["page_size"] else 1, rows, p["heads_kv"], p["head_dim"], **kw)
        extra = {self.table_arg: torch.zeros(1, 1, dtype=torch.int32, device=dev)} if p["page_size"] else {}
        try:
            fn(q, k, torch.zeros_like(k), cache_seqlens=torch.full((1,), rows, dtype=torch.int32, device=dev),
               softmax_scale=softmax_scale(case), causal=True, **extra)
            torch.cuda.synchronize()
        except (RuntimeError, ValueError, NotImplementedError, AssertionError, TypeError) as exc:
            if "out of memory" in str(exc).lower():
                raise
            raise Unsupported(self.title, f"{type(exc).__name__}: {exc}") from exc


class FlashInferDecode(Backend):
    """``flashinfer-decode``: FlashInfer's batch decode on a paged cache (NHD), one query token."""

    name = "flashinfer-decode"
    op = "decode_attention"
    device = "cuda"
    features = PAGED
    description = ("FlashInfer BatchDecodeWithPagedKVCacheWrapper (NHD paged KV, planned once per case, the "
                   "block table copied into its indices buffer per call); one query token per sequence")
    install = "pip install flashinfer-python"
    #: workspace FlashInfer's examples allocate (128 MiB)
    workspace_bytes = 128 * 2**20

    def available(self) -> str | None:
        if importlib.util.find_spec("flashinfer") is None:
            return f"flashinfer is not installed: {self.install}"
        reason = torch_cuda_unavailable()
        if reason:
            return reason
        try:
            importlib.import_module("flashinfer")
        except Exception as exc:  # noqa: BLE001 - built for another torch/CUDA
            return f"flashinfer failed to import: {type(exc).__name__}: {exc}"
        return None

    def supports(self, case: Case) -> str | None:
        if not case["page_size"]:
            return "contiguous cache: FlashInfer's batch decode takes a paged cache (set page_size)"
        if case["seqlen_q"] != 1:
            return (f"seqlen_q={case['seqlen_q']}: FlashInfer's batch decode takes one query token per sequence "
                    "(several are its prefill wrapper's job)")
        if case.dtype not in (DType.FP16, DType.BF16):
            return "FlashInfer decode is run with fp16/bf16 caches here"
        return None

    def prepare(self, case: Case):
        import flashinfer
        import torch

        from kbench.api import oom_as_memory_error, torch_dtype
        from kbench_torch.common import torch_device

        p, dev, dtype = case.params, torch_device(), case.dtype
        b, page = p["batch"], p["page_size"]
        pps = -(-p["seqlen_kv"] // page)  # pages per sequence
        i32 = dict(dtype=torch.int32, device=dev)
        indptr = torch.arange(b + 1, **i32) * pps
        indices = torch.zeros(b * pps, **i32)
        last = torch.full((b,), p["seqlen_kv"] - (pps - 1) * page, **i32)
        workspace = torch.empty(self.workspace_bytes, dtype=torch.uint8, device=dev)
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            workspace, "NHD", use_cuda_graph=True, paged_kv_indptr_buffer=indptr.clone(),
            paged_kv_indices_buffer=indices, paged_kv_last_page_len_buffer=last.clone())
        tdt = torch_dtype(dtype)
        try:
            wrapper.plan(indptr, torch.arange(b * pps, **i32), last, p["heads_q"], p["heads_kv"], p["head_dim"], page,
                         pos_encoding_mode="NONE", q_data_type=tdt, kv_data_type=tdt, sm_scale=softmax_scale(case))
        except (RuntimeError, ValueError, NotImplementedError) as exc:
            if "out of memory" in str(exc).lower():
                raise
            raise Unsupported("FlashInfer", f"{type(exc).__name__}: {exc}") from exc

        def run(q, k_pages, v_pages, block_table, out):
            indices.copy_(as_torch(block_table).reshape(-1))
            o = wrapper.run(as_torch(q, dtype)[:, 0], (as_torch(k_pages, dtype), as_torch(v_pages, dtype)))
            as_torch(out, dtype)[:, 0].copy_(o)
        return oom_as_memory_error(run)

    def info(self) -> dict[str, Any]:
        return {**torch_info(), "flashinfer": getattr(importlib.import_module("flashinfer"), "__version__", None)}


def decode_backends() -> list[Backend]:
    return [
        TorchDecode(), TorchDecodeCuda(),
        FlashAttentionDecode("flash-attn-decode", "flash_attn", "FlashAttention 2", table_arg="block_table",
                             min_capability=(8, 0), max_capability=None, min_version="2.1",
                             install="pip install flash-attn --no-build-isolation"),
        FlashAttentionDecode("flash-attn3-decode", "flash_attn_interface", "FlashAttention 3", table_arg="page_table",
                             min_capability=(9, 0), max_capability=(9, 0),
                             install="build `hopper/` of the flash-attention repository"),
        FlashInferDecode(),
    ]
