"""Iteration-level simulation of one serving plan (docs/plan.md, "The simulation").

Requests arrive (Poisson, Gamma with a coefficient of variation, or a replayed trace; multi-turn conversations
come back after a think time) and are served by lanes (an instance of tp x pp devices is pp lanes) that run
iterations as a continuous-batching engine does: every iteration carries the decode tokens of the running
batch plus, in aggregated serving, chunks of waiting prompts up to the token budget, and takes the time of
:class:`~kbench.plan.model.DeviceModel`'s roofline (or measured) pieces for exactly that content. A prefill in
an aggregated lane therefore stretches the decode steps it shares an iteration with (the interference
Splitwise and DistServe measure). Disaggregated plans have prefill lanes, a FIFO KV transfer per prefill lane
over the link, and decode lanes. Requests reserve KV room for their whole context when admitted (no
preemption, TensorRT-LLM's default policy).

A tight event loop of our own (heapq), not SimPy: between events a decode-only lane's steps differ only by
the context they read, which grows linearly, so the loop jumps over whole runs of steps in closed form and
re-plans a run when a request arrives at that lane. Events are then a few per request, not one per token;
SimPy's process switches cost more than the whole step arithmetic and cannot jump.
"""
from __future__ import annotations

import heapq
import math
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from kbench.plan.inputs import SLO, RequestClass, Workload
from kbench.plan.model import DeviceModel, Parallel

#: JSQ over every lane up to this many, then the better of two lanes drawn at random (power of two choices)
JSQ_LANES = 16
#: share of requests (by arrival) left out of the statistics at each end: the empty start and the draining end
WARMUP = 0.1

_IDLE, _MIXED, _SEG = 0, 1, 2
_BOTH, _PREFILL, _DECODE = 0, 1, 2


# ---------------------------------------------------------------------------------------------
# Requests
# ---------------------------------------------------------------------------------------------

@dataclass
class Stream:
    """The random draws of one simulation, at unit rate: arrival gaps of first turns, lengths, think times.
    ``at(rate)`` scales the gaps, so that simulations at different rates share their draws (common random
    numbers: the attainment then falls with the rate without noise between them)."""
    gaps: list[float]            # unit-rate gaps between conversations' first turns (trace: seconds as recorded)
    input: list[int]             # per request: context tokens
    cached: list[int]            # per request: of which found in the prefix cache
    output: list[int]
    think: list[float]           # per request: think time before it (turns after the first)
    first_of: list[int]          # per request: index of its conversation's first turn
    next_turn: list[int]         # per request: the next turn's index, or -1
    unit_rate: float = 1.0       # the rate the gaps are drawn at (a trace: its own)
    source: str = ""
    turns: int = 1               # requests per conversation (consecutive in the lists)

    def __len__(self) -> int:
        return len(self.input)

    def head(self, conversations: int) -> Stream:
        """The first ``conversations`` conversations (all their turns), with the same draws."""
        if conversations >= len(self.gaps):
            return self
        n = conversations * self.turns
        return Stream(self.gaps[:conversations], self.input[:n], self.cached[:n], self.output[:n], self.think[:n],
                      self.first_of[:n], self.next_turn[:n], self.unit_rate, self.source, self.turns)


def make_stream(workload: Workload, n: int, seed: int = 0) -> Stream:
    """``n`` requests of ``workload``: classes drawn by share (or a trace's rows in order), conversations of
    ``turns`` requests whose turn j carries the j earlier turns as cached context."""
    import numpy as np

    rng = np.random.default_rng(seed)
    turns = workload.turns
    convs = max(1, math.ceil(n / turns))
    arr = workload.arrivals
    if arr.process == "trace" and arr.trace is not None:
        tr = arr.trace
        convs = min(convs, len(tr.input))
        times = tr.arrival[:convs]
        gaps = [times[0]] + [b - a for a, b in zip(times, times[1:])]
        lengths = [RequestClass(1.0, tr.input[i], tr.output[i]) for i in range(convs)]
        unit, source = tr.rate, arr.label
    else:
        if arr.process == "gamma":
            k = 1.0 / arr.cv ** 2
            gaps = (rng.gamma(k, 1.0 / k, convs)).tolist()
        else:
            gaps = rng.exponential(1.0, convs).tolist()
        shares = np.array([c.share for c in workload.mix])
        pick = rng.choice(len(shares), size=convs, p=shares / shares.sum()).tolist()
        lengths = [workload.mix[i] for i in pick]
        unit, source = 1.0, arr.label
    think = rng.exponential(workload.think_time, convs * turns).tolist() if workload.think_time > 0 else \
        [0.0] * (convs * turns)
    s = Stream([], [], [], [], [], [], [], unit, source, turns)
    # conversations start at 1/turns of the request rate, so that requests arrive at the rate asked for
    s.gaps = [g * turns for g in gaps] if turns > 1 else gaps
    for cls in lengths:
        first = len(s.input)
        for j in range(turns):
            context, cached = workload.turn(cls, j)
            s.input.append(context)
            s.cached.append(cached)
            s.output.append(cls.output)
            s.think.append(think[first + j] if j else 0.0)
            s.first_of.append(first)
            s.next_turn.append(first + j + 1 if j + 1 < turns else -1)
    return s


# ---------------------------------------------------------------------------------------------
# The plan as simulated
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Pool:
    dm: DeviceModel
    par: Parallel
    instances: int


@dataclass(frozen=True)
class SimPlan:
    """What to simulate: one pool serving both phases (``decode`` None), or a prefill and a decode pool
    joined by a link of ``link_bandwidth`` B/s per transfer (min(tp) links in parallel, efficiency applied).
    ``only`` simulates one pool of a disaggregated plan alone, to find what one instance of it carries:
    ``"prefill"`` (requests end when their KV cache has crossed the link: TTFT only) or ``"decode"`` (requests
    arrive with their KV cache: TPOT only; ``prefill`` is then the decode pool)."""
    prefill: Pool
    decode: Pool | None = None
    link_bandwidth: float = 0.0
    link_latency: float = 0.0
    chunk: int = 8192
    max_batch: int = 512
    only: str | None = None


class _Lane:
    """One lane: the scheduler state of an instance's micro-batch pipeline slot."""
    __slots__ = ("role", "dm", "tp", "par", "waiting", "pre", "heap", "b", "steps", "ctx", "kv", "siblings",
                 "state", "version", "t0", "seg_a", "seg_q", "seg_k", "pieces", "busy",
                 "link_free", "pending", "cf", "wr", "kw", "comm1", "comm2", "comm_pp", "moe", "kappa", "index")

    def __init__(self, role: int, pool: Pool, index: int, max_batch: int, kv: list[int]) -> None:
        dm, par = pool.dm, pool.par
        self.role, self.dm, self.tp, self.par, self.index = role, dm, par.tp, par, index
        self.waiting: deque[int] = deque()
        self.pre: list[list[int]] = []         # [rid, tokens still to prefill]
        self.heap: list[tuple[int, int]] = []  # decode batch: (step at which it finishes, rid)
        self.b = self.steps = 0
        self.ctx = 0.0                         # total context of the decode batch
        self.kv = kv                           # [tokens reserved, room]: shared by the pp lanes of the instance
        self.siblings: list[_Lane] = []
        self.state, self.version = _IDLE, 0
        self.t0 = self.seg_a = self.seg_q = 0.0
        self.seg_k = 0
        self.pieces: list[tuple[list[int], int]] = []
        self.busy = 0.0
        self.link_free = 0.0
        self.pending = 0                       # prompt tokens queued or in prefill here (routing)
        # the constant pieces of an iteration's time (DeviceModel.gemm and .comm, unrolled for speed)
        self.cf = 2.0 * dm.params.matmul / (par.tp * dm.compute.value)
        self.wr = dm.weight_bytes / (par.tp * dm.memory.value)
        self.kw = dm.kv_per_token / (par.tp * dm.memory.value)
        self.moe = dm.model.moe is not None
        self.comm1, self.comm2, self.comm_pp = dm.comm_lines(par)
        self.kappa: dict[tuple[int, int], float] = {}

    def gemm(self, n: int, c: int) -> float:
        """A pass over ``n`` tokens of which ``c`` are prompt tokens (whose KV is written)."""
        wr = self.dm.weights_read(n) / (self.tp * self.dm.memory.value) if self.moe else self.wr
        a1, b1 = self.comm1
        a2, b2 = self.comm2
        a3, b3 = self.comm_pp
        return max(n * self.cf, wr + c * self.kw) + min(a1 + b1 * n, a2 + b2 * n) + a3 + b3 * n

    def kv_per_token(self, b: int, avg: float) -> float:
        key = (b, int(avg) >> 5)
        found = self.kappa.get(key)
        if found is None:
            found = self.dm.kv_seconds_per_token(b, avg, self.tp)[0]
            self.kappa[key] = found
        return found


# ---------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------

@dataclass
class SimResult:
    """Per-request latencies of the measured requests and the pools' figures."""
    ttft: Any                        # numpy arrays, seconds, one entry per measured request
    tpot: Any
    e2e: Any
    slo: SLO
    attainment: float                # fraction of measured requests meeting TTFT and TPOT
    requests: int                    # simulated requests
    measured: int                    # requests in the statistics
    rate: float                      # offered requests per second
    span: float                      # simulated seconds
    output_tokens: int               # tokens generated by the measured requests
    utilization: dict[str, float] = field(default_factory=dict)    # pool -> busy fraction
    mean_batch: float = 0.0          # requests in the decode batch per decode lane, averaged over the measured window
    stopped: bool = False            # stopped early: the attainment target could no longer be reached
    source: str = ""
    index: list[int] = field(default_factory=list)                 # the measured requests, in stream order

    def percentile(self, what: str, q: float) -> float:
        import numpy as np

        values = getattr(self, what)
        return float(np.percentile(values, q)) if len(values) else math.inf

    @property
    def ttft_met(self) -> float:
        return float((self.ttft <= self.slo.ttft).mean()) if self.measured else 0.0

    @property
    def tpot_met(self) -> float:
        return float((self.tpot <= self.slo.tpot).mean()) if self.measured else 0.0


# ---------------------------------------------------------------------------------------------
# The event loop
# ---------------------------------------------------------------------------------------------

def simulate(plan: SimPlan, stream: Stream, rate: float, slo: SLO, *, target: float | None = None,
             seed: int = 0) -> SimResult:
    """Simulate ``stream`` offered at ``rate`` requests per second to ``plan``. With ``target`` (an attainment
    fraction) the simulation stops as soon as more measured requests missed the SLO than the target allows
    (the result's attainment is then an upper bound below the target, ``stopped`` True)."""
    import numpy as np

    n = len(stream)
    inp, cached, out = stream.input, stream.cached, stream.output
    first_of, next_turn, think = stream.first_of, stream.next_turn, stream.think
    scale = stream.unit_rate / rate
    arrival = [math.nan] * n
    first = [math.nan] * n
    finish = [math.nan] * n
    # the measured window: conversations between the warm-up and the drain, by arrival order
    firsts = sorted({f for f in first_of})
    lo_c, hi_c = firsts[int(WARMUP * len(firsts))], firsts[min(len(firsts) - 1, int((1 - WARMUP) * len(firsts)))]
    measured = [lo_c <= first_of[r] < hi_c or (len(firsts) < 3) for r in range(n)]
    n_measured = sum(measured)
    allowed = math.inf if target is None else (1.0 - target) * n_measured
    misses = 0
    stopped = False
    slo_ttft, slo_tpot = slo.ttft, slo.tpot

    only = plan.only
    disagg = plan.decode is not None or only == "prefill"
    role = {None: _PREFILL if disagg else _BOTH, "prefill": _PREFILL, "decode": _DECODE}[only]
    front = _lanes(role, plan.prefill, plan.max_batch)
    back = _lanes(_DECODE, plan.decode, plan.max_batch) if plan.decode is not None and only is None else []
    chunk, max_batch = plan.chunk, plan.max_batch
    rng = random.Random(seed)
    home: dict[int, _Lane] = {}              # conversation -> the lane of its previous turn (prefix cache affinity)
    home_back: dict[int, _Lane] = {}

    events: list[tuple] = []
    seq = 0
    # first turns in order: cumulative gaps
    t = 0.0
    ci = 0
    for r in range(n):
        if r == first_of[r]:
            t += stream.gaps[ci] * scale
            ci += 1
            arrival[r] = t
            events.append((t, 0, seq, r, None))
            seq += 1
    heapq.heapify(events)
    # the measured window in time: from the first to the last measured conversation's first arrival
    win_lo = min((arrival[r] for r in range(n) if measured[r] and r == first_of[r]), default=0.0)
    win_hi = max((arrival[r] for r in range(n) if measured[r] and r == first_of[r]), default=0.0)
    batch_area = [0.0]                       # integral of the decode batch over the window, all decode lanes

    def account(b: int, t0: float, t1: float) -> None:
        lo, hi = (t0 if t0 > win_lo else win_lo), (t1 if t1 < win_hi else win_hi)
        if hi > lo:
            batch_area[0] += b * (hi - lo)

    def need(r: int) -> int:
        return inp[r] + out[r]

    def pick(pool: list[_Lane], key) -> _Lane:
        if len(pool) <= JSQ_LANES:
            return min(pool, key=key)
        a, b = rng.choice(pool), rng.choice(pool)
        return a if key(a) <= key(b) else b

    def finish_request(lane: _Lane | None, r: int, now: float, ttft_only: bool = False) -> None:
        """The request's last token at ``now``: its KV room on ``lane`` is freed (None: it held none)."""
        nonlocal misses, stopped, seq
        finish[r] = now
        if lane is not None:
            lane.kv[0] -= need(r)
            for sib in lane.siblings:       # room freed for the instance's other lanes
                if sib.state == _IDLE and sib.waiting:
                    start(sib, now)
        if measured[r]:
            o = out[r]
            tp = (now - first[r]) / (o - 1) if o > 1 and not ttft_only else 0.0
            if first[r] - arrival[r] > slo_ttft or tp > slo_tpot:
                misses += 1
                if misses > allowed:
                    stopped = True
        nt = next_turn[r]
        if nt >= 0:
            arrival[nt] = now + think[nt]
            heapq.heappush(events, (arrival[nt], 0, seq, nt, None))
            seq += 1

    def admit(lane: _Lane) -> None:
        w = lane.waiting
        if lane.role == _DECODE:
            kv = lane.kv
            while w and lane.b < max_batch and kv[0] + need(w[0]) <= kv[1]:
                r = w.popleft()
                kv[0] += need(r)
                heapq.heappush(lane.heap, (lane.steps + out[r] - 1, r))
                lane.b += 1
                lane.ctx += inp[r] + 1
        elif lane.role == _BOTH:
            kv = lane.kv
            while w and len(lane.pre) + lane.b < max_batch and kv[0] + need(w[0]) <= kv[1]:
                r = w.popleft()
                kv[0] += need(r)
                lane.pre.append([r, inp[r] - cached[r]])
        else:
            kv = lane.kv
            while w and kv[0] + inp[w[0]] <= kv[1]:
                r = w.popleft()
                kv[0] += inp[r]
                lane.pre.append([r, inp[r] - cached[r]])

    def start(lane: _Lane, now: float) -> None:
        """Plan the lane's next iteration (prompts waiting) or run of decode steps, from ``now``."""
        nonlocal seq
        admit(lane)
        lane.version += 1
        if lane.pre:
            b = lane.b
            budget = max(1, chunk - b)
            pieces = []
            tokens = 0
            attn = 0.0
            dm = lane.dm
            for entry in lane.pre:
                if budget <= 0:
                    break
                r, todo = entry
                c = todo if todo < budget else budget
                done = inp[r] - todo                 # tokens of the context already in the cache
                pairs = c * done + c * (c + 1) / 2
                attn += dm.prefill_attention(pairs, inp[r], lane.tp)
                pieces.append((entry, c))
                tokens += c
                budget -= c
            tau = lane.gemm(b + tokens, tokens) + attn
            if b:
                tau += lane.kv_per_token(b, lane.ctx / b) * lane.ctx
            lane.pieces = pieces
            lane.state = _MIXED
            lane.t0 = now
            lane.busy += tau
            if b and lane.role != _PREFILL:
                account(b, now, now + tau)
            heapq.heappush(events, (now + tau, 2, seq, lane, lane.version))
            seq += 1
        elif lane.b:
            b = lane.b
            k = lane.heap[0][0] - lane.steps            # steps until the next request finishes
            A = lane.gemm(b, 0)
            kappa = lane.kv_per_token(b, lane.ctx / b)
            # step i of the run takes A + kappa (C0 + i b): k steps take k a + q k (k - 1)
            lane.seg_a = A + kappa * lane.ctx
            lane.seg_q = kappa * b / 2
            lane.seg_k = k
            lane.t0 = now
            lane.state = _SEG
            dur = k * lane.seg_a + lane.seg_q * k * (k - 1)
            heapq.heappush(events, (now + dur, 2, seq, lane, lane.version))
            seq += 1
        else:
            lane.state = _IDLE

    def interrupt(lane: _Lane, now: float) -> None:
        """A request arrived at a lane in a run of decode steps: end the run at the first step boundary at
        or after ``now`` so that the next iteration can take it."""
        nonlocal seq
        a, q, k0 = lane.seg_a, lane.seg_q, lane.seg_k
        dt = now - lane.t0
        if q > 0:
            k = math.ceil((-(a - q) + math.sqrt((a - q) ** 2 + 4 * q * dt)) / (2 * q) - 1e-9)
        else:
            k = math.ceil(dt / a - 1e-9)
        k = max(1, k)
        if k >= k0:
            return
        lane.seg_k = k
        lane.version += 1
        heapq.heappush(events, (lane.t0 + k * a + q * k * (k - 1), 2, seq, lane, lane.version))
        seq += 1

    def arrive(lane: _Lane, r: int, now: float) -> None:
        lane.waiting.append(r)
        if lane.state == _IDLE:
            start(lane, now)
        elif lane.state == _SEG:
            interrupt(lane, now)

    last = 0.0
    while events and not stopped:
        now, kind, _, x, version = heapq.heappop(events)
        if kind == 0 and only == "decode":                    # a request arrives with its KV cache
            first[x] = now
            if out[x] <= 1:
                finish_request(None, x, now)
                continue
            conv = first_of[x]
            lane = home.get(conv) or pick(front, lambda ln: (ln.b + len(ln.waiting), ln.kv[0]))
            if next_turn[x] >= 0:
                home[conv] = lane
            arrive(lane, x, now)
        elif kind == 0:                                       # a request at the front door
            r = x
            conv = first_of[r]
            lane = home.get(conv)
            if lane is None:
                lane = pick(front, lambda ln: (ln.pending, ln.b))
            if next_turn[r] >= 0:
                home[conv] = lane
            else:
                home.pop(conv, None)
            lane.pending += inp[r] - cached[r]
            arrive(lane, r, now)
        elif kind == 1:                                       # KV cache arrived at the decode pool
            r, src = x
            src.kv[0] -= inp[r]
            for ln in (src, *src.siblings):
                if ln.state == _IDLE and ln.waiting:
                    start(ln, now)
            first[r] = now
            if out[r] <= 1 or only == "prefill":
                finish[r] = now
                finish_request(None, r, now, ttft_only=only == "prefill")
                continue
            conv = first_of[r]
            lane = home_back.get(conv) or pick(back, lambda ln: (ln.b + len(ln.waiting), ln.kv[0]))
            if next_turn[r] >= 0:
                home_back[conv] = lane
            else:
                home_back.pop(conv, None)
            arrive(lane, r, now)
        else:                                                 # a lane's iteration or run of steps ended
            lane = x
            if version != lane.version:
                continue
            last = now
            if lane.state == _MIXED:
                b = lane.b
                if b:
                    lane.steps += 1
                    lane.ctx += b
                    _finish_due(lane, now, inp, out, finish_request)
                for entry, c in lane.pieces:
                    entry[1] -= c
                    lane.pending -= c
                    if entry[1] == 0:
                        r = entry[0]
                        lane.pre.remove(entry)
                        if lane.role == _PREFILL:
                            x_time = inp[r] * lane.dm.kv_per_token / plan.link_bandwidth + plan.link_latency
                            begin = now if now > lane.link_free else lane.link_free
                            lane.link_free = begin + x_time
                            heapq.heappush(events, (lane.link_free, 1, seq, (r, lane), None))
                            seq += 1
                            continue
                        first[r] = now
                        if out[r] <= 1:
                            finish_request(lane, r, now)
                            continue
                        heapq.heappush(lane.heap, (lane.steps + out[r] - 1, r))
                        lane.b += 1
                        lane.ctx += inp[r] + 1
                lane.pieces = []
            elif lane.state == _SEG:
                k = lane.seg_k
                dur = k * lane.seg_a + lane.seg_q * k * (k - 1)
                lane.busy += dur
                account(lane.b, lane.t0, now)
                lane.steps += k
                lane.ctx += lane.b * k
                _finish_due(lane, now, inp, out, finish_request)
            lane.state = _IDLE
            start(lane, now)

    start_t = min((a for a in arrival if a == a), default=0.0)
    span = max(last, max((f for f in finish if f == f), default=0.0)) - start_t
    idx = [r for r in range(n) if measured[r]]
    ttft = np.array([first[r] - arrival[r] if first[r] == first[r] else math.inf for r in idx])
    tpot = np.array([((finish[r] - first[r]) / (out[r] - 1) if out[r] > 1 and only != "prefill" else 0.0)
                     if finish[r] == finish[r] else math.inf for r in idx])
    e2e = np.array([finish[r] - arrival[r] if finish[r] == finish[r] else math.inf for r in idx])
    ok = (ttft <= slo_ttft) & (tpot <= slo_tpot)
    util = {}
    pools = {None: (("prefill", front), ("decode", back)) if disagg else (("both", front),),
             "prefill": (("prefill", front),), "decode": (("decode", front),)}[only]
    for name, pool in pools:
        if pool and span > 0:
            util[name] = min(1.0, sum(ln.busy for ln in pool) / (len(pool) * span))
    dec_lanes = back if disagg and only is None else front
    mean_batch = batch_area[0] / (win_hi - win_lo) / len(dec_lanes) if dec_lanes and win_hi > win_lo else 0.0
    return SimResult(ttft=ttft, tpot=tpot, e2e=e2e, slo=slo, attainment=float(ok.mean()) if len(idx) else 0.0,
                     requests=n, measured=len(idx), rate=rate, span=span,
                     output_tokens=int(sum(out[r] for r in idx if finish[r] == finish[r])), utilization=util,
                     mean_batch=mean_batch, stopped=stopped,
                     source=stream.source, index=idx)


def _lanes(role: int, pool: Pool, max_batch: int) -> list[_Lane]:
    """The lanes of a pool: pp per instance, sharing the instance's KV room."""
    out = []
    room = pool.dm.kv_tokens(pool.par)
    for _ in range(pool.instances):
        kv = [0, room]
        lanes = [_Lane(role, pool, len(out) + j, max_batch, kv) for j in range(pool.par.pp)]
        for ln in lanes:
            ln.siblings = [x for x in lanes if x is not ln]
        out += lanes
    return out


def _finish_due(lane: _Lane, now: float, inp, out, finish_request) -> None:
    heap = lane.heap
    steps = lane.steps
    while heap and heap[0][0] <= steps:
        _, r = heapq.heappop(heap)
        lane.b -= 1
        lane.ctx -= inp[r] + out[r]
        finish_request(lane, r, now)
