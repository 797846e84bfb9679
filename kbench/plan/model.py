"""The serving model behind `kbench plan`: time per prefill and per decode step on one hardware type,
KV-cache capacity, pool sizes, TTFT/TPOT, goodput, cost and energy, for aggregated and disaggregated
serving. Formulas, assumptions and a worked example: docs/plan.md.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Sequence

from kbench.hardware import HardwareProfile
from kbench.plan.inputs import Interconnect, Workload
from kbench.plan.measured import MeasuredRates
from kbench.roofline import (DTYPE_BYTES, ModelConfig, attention_flops_per_pair, kv_bytes_per_token, param_count,
                             weights_touched)
from kbench.roofline.analysis import peak_names

#: tensor-parallel degrees tried per instance (one server of 8 GPUs at most; CPUs run one instance per machine)
TP_DEGREES = (1, 2, 4, 8)
#: largest pool the search considers (instances); a plan needing more is reported as not meeting the SLO
MAX_INSTANCES = 1 << 20


@dataclass(frozen=True)
class Assumptions:
    """What the plan assumes where nothing was measured (each is printed with the plan)."""
    compute_efficiency: float = 0.6     # fraction of the datasheet matmul peak reached
    bandwidth_efficiency: float = 0.8   # fraction of the datasheet memory bandwidth reached
    link_efficiency: float = 0.8        # fraction of an interconnect's bandwidth reached by a KV transfer
    usable_memory: float = 0.9          # fraction of device memory for weights + KV (the rest: activations, runtime)
    max_utilization: float = 0.8        # busiest a prefill instance may be (the queue grows without bound at 1)
    weights: str = "bf16"
    kv: str = "bf16"

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


class DeviceModel:
    """The rates of one hardware type for one model: matmul, memory, attention (prefill) and KV reads (decode).

    Matmuls and weight reads are always roofline figures: the datasheet roof times an assumed efficiency, or a
    calibrated roof (`kbench calibrate`, which measured a GEMM and a copy on the machine) taken as reached.
    Prefill attention and decode KV reads come from measured kernels when result files cover this hardware.
    """

    def __init__(self, hw: HardwareProfile, model: ModelConfig, assume: Assumptions,
                 measured: MeasuredRates | None = None) -> None:
        self.hw, self.model, self.assume, self.measured = hw, model, assume, measured
        self.params = param_count(model)
        self.weight_bytes = self.params.total * DTYPE_BYTES[assume.weights]
        self.kv_per_token = kv_bytes_per_token(model, assume.kv)
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
        head_dim = model.head_dim
        self._attn = self._decode = None
        if measured is not None:
            self._attn = measured.curve(hw.name, "prefill-attention", group=group, head_dim=head_dim,
                                        dtype=assume.kv)
            self._decode = measured.curve(hw.name, "decode-attention", group=group, head_dim=head_dim,
                                          dtype=assume.kv)

    @property
    def usable(self) -> bool:
        return self.compute is not None and self.memory is not None and bool(self.hw.capacity)

    def memory_bytes(self, tp: int) -> float:
        return tp * (self.hw.capacity or 0.0) * self.assume.usable_memory

    def kv_room(self, tp: int) -> float:
        """Bytes left for KV caches on ``tp`` devices once the weights are loaded."""
        return self.memory_bytes(tp) - self.weight_bytes

    def attention_rate(self, seqlen: int) -> Rate:
        if self._attn is not None:
            value, where = self._attn.at(seqlen)
            return Rate(value, "measured", f"{value / 1e12:.3g} TFLOP/s measured ({where}; {self._attn.file})")
        return self.compute

    def kv_read_rate(self, context: int) -> Rate:
        if self._decode is not None:
            value, where = self._decode.at(context)
            return Rate(value, "measured", f"{value / 1e9:.3g} GB/s measured ({where}; {self._decode.file})")
        return self.memory

    # -- phases ---------------------------------------------------------------------------------

    def prefill(self, tokens: int, tp: int) -> PhaseTime:
        """One prompt of ``tokens`` tokens on an instance of ``tp`` devices (tensor parallel, no
        communication cost): matmuls at max(compute, weight-read) time, then causal attention at the
        attention rate (measured or the compute roof)."""
        m, pc = self.model, self.params
        f_gemm = 2.0 * pc.matmul * tokens
        b_gemm = weights_touched(m, pc, tokens) * DTYPE_BYTES[self.assume.weights] + tokens * self.kv_per_token
        t_cmp, t_mem = f_gemm / (tp * self.compute.value), b_gemm / (tp * self.memory.value)
        attn = self.attention_rate(tokens)
        t_attn = attention_flops_per_pair(m, "prefill") * tokens * (tokens + 1) / 2 / (tp * attn.value)
        wall = "compute" if t_cmp + t_attn >= t_mem else "bandwidth"
        return PhaseTime(max(t_cmp, t_mem) + t_attn, wall, (self.compute, self.memory, attn))

    def decode_step(self, batch: int, context: float, tp: int) -> PhaseTime:
        """One decode step of ``batch`` requests with ``context`` cached tokens each on ``tp`` devices:
        matmuls (weights read once for the batch) plus attention over every request's KV cache."""
        m, pc = self.model, self.params
        f_gemm = 2.0 * pc.matmul * batch
        b_gemm = weights_touched(m, pc, batch) * DTYPE_BYTES[self.assume.weights]
        t_cmp, t_mem = f_gemm / (tp * self.compute.value), b_gemm / (tp * self.memory.value)
        kv = self.kv_read_rate(round(context))
        kv_bytes = batch * context * self.kv_per_token
        t_kv = kv_bytes / (tp * kv.value)
        t_attn_cmp = 0.0 if kv.origin == "measured" else (
            attention_flops_per_pair(m, "decode") * batch * context / (tp * self.compute.value))
        wall = "compute" if t_cmp + t_attn_cmp > t_mem + t_kv else "bandwidth"
        return PhaseTime(max(t_cmp, t_mem) + max(t_kv, t_attn_cmp), wall, (self.compute, self.memory, kv))


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
    prefill_instances: int = 0       # aggregated: the one pool's instances (both phases run on them)
    decode_instances: int = 0
    devices: int = 0
    prefill_devices: int = 0
    decode_devices: int = 0
    ttft: dict[int, float] = field(default_factory=dict)   # class index -> seconds (mean, queueing included)
    attainment_target: float = 0.9   # the workload's: the TTFT quantile shown is this one
    transfer: dict[int, float] = field(default_factory=dict)
    tpot: float = math.inf
    batch: int = 0                   # decode batch per instance at the operating point
    max_batch: int = 0               # decode batch the KV room allows per instance
    attainment: float = 0.0
    meets: bool = False
    goodput: float = 0.0             # requests per second meeting the SLO
    good_tokens: float = 0.0         # input + output tokens per second of those requests
    price_per_hour: float | None = None
    power: float | None = None       # watts, every device at its TDP
    prefill_wall: str = ""
    decode_wall: str = ""
    origins: tuple[str, ...] = ()    # where the rates came from: measured, calibrated, roofline
    reason: str = ""                 # why it does not meet the SLO
    miss: float = math.inf           # worst latency / its SLO over the classes (closeness of a plan that misses)

    @property
    def label(self) -> str:
        if self.mode == "aggregated":
            return f"aggregated {self.prefill_hw} x{self.tp_prefill}"
        return f"P {self.prefill_hw} x{self.tp_prefill} -> D {self.decode_hw} x{self.tp_decode} via {self.link}"

    def ttft_quantile(self, shares: Sequence[float], fraction: float) -> float:
        """The TTFT that ``fraction`` of requests stay within (classes by TTFT, shares accumulated): the
        p90 TTFT for fraction 0.9, the latency the attainment is judged on."""
        total = 0.0
        for i in sorted(self.ttft, key=self.ttft.get):
            total += shares[i]
            if total >= fraction - 1e-9:
                return self.ttft[i]
        return max(self.ttft.values(), default=math.inf)

    @property
    def per_device(self) -> float:
        return self.goodput / self.devices if self.devices else 0.0

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

    def metric(self, by: str) -> float | None:
        return {"device": self.per_device, "dollar": self.per_dollar, "joule": self.per_megajoule}[by]


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


class Planner:
    """Every aggregated and disaggregated plan for one model and workload over the given hardware."""

    def __init__(self, model: ModelConfig, workload: Workload, hardware: Sequence[HardwareProfile],
                 interconnects: dict[str, Interconnect], assume: Assumptions = Assumptions(),
                 measured: MeasuredRates | None = None, links: Sequence[str] | None = None,
                 tp_degrees: Sequence[int] | None = None) -> None:
        self.model, self.workload, self.assume = model, workload, assume
        self.hardware = list(hardware)
        self.interconnects, self.links = interconnects, links
        self.devices = {hw.name: DeviceModel(hw, model, assume, measured) for hw in hardware}
        self.tp_degrees = tp_degrees
        mix = workload.mix
        # requests in decode at once, per class, are proportional to share x output (Little's law)
        decode_weight = [c.share * c.output for c in mix]
        total = sum(decode_weight)
        self.decode_share = [w / total for w in decode_weight]
        self.decode_context = sum(s * (c.input + c.output / 2) for s, c in zip(self.decode_share, mix))
        self.slot_tokens = sum(s * (c.input + c.output) for s, c in zip(self.decode_share, mix))
        self.largest_request = max(c.input + c.output for c in mix)
        self.longest_prompt = max(c.input for c in mix)
        self._prefill_cache: dict[tuple[str, int], list[PhaseTime]] = {}

    def degrees(self, hw: HardwareProfile) -> Sequence[int]:
        if self.tp_degrees:
            return self.tp_degrees
        return (1,) if hw.kind == "cpu" else TP_DEGREES

    def prefill_times(self, hw: str, tp: int) -> list[PhaseTime]:
        key = (hw, tp)
        if key not in self._prefill_cache:
            self._prefill_cache[key] = [self.devices[hw].prefill(c.input, tp) for c in self.workload.mix]
        return self._prefill_cache[key]

    # -- decode pool ----------------------------------------------------------------------------

    def _decode_pool(self, dm: DeviceModel, tp: int, busy: float = 0.0) -> tuple[int, Callable[[int], float]]:
        """Largest batch the KV room allows and the TPOT at a batch (a step stretched by the share
        ``busy`` of time the instance spends on prefills, in aggregated serving)."""
        max_batch = max(0, math.floor(dm.kv_room(tp) / (self.slot_tokens * dm.kv_per_token)))
        return max_batch, lambda b: dm.decode_step(b, self.decode_context, tp).seconds / (1.0 - busy)

    # -- one plan ---------------------------------------------------------------------------------

    def _finish(self, plan: Plan, ttft: list[float], transfer: list[float], tpot: float) -> Plan:
        wl = self.workload
        plan.ttft = dict(enumerate(ttft))
        plan.attainment_target = wl.attainment
        plan.transfer = dict(enumerate(transfer))
        plan.tpot = tpot
        met = [i for i, t in enumerate(ttft) if t <= wl.slo.ttft and tpot <= wl.slo.tpot]
        plan.attainment = sum(wl.mix[i].share for i in met)
        plan.miss = max([tpot / wl.slo.tpot] + [t / wl.slo.ttft for t in ttft])
        plan.meets = plan.attainment >= wl.attainment - 1e-9
        plan.goodput = wl.rate * plan.attainment
        plan.good_tokens = wl.rate * sum(wl.mix[i].share * (wl.mix[i].input + wl.mix[i].output) for i in met)
        pre, dec = self.devices[plan.prefill_hw].hw, self.devices[plan.decode_hw].hw
        plan.devices = plan.prefill_devices + plan.decode_devices
        if pre.price_per_hour and dec.price_per_hour:
            plan.price_per_hour = plan.prefill_devices * pre.price_per_hour + plan.decode_devices * dec.price_per_hour
        if pre.power_watts and dec.power_watts:
            plan.power = plan.prefill_devices * pre.power_watts + plan.decode_devices * dec.power_watts
        if not plan.meets and not plan.reason:
            worst = []
            if tpot > wl.slo.tpot:
                worst.append(f"TPOT {_t(tpot)} > {_t(wl.slo.tpot)}")
            for i, t in enumerate(ttft):
                if t > wl.slo.ttft:
                    worst.append(f"TTFT {_t(t)} > {_t(wl.slo.ttft)} for {wl.mix[i].input:,}-token prompts")
            plan.reason = "; ".join(worst) + f" (attainment {plan.attainment:.0%} < {wl.attainment:.0%})"
        return plan

    def aggregated(self, hw: HardwareProfile, tp: int) -> Plan:
        """Both phases on one pool of instances; prefills take priority (chunked into the decode batch), so
        decode steps are stretched by the share of time spent prefilling."""
        wl, dm = self.workload, self.devices[hw.name]
        plan = Plan("aggregated", hw.name, hw.name, tp, tp, None)
        if dm.kv_room(tp) < self.largest_request * dm.kv_per_token:
            plan.reason = (f"the weights and one {self.largest_request:,}-token request need "
                           f"{(dm.weight_bytes + self.largest_request * dm.kv_per_token) / 1e9:.0f} GB, "
                           f"{tp} x {hw.name} hold {dm.memory_bytes(tp) / 1e9:.0f} GB usable")
            return plan
        pre = self.prefill_times(hw.name, tp)
        mean_s = sum(c.share * p.seconds for c, p in zip(wl.mix, pre))
        mean_s2 = sum(c.share * p.seconds ** 2 for c, p in zip(wl.mix, pre))
        demand = wl.rate * wl.mean("output")       # decode tokens per second, whole pool

        def state(n: int):
            lam = wl.rate / n
            busy = lam * mean_s
            if busy > self.assume.max_utilization:
                return None
            max_batch, tpot_at = self._decode_pool(dm, tp, busy)
            best = _largest(lambda b: tpot_at(b) <= wl.slo.tpot, max_batch) or min(1, max_batch)
            if not best or best / tpot_at(best) < demand / n:
                return None
            need = _largest(lambda b: b / tpot_at(b) < demand / n, best) + 1
            wait = lam * mean_s2 / (2 * (1 - busy))
            return busy, max_batch, need, tpot_at(min(need, best)), [wait + p.seconds for p in pre], best

        def ok(n: int) -> bool:
            s = state(n)
            return s is not None and self._attains(s[4], s[3])

        n = _smallest(ok, 1)
        if n is None:
            # the closest plan: the fewest instances reaching the best attainment any pool size reaches (no
            # queueing, decode batch 1)
            _, tpot_alone = self._decode_pool(dm, tp)
            reachable = self._attainment([p.seconds for p in pre], tpot_alone(1))

            def closest(k: int) -> bool:
                s = state(k)
                return s is not None and self._attainment(s[4], s[3]) >= reachable - 1e-9
            n = _smallest(closest, 1)
            if n is None:
                plan.reason = "decode cannot keep up with the arrival rate within the pool size limit"
                return plan
        busy, max_batch, need, tpot, ttft, best = state(n)
        plan.prefill_instances = plan.decode_instances = n
        plan.prefill_devices, plan.decode_devices = n * tp, 0
        plan.batch, plan.max_batch = need, max_batch
        plan.prefill_wall = _phase_wall(pre)
        plan.decode_wall = self._decode_wall(dm, tp, best, max_batch)
        plan.origins = self._origins(dm, dm)
        return self._finish(plan, ttft, [0.0] * len(ttft), tpot)

    def disaggregated(self, phw: HardwareProfile, ptp: int, dhw: HardwareProfile, dtp: int,
                      link: Interconnect) -> Plan:
        """Prefill pool on ``phw`` (instances of ``ptp`` devices), decode pool on ``dhw``; each request's KV
        cache crosses ``link`` once, after its prefill, before its first token."""
        wl = self.workload
        pdm, ddm = self.devices[phw.name], self.devices[dhw.name]
        plan = Plan("disaggregated", phw.name, dhw.name, ptp, dtp, link.name)
        if pdm.kv_room(ptp) < self.longest_prompt * pdm.kv_per_token:
            plan.reason = (f"prefill: the weights and a {self.longest_prompt:,}-token prompt do not fit "
                           f"{ptp} x {phw.name}")
            return plan
        if ddm.kv_room(dtp) < self.largest_request * ddm.kv_per_token:
            plan.reason = (f"decode: the weights and a {self.largest_request:,}-token request do not fit "
                           f"{dtp} x {dhw.name}")
            return plan
        pre = self.prefill_times(phw.name, ptp)
        bw = min(ptp, dtp) * link.bandwidth * self.assume.link_efficiency
        transfer = [c.input * pdm.kv_per_token / bw + link.latency for c in wl.mix]
        mean_s = sum(c.share * p.seconds for c, p in zip(wl.mix, pre))
        mean_s2 = sum(c.share * p.seconds ** 2 for c, p in zip(wl.mix, pre))
        max_batch, tpot_at = self._decode_pool(ddm, dtp)
        best = _largest(lambda b: tpot_at(b) <= wl.slo.tpot, max_batch) or min(1, max_batch)
        demand = wl.rate * wl.mean("output")
        n_dec = max(1, math.ceil(demand / (best / tpot_at(best))))
        need = _largest(lambda b: b / tpot_at(b) < demand / n_dec, best) + 1
        tpot = tpot_at(min(need, best))

        def ttft(n: int) -> list[float] | None:
            lam = wl.rate / n
            busy = lam * mean_s
            if busy > self.assume.max_utilization:
                return None
            wait = lam * mean_s2 / (2 * (1 - busy))
            return [wait + p.seconds + x for p, x in zip(pre, transfer)]

        n_pre = _smallest(lambda n: ttft(n) is not None and self._attains(ttft(n), tpot), 1)
        if n_pre is None:   # the closest: the fewest instances reaching the best attainment of any pool size
            reachable = self._attainment([p.seconds + x for p, x in zip(pre, transfer)], tpot)
            n_pre = _smallest(lambda n: ttft(n) is not None and self._attainment(ttft(n), tpot) >= reachable - 1e-9, 1)
        plan.prefill_instances, plan.decode_instances = n_pre, n_dec
        plan.prefill_devices, plan.decode_devices = n_pre * ptp, n_dec * dtp
        plan.batch, plan.max_batch = need, max_batch
        plan.prefill_wall = _phase_wall(pre)
        if max(transfer) > max(p.seconds for p in pre):
            plan.prefill_wall += f" (KV transfer {_t(max(transfer))} > prefill)"
        plan.decode_wall = self._decode_wall(ddm, dtp, best, max_batch)
        plan.origins = self._origins(pdm, ddm)
        return self._finish(plan, ttft(n_pre), transfer, tpot)

    def _attainment(self, ttft: list[float], tpot: float) -> float:
        """Share of requests in classes whose TTFT and the TPOT meet the SLO."""
        wl = self.workload
        if tpot > wl.slo.tpot:
            return 0.0
        return sum(c.share for c, t in zip(wl.mix, ttft) if t <= wl.slo.ttft)

    def _attains(self, ttft: list[float], tpot: float) -> bool:
        return self._attainment(ttft, tpot) >= self.workload.attainment - 1e-9

    def _decode_wall(self, dm: DeviceModel, tp: int, best: int, max_batch: int) -> str:
        """What limits the batch of a decode instance: ``capacity`` when memory holds fewer requests than the
        TPOT SLO would allow, else the roof that binds a step at the largest batch meeting the TPOT."""
        if best >= max_batch:
            return "capacity"
        return dm.decode_step(max(best, 1), self.decode_context, tp).wall

    def _origins(self, *dms: DeviceModel) -> tuple[str, ...]:
        found = set()
        for dm in dms:
            found.add(dm.compute.origin)
            found.add(dm.memory.origin)
            for c in self.workload.mix:
                found.add(dm.attention_rate(c.input).origin)
            found.add(dm.kv_read_rate(round(self.decode_context)).origin)
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
        plans = [self.aggregated(hw, tp) for hw in usable for tp in self.degrees(hw)]
        for phw in usable:
            for dhw in usable:
                for link in self.links_between(phw, dhw):
                    plans += [self.disaggregated(phw, ptp, dhw, dtp, link)
                              for ptp in self.degrees(phw) for dtp in self.degrees(dhw)]
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
        key = (p.mode, p.prefill_hw, p.decode_hw, p.link)
        if key not in groups or _key(p, by) < _key(groups[key], by):
            groups[key] = p
    return sorted(groups.values(), key=lambda p: _key(p, by))


def _key(p: Plan, by: str) -> tuple:
    value = p.metric(by)
    if p.meets:
        return (0, -(value if value is not None else -1.0), p.devices)
    return (1, p.devices == 0, -p.attainment, p.miss, p.devices)


def rank(plans: Iterable[Plan], by: str) -> list[Plan]:
    return sorted(plans, key=lambda p: _key(p, by))
