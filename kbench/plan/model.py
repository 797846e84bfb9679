"""The serving model behind `kbench plan`: the time of a prefill, a decode step or a mixed iteration on one
instance of a hardware type (tensor-parallel all-reduces and pipeline stages included), KV-cache capacity,
and the mean-value screen that sizes aggregated and disaggregated pools (M/G/1 prefill queue, fluid decode).
The iteration-level simulation (:mod:`kbench.plan.simulate`) uses the same times. Formulas, assumptions and a
worked example: docs/plan.md.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Mapping, Sequence

from kbench.hardware import HardwareProfile
from kbench.plan import kernels
from kbench.plan.inputs import Interconnect, ServedClass, Workload
from kbench.plan.measured import MeasuredRates
from kbench.roofline import (DTYPE_BYTES, ModelConfig, attention_flops_per_pair, kv_bytes_per_token, param_count,
                             weights_touched)
from kbench.roofline.analysis import peak_names

#: tensor-parallel degrees tried per instance (one server of 8 GPUs at most; CPUs run one instance per machine)
TP_DEGREES = (1, 2, 4, 8)
#: devices per server: tensor parallelism stays inside one; pipeline stages beyond it talk over the network
NODE_DEVICES = 8
#: largest pool the search considers (instances); a plan needing more is reported as not meeting the SLO
MAX_INSTANCES = 1 << 20
#: bytes per activation element crossing an all-reduce or a pipeline boundary (bf16 activations)
ACTIVATION_BYTES = 2


@dataclass(frozen=True)
class Assumptions:
    """What the plan assumes where nothing was measured, and the scheduler it plans for (each is printed)."""
    compute_efficiency: float = 0.8     # fraction of the datasheet matmul peak reached (shaped: by a large GEMM)
    bandwidth_efficiency: float = 0.8   # fraction of the datasheet memory bandwidth reached
    link_efficiency: float = 0.8        # fraction of an interconnect's bandwidth reached (KV transfer, all-reduce)
    usable_memory: float = 0.9          # fraction of device memory for weights + KV (the rest: activations, runtime)
    max_utilization: float = 0.8        # busiest a prefill instance may be in the screen (the queue grows without bound at 1)
    weights: str = "bf16"
    kv: str = "bf16"
    chunk: int = 8192                   # tokens per iteration (decode tokens + prefill chunk), TensorRT-LLM's max_num_tokens
    max_batch: int = 512                # requests per instance the scheduler admits at most
    step_model: str = "shaped"          # "shaped": kernel times by shape on GPUs (kbench.plan.kernels); "roofline"
    prefill_headroom: float = 0.9       # disaggregated plans run their prefill pool at most at this share, and
    decode_headroom: float = 0.92       # their decode pool at this share, of the simulated capacity (rate matching)

    def scaled(self, factor: float) -> Assumptions:
        """The assumed efficiencies times ``factor`` (capped at 1): the sensitivity check."""
        return replace(self, compute_efficiency=min(1.0, self.compute_efficiency * factor),
                       bandwidth_efficiency=min(1.0, self.bandwidth_efficiency * factor),
                       link_efficiency=min(1.0, self.link_efficiency * factor))


@dataclass(frozen=True)
class Rate:
    """One rate of one device, and where it comes from."""
    value: float        # FLOP/s or B/s, one device
    origin: str         # "measured" (a result file), "calibrated" (kbench calibrate roof) or "roofline"
    detail: str


@dataclass(frozen=True)
class Parallel:
    """One instance: ``tp`` devices in tensor parallel times ``pp`` pipeline stages. A pipeline keeps ``pp``
    micro-batches in flight, so the instance serves as ``pp`` lanes, each with the step time of the whole model
    on ``tp`` devices plus the stage-to-stage transfers, sharing the instance's KV room. MoE models may also run
    attention data-parallel (``dp`` ranks of ``tp`` devices, each with its own requests and KV cache, stepping
    together) and their experts ``ep``-way expert-parallel over the ``tp x dp`` devices (each expert's width
    split the remaining ``tp dp / ep`` ways)."""
    tp: int = 1
    pp: int = 1
    ep: int = 1
    dp: int = 1

    @property
    def devices(self) -> int:
        return self.tp * self.dp * self.pp

    @property
    def moe_tp(self) -> int:
        return max(1, self.tp * self.dp // self.ep)

    @property
    def label(self) -> str:
        return (f"TP{self.tp}" + (f" DP{self.dp}" if self.dp > 1 else "") + (f" EP{self.ep}" if self.ep > 1 else "")
                + (f" PP{self.pp}" if self.pp > 1 else ""))

    @property
    def short(self) -> str:
        """aiconfigurator's spelling: tp4pp1 (dp2 ep4 where used)."""
        return (f"tp{self.tp}pp{self.pp}" + (f"dp{self.dp}" if self.dp > 1 else "")
                + (f"ep{self.ep}" if self.ep > 1 else ""))


def as_parallel(par: Parallel | int, pp: int = 1) -> Parallel:
    """A Parallel from a tensor-parallel degree (and pipeline stages), or the Parallel given."""
    return par if isinstance(par, Parallel) else Parallel(par, pp)


class DeviceModel:
    """The rates of one hardware type for one model: matmul, memory, attention (prefill), KV reads (decode)
    and the links that tensor- and pipeline-parallel instances talk over.

    Matmuls and weight reads are always roofline figures: the datasheet roof times an assumed efficiency, or a
    calibrated roof (`kbench calibrate`, which measured a GEMM and a copy on the machine) taken as reached.
    Prefill attention and decode KV reads come from measured kernels when result files cover this hardware
    (decode only at the parallel work it was measured at: batch x KV heads per device).
    """

    def __init__(self, hw: HardwareProfile, model: ModelConfig, assume: Assumptions,
                 measured: MeasuredRates | None = None,
                 interconnects: Mapping[str, Interconnect] | None = None) -> None:
        self.hw, self.model, self.assume, self.measured = hw, model, assume, measured
        self.params = param_count(model)
        self.weight_bytes = self.params.total * DTYPE_BYTES[assume.weights]
        self.kv_per_token = kv_bytes_per_token(model, assume.kv)
        self.attention_weight_bytes = model.layers * (model.heads_q * 2 + model.heads_kv * 2) * model.head_dim \
            * model.hidden * DTYPE_BYTES[assume.weights]
        self.pair_flops = {ph: attention_flops_per_pair(model, ph) for ph in ("prefill", "decode")}
        links = [interconnects[n] for n in hw.interconnects if interconnects and n in interconnects]
        #: the link inside a server (all-reduces) and between servers (pipeline stages beyond one server)
        self.node_link = next((x for x in links if x.scope == "node"), None)
        self.net_link = next((x for x in links if x.scope == "network"), None)
        names = peak_names(assume.weights)
        peak = next((hw.peak(n) for n in names if hw.peak(n)), None)
        if peak:
            self.compute = Rate(peak * assume.compute_efficiency, "roofline",
                                f"{peak / 1e12:g} TFLOP/s datasheet x assumed efficiency {assume.compute_efficiency:g}")
        else:
            cal = next((hw.measured_peak(n) for n in names if hw.measured_peak(n)), None)
            if cal is None:
                cal = max(hw.measured_flops.values(), default=None)
            self.compute = None if not cal else Rate(cal, "calibrated", f"{cal / 1e12:.3g} TFLOP/s calibrated GEMM")
        if hw.bandwidth:
            self.memory = Rate(hw.bandwidth * assume.bandwidth_efficiency, "roofline",
                               f"{hw.bandwidth / 1e9:g} GB/s datasheet x assumed efficiency "
                               f"{assume.bandwidth_efficiency:g}")
        elif hw.measured_bandwidth:
            self.memory = Rate(hw.measured_bandwidth, "calibrated",
                               f"{hw.measured_bandwidth / 1e9:.3g} GB/s calibrated copy")
        else:
            self.memory = None
        group = model.heads_q / model.heads_kv
        self._attn = self._decode = None
        if measured is not None:
            self._attn = measured.curve(hw.name, "prefill-attention", group=group, head_dim=model.head_dim,
                                        dtype=assume.kv)
            self._decode = measured.curve(hw.name, "decode-attention", group=group, head_dim=model.head_dim,
                                          dtype=assume.kv)
        self._attn_cache: dict[int, Rate] = {}
        self._weights_cache: dict[int, float] = {}
        self._pass_cache: dict[tuple, tuple[float, float, float]] = {}
        #: coefficient of variation of a step's time, from the measured spread of the result files (else 0)
        self.jitter = measured.jitter.get(hw.name, 0.0) if measured is not None else 0.0
        self._shaped_setup(peak)

    def _shaped_setup(self, peak: float | None) -> None:
        """The kernel-by-shape model (kbench.plan.kernels) on GPUs with datasheet roofs: GEMMs up to the assumed
        efficiency of a large GEMM, bandwidth-bound kernels up to the assumed bandwidth efficiency; prefill
        attention at its own efficiency unless measured."""
        hw, a = self.hw, self.assume
        self.shaped = bool(a.step_model == "shaped" and hw.kind == "gpu" and peak and hw.bandwidth)
        self.peak = (peak or 0.0) * kernels.SUSTAINED_TENSOR.get(hw.name, 1.0)   # GEMMs, grouped GEMMs
        self.bandwidth = hw.bandwidth or 0.0
        self.kernel_rates = (self.peak * a.compute_efficiency, self.bandwidth * a.bandwidth_efficiency)
        if self.shaped:
            eff = kernels.PREFILL_ATTN_EFF * a.compute_efficiency / 0.8
            self.prefill_attention_roof = Rate(peak * eff, "roofline", f"{peak / 1e12:g} TFLOP/s "
                                               f"datasheet x fused-attention efficiency {eff:.2g}")
        else:
            self.prefill_attention_roof = self.compute

    @property
    def usable(self) -> bool:
        return self.compute is not None and self.memory is not None and bool(self.hw.capacity)

    def memory_bytes(self, devices: int) -> float:
        return devices * (self.hw.capacity or 0.0) * self.assume.usable_memory

    def kv_room(self, devices: int) -> float:
        """Bytes left for KV caches on ``devices`` devices once the weights are loaded."""
        return self.memory_bytes(devices) - self.weight_bytes

    def kv_tokens(self, par: Parallel) -> int:
        """Tokens of KV cache an instance holds (its pp lanes share them: a request's KV is split over the
        stages by layer, so one request may use the whole room)."""
        replicated = (par.dp - 1) * self.attention_weight_bytes    # each data-parallel rank holds attention whole
        copies = par.tp * par.dp / self.kv_split(par)               # KV heads held twice where tp > KV heads
        return max(0, math.floor((self.kv_room(par.devices) - replicated) / (self.kv_per_token * copies)))

    def kv_split(self, par: Parallel) -> int:
        """Over how many devices a token's KV cache is split: the data-parallel ranks times the tensor-parallel
        devices up to the KV heads (beyond them each head is held by tp / heads devices; MLA's latent by every
        tensor-parallel device)."""
        if self.model.mla is not None:
            return par.dp
        return min(par.tp, self.model.heads_kv) * par.dp

    def lane_tokens(self, par: Parallel) -> float:
        """An instance's KV room per lane, on average: what a lane's batch is sized from."""
        return self.kv_tokens(par) / par.pp

    def parallel_problem(self, par: Parallel) -> str | None:
        """Why this hardware cannot run an instance of ``par``, or None."""
        if par.tp * par.dp > NODE_DEVICES:
            return f"tensor and data-parallel attention stay within a server of {NODE_DEVICES} devices"
        if par.tp * par.dp > 1 and self.node_link is None:
            return f"{self.hw.name} lists no link inside a server for tensor-parallel all-reduces"
        if par.pp > 1 and par.devices > NODE_DEVICES and self.net_link is None and self.node_link is not None:
            return f"{self.hw.name} lists no network link for pipeline stages across servers"
        return None

    def attention_rate(self, seqlen: int) -> Rate:
        if self._attn is None:
            return self.prefill_attention_roof
        found = self._attn_cache.get(seqlen)
        if found is None:
            value, where = self._attn.at(seqlen)
            found = Rate(value, "measured", f"{value / 1e12:.3g} TFLOP/s measured ({where}; {self._attn.file})")
            self._attn_cache[seqlen] = found
        return found

    def work(self, batch: float, tp: int) -> float:
        """(request, KV head) pairs one device works on in a decode step of ``batch`` requests."""
        return batch * max(1.0, self.model.heads_kv / tp)

    def kv_read_rate(self, context: int, work: float | None = None) -> Rate:
        """The KV-read rate of a decode step over ``context`` cached tokens per request and ``work`` (request, KV
        head) pairs per device: measured where a result file covers that work, else the bandwidth roof."""
        if self._decode is not None:
            found = self._decode.at(context, work)
            if found is not None:
                value, where = found
                return Rate(value, "measured", f"{value / 1e9:.3g} GB/s measured ({where}; {self._decode.file})")
            top = self._decode.works[-1]
            return replace(self.memory, detail=self.memory.detail + f" (measured only up to {top} heads x requests "
                                                                    f"per device, {work:g} here)")
        return self.memory

    # -- the pieces of an iteration --------------------------------------------------------------------

    def weights_read(self, tokens: int) -> float:
        """Bytes of weights a forward pass over ``tokens`` tokens reads (MoE: the experts they reach)."""
        if self.model.moe is None:
            return self.weight_bytes
        found = self._weights_cache.get(tokens)
        if found is None:
            found = weights_touched(self.model, self.params, tokens) * DTYPE_BYTES[self.assume.weights]
            self._weights_cache[tokens] = found
        return found

    def allreduce(self, nbytes: float, tp: int) -> float:
        """One all-reduce of ``nbytes`` over ``tp`` devices joined by the server's link. Shaped: the fraction of
        the link TensorRT-LLM's custom all-reduce reaches at that size (:func:`kernels.allreduce_time`).
        Roofline: the faster of one-shot (latency + (tp-1) S / bw) and two-shot ((tp-1) latencies + 2 (tp-1)/tp
        S / bw)."""
        if tp <= 1:
            return 0.0
        link = self.node_link
        if self.shaped:
            return kernels.allreduce_time(nbytes, tp, link.bandwidth, link.latency, self.assume.link_efficiency / 0.8)
        bw = link.bandwidth * self.assume.link_efficiency
        one_shot = link.latency + (tp - 1) * nbytes / bw
        two_shot = (tp - 1) * link.latency + 2 * (tp - 1) / tp * nbytes / bw
        return min(one_shot, two_shot)

    def stage_transfer(self, tokens: int, par: Parallel) -> float:
        """The pp-1 transfers of a pass's activations between pipeline stages."""
        if par.pp <= 1:
            return 0.0
        link = self.net_link if par.devices > NODE_DEVICES else (self.node_link or self.net_link)
        if link is None:
            return 0.0
        return (par.pp - 1) * (link.latency + tokens * self.model.hidden * ACTIVATION_BYTES
                               / (link.bandwidth * self.assume.link_efficiency))

    def comm(self, tokens: int, par: Parallel) -> float:
        """Communication of one forward pass over ``tokens`` tokens: two all-reduces per layer (after attention
        and after the MLP) over the attention's tensor-parallel devices, each of the tokens of one data-parallel
        rank; the pipeline's stage transfers."""
        per_rank = tokens / par.dp
        return (2 * self.model.layers * self.allreduce(per_rank * self.model.hidden * ACTIVATION_BYTES, par.tp)
                + self.stage_transfer(tokens, par))

    def pass_time(self, tokens: int, par: Parallel, prompt_tokens: int = 0) -> float:
        """Everything of a forward pass over ``tokens`` tokens but attention over the cache: matmuls (weights),
        elementwise kernels, MoE layers, communication, the KV writes of ``prompt_tokens`` new prompt tokens and
        (shaped) every kernel's floor: the fixed cost of an iteration."""
        a, b, extra = self.pass_parts(tokens, par)
        return max(a, b + prompt_tokens * self.kv_write_seconds(par)) + extra

    def kv_write_seconds(self, par: Parallel) -> float:
        """Seconds to write one token's KV cache on an instance."""
        return self.kv_per_token / (self.kv_split(par) * self.memory.value)

    def pass_parts(self, tokens: int, par: Parallel) -> tuple[float, float, float]:
        """A pass's time as ``max(a, b + KV writes) + extra``: roofline, a = matmul compute, b = weight reads,
        extra = communication; shaped, a = 0, b = the pass by kernels, extra = 0. Memoized."""
        key = (tokens, par)
        found = self._pass_cache.get(key)
        if found is None:
            if self.shaped:
                found = (0.0, self._shaped_pass(tokens, par), 0.0)
            else:
                found = (2.0 * self.params.matmul * tokens / (par.tp * par.dp * self.compute.value),
                         self.weights_read(tokens) / (par.tp * par.dp * self.memory.value), self.comm(tokens, par))
            self._pass_cache[key] = found
        return found

    def _shaped_pass(self, tokens: int, par: Parallel) -> float:
        """Per layer: the attention projections (qkv, o) on each data-parallel rank's tokens, the MLP (dense
        gate/up and down GEMMs, or the MoE layer over every rank's tokens with its all-to-all), the elementwise
        kernels, the decode-attention floor and the all-reduces; then the LM head on one token per sequence
        (bounded by the tokens) and the stage transfers."""
        m, x = self.model, self.kernel_rates
        flops, bw = x
        n_rank = tokens / par.dp
        t = par.tp
        q_out = (m.heads_q + 2 * m.heads_kv) * m.head_dim / t
        attn = (kernels.gemm_time(n_rank, q_out, m.hidden, flops, bw)
                + kernels.gemm_time(n_rank, m.hidden, m.heads_q * m.head_dim / t, flops, bw))
        norms = 2 * (kernels.ELEMENTWISE_FLOOR + n_rank * kernels.NORM_ELEMENTS * m.hidden * 2 / bw)
        dense = (kernels.gemm_time(n_rank, 2 * m.ffn / t, m.hidden, flops, bw)
                 + kernels.gemm_time(n_rank, m.hidden, m.ffn / t, flops, bw)
                 + kernels.ELEMENTWISE_FLOOR + n_rank * kernels.ACT_ELEMENTS * m.ffn / t * 2 / bw)
        per_layer = attn + norms + kernels.DECODE_ATTN_FLOOR
        total = m.layers * per_layer
        if m.moe is None:
            total += m.layers * dense
        else:
            e = m.moe
            moe = kernels.moe_layer_time(tokens, m.hidden, e.expert_ffn, e.experts, e.active, par.ep, par.moe_tp,
                                         self.peak, self.bandwidth)
            if e.shared:
                shared = kernels.gemm_time(n_rank, 2 * e.shared * e.expert_ffn / t, m.hidden, flops, bw)
                moe += shared + kernels.gemm_time(n_rank, m.hidden, e.shared * e.expert_ffn / t, flops, bw)
            if par.dp > 1:
                link = self.node_link.bandwidth if self.node_link else self.memory.value
                moe += kernels.alltoall_time(tokens, m.hidden, e.active, par.ep, link)
            total += e.dense_layers * dense + (m.layers - e.dense_layers) * moe
        head = kernels.gemm_time(min(n_rank, max(1.0, n_rank)), m.vocab / t, m.hidden, flops, bw)
        return total + head + self.comm(tokens, par)

    def kv_seconds_per_token(self, batch: float, context: float, par: Parallel | int) -> tuple[float, Rate]:
        """Seconds a decode step spends per cached token (over all requests): the KV read at the measured or
        roofline rate (shaped: at the fraction of the bandwidth a layer of that size reaches), or at the roofline
        the attention FLOPs where they take longer."""
        par = as_parallel(par)
        devices = self.kv_split(par)
        kv = self.kv_read_rate(round(context), self.work(batch / par.dp, par.tp))
        if kv.origin == "measured":
            return self.kv_per_token / (devices * kv.value), kv
        if self.shaped:
            layer = batch * context * self.kv_per_token / (devices * self.bandwidth * self.model.layers)
            eff = kernels.decode_attention_efficiency(layer) / kernels.dp_imbalance(batch, par.dp)
            return self.kv_per_token / (devices * self.bandwidth * eff), kv
        t = self.kv_per_token / (devices * kv.value)
        return max(t, self.pair_flops["decode"] / (devices * self.compute.value)), kv

    def prefill_attention(self, pairs: float, length: int, par: Parallel | int) -> float:
        """Causal attention of ``pairs`` (query, key) pairs of a prompt of ``length`` tokens."""
        par = as_parallel(par)
        return self.pair_flops["prefill"] * pairs / (par.tp * par.dp * self.attention_rate(length).value)

    # -- phases ---------------------------------------------------------------------------------

    def prefill(self, tokens: int, par: Parallel | int = 1, cached: int = 0, pp: int = 1) -> PhaseTime:
        """One prompt of ``tokens`` tokens, ``cached`` of them in the prefix cache, in one pass on an instance
        (the pass over the new tokens with their KV writes, causal attention of the new tokens over the whole
        context at the attention rate)."""
        par = as_parallel(par, pp)
        new = tokens - cached
        attn = self.attention_rate(tokens)
        pairs = new * cached + new * (new + 1) / 2
        t_attn = self.prefill_attention(pairs, tokens, par)
        t_pass = self.pass_time(new, par, new)
        t_cmp = 2.0 * self.params.matmul * new / (par.tp * par.dp * self.compute.value)
        wall = "compute" if t_cmp + t_attn >= self.weights_read(new) / (par.tp * self.memory.value) else "bandwidth"
        return PhaseTime(t_pass + t_attn, wall, (self.compute, self.memory, attn))

    def decode_step(self, batch: int, context: float, par: Parallel | int = 1, pp: int = 1) -> PhaseTime:
        """One decode step of ``batch`` requests with ``context`` cached tokens each on one lane: the pass over
        the batch (weights read once for the batch) and attention over every request's KV cache."""
        par = as_parallel(par, pp)
        per_token, kv = self.kv_seconds_per_token(batch, context, par)
        t_kv = batch * context * per_token
        t_cmp = 2.0 * self.params.matmul * batch / (par.tp * par.dp * self.compute.value)
        t_mem = self.weights_read(batch) / (par.tp * self.memory.value)
        wall = "compute" if t_cmp > t_mem + t_kv else "bandwidth"
        return PhaseTime(self.pass_time(batch, par) + t_kv, wall, (self.compute, self.memory, kv))


@dataclass(frozen=True)
class PhaseTime:
    seconds: float
    wall: str                       # the roof that binds: compute or bandwidth
    rates: tuple[Rate, ...]         # the rates used


# ---------------------------------------------------------------------------------------------
# Plans
# ---------------------------------------------------------------------------------------------

@dataclass
class Plan:
    mode: str                        # "aggregated" or "disaggregated"
    prefill_hw: str
    decode_hw: str
    tp_prefill: int
    tp_decode: int
    link: str | None
    pp_prefill: int = 1
    pp_decode: int = 1
    ep_prefill: int = 1              # MoE: expert-parallel degree and attention data-parallel ranks per phase
    dp_prefill: int = 1
    ep_decode: int = 1
    dp_decode: int = 1
    prefill_instances: int = 0       # aggregated: the one pool's instances (both phases run on them)
    decode_instances: int = 0
    devices: int = 0
    cluster: int = 0                 # --devices N: the fixed cluster; per-device figures are over its N devices
    prefill_devices: int = 0
    decode_devices: int = 0
    rate: float = 0.0                # requests per second offered (the workload's, or the most the devices serve)
    ttft: dict[int, float] = field(default_factory=dict)   # screen: served class -> seconds (mean, queueing included)
    attainment_target: float = 0.9   # the workload's: the TTFT quantile shown is this one
    transfer: dict[int, float] = field(default_factory=dict)
    tpot: float = math.inf
    batch: float = 0                 # decode batch per lane at the operating point (simulated: the mean)
    max_batch: int = 0               # decode batch the KV room allows per lane
    attainment: float = 0.0
    meets: bool = False
    goodput: float = 0.0             # requests per second meeting the SLO
    good_tokens: float = 0.0         # input + output tokens per second of those requests
    good_output: float = 0.0         # output tokens per second of those requests
    served_output: float = 0.0       # output tokens per second of every request served at this rate
    price_per_hour: float | None = None
    power: float | None = None       # watts drawn on average (TDP, or measured busy/idle power x utilization)
    power_source: str = ""           # "TDP" or "measured"
    prefill_wall: str = ""
    decode_wall: str = ""
    origins: tuple[str, ...] = ()    # where the rates came from: measured, calibrated, roofline
    reason: str = ""                 # why it does not meet the SLO
    miss: float = math.inf           # worst latency / its SLO over the classes (closeness of a plan that misses)
    sim: object | None = None        # the simulation's figures (kbench.plan.simulate.SimResult) once simulated
    screen: Plan | None = None       # the mean-value screen's plan this one was simulated from

    @classmethod
    def of(cls, mode: str, prefill_hw: str, decode_hw: str, ppar: Parallel, dpar: Parallel,
           link: str | None) -> Plan:
        return cls(mode, prefill_hw, decode_hw, ppar.tp, dpar.tp, link, ppar.pp, dpar.pp, ppar.ep, ppar.dp,
                   dpar.ep, dpar.dp)

    @property
    def prefill_par(self) -> Parallel:
        return Parallel(self.tp_prefill, self.pp_prefill, self.ep_prefill, self.dp_prefill)

    @property
    def decode_par(self) -> Parallel:
        return Parallel(self.tp_decode, self.pp_decode, self.ep_decode, self.dp_decode)

    @property
    def key(self) -> tuple:
        """The choice this plan makes: (mode, prefill hardware, decode hardware, link)."""
        return (self.mode, self.prefill_hw, self.decode_hw, self.link)

    @property
    def label(self) -> str:
        if self.mode == "aggregated":
            return f"aggregated {self.prefill_hw} {self.prefill_par.label}"
        return (f"P {self.prefill_hw} {self.prefill_par.label} -> D {self.decode_hw} {self.decode_par.label} "
                f"via {self.link}")

    def ttft_quantile(self, shares: Sequence[float], fraction: float) -> float:
        """The TTFT that ``fraction`` of requests stay within: the simulated percentile, or in the screen
        the mean TTFT of the class within which ``fraction`` of requests fall (classes by TTFT, shares
        accumulated)."""
        if self.sim is not None:
            return self.sim.percentile("ttft", 100 * fraction)
        total = 0.0
        for i in sorted(self.ttft, key=self.ttft.get):
            total += shares[i]
            if total >= fraction - 1e-9:
                return self.ttft[i]
        return max(self.ttft.values(), default=math.inf)

    @property
    def per_device_of(self) -> int:
        """The devices a per-device figure is over: the plan's, or on a fixed cluster (--devices) all of the
        cluster's, since the devices a plan leaves idle are bought all the same (docs/plan.md, "Fixed cluster")."""
        return max(self.devices, self.cluster) if self.devices else 0

    @property
    def per_device(self) -> float:
        return self.goodput / self.per_device_of if self.devices else 0.0

    @property
    def output_per_device(self) -> float:
        """Output tokens per second per device at the rate served within the SLO attainment (aiconfigurator's
        tokens/s/gpu at the SLO), over the cluster's devices with --devices."""
        return self.served_output / self.per_device_of if self.devices and self.meets else 0.0

    @property
    def per_dollar(self) -> float | None:
        """Requests meeting the SLO per dollar."""
        return self.goodput * 3600 / self.price_per_hour if self.price_per_hour else None

    @property
    def per_megajoule(self) -> float | None:
        return self.goodput / self.power * 1e6 if self.power else None

    @property
    def dollars_per_mtok(self) -> float | None:
        return self.price_per_hour / 3600 / self.good_tokens * 1e6 if self.price_per_hour and self.good_tokens else None

    @property
    def kwh_per_mtok(self) -> float | None:
        return self.power / self.good_tokens * 1e6 / 3.6e6 if self.power and self.good_tokens else None

    @property
    def joules_per_output_token(self) -> float | None:
        return self.power / self.good_output if self.power and self.good_output else None

    def metric(self, by: str) -> float | None:
        return {"device": self.per_device, "dollar": self.per_dollar, "joule": self.per_megajoule,
                "output": self.output_per_device}[by]


def _smallest(ok: Callable[[int], bool], lo: int, hi: int = MAX_INSTANCES) -> int | None:
    """Smallest n in [lo, hi] with ok(n), for ok monotone (False ... False True ... True)."""
    if lo > hi:
        return None
    n = lo
    while not ok(n):
        if n >= hi:
            return None
        lo, n = n + 1, min(hi, n * 2)
    while lo < n:
        mid = (lo + n) // 2
        if ok(mid):
            n = mid
        else:
            lo = mid + 1
    return n


def _largest(ok: Callable[[int], bool], hi: int) -> int:
    """Largest b in [1, hi] with ok(b) for ok monotone (True ... True False ...); 0 when ok(1) fails."""
    if hi < 1 or not ok(1):
        return 0
    lo = 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def parallel_configs(hw: HardwareProfile, tp_degrees: Sequence[int] | None,
                     pp_degrees: Sequence[int] | None, moe: bool = False) -> list[Parallel]:
    """Every tensor- x pipeline-parallel degree; for MoE models also, at each degree d > 1, the experts d-way
    expert-parallel under tensor-parallel attention (TP d EP d) and under data-parallel attention (TP1 DP d
    EP d: each rank its own requests, the experts spread over all)."""
    tps = tp_degrees or ((1,) if hw.kind == "cpu" else TP_DEGREES)
    found = [Parallel(t, p) for p in (pp_degrees or (1,)) for t in tps]
    if moe and hw.kind != "cpu":
        found += [Parallel(t, p, ep=t) for p in (pp_degrees or (1,)) for t in tps if t > 1]
        found += [Parallel(1, p, ep=t, dp=t) for p in (pp_degrees or (1,)) for t in tps if t > 1]
    return found


class Planner:
    """The mean-value screen: every aggregated and disaggregated plan for one model and workload over the
    given hardware, each pool sized by closed formulas (docs/plan.md, "The screen")."""

    def __init__(self, model: ModelConfig, workload: Workload, hardware: Sequence[HardwareProfile],
                 interconnects: dict[str, Interconnect], assume: Assumptions = Assumptions(),
                 measured: MeasuredRates | None = None, links: Sequence[str] | None = None,
                 tp_degrees: Sequence[int] | None = None, pp_degrees: Sequence[int] | None = None) -> None:
        self.model, self.workload, self.assume = model, workload, assume
        self.hardware = list(hardware)
        self.interconnects, self.links = interconnects, links
        self.measured = measured
        self.devices = {hw.name: DeviceModel(hw, model, assume, measured, interconnects) for hw in hardware}
        self.tp_degrees, self.pp_degrees = tp_degrees, pp_degrees
        self.mix: tuple[ServedClass, ...] = workload.served()
        self.shares = [c.share for c in self.mix]
        # requests in decode at once, per class, are proportional to share x output (Little's law)
        decode_weight = [c.share * c.output for c in self.mix]
        total = sum(decode_weight)
        self.decode_share = [w / total for w in decode_weight]
        self.decode_context = sum(s * (c.input + c.output / 2) for s, c in zip(self.decode_share, self.mix))
        self.slot_tokens = sum(s * (c.input + c.output) for s, c in zip(self.decode_share, self.mix))
        self.mean_output = sum(c.share * c.output for c in self.mix)
        self.largest_request = max(c.input + c.output for c in self.mix)
        self.longest_prompt = max(c.input for c in self.mix)
        self._prefill_cache: dict[tuple[str, Parallel], list[PhaseTime]] = {}

    def configs(self, hw: HardwareProfile) -> list[Parallel]:
        """The parallel configurations to try on ``hw``: --tp x --pp; without --pp, pipeline stages (2, 4 of the
        largest TP) only where no single-stage configuration holds the largest request."""
        dm = self.devices[hw.name]
        found = [p for p in parallel_configs(hw, self.tp_degrees, self.pp_degrees, self.model.moe is not None)
                 if dm.parallel_problem(p) is None]
        if self.pp_degrees is None and found and not any(dm.kv_tokens(p) >= self.largest_request for p in found):
            top = max(p.tp for p in found)
            found += [p for p in (Parallel(top, 2), Parallel(top, 4)) if dm.parallel_problem(p) is None]
        return found

    def degrees(self, hw: HardwareProfile) -> Sequence[int]:
        return sorted({p.tp for p in self.configs(hw)})

    def prefill_times(self, hw: str, par: Parallel) -> list[PhaseTime]:
        key = (hw, par)
        if key not in self._prefill_cache:
            self._prefill_cache[key] = [self.devices[hw].prefill(c.input, par, c.cached) for c in self.mix]
        return self._prefill_cache[key]

    # -- decode pool ----------------------------------------------------------------------------

    def _decode_pool(self, dm: DeviceModel, par: Parallel, busy: float = 0.0) -> tuple[int, Callable[[int], float]]:
        """Largest batch per lane the KV room (and the scheduler) allows and the TPOT at a batch (a step
        stretched by the share ``busy`` of time the lane spends on prefills, in aggregated serving)."""
        max_batch = min(self.assume.max_batch, max(0, math.floor(dm.lane_tokens(par) / self.slot_tokens)))
        return max_batch, lambda b: dm.decode_step(b, self.decode_context, par).seconds / (1.0 - busy)

    # -- one plan ---------------------------------------------------------------------------------

    def _finish(self, plan: Plan, ttft: list[float], transfer: list[float], tpot: float) -> Plan:
        wl, mix = self.workload, self.mix
        plan.ttft = dict(enumerate(ttft))
        plan.attainment_target = wl.attainment
        plan.transfer = dict(enumerate(transfer))
        plan.tpot = tpot
        plan.rate = wl.rate
        met = [i for i, t in enumerate(ttft) if t <= wl.slo.ttft and tpot <= wl.slo.tpot]
        plan.attainment = sum(mix[i].share for i in met)
        plan.miss = max([tpot / wl.slo.tpot] + [t / wl.slo.ttft for t in ttft])
        plan.meets = plan.attainment >= wl.attainment - 1e-9
        plan.goodput = wl.rate * plan.attainment
        plan.good_tokens = wl.rate * sum(mix[i].share * (mix[i].input + mix[i].output) for i in met)
        plan.good_output = wl.rate * sum(mix[i].share * mix[i].output for i in met)
        plan.served_output = wl.rate * self.mean_output
        plan.devices = plan.prefill_devices + plan.decode_devices
        self.price_and_power(plan)
        if not plan.meets and not plan.reason:
            worst = []
            if tpot > wl.slo.tpot:
                worst.append(f"TPOT {_t(tpot)} > {_t(wl.slo.tpot)}")
            for i, t in enumerate(ttft):
                if t > wl.slo.ttft:
                    worst.append(f"TTFT {_t(t)} > {_t(wl.slo.ttft)} for {mix[i].input:,}-token prompts")
            plan.reason = "; ".join(dict.fromkeys(worst)) + f" (attainment {plan.attainment:.0%} < {wl.attainment:.0%})"
        return plan

    def price_and_power(self, plan: Plan, utilization: tuple[float, float] | None = None) -> None:
        """Price per hour and average power of the plan's devices: measured busy and idle power weighted by
        the pools' utilization where the result files hold sustained-loop energy for every hardware type of
        the plan (and the simulation gave the utilization), else every device at its TDP."""
        pre, dec = self.devices[plan.prefill_hw].hw, self.devices[plan.decode_hw].hw
        n_pre = plan.prefill_devices
        n_dec = plan.decode_devices
        plan.price_per_hour = (n_pre * pre.price_per_hour + n_dec * dec.price_per_hour
                               if pre.price_per_hour and dec.price_per_hour else None)
        power = self.measured.power if self.measured is not None else {}
        mp, md = power.get(pre.name), power.get(dec.name)
        if utilization is not None and mp is not None and md is not None:
            u_pre, u_dec = utilization

            def watts(p, busy_w, u):
                idle = p.idle_w if p.idle_w is not None else busy_w
                return u * busy_w + (1 - u) * idle
            if plan.mode == "aggregated":
                # an aggregated instance does both: its busy power is the mean of the two phases' figures
                plan.power = n_pre * watts(mp, (mp.prefill_w + mp.decode_w) / 2, u_pre)
            else:
                plan.power = n_pre * watts(mp, mp.prefill_w, u_pre) + n_dec * watts(md, md.decode_w, u_dec)
            plan.power_source = "measured"
        elif pre.power_watts and dec.power_watts:
            plan.power = n_pre * pre.power_watts + n_dec * dec.power_watts
            plan.power_source = "TDP"
        else:
            plan.power, plan.power_source = None, ""

    def aggregated(self, hw: HardwareProfile, tp: int | Parallel) -> Plan:
        """Both phases on one pool of instances; prefills take priority (chunked into the decode batch), so
        decode steps are stretched by the share of time spent prefilling."""
        par = tp if isinstance(tp, Parallel) else Parallel(tp)
        wl, dm, mix = self.workload, self.devices[hw.name], self.mix
        plan = Plan.of("aggregated", hw.name, hw.name, par, par, None)
        if dm.kv_tokens(par) < self.largest_request:
            plan.reason = (f"the weights and one {self.largest_request:,}-token request need "
                           f"{(dm.weight_bytes + self.largest_request * dm.kv_per_token * par.pp) / 1e9:.0f} GB, "
                           f"{par.devices} x {hw.name} hold {dm.memory_bytes(par.devices) / 1e9:.0f} GB usable")
            return plan
        pre = self.prefill_times(hw.name, par)
        mean_s = sum(c.share * p.seconds for c, p in zip(mix, pre))
        mean_s2 = sum(c.share * p.seconds ** 2 for c, p in zip(mix, pre))
        demand = wl.rate * self.mean_output       # decode tokens per second, whole pool

        def state(n: int):
            lam = wl.rate / n
            busy = lam * mean_s
            if busy > self.assume.max_utilization:
                return None
            max_batch, tpot_at = self._decode_pool(dm, par, busy)
            best = _largest(lambda b: tpot_at(b) <= wl.slo.tpot, max_batch) or min(1, max_batch)
            if not best or best / tpot_at(best) < demand / n:
                return None
            need = _largest(lambda b: b / tpot_at(b) < demand / n, best) + 1
            wait = lam * mean_s2 / (2 * (1 - busy))
            return busy, max_batch, need, tpot_at(min(need, best)), [wait + p.seconds for p in pre], best

        def ok(lanes: int) -> bool:
            s = state(lanes)
            return s is not None and self._attains(s[4], s[3])

        lanes = _smallest(ok, 1)
        if lanes is None:
            # the closest plan: the fewest lanes reaching the best attainment any pool size reaches (no
            # queueing, decode batch 1)
            _, tpot_alone = self._decode_pool(dm, par)
            reachable = self._attainment([p.seconds for p in pre], tpot_alone(1))

            def closest(k: int) -> bool:
                s = state(k)
                return s is not None and self._attainment(s[4], s[3]) >= reachable - 1e-9
            lanes = _smallest(closest, 1)
            if lanes is None:
                plan.reason = "decode cannot keep up with the arrival rate within the pool size limit"
                return plan
        busy, max_batch, need, tpot, ttft, best = state(lanes)
        n = math.ceil(lanes / par.pp)
        plan.prefill_instances = plan.decode_instances = n
        plan.prefill_devices, plan.decode_devices = n * par.devices, 0
        plan.batch, plan.max_batch = need, max_batch
        plan.prefill_wall = _phase_wall(pre)
        plan.decode_wall = self._decode_wall(dm, par, best, max_batch)
        plan.origins = self._origins(dm, dm, par, par)
        return self._finish(plan, ttft, [0.0] * len(ttft), tpot)

    def transfer_times(self, pdm: DeviceModel, ppar: Parallel, dpar: Parallel, link: Interconnect) -> list[float]:
        """KV transfer of each served class's whole context, over min(devices) links in parallel."""
        bw = min(ppar.tp * ppar.dp, dpar.tp * dpar.dp) * link.bandwidth * self.assume.link_efficiency
        return [c.input * pdm.kv_per_token / bw + link.latency for c in self.mix]

    def disaggregated(self, phw: HardwareProfile, ptp: int | Parallel, dhw: HardwareProfile, dtp: int | Parallel,
                      link: Interconnect) -> Plan:
        """Prefill pool on ``phw``, decode pool on ``dhw``; each request's KV cache crosses ``link`` once,
        after its prefill, before its first token."""
        ppar = ptp if isinstance(ptp, Parallel) else Parallel(ptp)
        dpar = dtp if isinstance(dtp, Parallel) else Parallel(dtp)
        wl, mix = self.workload, self.mix
        pdm, ddm = self.devices[phw.name], self.devices[dhw.name]
        plan = Plan.of("disaggregated", phw.name, dhw.name, ppar, dpar, link.name)
        if pdm.kv_tokens(ppar) < self.longest_prompt:
            plan.reason = (f"prefill: the weights and a {self.longest_prompt:,}-token prompt do not fit "
                           f"{ppar.devices} x {phw.name}")
            return plan
        if ddm.kv_tokens(dpar) < self.largest_request:
            plan.reason = (f"decode: the weights and a {self.largest_request:,}-token request do not fit "
                           f"{dpar.devices} x {dhw.name}")
            return plan
        pre = self.prefill_times(phw.name, ppar)
        transfer = self.transfer_times(pdm, ppar, dpar, link)
        mean_s = sum(c.share * p.seconds for c, p in zip(mix, pre))
        mean_s2 = sum(c.share * p.seconds ** 2 for c, p in zip(mix, pre))
        max_batch, tpot_at = self._decode_pool(ddm, dpar)
        best = _largest(lambda b: tpot_at(b) <= wl.slo.tpot, max_batch) or min(1, max_batch)
        demand = wl.rate * self.mean_output
        d_lanes = max(1, math.ceil(demand / (best / tpot_at(best))))
        need = _largest(lambda b: b / tpot_at(b) < demand / d_lanes, best) + 1
        tpot = tpot_at(min(need, best))

        def ttft(n: int) -> list[float] | None:
            lam = wl.rate / n
            busy = lam * mean_s
            if busy > self.assume.max_utilization:
                return None
            wait = lam * mean_s2 / (2 * (1 - busy))
            return [wait + p.seconds + x for p, x in zip(pre, transfer)]

        p_lanes = _smallest(lambda n: ttft(n) is not None and self._attains(ttft(n), tpot), 1)
        if p_lanes is None:   # the closest: the fewest lanes reaching the best attainment of any pool size
            reachable = self._attainment([p.seconds + x for p, x in zip(pre, transfer)], tpot)
            p_lanes = _smallest(lambda n: ttft(n) is not None and self._attainment(ttft(n), tpot) >= reachable - 1e-9, 1)
        n_pre, n_dec = math.ceil(p_lanes / ppar.pp), math.ceil(d_lanes / dpar.pp)
        plan.prefill_instances, plan.decode_instances = n_pre, n_dec
        plan.prefill_devices, plan.decode_devices = n_pre * ppar.devices, n_dec * dpar.devices
        plan.batch, plan.max_batch = need, max_batch
        plan.prefill_wall = _phase_wall(pre)
        if max(transfer) > max(p.seconds for p in pre):
            plan.prefill_wall += f" (KV transfer {_t(max(transfer))} > prefill)"
        plan.decode_wall = self._decode_wall(ddm, dpar, best, max_batch)
        plan.origins = self._origins(pdm, ddm, ppar, dpar)
        return self._finish(plan, ttft(p_lanes), transfer, tpot)

    def _attainment(self, ttft: list[float], tpot: float) -> float:
        """Share of requests in classes whose TTFT and the TPOT meet the SLO."""
        wl = self.workload
        if tpot > wl.slo.tpot:
            return 0.0
        return sum(c.share for c, t in zip(self.mix, ttft) if t <= wl.slo.ttft)

    def _attains(self, ttft: list[float], tpot: float) -> bool:
        return self._attainment(ttft, tpot) >= self.workload.attainment - 1e-9

    def _decode_wall(self, dm: DeviceModel, par: Parallel, best: int, max_batch: int) -> str:
        """What limits the batch of a decode lane: ``capacity`` when memory holds fewer requests than the
        TPOT SLO would allow (``max batch`` when the scheduler's cap does), else the roof that binds a step at the
        largest batch meeting the TPOT."""
        if best >= max_batch:
            room = math.floor(dm.lane_tokens(par) / self.slot_tokens)
            return "capacity" if room <= self.assume.max_batch else "max batch"
        return dm.decode_step(max(best, 1), self.decode_context, par).wall

    def _origins(self, pdm: DeviceModel, ddm: DeviceModel, ppar: Parallel, dpar: Parallel) -> tuple[str, ...]:
        found = set()
        for dm, par in ((pdm, ppar), (ddm, dpar)):
            found.add(dm.compute.origin)
            found.add(dm.memory.origin)
            for c in self.mix:
                found.add(dm.attention_rate(c.input).origin)
            found.add(dm.kv_read_rate(round(self.decode_context), dm.work(1, par.tp)).origin)
        return tuple(o for o in ("measured", "calibrated", "roofline") if o in found)

    # -- every plan ---------------------------------------------------------------------------------

    def links_between(self, a: HardwareProfile, b: HardwareProfile) -> list[Interconnect]:
        """Links a disaggregated pair can use: both ends list it (node-scope links only within one
        hardware type, whose pools can share servers); --interconnect picks among them or forces its own."""
        if self.links:
            return [self.interconnects[n] for n in self.links]
        common = [n for n in a.interconnects if n in b.interconnects and n in self.interconnects]
        return [self.interconnects[n] for n in common if a.name == b.name or self.interconnects[n].scope == "network"]

    def all_plans(self) -> list[Plan]:
        usable = [hw for hw in self.hardware if self.devices[hw.name].usable]
        plans = [self.aggregated(hw, par) for hw in usable for par in self.configs(hw)]
        for phw in usable:
            for dhw in usable:
                for link in self.links_between(phw, dhw):
                    plans += [self.disaggregated(phw, ppar, dhw, dpar, link)
                              for ppar in self.configs(phw) for dpar in self.configs(dhw)]
        return plans


def _phase_wall(times: Iterable[PhaseTime]) -> str:
    walls = sorted({p.wall for p in times})
    return "/".join(walls)


def _t(seconds: float) -> str:
    if seconds == math.inf:
        return "inf"
    if seconds >= 1:
        return f"{seconds:.3g} s"
    return f"{seconds * 1e3:.3g} ms"


def best_per_choice(plans: Iterable[Plan], by: str) -> list[Plan]:
    """One plan per (mode, prefill hardware, decode hardware, link): the best meeting the SLO by ``by``
    (ties: fewer devices), ranked; the plans that meet come first."""
    groups: dict[tuple, Plan] = {}
    for p in plans:
        if p.key not in groups or _key(p, by) < _key(groups[p.key], by):
            groups[p.key] = p
    return sorted(groups.values(), key=lambda p: _key(p, by))


def _key(p: Plan, by: str) -> tuple:
    value = p.metric(by)
    if p.meets:
        return (0, -(value if value is not None else -1.0), p.devices)
    return (1, p.devices == 0, -p.attainment, p.miss, p.devices)
