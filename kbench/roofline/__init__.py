"""Roofline math: the capacity analysis of LLM inference (``kbench roofline``, ``kbench plan``), without
running a kernel, and where a measured kernel sits against its hardware's roofs.

Four homes: :mod:`kbench.roofline.models` (model configurations and their files),
:mod:`kbench.roofline.analysis` (parameters, bytes, FLOPs, intensity, footprint, the binding wall),
:mod:`kbench.roofline.table` (the command's table) and :mod:`kbench.roofline.point` (a record's attained
rates and roof fractions, which the judge writes into ``metrics``). Hardware profiles, the figures all of
them read, are :mod:`kbench.hardware`. The plots are in :mod:`kbench.report.capacity`, the option parsing
in :mod:`kbench.commands.roofline`. Formulas and a worked example: docs/roofline.md.
"""
from __future__ import annotations

from typing import Any

from kbench.roofline.analysis import (DTYPE_BYTES, STORAGE_ONLY_BYTES, ParamCount, Phase, RooflineRow, analyze,
                                      analyze_all, attention_flops_per_pair, attention_params, decode, ffn_params,
                                      kv_bytes_per_token, param_count, prefill, weights_touched)
from kbench.roofline.models import (MLA, MODEL_FILE_SCHEMA, ModelConfig, MoE, builtin_models, load_models,
                                    models_from_data)
from kbench.roofline.table import TABLE_HEADERS, table_rows

#: names that moved out of the analysis (plots, option parsing) and where they live now: still importable
#: from here, loaded on first use so that the analysis does not import matplotlib or click
_MOVED = {"plot_quadrants": "kbench.report.capacity", "plot_footprint": "kbench.report.capacity",
          "parse_context": "kbench.commands.roofline", "split_names": "kbench.commands.roofline",
          "pick": "kbench.commands.roofline", "check_dtype": "kbench.commands.roofline",
          "MAX_CONTEXT": "kbench.commands.roofline"}


def __getattr__(name: str) -> Any:
    if name not in _MOVED:
        raise AttributeError(f"module 'kbench.roofline' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(_MOVED[name]), name)


__all__ = ["DTYPE_BYTES", "MLA", "MODEL_FILE_SCHEMA", "MoE", "ModelConfig", "ParamCount", "Phase", "RooflineRow",
           "STORAGE_ONLY_BYTES", "TABLE_HEADERS", "analyze", "analyze_all", "attention_flops_per_pair",
           "attention_params", "builtin_models", "decode", "ffn_params", "kv_bytes_per_token", "load_models",
           "models_from_data", "param_count", "prefill", "table_rows", "weights_touched", *_MOVED]
