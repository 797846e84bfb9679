"""``cudnn``: the cuDNN frontend's SDPA graph (Python package ``nvidia-cudnn-frontend``, module ``cudnn``).

A graph is built per case in ``prepare`` (validation, heuristics, plan build and the workspace stay
out of the timing); the timed call executes it on kbench's arrays directly: Q, K, V and O are
torch views (b, h, s, d) of the (b, s, h, d) buffers, so cuDNN writes the poisoned ``out`` itself.
The causal mask is cuDNN's bottom-right one, kbench's convention; cuDNN refuses it when
seqlen_q > seqlen_kv, and so does ``supports()``. GQA: K and V with heads_kv heads (cuDNN >= 8.9.7).

Any other refusal comes from cuDNN itself while the graph is built: ``cudnnGraphNotSupportedError`` at
any step, or an exception from ``check_support()``/``build_plans()`` (no engine for this graph on this
GPU and cuDNN). ``prepare`` raises it as :class:`kbench.unsupported.Unsupported` with cuDNN's message,
so the record is a skip that says why; out-of-memory and other failures stay errors.
"""
from __future__ import annotations

import importlib.util
from functools import lru_cache
from typing import Any

from kbench.api import Backend, Case, DType, Unsupported, as_torch, softmax_scale, torch_dtype
from kbench_torch.common import cuda_capability, torch_cuda_unavailable, torch_device, torch_info


@lru_cache(maxsize=None)
def _handle():
    import cudnn
    import torch

    handle = cudnn.create_handle()
    # the stream kbench times on: torch's current stream on our device (the legacy default stream)
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream(torch_device()).cuda_stream)
    return handle


def _io_type(cudnn, dtype: DType):
    return {DType.FP16: cudnn.data_type.HALF, DType.BF16: cudnn.data_type.BFLOAT16}[dtype]


def _sdpa(graph, q, k, v, *, scale: float, causal: bool):
    """``graph.sdpa`` across frontend versions: ``generate_stats`` (new) or ``is_inference`` (old)."""
    mask = {"use_causal_mask_bottom_right": True} if causal else {}
    try:
        return graph.sdpa(name="sdpa", q=q, k=k, v=v, attn_scale=scale, generate_stats=False, **mask)
    except TypeError:
        return graph.sdpa(name="sdpa", q=q, k=k, v=v, attn_scale=scale, is_inference=True, **mask)


def plan(graph, cudnn) -> None:
    """Validate, lower, plan and build ``graph``; cuDNN's refusals become :class:`Unsupported` (module doc)."""
    try:
        graph.validate()
        graph.build_operation_graph()
        graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    except _refusal_types(cudnn) as exc:
        raise Unsupported("cuDNN", f"{type(exc).__name__}: {exc}") from exc
    try:
        graph.check_support()  # the support decisions: any failure here is cuDNN declining the graph
        graph.build_plans()
    except Exception as exc:  # noqa: BLE001 - out-of-memory is not a refusal: it stays an error
        if _is_out_of_memory(exc):
            raise
        raise Unsupported("cuDNN", f"{type(exc).__name__}: {exc}") from exc


def _refusal_types(cudnn) -> tuple[type[BaseException], ...]:
    """cuDNN's 'graph not supported' exception (frontend >= 1.0), when this frontend has it."""
    found = getattr(cudnn, "cudnnGraphNotSupportedError", None)
    return (found,) if isinstance(found, type) and issubclass(found, BaseException) else ()


def _is_out_of_memory(exc: BaseException) -> bool:
    text = f"{type(exc).__name__} {exc}".lower()
    return isinstance(exc, MemoryError) or "out of memory" in text or "out_of_memory" in text or "alloc" in text


class CudnnFrontendSDPA(Backend):
    name = "cudnn"
    op = "attention"
    device = "cuda"
    description = "cuDNN frontend SDPA graph (nvidia-cudnn-frontend), bottom-right causal, native GQA"

    def available(self) -> str | None:
        if importlib.util.find_spec("cudnn") is None:  # the missing package first: it is the fix
            return "module cudnn is not installed: pip install nvidia-cudnn-frontend"
        reason = torch_cuda_unavailable()
        if reason:
            return reason
        try:
            import cudnn
        except Exception as exc:  # noqa: BLE001
            if isinstance(exc, ModuleNotFoundError) and exc.name == "cudnn":
                return "module cudnn is not installed: pip install nvidia-cudnn-frontend"
            return f"cudnn (cuDNN frontend) failed to import: {type(exc).__name__}: {exc}"
        try:
            version = cudnn.backend_version()
        except Exception as exc:  # noqa: BLE001 - the frontend could not load libcudnn
            return f"the cuDNN library could not be loaded: {type(exc).__name__}: {exc}"
        if version < 8907:
            return f"cuDNN {version} is older than 8.9.7 (SDPA with GQA and bottom-right causal)"
        if cuda_capability() < (8, 0):
            return "cuDNN SDPA needs compute capability >= 8.0"
        return None

    def supports(self, case: Case) -> str | None:
        if case.dtype not in (DType.FP16, DType.BF16):
            return "cuDNN SDPA takes fp16/bf16 only"
        if case["head_dim"] % 8:
            return f"cuDNN SDPA needs head_dim a multiple of 8 (got {case['head_dim']})"
        if case["head_dim"] > 256:
            return "cuDNN SDPA on this path takes head_dim <= 256"
        if case["causal"] and case["seqlen_q"] > case["seqlen_kv"]:
            return "cuDNN's bottom-right causal mask does not support seqlen_q > seqlen_kv"
        return None

    def _build(self, case: Case):
        import cudnn
        import torch

        p = case.params
        b, sq, sk, d = p["batch"], p["seqlen_q"], p["seqlen_kv"], p["head_dim"]
        hq, hkv, dtype = p["heads_q"], p["heads_kv"], case.dtype
        dev, dt = torch_device(), torch_dtype(dtype)
        # templates with kbench's memory layout: (b, s, h, d) storage seen as (b, h, s, d)
        tq = torch.empty(b, sq, hq, d, device=dev, dtype=dt).transpose(1, 2)
        tk = torch.empty(b, sk, hkv, d, device=dev, dtype=dt).transpose(1, 2)
        handle = _handle()
        graph = cudnn.pygraph(io_data_type=_io_type(cudnn, dtype), intermediate_data_type=cudnn.data_type.FLOAT,
                              compute_data_type=cudnn.data_type.FLOAT, handle=handle)
        q, k, v = graph.tensor_like(tq), graph.tensor_like(tk), graph.tensor_like(tk)
        o, _stats = _sdpa(graph, q, k, v, scale=softmax_scale(case), causal=case["causal"])
        o.set_output(True).set_dim(list(tq.shape)).set_stride(list(tq.stride()))
        plan(graph, cudnn)
        workspace = torch.empty(max(1, graph.get_workspace_size()), device=dev, dtype=torch.uint8)
        return graph, handle, (q, k, v, o), workspace

    def prepare(self, case: Case):
        from kbench.api import oom_as_memory_error

        graph, handle, (gq, gk, gv, go), workspace = self._build(case)
        dtype = case.dtype

        def run(q, k, v, out):
            pack = {t: as_torch(a, dtype).transpose(1, 2) for t, a in ((gq, q), (gk, k), (gv, v), (go, out))}
            graph.execute(pack, workspace, handle=handle)
        return oom_as_memory_error(run)

    def info(self) -> dict[str, Any]:
        import cudnn

        info = {**torch_info(), "cudnn_backend": cudnn.backend_version()}
        try:
            import importlib.metadata as md

            info["nvidia-cudnn-frontend"] = md.version("nvidia-cudnn-frontend")
        except Exception:  # noqa: BLE001
            pass
        return info
