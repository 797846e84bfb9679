"""The validation grid of `kbench plan` against NVIDIA's aiconfigurator (docs/plan.md, "Validation"): the
scenarios, aiconfigurator's answers as recorded, a runner of the ``aiconfigurator`` command (an optional tool:
never imported, started as a subprocess where installed) and the parser of its result tables.
"""
from __future__ import annotations

import math
import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

#: the aiconfigurator release the recorded answers come from
AIC_VERSION = "0.12.0"


@dataclass(frozen=True)
class Scenario:
    name: str
    model: str              # kbench model name (kbench/data/models.yaml)
    model_path: str         # the Hugging Face path aiconfigurator knows the model by
    hardware: str           # kbench hardware profile
    system: str             # aiconfigurator system name
    gpus: int               # cluster size both tools plan for
    isl: int                # input tokens per request
    osl: int                # output tokens per request
    ttft: float             # SLO, seconds
    tpot: float             # SLO, seconds

    def aiconfigurator_command(self) -> list[str]:
        return ["aiconfigurator", "cli", "default", "--model-path", self.model_path, "--total-gpus", str(self.gpus),
                "--system", self.system, "--isl", str(self.isl), "--osl", str(self.osl),
                "--ttft", f"{self.ttft * 1e3:g}", "--tpot", f"{self.tpot * 1e3:g}", "--backend", "trtllm"]

    def kbench_args(self) -> list[str]:
        """The same question to `kbench plan`: the cluster of ``gpus`` devices, its KV transfers between
        servers over InfiniBand, ranked by output tokens per second per device."""
        return ["-m", self.model, "--hardware", self.hardware, "--devices", str(self.gpus),
                "--isl", str(self.isl), "--osl", str(self.osl), "--interconnect", "ib-ndr", "--rank-by", "output",
                "--slo", f"ttft={self.ttft:g}s,tpot={self.tpot * 1e3:g}ms"]


#: models x hardware x ISL/OSL x SLO; every model and system is in both tools' data, bf16 weights and KV cache
GRID: tuple[Scenario, ...] = (
    Scenario("70b-h200-8k", "llama-3.1-70b", "meta-llama/Meta-Llama-3.1-70B", "h200", "h200_sxm", 16,
             8000, 1000, 2.0, 0.050),
    Scenario("70b-h100-4k", "llama-3.1-70b", "meta-llama/Meta-Llama-3.1-70B", "h100-sxm", "h100_sxm", 16,
             4000, 500, 1.0, 0.040),
    Scenario("70b-b200-16k", "llama-3.1-70b", "meta-llama/Meta-Llama-3.1-70B", "b200", "b200_sxm", 16,
             16000, 1000, 3.0, 0.030),
    Scenario("70b-a100-2k", "llama-3.1-70b", "meta-llama/Meta-Llama-3.1-70B", "a100-80gb-sxm", "a100_sxm", 16,
             2000, 500, 3.0, 0.080),
    Scenario("8b-h100-2k", "llama-3.1-8b", "meta-llama/Meta-Llama-3.1-8B", "h100-sxm", "h100_sxm", 8,
             2000, 500, 0.5, 0.020),
    Scenario("8b-h200-decode", "llama-3.1-8b", "meta-llama/Meta-Llama-3.1-8B", "h200", "h200_sxm", 8,
             1000, 2000, 0.3, 0.010),
    Scenario("qwen3-8b-b200-8k", "qwen3-8b", "Qwen/Qwen3-8B", "b200", "b200_sxm", 8,
             8000, 500, 0.8, 0.015),
    Scenario("qwen3-32b-h200-4k", "qwen3-32b", "Qwen/Qwen3-32B", "h200", "h200_sxm", 16,
             4000, 1000, 1.5, 0.030),
    Scenario("moe-30b-h200-2k", "qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B", "h200", "h200_sxm", 8,
             2000, 500, 1.0, 0.020),
    Scenario("moe-30b-b200-chat", "qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B", "b200", "b200_sxm", 16,
             512, 128, 0.3, 0.010),
    Scenario("moe-30b-h100-8k", "qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B", "h100-sxm", "h100_sxm", 16,
             8000, 512, 2.0, 0.030),
    Scenario("moe-235b-h200-4k", "qwen3-235b-a22b", "Qwen/Qwen3-235B-A22B", "h200", "h200_sxm", 32,
             4000, 1000, 3.0, 0.050),
    Scenario("8b-a100-chat", "llama-3.1-8b", "meta-llama/Meta-Llama-3.1-8B", "a100-80gb-sxm", "a100_sxm", 8,
             512, 128, 0.2, 0.020),
    Scenario("70b-h200-32k", "llama-3.1-70b", "meta-llama/Meta-Llama-3.1-70B", "h200", "h200_sxm", 32,
             32000, 256, 10.0, 0.050),
    Scenario("qwen3-32b-b200-gen", "qwen3-32b", "Qwen/Qwen3-32B", "b200", "b200_sxm", 16,
             1000, 2000, 1.0, 0.015),
    Scenario("8b-b200-32k", "llama-3.1-8b", "meta-llama/Meta-Llama-3.1-8B", "b200", "b200_sxm", 8,
             32000, 256, 3.0, 0.020),
    Scenario("qwen3-8b-h100-gen", "qwen3-8b", "Qwen/Qwen3-8B", "h100-sxm", "h100_sxm", 16,
             1000, 2000, 0.5, 0.008),
    Scenario("70b-b200-chat", "llama-3.1-70b", "meta-llama/Meta-Llama-3.1-70B", "b200", "b200_sxm", 32,
             512, 128, 0.5, 0.025),
)

#: scenarios of the same class kept aside while the step model was built (never looked at before it was done):
#: the held-out check reported separately in docs/plan.md
HELD_OUT: tuple[Scenario, ...] = (
    Scenario("ho-moe-30b-h200-32k", "qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B", "h200", "h200_sxm", 16,
             32000, 256, 5.0, 0.030),
    Scenario("ho-70b-h100-gen", "llama-3.1-70b", "meta-llama/Meta-Llama-3.1-70B", "h100-sxm", "h100_sxm", 32,
             1000, 2000, 2.0, 0.040),
    Scenario("ho-qwen3-32b-a100-8k", "qwen3-32b", "Qwen/Qwen3-32B", "a100-80gb-sxm", "a100_sxm", 16,
             8000, 512, 4.0, 0.060),
    Scenario("ho-8b-h200-chat", "llama-3.1-8b", "meta-llama/Meta-Llama-3.1-8B", "h200", "h200_sxm", 8,
             512, 128, 0.1, 0.008),
)

#: aiconfigurator 0.12.0's answers for GRID (``aiconfigurator cli default ... --backend trtllm``, offline, run on
#: 2026-12-01; re-run with benchmarks/plan_aiconfigurator.py --aiconfigurator): per mode the best configuration's
#: output tokens/s per GPU, TTFT (s), TPOT (s, from its tokens/s/user), parallelism and decode batch
RECORDED: dict[str, dict[str, tuple[float, float, float, str, int] | None]] = {
    "70b-h200-8k": {"agg": (222.88, 1.851, 0.0344, "tp4pp1", 32),
                   "disagg": (222.75, 1.818, 0.0248, "P 2xtp2pp1 + D 1xtp4pp1", 52)},
    "70b-h100-4k": {"agg": (209.95, 0.960, 0.0366, "tp4pp1", 32),
                   "disagg": (223.99, 0.904, 0.0299, "P 2xtp2pp1 + D 1xtp4pp1", 76)},
    "70b-b200-16k": {"agg": (228.95, 2.884, 0.0272, "tp4pp1", 28),
                    "disagg": (202.28, 2.003, 0.0169, "P 2xtp2pp1 + D 1xtp4pp1", 32)},
    "70b-a100-2k": {"agg": (201.11, 1.442, 0.0777, "tp4pp1", 64),
                   "disagg": (168.97, 1.199, 0.0496, "P 2xtp2pp1 + D 1xtp4pp1", 100)},
    "8b-h100-2k": {"agg": (3679.28, 0.425, 0.0189, "tp2pp1", 144),
                  "disagg": (3369.6, 0.090, 0.0198, "P 3xtp1pp1 + D 5xtp1pp1", 116)},
    "8b-h200-decode": {"agg": (7540.25, 0.292, 0.0094, "tp2pp1", 144),
                      "disagg": (5399.25, 0.044, 0.0097, "P 2xtp1pp1 + D 3xtp2pp1", 152)},
    "qwen3-8b-b200-8k": {"agg": (2055.28, 0.548, 0.0144, "tp1pp1", 32),
                        "disagg": (1928.78, 0.206, 0.0148, "P 2xtp1pp1 + D 1xtp2pp1", 124)},
    "qwen3-32b-h200-4k": {"agg": (897.3, 1.388, 0.0300, "tp2pp1", 56),
                         "disagg": (831.79, 0.749, 0.0299, "P 4xtp1pp1 + D 1xtp4pp1", 216)},
    "moe-30b-h200-2k": {"agg": (3973.87, 0.468, 0.0192, "tp1pp1dp4etp1ep4", 80),
                       "disagg": (3210.17, 0.083, 0.0195, "P 4xtp1pp1dp1etp1ep1 + D 1xtp1pp1dp4etp1ep4", 136)},
    "moe-30b-b200-chat": {"agg": (6871.61, 0.207, 0.0095, "tp1pp1dp4etp1ep4", 80),
                         "disagg": (4042.41, 0.030, 0.0100, "P 5xtp1pp1dp2etp1ep2 + D 3xtp2pp1dp1etp1ep2", 232)},
    "moe-30b-h100-8k": {"agg": (1033.75, 1.104, 0.0286, "tp1pp1dp4etp1ep4", 32),
                       "disagg": (1061.34, 0.308, 0.0295, "P 8xtp1pp1dp1etp1ep1 + D 1xtp1pp1dp8etp1ep8", 68)},
    "ho-70b-h100-gen": {"agg": (1108.52, 0.367, 0.0360, "tp4pp1", 160),
                       "disagg": (813.45, 0.234, 0.0297, "P 2xtp2pp1 + D 7xtp4pp1", 120)},
    "ho-qwen3-32b-a100-8k": {"agg": (118.96, 3.783, 0.0591, "tp4pp1", 32),
                            "disagg": (118.67, 2.597, 0.0485, "P 6xtp2pp1 + D 1xtp4pp1", 100)},
    "ho-8b-h200-chat": {"agg": (4176.46, 0.042, 0.0075, "tp2pp1", 64),
                       "disagg": (4318.73, 0.024, 0.0077, "P 2xtp1pp1 + D 1xtp2pp1", 256)},
    "moe-235b-h200-4k": {"agg": (476.99, 1.881, 0.0486, "tp1pp1dp8etp4ep2", 24),
                        "disagg": (444.71, 0.911, 0.0398, "P 2xtp1pp1dp4etp2ep2 + D 3xtp1pp1dp8etp1ep8", 26)},
    "8b-a100-chat": {"agg": (1762.08, 0.155, 0.0174, "tp2pp1", 64),
                    "disagg": (1794.24, 0.072, 0.0190, "P 5xtp1pp1 + D 3xtp1pp1", 108)},
    "70b-h200-32k": {"agg": (19.74, 9.811, 0.0454, "tp2pp1", 4),
                    "disagg": (19.15, 9.464, 0.0383, "P 14xtp2pp1 + D 1xtp4pp1", 36)},
    "qwen3-32b-b200-gen": {"agg": (4239.25, 0.489, 0.0149, "tp4pp1", 256),
                          "disagg": (3331.89, 0.102, 0.0150, "P 2xtp1pp1 + D 7xtp2pp1", 124)},
    "8b-b200-32k": {"agg": (319.32, 2.362, 0.0182, "tp1pp1", 10),
                   "disagg": (291.86, 1.066, 0.0153, "P 6xtp1pp1 + D 1xtp2pp1", 40)},
    "qwen3-8b-h100-gen": {"agg": (4159.98, 0.207, 0.0076, "tp4pp1", 128),
                         "disagg": (2867.3, 0.048, 0.0077, "P 4xtp1pp1 + D 3xtp4pp1", 128)},
    "70b-b200-chat": {"agg": (1059.23, 0.340, 0.0238, "tp4pp1", 112),
                     "disagg": (1230.21, 0.116, 0.0242, "P 22xtp1pp1 + D 5xtp2pp1", 224)},
    "ho-moe-30b-h200-32k": {"agg": (164.13, 4.497, 0.0231, "tp1pp1dp1etp1ep1", 8),
                           "disagg": (141.87, 2.194, 0.0164, "P 12xtp1pp1dp1etp1ep1 + D 1xtp4pp1dp1etp1ep4", 44)},
}


def recorded(name: str) -> dict[str, dict[str, Any]]:
    """RECORDED[name] in the shape parse_aiconfigurator returns."""
    out: dict[str, dict[str, Any] | None] = {}
    for mode, found in RECORDED[name].items():
        if found is None:
            out[mode] = None
            continue
        tok, ttft, tpot, parallel, batch = found
        out[mode] = {"tokens_s_gpu": tok, "ttft_s": ttft, "tpot_s": tpot, "parallel": parallel, "batch": batch}
    return out


@dataclass(frozen=True)
class Row:
    """One scenario side by side: each tool's best tokens/s per GPU per mode and its verdict."""
    scenario: Scenario
    aic: Mapping[str, Mapping[str, Any] | None]
    kbench: Mapping[str, Mapping[str, Any] | None]

    def best(self, side: str) -> tuple[str, float]:
        found = self.aic if side == "aic" else self.kbench
        mode, entry = max(((m, e) for m, e in found.items() if e), key=lambda me: me[1]["tokens_s_gpu"],
                          default=("none", None))
        return mode, entry["tokens_s_gpu"] if entry else 0.0

    @property
    def ratio(self) -> float:
        """kbench's best tokens/s per GPU over aiconfigurator's."""
        return self.best("kbench")[1] / self.best("aic")[1]

    @property
    def aic_margin(self) -> float:
        """How much aiconfigurator's winning mode leads the other (0.1: 10%)."""
        agg, dis = (self.aic.get(m) for m in ("agg", "disagg"))
        if not agg or not dis:
            return math.inf
        hi, lo = max(agg["tokens_s_gpu"], dis["tokens_s_gpu"]), min(agg["tokens_s_gpu"], dis["tokens_s_gpu"])
        return hi / lo - 1

    @property
    def within(self) -> bool:
        return abs(self.ratio - 1) <= 0.2

    @property
    def verdict_required(self) -> bool:
        return self.aic_margin > 0.1

    @property
    def same_verdict(self) -> bool:
        return self.best("aic")[0] == self.best("kbench")[0]


def kbench_best(data: Mapping[str, Any]) -> dict[str, dict[str, Any] | None]:
    """The best plan per mode from `kbench plan --format json` (its plans are ranked), in the shape of
    parse_aiconfigurator."""
    out: dict[str, dict[str, Any] | None] = {"agg": None, "disagg": None}
    for p in data["plans"]:
        mode = "agg" if p["mode"] == "aggregated" else "disagg"
        if out[mode] is not None or not p["meets_slo"]:
            continue
        sim = p.get("simulation") or {}
        if mode == "agg":
            parallel = f"{p['parallel_prefill']} x{p['prefill_instances']}"
        else:
            parallel = (f"P {p['prefill_instances']}x{p['parallel_prefill']} + "
                        f"D {p['decode_instances']}x{p['parallel_decode']}")
        out[mode] = {"tokens_s_gpu": p["output_tokens_per_s_per_device"], "ttft_s": sim.get("ttft_p50_s"),
                     "ttft_p90_s": sim.get("ttft_p90_s"), "tpot_s": sim.get("tpot_p50_s"),
                     "tpot_p90_s": sim.get("tpot_p90_s"), "parallel": parallel, "batch": p["batch"],
                     "req_s": p["rate_req_s"], "devices": p["devices"]}
    return out


def run_kbench(scenario: Scenario, extra: Sequence[str] = ()) -> dict[str, dict[str, Any] | None]:
    """`kbench plan` for one scenario, in this process (--format json), best plan per mode."""
    return run_kbench_json(scenario, extra)[0]


def run_kbench_json(scenario: Scenario, extra: Sequence[str] = ()) -> tuple[dict[str, dict[str, Any] | None],
                                                                         dict[str, Any]]:
    """`kbench plan --format json` for one scenario: the best plan per mode and the whole answer."""
    import json

    from click.testing import CliRunner

    from kbench.cli import cli

    res = CliRunner().invoke(cli, ["plan", *scenario.kbench_args(), "--format", "json", *extra],
                             catch_exceptions=False)
    if res.exit_code not in (0, 2):
        raise RuntimeError(f"kbench plan failed ({res.exit_code}): {res.output[-2000:]}")
    text = res.output
    data = json.loads(text[text.index("{"): text.rindex("}") + 1])
    return kbench_best(data), data


_ROW = re.compile(r"^\|\s*\d+\s*\|")


def _table(text: str, title: str) -> list[dict[str, str]]:
    """The rows of one of aiconfigurator's result tables (``agg Top Configurations`` ...) as dicts by header."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(title)), None)
    if start is None:
        return []
    header: list[str] | None = None
    rows = []
    for line in lines[start + 1:]:
        if line.startswith("|") and header is None:
            header = [h.strip() for h in line.strip().strip("|").split("|")]
        elif _ROW.match(line) and header:
            rows.append(dict(zip(header, (c.strip() for c in line.strip().strip("|").split("|")))))
        elif rows and not line.startswith(("|", "+")):
            break
    return rows


def _best(row: Mapping[str, str], mode: str) -> dict[str, Any]:
    per_user = float(row["tokens/s/user"])
    out: dict[str, Any] = {"tokens_s_gpu": float(row["tokens/s/gpu"]), "ttft_s": float(row["TTFT"]) / 1e3,
                           "tpot_s": 1.0 / per_user if per_user else None, "req_s": float(row["req/s"])}
    if mode == "agg":
        out.update(parallel=row["parallel"], batch=int(row["bs"]))
    else:
        out.update(parallel=f"P {row['(p)workers']}x{row['(p)parallel']} + D {row['(d)workers']}x{row['(d)parallel']}",
                   batch=int(row["(d)bs"]))
    return out


def parse_aiconfigurator(text: str) -> dict[str, dict[str, Any] | None]:
    """The best aggregated and disaggregated configuration from the output of ``aiconfigurator cli default``:
    output tokens/s per GPU, TTFT and TPOT (seconds; TPOT from its tokens/s/user), request rate, parallelism and
    batch. None for a mode without a configuration meeting the SLO."""
    found: dict[str, dict[str, Any] | None] = {}
    for mode in ("agg", "disagg"):
        rows = _table(text, f"{mode} Top Configurations")
        found[mode] = _best(rows[0], mode) if rows else None
    return found


def aiconfigurator_missing() -> str | None:
    """Why aiconfigurator cannot run here, or None."""
    if shutil.which("aiconfigurator") is None:
        return (f"aiconfigurator is not installed (an optional tool, about 400 MB with pandas and pyarrow): "
                f"pip install aiconfigurator=={AIC_VERSION}")
    return None


def run_aiconfigurator(scenario: Scenario, timeout: float = 600.0) -> dict[str, dict[str, Any] | None]:
    """Run ``aiconfigurator cli default`` for one scenario (offline; 30-60 s) and parse its answer."""
    proc = subprocess.run(scenario.aiconfigurator_command(), capture_output=True, text=True, timeout=timeout,
                          check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"aiconfigurator failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return parse_aiconfigurator(proc.stdout + proc.stderr)
