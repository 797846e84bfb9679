"""Operational intensity and capacity footprint of LLM inference, without running a kernel.

The analysis of Zhao and Liu, "Heterogeneous Computing: The Key to Powering the Future of AI Agent
Inference" (arXiv 2601.22001): for a model, a context length and a device, how many FLOPs per byte
prefill and decode do (operational intensity), how many bytes one request must keep resident
(capacity footprint), how many requests fit, and which wall binds first: compute, bandwidth or
capacity. Formulas and a worked example: docs/roofline.md.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Iterable, Mapping, Sequence

from kbench.errors import BadInput
from kbench.hardware import HardwareProfile, check_schema, parse_package_data, parse_yaml_file

#: bytes per element of weights and KV cache; fp4 without its block scales (NVFP4 adds 1 byte per 16)
DTYPE_BYTES: dict[str, float] = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "fp4": 0.5}


# ---------------------------------------------------------------------------------------------
# Model configurations
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MoE:
    experts: int              # routed experts per MoE layer
    active: int               # routed experts per token
    expert_ffn: int           # SwiGLU intermediate size of one expert
    shared: int = 0           # always-active shared experts
    dense_layers: int = 0     # leading layers that keep a dense FFN (DeepSeek-V3: first 3)


@dataclass(frozen=True)
class MLA:
    kv_lora_rank: int         # latent cached per token per layer
    rope_dim: int             # decoupled RoPE key, cached too
    nope_dim: int             # per-head q/k dimension without RoPE
    v_head_dim: int
    q_lora_rank: int | None = None


@dataclass(frozen=True)
class ModelConfig:
    name: str
    title: str
    layers: int
    hidden: int
    heads_q: int
    heads_kv: int
    head_dim: int
    ffn: int
    vocab: int
    tied_embeddings: bool = False
    moe: MoE | None = None
    mla: MLA | None = None
    params: float | None = None          # published total, to check the count against
    active_params: float | None = None
    source: str = ""
    notes: str = ""

    @property
    def attention(self) -> str:
        """``mla``, ``mha`` (one KV head per query head) or ``gqa``."""
        if self.mla is not None:
            return "mla"
        return "mha" if self.heads_kv == self.heads_q else "gqa"

    def as_mha(self) -> ModelConfig:
        """The same model with one KV head per query head (what GQA saves, for the footprint plot)."""
        return replace(self, name=f"{self.name}-as-mha", title=f"{self.title} as MHA", heads_kv=self.heads_q,
                       mla=None, params=None, active_params=None)


MODEL_FILE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["models"],
    "additionalProperties": False,
    "properties": {
        "version": {"const": 1, "description": "format version 1"},
        "models": {"type": "array", "items": {"$ref": "#/$defs/model"}, "description": "a list of models"},
    },
    "$defs": {
        "count": {"type": "integer", "minimum": 1, "description": "a positive integer"},
        "model": {
            "type": "object",
            "required": ["name", "layers", "hidden", "heads_q", "heads_kv", "head_dim", "ffn", "vocab"],
            "additionalProperties": False,
            "properties": {
                "name": {"type": "string", "pattern": "^[a-z0-9][a-z0-9._-]*$",
                         "description": "a lower-case name such as my-model-7b"},
                "title": {"type": "string"}, "source": {"type": "string"}, "notes": {"type": "string"},
                **{k: {"$ref": "#/$defs/count"} for k in ("layers", "hidden", "heads_q", "heads_kv", "head_dim",
                                                          "ffn", "vocab")},
                "tied_embeddings": {"type": "boolean"},
                "params": {"type": "number", "exclusiveMinimum": 0,
                           "description": "a number such as 7.0e+9 (YAML reads 7e9 or 7.0e9 as a string: write the dot and the sign)"},
                "active_params": {"type": "number", "exclusiveMinimum": 0,
                                  "description": "a number such as 3.0e+9 (write the dot and the exponent sign)"},
                "moe": {"type": "object", "additionalProperties": False,
                        "required": ["experts", "active", "expert_ffn"],
                        "properties": {"experts": {"$ref": "#/$defs/count"}, "active": {"$ref": "#/$defs/count"},
                                       "expert_ffn": {"$ref": "#/$defs/count"},
                                       "shared": {"type": "integer", "minimum": 0},
                                       "dense_layers": {"type": "integer", "minimum": 0}}},
                "mla": {"type": "object", "additionalProperties": False,
                        "required": ["kv_lora_rank", "rope_dim", "nope_dim", "v_head_dim"],
                        "properties": {"kv_lora_rank": {"$ref": "#/$defs/count"},
                                       "rope_dim": {"type": "integer", "minimum": 0},
                                       "nope_dim": {"$ref": "#/$defs/count"},
                                       "v_head_dim": {"$ref": "#/$defs/count"},
                                       "q_lora_rank": {"type": ["integer", "null"], "minimum": 1}}},
            },
        },
    },
}


def models_from_data(data: Any, *, file: str | None = None,
                     lines: Mapping[tuple, int] | None = None) -> list[ModelConfig]:
    from kbench.yamlsource import describe_path

    check_schema(data, MODEL_FILE_SCHEMA, file=file, lines=lines, what="model file")
    out = []
    for i, item in enumerate(data["models"]):
        item = dict(item)
        moe = MoE(**item.pop("moe")) if "moe" in item else None
        mla = MLA(**item.pop("mla")) if "mla" in item else None
        item.setdefault("title", item["name"])
        model = ModelConfig(**item, moe=moe, mla=mla)
        problem = None
        if model.heads_q % model.heads_kv:
            problem = (f"heads_q={model.heads_q} is not a multiple of heads_kv={model.heads_kv}",
                       "use a heads_kv that divides heads_q")
        elif moe and (moe.active > moe.experts or moe.dense_layers > model.layers):
            problem = ("moe.active exceeds moe.experts, or moe.dense_layers exceeds layers",
                       "check the MoE fields against the model's config.json")
        if problem:
            raise BadInput(f"model {model.name!r}: {problem[0]}", file=file,
                           where=describe_path(("models", i), dict(lines or {})), fix=problem[1])
        out.append(model)
    return out


def load_models(path: str) -> list[ModelConfig]:
    """Models from a YAML file in the format of kbench/data/models.yaml."""
    return parse_yaml_file(path, models_from_data)


def builtin_models() -> list[ModelConfig]:
    return parse_package_data("models.yaml", models_from_data)


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


def _compute_peak(hw: HardwareProfile, weights: str) -> float | None:
    """Matmul roof for weights of this dtype (fp32 weights use tf32 if the device has it); the
    datasheet figure, else the calibrated one."""
    names = ("tf32", "fp32") if weights == "fp32" else (weights,)
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


# ---------------------------------------------------------------------------------------------
# Table and plots
# ---------------------------------------------------------------------------------------------

TABLE_HEADERS = ("model", "context", "hardware", "weights GB", "KV/token KB", "KV/req GB", "1 req GB",
                 "prefill FLOP/B", "decode FLOP/B", "ridge", "devices/req", "reqs/device", "reqs/group",
                 "wall", "decode tok/s")


def _g(x: float | None, digits: int = 4) -> str:
    return "" if x is None else f"{x:.{digits}g}"


def table_rows(rows: Iterable[RooflineRow]) -> list[list[str]]:
    out = []
    for r in rows:
        group = "" if r.requests_on_group is None else f"{r.requests_on_group} on {r.devices_per_request}"
        out.append([r.model, f"{r.context:,}", r.hardware, f"{r.weight_bytes / 1e9:.1f}",
                    f"{r.kv_bytes_per_token / 1e3:.2f}", f"{r.kv_bytes_per_request / 1e9:.2f}",
                    f"{r.one_request_bytes / 1e9:.1f}", _g(r.prefill_intensity), _g(r.decode_intensity, 3),
                    _g(r.ridge, 3), "" if r.devices_per_request is None else str(r.devices_per_request),
                    "" if r.requests_per_device is None else str(r.requests_per_device), group, r.wall,
                    _g(r.decode_tokens_per_s, 3)])
    return out


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_quadrants(rows: Sequence[RooflineRow], hardware: Sequence[HardwareProfile], path: str) -> str:
    """Intensity x capacity footprint: each (model, context) as a prefill and a decode point.

    Horizontal lines: each device's ridge point (above: compute-bound, below: memory-bound). Vertical
    lines: each device's capacity (right of it: one request does not fit, the capacity wall).
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 7))
    seen: dict[tuple, RooflineRow] = {}
    for r in rows:
        seen.setdefault((r.model, r.context), r)
    models = sorted({r.model for r in seen.values()})
    colors = {name: plt.cm.tab10(i % 10) for i, name in enumerate(models)}
    contexts = sorted({r.context for r in seen.values()})
    sizes = {c: 30 + 170 * i / max(1, len(contexts) - 1) for i, c in enumerate(contexts)}
    for r in seen.values():
        x = r.one_request_bytes / 1e9
        ax.scatter([x], [r.prefill_intensity], marker="^", s=sizes[r.context], color=colors[r.model], alpha=0.8)
        ax.scatter([x], [r.decode_intensity], marker="o", s=sizes[r.context], color=colors[r.model], alpha=0.8)
    xs = [r.one_request_bytes / 1e9 for r in seen.values()]
    ys = [v for r in seen.values() for v in (r.prefill_intensity, r.decode_intensity)]
    for i, hw in enumerate(hardware):
        style = dict(color=plt.cm.Dark2(i % 8), linestyle="--", linewidth=1)
        ridge = next((r.ridge for r in rows if r.hardware == hw.name and r.ridge), None)
        # labels staggered by index so that devices with close ridges or capacities stay readable
        if ridge:
            ax.axhline(ridge, **style)
            ax.annotate(f"{hw.name} ridge {ridge:.0f}", (min(xs) * 0.8 * 1.9 ** i, ridge), fontsize=7,
                        va="bottom" if i % 2 == 0 else "top", color=style["color"])
            ys.append(ridge)
        if hw.capacity:
            ax.axvline(hw.capacity / 1e9, **style)
            ax.annotate(f"{hw.name} {hw.capacity / 1e9:.0f} GB", (hw.capacity / 1e9, max(ys) / 6 ** i), fontsize=7,
                        rotation=90, va="top", ha="right" if i % 2 == 0 else "left", color=style["color"])
            xs.append(hw.capacity / 1e9)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(min(xs) / 2, max(xs) * 2)
    ax.set_ylim(min(ys) / 3, max(ys) * 3)
    for (tx, ty, text) in ((0.02, 0.97, "compute-bound, fits"), (0.98, 0.97, "compute-bound, exceeds one device"),
                           (0.02, 0.03, "memory-bound, fits"), (0.98, 0.03, "memory-bound, exceeds one device\n(capacity wall)")):
        ax.text(tx, ty, text, transform=ax.transAxes, ha="left" if tx < 0.5 else "right",
                va="top" if ty > 0.5 else "bottom", fontsize=9, color="0.35", style="italic")
    handles = [plt.Line2D([], [], marker="s", linestyle="", color=colors[n], label=n) for n in models]
    handles += [plt.Line2D([], [], marker="^", linestyle="", color="0.4", label="prefill"),
                plt.Line2D([], [], marker="o", linestyle="", color="0.4", label="decode (batch 1)")]
    handles += [plt.Line2D([], [], marker="o", linestyle="", color="0.6", markersize=math.sqrt(sizes[c]) / 1.5,
                           label=f"context {c:,}") for c in contexts]
    ax.legend(handles=handles, fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.set_xlabel("capacity footprint of one request: weights + KV cache (GB)")
    ax.set_ylabel("operational intensity (FLOP / byte of DRAM traffic)")
    w = rows[0] if rows else None
    ax.set_title("Intensity x capacity footprint" + (f" (weights {w.weights_dtype}, KV {w.kv_dtype})" if w else ""))
    ax.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_footprint(models: Sequence[ModelConfig], hardware: Sequence[HardwareProfile], path: str, *,
                   kv: str = "bf16", max_context: int = 2_000_000) -> str:
    """KV cache per request against context length, MHA vs GQA vs MLA, with device capacities.

    Every GQA model also appears as its MHA counterpart (dashed), to show what sharing KV heads saves.
    """
    import numpy as np

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 6.5))
    ctx = np.logspace(3, math.log10(max_context), 60)
    for i, model in enumerate(models):
        variants = [(model, "-")] + ([(model.as_mha(), "--")] if model.attention == "gqa" else [])
        for m, style in variants:
            per_tok = kv_bytes_per_token(m, kv)
            ax.plot(ctx, ctx * per_tok / 1e9, style, color=plt.cm.tab10(i % 10),
                    label=f"{m.title} [{m.attention.upper()}, {per_tok / 1e3:.1f} KB/token]")
    for j, hw in enumerate(sorted((h for h in hardware if h.capacity), key=lambda h: h.capacity)):
        ax.axhline(hw.capacity / 1e9, color=plt.cm.Dark2(j % 8), linestyle=":", linewidth=1)
        # alternate label sides so that close capacities (128, 141 GB) stay readable
        ax.annotate(f"{hw.name} {hw.capacity / 1e9:.0f} GB", (ctx[-1] if j % 2 else ctx[0], hw.capacity / 1e9),
                    fontsize=7, va="bottom", ha="right" if j % 2 else "left", color=plt.cm.Dark2(j % 8))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel(f"KV cache per request ({kv}, GB)")
    ax.set_title("Capacity footprint vs context: MHA vs GQA vs MLA")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------

_SUFFIX = {"k": 10**3, "m": 10**6, "ki": 2**10, "mi": 2**20}
#: longest context --context accepts (10^12 tokens: far beyond any model, still exact in a float)
MAX_CONTEXT = 10**12


def parse_context(text: str) -> int:
    """``1000000``, ``1_000_000``, ``128k`` (x1000), ``1M`` (x10^6), ``128Ki`` (x1024), ``1Mi`` (x2^20)."""
    raw = text.strip().replace("_", "").replace(",", "")
    low = raw.lower()
    for suffix in ("ki", "mi", "k", "m"):
        if low.endswith(suffix):
            try:
                value = float(low[: -len(suffix)]) * _SUFFIX[suffix]
            except ValueError:
                break
            # 1e400k is inf, and 1e30k is no context length: refuse both instead of overflowing below
            if math.isfinite(value) and 1 <= value <= MAX_CONTEXT and value == int(value):
                return int(value)
            break
    else:
        if raw.isdigit() and len(raw) <= 16 and 1 <= int(raw) <= MAX_CONTEXT:
            return int(raw)
    raise BadInput(f"bad context length {text!r}", where="--context",
                   fix=f"give a positive integer of tokens up to {MAX_CONTEXT:,}, e.g. 1000000, 128k (x1000), "
                       "1M (x10^6), 128Ki (x1024)")


def split_names(values: Iterable[str]) -> list[str]:
    return [v.strip() for value in values for v in value.split(",") if v.strip()]


def pick(names: Sequence[str], known: Mapping[str, Any], what: str, option: str) -> list[Any]:
    out = []
    for name in names:
        key = name.lower()
        if key not in known:
            raise BadInput(f"unknown {what} {name!r}", where=option, fix=f"use one of: {', '.join(sorted(known))}")
        out.append(known[key])
    return out


def check_dtype(value: str, option: str) -> str:
    if value not in DTYPE_BYTES:
        raise BadInput(f"unknown precision {value!r}", where=option, fix=f"use one of: {', '.join(DTYPE_BYTES)}")
    return value


__all__ = ["DTYPE_BYTES", "MLA", "MoE", "ModelConfig", "Phase", "RooflineRow", "analyze", "analyze_all",
           "attention_flops_per_pair", "builtin_models", "decode", "kv_bytes_per_token", "load_models",
           "param_count", "plot_footprint", "plot_quadrants", "prefill", "table_rows"]
