"""Operational intensity and capacity footprint of LLM inference, without running a kernel.

The analysis of Zhao and Liu, "Heterogeneous Computing: The Key to Powering the Future of AI Agent
Inference" (arXiv 2601.22001): for a model, a context length and a device, how many FLOPs per byte
prefill and decode do (operational intensity), how many bytes one request must keep resident
(capacity footprint), how many requests fit, and which wall binds first: compute, bandwidth or
capacity. Formulas and a worked example: docs/roofline.md.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Sequence

from kbench.enums import DType
from kbench.hardware import HardwareProfile
from kbench.roofline.models import ModelConfig

#: storage formats the analysis knows besides the element types kernels run in (DType): fp8 of either
#: flavour, and fp4 without its block scales (NVFP4 adds 1 byte per 16)
STORAGE_ONLY_BYTES: dict[str, float] = {"fp8": 1.0, "fp4": 0.5}
#: bytes per element of weights and KV cache, by name: every DType, then the storage-only formats
DTYPE_BYTES: dict[str, float] = {**{d.value: float(d.itemsize) for d in DType}, **STORAGE_ONLY_BYTES}


# ---------------------------------------------------------------------------------------------
# Parameters, bytes and FLOPs
# ---------------------------------------------------------------------------------------------

def attention_params(m: ModelConfig) -> int:
    """Projection weights of one attention layer (no biases)."""
    h = m.hidden
    if m.mla is None:
        return h * m.heads_q * m.head_dim * 2 + 2 * h * m.heads_kv * m.head_dim   # q, o; k, v
    a = m.mla
    qk = a.nope_dim + a.rope_dim
    q = h * a.q_lora_rank + a.q_lora_rank * m.heads_q * qk + a.q_lora_rank if a.q_lora_rank else h * m.heads_q * qk
    kv = h * (a.kv_lora_rank + a.rope_dim) + a.kv_lora_rank + a.kv_lora_rank * m.heads_q * (a.nope_dim + a.v_head_dim)
    return q + kv + m.heads_q * a.v_head_dim * h


def ffn_params(hidden: int, inner: int) -> int:
    """SwiGLU: gate, up and down projections."""
    return 3 * hidden * inner


@dataclass(frozen=True)
class ParamCount:
    total: float          # every weight (all experts): what must be resident
    active: float         # weights one token uses (published "active" figures count embeddings too)
    matmul: float         # weights one token multiplies by (active minus the input embedding lookup)
    expert: float         # one routed expert's weights (for the expert-coverage estimate)
    moe_layers: int


def param_count(m: ModelConfig) -> ParamCount:
    per_layer = attention_params(m) + 2 * m.hidden                  # two RMSNorm weights
    embed = m.vocab * m.hidden
    head = 0 if m.tied_embeddings else m.vocab * m.hidden
    if m.moe is None:
        dense = m.layers * ffn_params(m.hidden, m.ffn)
        moe_total = moe_active = expert = 0.0
        moe_layers = 0
    else:
        e = m.moe
        moe_layers = m.layers - e.dense_layers
        expert = ffn_params(m.hidden, e.expert_ffn)
        router = m.hidden * e.experts
        dense = e.dense_layers * ffn_params(m.hidden, m.ffn)
        moe_total = moe_layers * ((e.experts + e.shared) * expert + router)
        moe_active = moe_layers * ((e.active + e.shared) * expert + router)
    body = m.layers * per_layer + m.hidden + dense                  # + final norm
    total = body + moe_total + embed + head
    active = body + moe_active + embed + head
    return ParamCount(total=float(total), active=float(active), matmul=float(active - (0 if m.tied_embeddings else embed)),
                      expert=float(expert), moe_layers=moe_layers)


def kv_bytes_per_token(m: ModelConfig, kv_dtype: str = "bf16") -> float:
    """KV cache per token: 2 * layers * kv_heads * head_dim * bytes (GQA/MHA); layers * (latent + rope) * bytes (MLA)."""
    b = DTYPE_BYTES[kv_dtype]
    if m.mla is not None:
        return m.layers * (m.mla.kv_lora_rank + m.mla.rope_dim) * b
    return 2 * m.layers * m.heads_kv * m.head_dim * b


def attention_flops_per_pair(m: ModelConfig, phase: str) -> float:
    """FLOPs of Q K^T and P V for one (query token, visible key) pair, summed over layers and heads.

    MLA decodes in the absorbed form (scores against the cached latent: dims kv_lora+rope and kv_lora,
    as FlashMLA does) and prefills in the expanded form (nope+rope and v_head_dim).
    """
    if m.mla is None:
        dqk = dv = m.head_dim
    elif phase == "decode":
        dqk, dv = m.mla.kv_lora_rank + m.mla.rope_dim, m.mla.kv_lora_rank
    else:
        dqk, dv = m.mla.nope_dim + m.mla.rope_dim, m.mla.v_head_dim
    return 2.0 * m.layers * m.heads_q * (dqk + dv)


def weights_touched(m: ModelConfig, pc: ParamCount, tokens: int) -> float:
    """Weights read by a forward pass over ``tokens`` tokens routed independently.

    Dense models read every weight. An MoE layer reads its shared experts and, under uniform routing,
    E * (1 - (1 - k/E)^tokens) distinct routed experts: k for one token, nearly all for thousands.
    """
    if m.moe is None:
        return pc.total
    e = m.moe
    distinct = e.experts * (1.0 - (1.0 - e.active / e.experts) ** max(tokens, 1))
    return pc.total - pc.moe_layers * (e.experts - distinct) * pc.expert


@dataclass(frozen=True)
class Phase:
    flops: float
    bytes: float

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes


def prefill(m: ModelConfig, context: int, weights: str = "bf16", kv: str = "bf16") -> Phase:
    """One request's prompt of ``context`` tokens in one pass: weights read once, the KV cache written once.

    FLOPs = 2 * matmul params * L + attention pairs (causal: L(L+1)/2) * per-pair FLOPs.
    """
    pc = param_count(m)
    flops = 2.0 * pc.matmul * context + attention_flops_per_pair(m, "prefill") * context * (context + 1) / 2
    nbytes = weights_touched(m, pc, context) * DTYPE_BYTES[weights] + context * kv_bytes_per_token(m, kv)
    return Phase(flops, nbytes)


def decode(m: ModelConfig, context: int, batch: int = 1, weights: str = "bf16", kv: str = "bf16") -> Phase:
    """One decode step of ``batch`` requests, each with ``context`` tokens cached: weights read once for
    the batch, every request's KV cache read once."""
    pc = param_count(m)
    flops = batch * (2.0 * pc.matmul + attention_flops_per_pair(m, "decode") * context)
    nbytes = weights_touched(m, pc, batch) * DTYPE_BYTES[weights] + batch * context * kv_bytes_per_token(m, kv)
    return Phase(flops, nbytes)


# ---------------------------------------------------------------------------------------------
# One (model, context, hardware) point
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RooflineRow:
    model: str
    attention: str
    context: int
    hardware: str
    weights_dtype: str
    kv_dtype: str
    weight_bytes: float
    kv_bytes_per_token: float
    kv_bytes_per_request: float       # the capacity footprint of one request (shared weights excluded)
    one_request_bytes: float          # weights + one request's KV: what a lone request needs resident
    prefill_intensity: float
    decode_intensity: float           # batch 1
    ridge: float | None               # the device's FLOP/byte ridge for the weights' dtype
    capacity: float | None
    devices_per_request: int | None   # devices whose memory holds weights + one request
    requests_per_device: int | None   # requests that fit one device beside the weights (0: weights don't fit)
    requests_on_group: int | None     # requests that fit on devices_per_request devices
    batch_intensity: float | None     # decode intensity at requests_on_group requests
    prefill_bound: str | None
    wall: str                         # capacity, bandwidth or compute
    group_bound: str | None           # the roof binding a decode step of requests_on_group on the group
    decode_tokens_per_s: float | None  # roofline upper bound for the group at requests_on_group
    notes: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def peak_names(dtype: str) -> tuple[str, ...]:
    """The hardware-profile peaks (kbench.hardware.DTYPES) a matmul of this element type may run at, best
    first: fp32 uses tf32 where the device has it; a flavoured DType (``fp8_e4m3``) falls back to its
    family's figure (``fp8``), which datasheets give for both flavours."""
    if dtype == DType.FP32.value:
        return ("tf32", dtype)
    family = dtype.split("_")[0]
    return (dtype, family) if family != dtype else (dtype,)


def _compute_peak(hw: HardwareProfile, weights: str) -> float | None:
    """Matmul roof for weights of this dtype (:func:`peak_names`); the datasheet figure, else the calibrated one."""
    names = peak_names(weights)
    for peak in (hw.peak, hw.measured_peak):
        found = next((peak(n) for n in names if peak(n)), None)
        if found:
            return found
    return None


def analyze(m: ModelConfig, context: int, hw: HardwareProfile, *, weights: str = "bf16", kv: str = "bf16",
            usable: float = 1.0) -> RooflineRow:
    """Intensities, footprints, fits and the binding wall for one model at one context on one device.

    Wall: ``capacity`` when weights plus one request's KV cache exceed one device; otherwise the
    roof that binds a decode step at the largest batch that fits on one device (``bandwidth`` or
    ``compute``). ``usable`` is the fraction of device memory available to weights and KV.
    """
    pc = param_count(m)
    w_bytes = pc.total * DTYPE_BYTES[weights]
    kv_tok = kv_bytes_per_token(m, kv)
    kv_req = kv_tok * context
    peak = _compute_peak(hw, weights)
    bw = hw.bandwidth or hw.measured_bandwidth
    cap = hw.capacity * usable if hw.capacity else None
    pre = prefill(m, context, weights, kv)
    dec = decode(m, context, 1, weights, kv)
    ridge = peak / bw if peak and bw else None
    notes = []
    if peak is None:
        notes.append(f"no {weights} compute figure for {hw.name}")
    n_dev = per_dev = on_group = None
    batch_i = tok_s = group_bound = None
    wall = "bandwidth"
    if cap:
        n_dev = max(1, math.ceil((w_bytes + kv_req) / cap))
        per_dev = max(0, math.floor((cap - w_bytes) / kv_req)) if kv_req else None
        on_group = max(0, math.floor((n_dev * cap - w_bytes) / kv_req)) if kv_req else None
    if on_group:
        step = decode(m, context, on_group, weights, kv)
        batch_i = step.intensity
        t_mem = step.bytes / (bw * n_dev) if bw else 0.0
        t_cmp = step.flops / (peak * n_dev) if peak else 0.0
        if max(t_mem, t_cmp) > 0:
            tok_s = on_group / max(t_mem, t_cmp)
            wall = group_bound = "compute" if t_cmp > t_mem else "bandwidth"
        else:
            wall = "unknown"
            notes.append(f"{hw.name} has neither a bandwidth nor a {weights} compute figure")
    if n_dev is not None and n_dev > 1:
        wall = "capacity"
    prefill_bound = None if ridge is None else ("compute" if pre.intensity >= ridge else "bandwidth")
    return RooflineRow(
        model=m.name, attention=m.attention, context=context, hardware=hw.name, weights_dtype=weights, kv_dtype=kv,
        weight_bytes=w_bytes, kv_bytes_per_token=kv_tok, kv_bytes_per_request=kv_req,
        one_request_bytes=w_bytes + kv_req, prefill_intensity=pre.intensity, decode_intensity=dec.intensity,
        ridge=ridge, capacity=cap, devices_per_request=n_dev, requests_per_device=per_dev,
        requests_on_group=on_group, batch_intensity=batch_i, prefill_bound=prefill_bound, wall=wall,
        group_bound=group_bound, decode_tokens_per_s=tok_s, notes="; ".join(notes))


def analyze_all(models: Sequence[ModelConfig], contexts: Sequence[int], hardware: Sequence[HardwareProfile],
                **kwargs: Any) -> list[RooflineRow]:
    return [analyze(m, c, h, **kwargs) for m in models for c in contexts for h in hardware]

