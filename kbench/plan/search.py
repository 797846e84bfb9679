"""From the screen to simulated plans (docs/plan.md, "How the plan is chosen"): the most one instance carries
within the SLO, found by bisection over the arrival rate with the iteration-level simulation; pools sized from
it for the workload's rate (or, with a fixed number of devices, the highest rate they serve); every pool then
simulated whole, resized until it meets the SLO, and ranked on the simulated figures.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from kbench.hardware import HardwareProfile
from kbench.plan.inputs import Interconnect
from kbench.plan.model import Parallel, Plan, Planner, best_per_choice
from kbench.plan.simulate import Pool, SimPlan, SimResult, Stream, make_stream, simulate

#: relative width at which the bisection of an instance's highest rate stops
RATE_TOLERANCE = 0.03
#: most resizings of a pool after the whole-plan simulation misses the SLO
MAX_RESIZE = 6
#: the search's simulations span at least this many lifetimes of a request (its end-to-end latency alone), so
#: that a queue which grows without bound shows; ...
LIFETIMES = 10
#: ... up to this many requests
MAX_SEARCH_REQUESTS = 20_000
#: whole-plan simulations span at least LIFETIMES request lifetimes too, up to this many requests (then a warning)
MAX_WHOLE_REQUESTS = 60_000


@dataclass(frozen=True)
class Choice:
    """A candidate to simulate: aggregated on ``phw`` with ``ppar``, or disaggregated P ``phw``/``ppar`` -> D
    ``dhw``/``dpar`` over ``link``."""
    mode: str
    phw: HardwareProfile
    ppar: Parallel
    dhw: HardwareProfile
    dpar: Parallel
    link: Interconnect | None


class Search:
    """Simulation-backed sizing for one planner (model, workload, hardware, assumptions)."""

    def __init__(self, planner: Planner, *, requests: int = 4000, search_requests: int = 1500, seed: int = 0,
                 devices: int | None = None, progress: Callable[[str], None] | None = None) -> None:
        self.planner = planner
        self.workload = planner.workload
        self.target = planner.workload.attainment
        self.devices = devices
        self.seed = seed
        self.stream: Stream = make_stream(self.workload, requests, seed)
        self.search_requests = search_requests
        self.search_stream: Stream = make_stream(self.workload, max(search_requests, MAX_SEARCH_REQUESTS), seed + 1)
        self.progress = progress or (lambda _msg: None)
        self._capacity: dict[tuple, float] = {}
        self.simulations = 0
        self.requests = requests
        self.warnings: list[str] = []          # runs that did not reach steady state, or were cut short
        self.budget_notes: list[str] = []      # why a plan leaves devices of --devices unused
        self._whole: Stream = self.stream

    # -- simulated plans ---------------------------------------------------------------------------------

    def sim_plan(self, c: Choice, n_front: int, n_back: int = 0, only: str | None = None) -> SimPlan:
        pl = self.planner
        a = pl.assume
        pdm, ddm = pl.devices[c.phw.name], pl.devices[c.dhw.name]
        jitter = max(pdm.jitter, ddm.jitter)
        if c.mode == "aggregated":
            return SimPlan(Pool(pdm, c.ppar, n_front), chunk=a.chunk, max_batch=a.max_batch, jitter=jitter)
        if only == "decode":
            return SimPlan(Pool(ddm, c.dpar, n_back), chunk=a.chunk, max_batch=a.max_batch, only="decode",
                           jitter=jitter)
        bw = min(c.ppar.tp * c.ppar.dp, c.dpar.tp * c.dpar.dp) * c.link.bandwidth * a.link_efficiency
        decode = None if only == "prefill" else Pool(ddm, c.dpar, n_back)
        return SimPlan(Pool(pdm, c.ppar, n_front), decode, bw, c.link.latency, a.chunk, a.max_batch, only, jitter)

    def run(self, plan: SimPlan, rate: float, stream: Stream | None = None, stop: bool = True,
            life: float = 0.0) -> SimResult:
        """One simulation: on ``stream``, or a whole-plan stream of at least --requests requests spanning
        LIFETIMES lifetimes (``life`` seconds) of a request at ``rate``."""
        self.simulations += 1
        stream = stream or self.whole_stream(rate, life)
        res = simulate(plan, stream, rate, self.workload.slo, target=self.target if stop else None, seed=self.seed)
        res.stream = stream
        return res

    def whole_stream(self, rate: float, life: float) -> Stream:
        need = min(MAX_WHOLE_REQUESTS, max(self.requests, math.ceil(LIFETIMES * rate * life)))
        if need > len(self._whole):
            self._whole = make_stream(self.workload, need, self.seed)
        return self._whole.head(math.ceil(need / self.workload.turns))

    def lifetime(self, c: Choice) -> float:
        """A request's lifetime served alone: prefill (+ KV transfer) + decode."""
        if c.mode == "aggregated":
            return self.fluid(c, "both")[1]
        return self.fluid(c, "prefill")[1] + self.fluid(c, "decode")[1]

    def fluid(self, c: Choice, role: str) -> tuple[float, float]:
        """An upper bound on the rate one instance of ``role`` carries (its work per request, with every
        iteration full, against time) and the lifetime of a request served alone (seconds)."""
        pl = self.planner
        mix = pl.mix
        par = c.dpar if role == "decode" else c.ppar
        dm = pl.devices[c.dhw.name if role == "decode" else c.phw.name]
        chunk = pl.assume.chunk
        per_token = dm.pass_time(chunk, par, chunk) / chunk
        prefill = sum(c_.share * ((c_.input - c_.cached) * per_token + dm.prefill_attention(
            (c_.input - c_.cached) * c_.cached + (c_.input - c_.cached) ** 2 / 2, c_.input, par)) for c_ in mix)
        alone_pre = sum(c_.share * dm.prefill(c_.input, par, c_.cached).seconds for c_ in mix)
        b_max = max(1, min(pl.assume.max_batch, math.floor(dm.lane_tokens(par) / pl.slot_tokens)))
        step_full = dm.decode_step(b_max, pl.decode_context, par).seconds
        decode = pl.mean_output * step_full / b_max
        alone_dec = pl.mean_output * dm.decode_step(1, pl.decode_context, par).seconds
        work = {"both": prefill + decode, "prefill": prefill, "decode": decode}[role]
        life = {"both": alone_pre + alone_dec, "prefill": alone_pre, "decode": alone_dec}[role]
        return par.pp / work, life

    def instance_capacity(self, c: Choice, role: str, guess: float) -> float:
        """The highest arrival rate one instance (all its pp lanes) carries with the SLO met for the
        attainment target: ``role`` "both" (aggregated), "prefill" (TTFT, KV transfer included) or "decode"
        (TPOT). Bisection in the rate from ``guess``, on the search stream, to RATE_TOLERANCE."""
        if role == "prefill":
            key = (role, c.phw.name, c.ppar, c.link.name, c.dpar.tp * c.dpar.dp)
        elif role == "decode":
            key = (role, c.dhw.name, c.dpar)
        else:
            key = (role, c.phw.name, c.ppar)
        if key in self._capacity:
            return self._capacity[key]
        plan = self.sim_plan(c, 1, 1, None if role == "both" else role)
        bound, life = self.fluid(c, role)
        turns = self.workload.turns

        def ok(rate: float) -> bool:
            if rate >= bound:       # more work arrives than the instance can do: unstable, however short the run
                return False
            n = min(MAX_SEARCH_REQUESTS, max(self.search_requests, math.ceil(LIFETIMES * rate * life)))
            res = self.run(plan, rate, self.search_stream.head(math.ceil(n / turns)))
            return not res.stopped and res.attainment >= self.target - 1e-9

        lo = hi = None
        r = max(min(guess, 0.9 * bound), 1e-9)
        for _ in range(24):          # up to 2^12 above the guess, 2^-10 below it (then: no rate meets)
            if ok(r):
                lo = r
                if hi is not None:
                    break
                r *= 2
            else:
                hi = r
                if lo is not None or r < guess / 1000:
                    break
                r /= 2
        if lo is None:
            self._capacity[key] = 0.0
            return 0.0
        while hi is not None and hi / lo > 1 + RATE_TOLERANCE:
            mid = math.sqrt(lo * hi)
            if ok(mid):
                lo = mid
            else:
                hi = mid
        self._capacity[key] = lo
        self.progress(f"{role} {c.phw.name if role != 'decode' else c.dhw.name} "
                      f"{(c.ppar if role != 'decode' else c.dpar).label}: {lo:.4g} req/s per instance")
        return lo

    # -- sizing -------------------------------------------------------------------------------------------

    def _weight(self, hw: HardwareProfile, by: str) -> float:
        """What one device of ``hw`` costs in the ranking's unit: a device, its price, or its power."""
        if by == "dollar" and hw.price_per_hour:
            return hw.price_per_hour
        if by == "joule" and hw.power_watts:
            return hw.power_watts
        return 1.0

    def evaluate(self, key: tuple, screened: list[Plan], by: str, keep: int = 2) -> list[Plan]:
        """Simulated plans for one choice (mode, prefill hardware, decode hardware, link): the capacity of one
        instance of every parallel configuration the screen found feasible, the ``keep`` best configurations
        (by devices, price or power per unit of rate) sized and simulated whole."""
        mode, pname, dname, lname = key
        pl = self.planner
        hw = {h.name: h for h in pl.hardware}
        phw, dhw = hw[pname], hw[dname]
        link = pl.interconnects.get(lname) if lname else None
        feasible = [p for p in screened if p.key == key and p.devices and p.meets]
        if not feasible:
            return []
        wl = self.workload
        options = []   # (cost per unit rate, choice, screen plan)
        if mode == "aggregated":
            for sp in feasible:
                c = Choice(mode, phw, sp.prefill_par, dhw, sp.prefill_par, None)
                cap = self.instance_capacity(c, "both", wl.rate / max(1, sp.prefill_instances))
                if cap <= 0:
                    continue
                if self.devices:    # a fixed cluster: the most requests it serves
                    options.append((-(self.devices // sp.prefill_par.devices) * cap, c, sp))
                else:               # pools sized for the rate: devices (price, power) per request per second
                    options.append((sp.prefill_par.devices * self._weight(phw, by) / cap, c, sp))
        else:
            pre = {sp.prefill_par: sp for sp in feasible}
            dec = {sp.decode_par: sp for sp in feasible}
            p_caps, d_caps = {}, {}
            for par, sp in pre.items():
                c = Choice(mode, phw, par, dhw, next(iter(dec)), link)
                p_caps[par] = self.instance_capacity(c, "prefill", wl.rate / max(1, sp.prefill_instances))
            for par, sp in dec.items():
                c = Choice(mode, phw, next(iter(pre)), dhw, par, link)
                d_caps[par] = self.instance_capacity(c, "decode", wl.rate / max(1, sp.decode_instances))
            for sp in feasible:
                pc, dc = p_caps.get(sp.prefill_par, 0.0), d_caps.get(sp.decode_par, 0.0)
                if pc <= 0 or dc <= 0:
                    continue
                if self.devices:
                    found = self.split(pc, dc, sp.prefill_par.devices, sp.decode_par.devices)
                    if found is None:
                        continue
                    cost = -found[2]
                else:
                    cost = (sp.prefill_par.devices * self._weight(phw, by) / pc
                            + sp.decode_par.devices * self._weight(dhw, by) / dc)
                options.append((cost, Choice(mode, phw, sp.prefill_par, dhw, sp.decode_par, link), sp))
        options.sort(key=lambda o: o[0])
        out = []
        for _, c, sp in options[:keep]:
            plan = self.size(c, sp)
            if plan is not None:
                out.append(plan)
        return out

    def split(self, p_cap: float, d_cap: float, dp: int, dd: int) -> tuple[int, int, float] | None:
        """The prefill and decode instances of a fixed cluster that serve the most requests per second (ties:
        fewer devices): (n_p, n_d, rate) with n_p dp + n_d dd <= devices."""
        best = None
        for n_p in range(1, self.devices // dp + 1):
            n_d = (self.devices - n_p * dp) // dd
            if n_d < 1:
                break
            n_d = min(n_d, max(1, math.ceil(n_p * p_cap / d_cap)))   # no decode instances that would idle
            rate = min(n_p * p_cap, n_d * d_cap)
            key = (rate, -(n_p * dp + n_d * dd))
            if best is None or key > best[0]:
                best = (key, n_p, n_d, rate)
        return None if best is None else best[1:]

    def size(self, c: Choice, screen: Plan) -> Plan | None:
        """The simulated plan for choice ``c``: pools sized from one instance's capacity for the workload's
        rate (or the most the fixed devices serve), then simulated whole and resized until they meet the SLO."""
        wl = self.workload
        if c.mode == "aggregated":
            cap = self.instance_capacity(c, "both", wl.rate / max(1, screen.prefill_instances))
            if cap <= 0:
                return None
            if self.devices:
                n = self.devices // c.ppar.devices
                if n < 1:
                    return None
                rate = n * cap
                self._budget_note(c, n)
            else:
                n, rate = max(1, math.ceil(wl.rate / cap)), wl.rate
            return self._verify(c, [n, 0], rate, screen)
        a = self.planner.assume
        p_cap = self.instance_capacity(c, "prefill", wl.rate / max(1, screen.prefill_instances)) * a.prefill_headroom
        d_cap = self.instance_capacity(c, "decode", wl.rate / max(1, screen.decode_instances)) * a.decode_headroom
        if p_cap <= 0 or d_cap <= 0:
            return None
        if self.devices:
            found = self.split(p_cap, d_cap, c.ppar.devices, c.dpar.devices)
            if found is None:
                return None
            n_p, n_d, rate = found
        else:
            n_p, n_d, rate = max(1, math.ceil(wl.rate / p_cap)), max(1, math.ceil(wl.rate / d_cap)), wl.rate
        self._budget_note(c, n_p, n_d, p_cap, d_cap)
        return self._verify(c, [n_p, n_d], rate, screen)

    def headroom(self, c: Choice, counts: list[int]) -> float:
        """The share of the highest simulated rate a plan is run at: 1 aggregated; disaggregated, the headroom
        of the pool that limits it (Assumptions.prefill_headroom, decode_headroom: the rate matching of two
        pools, docs/plan.md)."""
        if c.mode == "aggregated":
            return 1.0
        a = self.planner.assume
        p = counts[0] * self.instance_capacity(c, "prefill", 1.0)
        d = counts[1] * self.instance_capacity(c, "decode", 1.0)
        return a.prefill_headroom if p * a.prefill_headroom <= d * a.decode_headroom else a.decode_headroom

    def _budget_note(self, c: Choice, n_p: int, n_d: int = 0, p_cap: float = 0.0, d_cap: float = 0.0) -> None:
        """Why a plan on --devices leaves devices unused (noted once per choice)."""
        if not self.devices:
            return
        used = n_p * c.ppar.devices + n_d * (c.dpar.devices if c.mode == "disaggregated" else 0)
        left = self.devices - used
        if left <= 0:
            return
        if c.mode == "aggregated":
            why = f"an instance of {c.ppar.label} takes {c.ppar.devices}"
        else:
            limit, need = (("prefill", c.ppar.devices) if n_p * p_cap <= n_d * d_cap else ("decode", c.dpar.devices))
            why = (f"one more {limit} instance (the pool that limits the rate) takes {need}" if need > left else
                   "the other pool would idle: more instances of it do not raise the rate")
        label = c.ppar.label if c.mode == "aggregated" else f"P {n_p} x {c.ppar.label} + D {n_d} x {c.dpar.label}"
        self.budget_notes.append(f"{c.mode} {label} uses {used} of {self.devices} devices: {why}")

    def _highest_rate(self, c: Choice, counts: list[int], rate: float) -> float:
        """The highest rate the whole plan serves within the SLO, from one instance's capacity times the
        instances (a router that balances load does better than that; a burst may do worse): steps of 10% up
        or down, then bisection to 2%."""
        plan = self.sim_plan(c, *counts)

        def ok(r: float) -> bool:
            if not self.stable(c, counts, r):
                return False
            res = self.run(plan, r, life=self.lifetime(c))
            return not res.stopped and res.attainment >= self.target - 1e-9

        lo, hi = (rate, None) if ok(rate) else (None, rate)
        for _ in range(MAX_RESIZE):
            if lo is not None and hi is not None:
                break
            if hi is None:
                r = lo * 1.1
                if ok(r):
                    lo = r
                else:
                    hi = r
            else:
                r = hi / 1.1
                if ok(r):
                    lo = r
                else:
                    hi = r
        if lo is None:
            return hi / 1.1
        while hi is not None and hi / lo > 1.02:
            mid = math.sqrt(lo * hi)
            lo, hi = (mid, hi) if ok(mid) else (lo, mid)
        return lo

    def stable(self, c: Choice, counts: list[int], rate: float) -> bool:
        """Whether the pools can do the work arriving at ``rate`` at all (fluid bound; a finite simulation of an
        overloaded pool can look fine while its queue has only begun to grow)."""
        if c.mode == "aggregated":
            return rate < counts[0] * self.fluid(c, "both")[0]
        return rate < counts[0] * self.fluid(c, "prefill")[0] and rate < counts[1] * self.fluid(c, "decode")[0]

    def _verify(self, c: Choice, counts: list[int], rate: float, screen: Plan) -> Plan:
        """Simulate the whole plan; where it misses the SLO, grow the pool that misses and try again; where it
        meets with a pool of one instance fewer, take that. With fixed devices: the highest rate it serves."""
        if self.devices:
            rate = self._highest_rate(c, counts, rate) * self.headroom(c, counts)
        life = self.lifetime(c)
        res = self.run(self.sim_plan(c, *counts), rate, stop=False, life=life)
        for _ in range(MAX_RESIZE):
            if res.attainment >= self.target - 1e-9:
                break
            if self.devices:
                rate /= 1.02
            elif c.mode == "aggregated" or res.ttft_met < res.tpot_met:
                counts[0] += 1
            else:
                counts[1] += 1
            res = self.run(self.sim_plan(c, *counts), rate, stop=False, life=life)
        if res.attainment >= self.target - 1e-9 and not self.devices:
            for i in (0, 1):
                if counts[i] > 1:
                    fewer = counts[:]
                    fewer[i] -= 1
                    if not self.stable(c, fewer, rate):
                        continue
                    trial = self.run(self.sim_plan(c, *fewer), rate, stop=False, life=life)
                    if trial.attainment >= self.target - 1e-9:
                        counts, res = fewer, trial
        self.check_steady(c, res, rate, life)
        return self.to_plan(c, counts, rate, res, screen)

    def check_steady(self, c: Choice, res: SimResult, rate: float, life: float) -> None:
        """A warning where the whole-plan run did not reach a steady state (the TTFT still drifting up), or
        could not span LIFETIMES request lifetimes within MAX_WHOLE_REQUESTS."""
        label = c.ppar.label if c.mode == "aggregated" else f"P {c.ppar.label} -> D {c.dpar.label}"
        span = res.requests / rate if rate > 0 else 0.0
        if life > 0 and span < LIFETIMES * life:
            self.warnings.append(f"{c.mode} {label}: {res.requests:,} requests span {span / life:.1f} request "
                                 f"lifetimes (< {LIFETIMES}); its figures may not be those of a steady state")
        if not res.steady:
            self.warnings.append(f"{c.mode} {label}: not in steady state after {res.requests:,} requests (mean TTFT "
                                 f"of the last third of requests {res.drift:.2f}x the first third's); the queue is "
                                 "still growing at this rate")

    def to_plan(self, c: Choice, counts: list[int], rate: float, res: SimResult, screen: Plan) -> Plan:
        wl, pl = self.workload, self.planner
        plan = Plan.of(c.mode, c.phw.name, c.dhw.name, c.ppar, c.dpar, c.link.name if c.link else None)
        plan.sim, plan.screen = res, screen
        plan.rate = rate
        if c.mode == "aggregated":
            plan.prefill_instances = plan.decode_instances = counts[0]
            plan.prefill_devices = counts[0] * c.ppar.devices
        else:
            plan.prefill_instances, plan.decode_instances = counts
            plan.prefill_devices = counts[0] * c.ppar.devices
            plan.decode_devices = counts[1] * c.dpar.devices
        plan.devices = plan.prefill_devices + plan.decode_devices
        plan.cluster = self.devices or 0
        plan.attainment_target = self.target
        plan.attainment = res.attainment
        plan.meets = res.attainment >= self.target - 1e-9
        stream = res.stream
        ok = (res.ttft <= wl.slo.ttft) & (res.tpot <= wl.slo.tpot)
        # each measured request stands for 1/n of the offered rate; count the tokens of those meeting the SLO
        n = max(1, len(ok))
        good = [r for r, met in zip(res.index, ok) if met]
        plan.goodput = rate * len(good) / n
        plan.good_output = rate * sum(stream.output[r] for r in good) / n
        plan.good_tokens = rate * sum(stream.input[r] + stream.output[r] for r in good) / n
        plan.served_output = rate * sum(stream.output[r] for r in res.index) / n
        plan.tpot = res.percentile("tpot", 100 * self.target)
        plan.ttft = {}
        plan.batch = round(res.mean_batch, 1) if res.mean_batch < 10 else round(res.mean_batch)
        dm = pl.devices[c.dhw.name]
        dpar = c.dpar if c.mode == "disaggregated" else c.ppar
        plan.max_batch = min(pl.assume.max_batch, int(dm.lane_tokens(dpar) / pl.slot_tokens)) if pl.slot_tokens else 0
        plan.prefill_wall, plan.decode_wall = screen.prefill_wall, screen.decode_wall
        plan.origins = screen.origins
        util = res.utilization
        plan_util = ((util.get("both", 1.0), util.get("both", 1.0)) if c.mode == "aggregated"
                     else (util.get("prefill", 1.0), util.get("decode", 1.0)))
        pl.price_and_power(plan, plan_util)
        if not plan.meets:
            plan.reason = (f"simulated attainment {res.attainment:.0%} < {self.target:.0%} (TTFT met by "
                           f"{res.ttft_met:.0%}, TPOT by {res.tpot_met:.0%} of requests)")
        return plan


def candidates(screened: list[Plan], by: str, top: int) -> list[tuple]:
    """The choices to simulate: the ``top`` best (mode, prefill hardware, decode hardware, link) choices of the
    screen, and the best of each mode whatever its rank."""
    ranked = [p for p in best_per_choice(screened, by) if p.devices and p.meets]
    picked: list[tuple] = []
    for mode in ("aggregated", "disaggregated"):
        first = next((p.key for p in ranked if p.mode == mode), None)
        if first is not None:
            picked.append(first)
    for p in ranked:
        if len(picked) >= top:
            break
        if p.key not in picked:
            picked.append(p.key)
    return picked


def simulate_plans(planner: Planner, screened: list[Plan], by: str, *, top: int = 4, requests: int = 4000,
                   search_requests: int = 1500, seed: int = 0, devices: int | None = None,
                   progress: Callable[[str], None] | None = None) -> tuple[list[Plan], Search]:
    """Simulate the screen's best choices; returns the simulated plans (unranked) and the search (its counts)."""
    search = Search(planner, requests=requests, search_requests=search_requests, seed=seed, devices=devices,
                    progress=progress)
    out = []
    for key in candidates(screened, by, top):
        out += search.evaluate(key, screened, by)
    return out, search


__all__ = ["Choice", "Search", "candidates", "simulate_plans"]
