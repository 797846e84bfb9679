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

Training and variants:

- ``mode: bwd`` / ``fwd_bwd``: two graphs, cuDNN's own backward (no autograd). The forward graph
  generates the softmax stats (``generate_stats=True``, float32 (b, h, sq, 1)); ``forward()`` (untimed
  in mode bwd) runs it into a private O and stats; ``backward()`` runs ``sdpa_backward`` with dO,
  writing dQ, dK, dV straight into kbench's buffers, and copies O into ``out``.
- ``window: [left, right]``: cuDNN's diagonal band, bottom-right aligned. cuDNN masks key ``j`` of row
  position ``pos`` when ``j <= pos - diagonal_band_left_bound`` or ``j > pos + diagonal_band_right_bound``
  (the reference mask of cudnn-frontend's test/python/test_mhas.py), so kbench's ``left`` is
  ``diagonal_band_left_bound = left + 1`` and ``right`` is ``diagonal_band_right_bound`` (0 with causal).
  A frontend without these keywords (before 1.8) refuses the case with a ``TypeError``: a skip.
- ``dtype: fp8_e4m3`` (forward): ``graph.sdpa_fp8`` with per-tensor descales of Q, K, V (the op's
  ``descale_q/k/v``), the probabilities quantised with ``scale_s = 448`` (P <= 1 fills e4m3's range;
  ``descale_s = 1/448``). O is asked for in bf16; where cuDNN allows only an FP8 O (Hopper), O is
  written in e4m3 with ``scale_o = 1/descale_v`` (|O| <= max|V|, so it cannot overflow) and converted to
  bf16 inside the timed call: that quantisation of O is part of what is measured. No FP8 backward.
- ``softcap`` is not implemented (it needs a score-modifier callback): no ``softcap`` feature.
"""
from __future__ import annotations

import importlib.util
from functools import lru_cache
from typing import Any

from kbench.api import Backend, Case, DType, TrainingKernel, Unsupported, as_torch, softmax_scale, torch_dtype
from kbench_torch.common import (as_torch_case, case_mode, case_window, cuda_capability, fp8_descales, is_fp8,
                                 torch_cuda_unavailable, torch_device, torch_info, training_features)

#: e4m3's largest finite value: the scale that maps softmax probabilities (<= 1) onto its range
FP8_MAX = 448.0


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


def band(*, causal: bool, window: tuple[int, int] | None) -> dict[str, int | bool]:
    """kbench's mask as cuDNN's bottom-right diagonal band (module doc); empty without a mask.

    Keys: ``bottom_right_causal`` (no window: the plain bottom-right causal mask), or ``left_bound`` /
    ``right_bound`` (either may be absent: that side unbounded).
    """
    if window is None:
        return {"bottom_right_causal": True} if causal else {}
    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    out: dict[str, int | bool] = {}
    if left >= 0:
        out["left_bound"] = left + 1
    if right >= 0:
        out["right_bound"] = right
    return out


def mask_kwargs(cudnn, *, causal: bool, window: tuple[int, int] | None, fp8: bool = False) -> dict[str, Any]:
    """Keywords of ``graph.sdpa`` / ``sdpa_backward`` (``diagonal_band_left_bound``/``_right_bound``) or
    ``sdpa_fp8`` (whose binding names them ``left_bound``/``right_bound``) for :func:`band`."""
    b = band(causal=causal, window=window)
    if b.get("bottom_right_causal"):
        return {"use_causal_mask_bottom_right": True}
    if not b:
        return {}
    prefix = "" if fp8 else "diagonal_band_"
    kw: dict[str, Any] = {"diagonal_alignment": cudnn.diagonal_alignment.BOTTOM_RIGHT}
    for side in ("left_bound", "right_bound"):
        if side in b:
            kw[prefix + side] = b[side]
    return kw


def _sdpa(graph, q, k, v, *, scale: float, mask: dict[str, Any], stats: bool = False):
    """``graph.sdpa`` across frontend versions: ``generate_stats`` (new) or ``is_inference`` (old)."""
    try:
        return graph.sdpa(name="sdpa", q=q, k=k, v=v, attn_scale=scale, generate_stats=stats, **mask)
    except TypeError:
        try:
            return graph.sdpa(name="sdpa", q=q, k=k, v=v, attn_scale=scale, is_inference=not stats, **mask)
        except TypeError as exc:  # a keyword this frontend lacks (the window's diagonal band)
            raise Unsupported("cuDNN", f"this cudnn frontend's graph.sdpa refuses the call: {exc}") from exc


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
    description = ("cuDNN frontend SDPA graph (nvidia-cudnn-frontend), bottom-right causal, native GQA; "
                   "backward through sdpa_backward, sliding windows as a diagonal band, FP8 forward via sdpa_fp8")
    features = training_features("window", "fp8")

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
        if is_fp8(case):
            if case_mode(case) != "fwd":
                return "kbench's cudnn backend runs FP8 forward only (sdpa_fp8_backward is not wired)"
        elif case.dtype not in (DType.FP16, DType.BF16):
            return "cuDNN SDPA takes fp16/bf16 only"  # (and fp8_e4m3 in the forward, above)
        if case["head_dim"] % 8:
            return f"cuDNN SDPA needs head_dim a multiple of 8 (got {case['head_dim']})"
        if case["head_dim"] > 256:
            return "cuDNN SDPA on this path takes head_dim <= 256"
        if case["causal"] and case["seqlen_q"] > case["seqlen_kv"]:
            return "cuDNN's bottom-right causal mask does not support seqlen_q > seqlen_kv"
        return None

    # -- graphs ----------------------------------------------------------------------------------

    def _templates(self, case: Case, dtype=None):
        """Empty torch tensors with kbench's memory layout: (b, s, h, d) storage seen as (b, h, s, d)."""
        import torch

        p = case.params
        dev, dt = torch_device(), dtype or torch_dtype(case.dtype)
        tq = torch.empty(p["batch"], p["seqlen_q"], p["heads_q"], p["head_dim"], device=dev, dtype=dt).transpose(1, 2)
        tk = torch.empty(p["batch"], p["seqlen_kv"], p["heads_kv"], p["head_dim"], device=dev, dtype=dt).transpose(1, 2)
        return tq, tk

    def _graph(self, cudnn, io_type):
        return cudnn.pygraph(io_data_type=io_type, intermediate_data_type=cudnn.data_type.FLOAT,
                             compute_data_type=cudnn.data_type.FLOAT, handle=_handle())

    def _mask(self, cudnn, case: Case) -> dict[str, Any]:
        return mask_kwargs(cudnn, causal=case["causal"], window=case_window(case), fp8=is_fp8(case))

    def _build(self, case: Case, *, stats: bool = False):
        """The forward graph; with ``stats`` it also writes the softmax stats (float32 (b, h, sq, 1))."""
        import cudnn
        import torch

        tq, tk = self._templates(case)
        graph = self._graph(cudnn, _io_type(cudnn, case.dtype))
        q, k, v = graph.tensor_like(tq), graph.tensor_like(tk), graph.tensor_like(tk)
        o, st = _sdpa(graph, q, k, v, scale=softmax_scale(case), mask=self._mask(cudnn, case), stats=stats)
        o.set_output(True).set_dim(list(tq.shape)).set_stride(list(tq.stride()))
        stats_buffer = None
        if stats:
            b, h, sq, _ = tq.shape
            stats_buffer = torch.empty(b, h, sq, 1, device=tq.device, dtype=torch.float32)
            st.set_output(True).set_dim(list(stats_buffer.shape)).set_stride(list(stats_buffer.stride()))
            st.set_data_type(cudnn.data_type.FLOAT)
        plan(graph, cudnn)
        workspace = torch.empty(max(1, graph.get_workspace_size()), device=tq.device, dtype=torch.uint8)
        return graph, _handle(), (q, k, v, o, st), workspace, stats_buffer

    def _build_backward(self, case: Case):
        import cudnn
        import torch

        tq, tk = self._templates(case)
        b, h, sq, _ = tq.shape
        stats = torch.empty(b, h, sq, 1, device=tq.device, dtype=torch.float32)
        graph = self._graph(cudnn, _io_type(cudnn, case.dtype))
        q, k, v = graph.tensor_like(tq), graph.tensor_like(tk), graph.tensor_like(tk)
        o, do, st = graph.tensor_like(tq), graph.tensor_like(tq), graph.tensor_like(stats)
        try:
            dq, dk, dv = graph.sdpa_backward(name="sdpa_backward", q=q, k=k, v=v, o=o, dO=do, stats=st,
                                             attn_scale=softmax_scale(case), **self._mask(cudnn, case))
        except TypeError as exc:
            raise Unsupported("cuDNN", f"this cudnn frontend's graph.sdpa_backward refuses the call: {exc}") from exc
        for grad, like in ((dq, tq), (dk, tk), (dv, tk)):
            grad.set_output(True).set_dim(list(like.shape)).set_stride(list(like.stride()))
        plan(graph, cudnn)
        workspace = torch.empty(max(1, graph.get_workspace_size()), device=tq.device, dtype=torch.uint8)
        return graph, (q, k, v, o, do, st, dq, dk, dv), workspace

    def _build_fp8(self, case: Case, *, bf16_output: bool):
        """The FP8 forward graph (module doc); O in bf16, or in e4m3 where cuDNN requires it."""
        import cudnn
        import torch

        e4m3, f32 = cudnn.data_type.FP8_E4M3, cudnn.data_type.FLOAT
        tq, tk = self._templates(case, dtype=torch.float8_e4m3fn)
        graph = self._graph(cudnn, e4m3)
        q, k, v = (graph.tensor(name=n, dim=list(t.shape), stride=list(t.stride()), data_type=e4m3)
                   for n, t in (("q", tq), ("k", tk), ("v", tk)))
        scalar = dict(dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=f32)
        names = ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o")
        scalars = {n: graph.tensor(name=n, **scalar) for n in names}
        try:
            o, _stats, amax_s, amax_o = graph.sdpa_fp8(q=q, k=k, v=v, **scalars, attn_scale=softmax_scale(case),
                                                       generate_stats=False, **self._mask(cudnn, case))
        except TypeError as exc:
            raise Unsupported("cuDNN", f"this cudnn frontend's graph.sdpa_fp8 refuses the call: {exc}") from exc
        o.set_output(True).set_dim(list(tq.shape)).set_stride(list(tq.stride()))
        o.set_data_type(cudnn.data_type.BFLOAT16 if bf16_output else e4m3)
        for amax in (amax_s, amax_o):
            amax.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]).set_data_type(f32)
        plan(graph, cudnn)
        dev = tq.device
        dq_, dk_, dv_ = fp8_descales(case)
        values = {"descale_q": dq_, "descale_k": dk_, "descale_v": dv_, "descale_s": 1.0 / FP8_MAX,
                  "scale_s": FP8_MAX, "scale_o": 1.0 if bf16_output else 1.0 / dv_}
        pack = {scalars[n]: torch.full((1, 1, 1, 1), values[n], device=dev, dtype=torch.float32) for n in names}
        pack[amax_s] = torch.empty(1, 1, 1, 1, device=dev, dtype=torch.float32)
        pack[amax_o] = torch.empty(1, 1, 1, 1, device=dev, dtype=torch.float32)
        workspace = torch.empty(max(1, graph.get_workspace_size()), device=dev, dtype=torch.uint8)
        return graph, (q, k, v, o), pack, workspace, values["scale_o"]

    # -- kernels ---------------------------------------------------------------------------------

    def prepare(self, case: Case):
        from kbench.api import oom_as_memory_error

        if is_fp8(case):
            return self._prepare_fp8(case)
        if case_mode(case) != "fwd":
            import torch

            o = torch.empty_like(self._templates(case)[0].transpose(1, 2))  # the private O, kbench's layout
            return CudnnTraining(self._build(case, stats=True), self._build_backward(case), o, case.dtype)
        graph, handle, (gq, gk, gv, go, _st), workspace, _ = self._build(case)
        dtype = case.dtype

        def run(q, k, v, out):
            pack = {t: as_torch(a, dtype).transpose(1, 2) for t, a in ((gq, q), (gk, k), (gv, v), (go, out))}
            graph.execute(pack, workspace, handle=handle)
        return oom_as_memory_error(run)

    def _prepare_fp8(self, case: Case):
        import torch

        from kbench.api import oom_as_memory_error

        try:
            graph, (gq, gk, gv, go), pack, workspace, scale_o = self._build_fp8(case, bf16_output=True)
            o8 = None
        except Unsupported:  # Hopper: cuDNN's FP8 attention writes O in FP8 only
            graph, (gq, gk, gv, go), pack, workspace, scale_o = self._build_fp8(case, bf16_output=False)
            tq, _ = self._templates(case, dtype=torch.float8_e4m3fn)
            o8 = tq  # a private e4m3 O, (b, h, s, d) view of (b, s, h, d) storage
        dtype, handle = case.dtype, _handle()

        def run(q, k, v, out):
            o = as_torch(out, DType.BF16)
            io = {gq: as_torch_case(q, dtype).transpose(1, 2), gk: as_torch_case(k, dtype).transpose(1, 2),
                  gv: as_torch_case(v, dtype).transpose(1, 2), go: o.transpose(1, 2) if o8 is None else o8}
            graph.execute({**pack, **io}, workspace, handle=handle)
            if o8 is not None:  # real O = stored / scale_o
                o.copy_(o8.transpose(1, 2).to(torch.float32) * (1.0 / scale_o))
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


class CudnnTraining(TrainingKernel):
    """Mode bwd / fwd_bwd on cuDNN's graphs (module doc): forward with stats, then ``sdpa_backward``."""

    def __init__(self, forward_graph, backward_graph, o, dtype: DType) -> None:
        self.fwd_graph, self.handle, fwd_tensors, self.fwd_ws, self.stats = forward_graph
        self.gq, self.gk, self.gv, self.go, self.gst = fwd_tensors
        self.bwd_graph, self.bwd_tensors, self.bwd_ws = backward_graph
        #: the forward's output (b, s, h, d): written by forward(), read by backward() and copied to ``out``
        self.o = o
        self.dtype = dtype

    def _views(self, *arrays):
        return [as_torch(a, self.dtype).transpose(1, 2) for a in arrays]

    def forward(self, q, k, v):
        from kbench_torch.training import memory_errors_named

        tq, tk, tv = self._views(q, k, v)
        with memory_errors_named():
            self.fwd_graph.execute({self.gq: tq, self.gk: tk, self.gv: tv, self.go: self.o.transpose(1, 2),
                                    self.gst: self.stats}, self.fwd_ws, handle=self.handle)
        return tq, tk, tv

    def backward(self, saved, do, out, dq, dk, dv):
        from kbench_torch.training import memory_errors_named

        tq, tk, tv = saved
        q, k, v, o, gdo, st, gdq, gdk, gdv = self.bwd_tensors
        tdo, tdq, tdk, tdv = self._views(do, dq, dk, dv)
        with memory_errors_named():
            self.bwd_graph.execute({q: tq, k: tk, v: tv, o: self.o.transpose(1, 2), gdo: tdo, st: self.stats,
                                    gdq: tdq, gdk: tdk, gdv: tdv}, self.bwd_ws, handle=self.handle)
            as_torch(out, self.dtype).copy_(self.o)
        return None
