"""Evolve lineages as histories: each committed version's scores, version number on the x axis.

The core keeps no lineages: the plugins that do (kbench-evolve) hand them over through the hook
``kbench_read_lineages``. A version's confidence band comes from the result file that measured it
(``result_file``) when that file is still there, and is left out when it is not.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kbench.errors import BadInput, KbenchError
from kbench.record import records_of
from kbench.results import load_result


@dataclass
class LineageVersion:
    number: int
    committed: str
    operator: str
    rationale: str
    geomean: float                                        # TFLOP/s, the lineage's fitness
    scores: dict[str, float]                              # case id -> TFLOP/s
    bands: dict[str, tuple[float, float]] = field(default_factory=dict)  # case id -> TFLOP/s 95% interval
    result_file: str | None = None


@dataclass
class LineageHistory:
    name: str
    root: Path
    versions: list[LineageVersion]
    attempts: int

    @property
    def cases(self) -> list[str]:
        return sorted({c for v in self.versions for c in v.scores})


def _bands(result_file: str | None) -> dict[str, tuple[float, float]]:
    """TFLOP/s interval per case from the confidence interval of the median time in the version's run."""
    if not result_file or not Path(result_file).is_file():
        return {}
    try:
        data = load_result(result_file)
    except KbenchError:
        return {}
    out = {}
    for rec in records_of(data, file=result_file):
        low, high, flops = rec.stat("ci_low"), rec.stat("ci_high"), rec.flops
        if rec.passed and flops and low and high:
            out.setdefault(rec.case_id, (flops / high / 1e12, flops / low / 1e12))
    return out


def load_lineages(workspace: str | Path, pm: Any = None) -> list[LineageHistory]:
    """Every lineage under an evolve workspace (``kbench evolve --workspace``, default ./evolve), as the plugins
    that keep lineages read them (hook ``kbench_read_lineages``), with each version's confidence bands."""
    if pm is None:
        from kbench.plugins import get_plugin_manager

        pm = get_plugin_manager()
    ws = Path(workspace)
    if not ws.is_dir():
        raise BadInput("no such evolve workspace", file=str(ws), where="--lineages",
                       fix="give the directory `kbench evolve` keeps its lineages in (KBENCH_EVOLVE_DIR, ./evolve)")
    answers = pm.hook.kbench_read_lineages(workspace=ws)
    if not answers:
        raise BadInput("reading lineages needs a plugin that keeps them, such as kbench-evolve", where="--lineages",
                       fix="pip install -e plugins/kbench-evolve, or leave out --lineages")
    out = [lineage for answer in answers for lineage in answer]
    for lineage in out:
        for v in lineage.versions:
            if not v.bands:
                v.bands = _bands(v.result_file)
    return out
