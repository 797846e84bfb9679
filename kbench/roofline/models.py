"""Model configurations of the capacity analysis (``kbench roofline``, ``kbench plan``): the shapes that
decide parameters, KV cache and FLOPs, read from kbench/data/models.yaml or a user's YAML file."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

from kbench.errors import BadInput
from kbench.hardware import check_schema, parse_package_data, parse_yaml_file


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

