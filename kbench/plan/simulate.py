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
    jitter: float = 0.0      # coefficient of variation of a step's time (measured spread), for the ITL percentiles


class _Lane:
    """One lane: the scheduler state of an instance's micro-batch pipeline slot."""
    __slots__ = ("role", "dm", "tp", "par", "waiting", "pre", "heap", "b", "steps", "ctx", "kv", "siblings",
                 "state", "version", "t0", "seg_a", "seg_q", "seg_k", "pieces", "busy",
                 "link_free", "pending", "kw", "passes", "kappa", "index")

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
        self.kw = dm.kv_write_seconds(par)
        self.passes: dict[int, tuple[float, float, float]] = {}
        self.kappa: dict[tuple[int, int], float] = {}

    def gemm(self, n: int, c: int) -> float:
        """A pass over ``n`` tokens of which ``c`` are prompt tokens (whose KV is written): everything but
        attention over the cache (DeviceModel.pass_time, memoized per lane)."""
        found = self.passes.get(n)
        if found is None:
            found = self.passes[n] = self.dm.pass_parts(n, self.par)
        a, b, extra = found
        b += c * self.kw
        return (a if a > b else b) + extra

    def kv_per_token(self, b: int, avg: float) -> float:
        key = (b, int(avg) >> 5)
        found = self.kappa.get(key)
        if found is None:
            found = self.dm.kv_seconds_per_token(b, avg, self.par)[0]
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
    itl: Any = None                  # (seconds, weight) arrays: per-token inter-token latencies (ITL) of decode lanes
    steady: bool = True              # whether the run reached a steady state (docs/plan.md, "Steady state")
    drift: float = 1.0               # mean TTFT of the last third of the measured requests over the first third
    stream: Any = None               # the requests simulated (set by the caller that keeps it)

    def percentile(self, what: str, q: float) -> float:
        import numpy as np

        if what == "itl":
            return _weighted_percentile(self.itl, q)
        values = getattr(self, what)
        return float(np.percentile(values, q)) if len(values) else math.inf

    @property
    def ttft_met(self) -> float:
        return float((self.ttft <= self.slo.ttft).mean()) if self.measured else 0.0

    @property
    def tpot_met(self) -> float:
        return float((self.tpot <= self.slo.tpot).mean()) if self.measured else 0.0


# ---------------------------------------------------------------------------------------------
# The event loop: arrivals, batching (admission), iterations and runs of them, KV transfers, metrics
# ---------------------------------------------------------------------------------------------

_ARRIVE, _KV, _END = 0, 1, 2
#: drift of the mean TTFT (last third of the measured requests over the first third) beyond which a run is
#: reported as not in steady state
STEADY_DRIFT = 1.5


def simulate(plan: SimPlan, stream: Stream, rate: float, slo: SLO, *, target: float | None = None,
             seed: int = 0) -> SimResult:
    """Simulate ``stream`` offered at ``rate`` requests per second to ``plan``. With ``target`` (an attainment
    fraction) the simulation stops as soon as more measured requests missed the SLO than the target allows
    (the result's attainment is then an upper bound below the target, ``stopped`` True)."""
    sim = _Simulation(plan, stream, rate, slo, target, seed)
    sim.run()
    return sim.result()


class _Simulation:
    """One simulation's state; each part of the loop is a method: arrivals (:meth:`on_arrival`), batching
    (:meth:`admit`), iterations and closed-form runs of them (:meth:`start`, :meth:`plan_run`,
    :meth:`interrupt`, :meth:`on_end`), KV transfers (:meth:`transfer`, :meth:`on_kv`) and metrics
    (:meth:`finish_request`, :meth:`account`, :meth:`result`)."""

    def __init__(self, plan: SimPlan, stream: Stream, rate: float, slo: SLO, target: float | None,
                 seed: int) -> None:
        n = len(stream)
        self.plan, self.stream, self.rate, self.slo, self.n = plan, stream, rate, slo, n
        self.inp, self.cached, self.out = stream.input, stream.cached, stream.output
        self.arrival, self.first, self.finish = [math.nan] * n, [math.nan] * n, [math.nan] * n
        firsts = sorted(set(stream.first_of))
        lo_c = firsts[int(WARMUP * len(firsts))]
        hi_c = firsts[min(len(firsts) - 1, int((1 - WARMUP) * len(firsts)))]
        self.measured = [lo_c <= stream.first_of[r] < hi_c or (len(firsts) < 3) for r in range(n)]
        self.allowed = math.inf if target is None else (1.0 - target) * sum(self.measured)
        self.misses, self.stopped, self.last = 0, False, 0.0
        self.only = plan.only
        self.disagg = plan.decode is not None or self.only == "prefill"
        role = {None: _PREFILL if self.disagg else _BOTH, "prefill": _PREFILL, "decode": _DECODE}[self.only]
        self.front = _lanes(role, plan.prefill, plan.max_batch)
        self.back = _lanes(_DECODE, plan.decode, plan.max_batch) if plan.decode is not None and self.only is None \
            else []
        self.rng = random.Random(seed)
        self.home: dict[int, _Lane] = {}      # conversation -> the lane of its previous turn (prefix cache affinity)
        self.home_back: dict[int, _Lane] = {}
        self.events: list[tuple] = []
        self.seq = 0
        self.batch_area = 0.0                 # integral of the decode batch over the window, all decode lanes
        self.itl: list[tuple[float, float]] = []   # (step seconds, tokens generated at that step time)
        self.schedule_arrivals()

    # -- arrivals ------------------------------------------------------------------------------------

    def schedule_arrivals(self) -> None:
        """Every conversation's first turn at the cumulative scaled gaps; the measured window in time."""
        st, scale = self.stream, self.stream.unit_rate / self.rate
        t, ci = 0.0, 0
        for r in range(self.n):
            if r == st.first_of[r]:
                t += st.gaps[ci] * scale
                ci += 1
                self.arrival[r] = t
                self.events.append((t, _ARRIVE, self.seq, r, None))
                self.seq += 1
        heapq.heapify(self.events)
        starts = [self.arrival[r] for r in range(self.n) if self.measured[r] and r == st.first_of[r]]
        self.win_lo, self.win_hi = (min(starts), max(starts)) if starts else (0.0, 0.0)

    def push(self, t: float, kind: int, x: Any, version: int | None = None) -> None:
        heapq.heappush(self.events, (t, kind, self.seq, x, version))
        self.seq += 1

    def pick(self, pool: list[_Lane], key) -> _Lane:
        """Join the shortest queue (up to JSQ_LANES lanes), else the better of two lanes drawn at random."""
        if len(pool) <= JSQ_LANES:
            return min(pool, key=key)
        a, b = self.rng.choice(pool), self.rng.choice(pool)
        return a if key(a) <= key(b) else b

    def on_arrival(self, r: int, now: float) -> None:
        """A request at the front door (or, simulating a decode pool alone, arriving with its KV cache)."""
        conv, st = self.stream.first_of[r], self.stream
        if self.only == "decode":
            self.first[r] = now
            if self.out[r] <= 1:
                self.finish_request(None, r, now)
                return
            lane = self.home.get(conv) or self.pick(self.front, lambda ln: (ln.b + len(ln.waiting), ln.kv[0]))
        else:
            lane = self.home.get(conv) or self.pick(self.front, lambda ln: (ln.pending, ln.b))
            lane.pending += self.inp[r] - self.cached[r]
        if st.next_turn[r] >= 0:
            self.home[conv] = lane
        else:
            self.home.pop(conv, None)
        self.arrive(lane, r, now)

    def arrive(self, lane: _Lane, r: int, now: float) -> None:
        lane.waiting.append(r)
        if lane.state == _IDLE:
            self.start(lane, now)
        elif lane.state == _SEG:
            self.interrupt(lane, now)

    # -- batching --------------------------------------------------------------------------------------

    def admit(self, lane: _Lane) -> None:
        """FCFS admission while the batch has room and the KV room holds the request's whole context
        (a prefill lane: its prompt, held until its KV cache has left)."""
        w, kv, inp, out = lane.waiting, lane.kv, self.inp, self.out
        cap = self.plan.max_batch
        if lane.role == _DECODE:
            while w and lane.b < cap and kv[0] + inp[w[0]] + out[w[0]] <= kv[1]:
                r = w.popleft()
                kv[0] += inp[r] + out[r]
                heapq.heappush(lane.heap, (lane.steps + out[r] - 1, r))
                lane.b += 1
                lane.ctx += inp[r] + 1
            return
        both = lane.role == _BOTH
        while w and (not both or len(lane.pre) + lane.b < cap) and \
                kv[0] + inp[w[0]] + (out[w[0]] if both else 0) <= kv[1]:
            r = w.popleft()
            kv[0] += inp[r] + (out[r] if both else 0)
            lane.pre.append([r, inp[r] - self.cached[r]])

    # -- iterations ------------------------------------------------------------------------------------

    def start(self, lane: _Lane, now: float) -> None:
        """Plan the lane's next iteration or run of iterations from ``now``: a run of decode steps to the next
        request's finish, a run of full prompt chunks (with the decode batch) to the end of the prompt's full
        chunks or the next finish, or one mixed iteration."""
        self.admit(lane)
        lane.version += 1
        budget = max(1, self.plan.chunk - lane.b)
        if lane.pre and lane.pre[0][1] < 2 * budget:        # the first prompt takes the whole budget otherwise
            self.mixed(lane, now, budget)
        elif lane.pre or lane.b:
            self.plan_run(lane, now, budget)
        else:
            lane.state = _IDLE

    def mixed(self, lane: _Lane, now: float, budget: int) -> None:
        """One iteration: the decode batch plus prompt chunks up to the token budget, FCFS."""
        pieces, tokens, attn, inp = [], 0, 0.0, self.inp
        for entry in lane.pre:
            if budget <= 0:
                break
            r, todo = entry
            c = todo if todo < budget else budget
            done = inp[r] - todo                 # tokens of the context already in the cache
            attn += lane.dm.prefill_attention(c * done + c * (c + 1) / 2, inp[r], lane.par)
            pieces.append((entry, c))
            tokens += c
            budget -= c
        b = lane.b
        tau = lane.gemm(b + tokens, tokens) + attn + (lane.kv_per_token(b, lane.ctx / b) * lane.ctx if b else 0.0)
        lane.pieces, lane.state, lane.t0, lane.seg_k = pieces, _MIXED, now, 1
        lane.seg_a, lane.seg_q = tau, 0.0
        self.push(now + tau, _END, lane, lane.version)

    def plan_run(self, lane: _Lane, now: float, budget: int) -> None:
        """k iterations that differ only linearly (the decode context grows by b per step; a prompt's chunk
        attends to c more cached tokens each time): step i takes a + 2 q i, k steps k a + q k (k - 1)."""
        b, k = lane.b, math.inf
        a = 0.0
        q2 = 0.0                                 # growth of a step's time per step (2 q)
        if b:
            kappa = lane.kv_per_token(b, lane.ctx / b)
            a += kappa * lane.ctx
            q2 += kappa * b
            k = lane.heap[0][0] - lane.steps     # steps until the next request finishes
        if lane.pre:
            entry = lane.pre[0]
            r, todo = entry
            c = budget
            k = min(k, todo // c - 1)            # full chunks, leaving the last (partial) one to a mixed iteration
            done = self.inp[r] - todo
            unit = lane.dm.prefill_attention(1.0, self.inp[r], lane.par)
            a += lane.gemm(b + c, c) + unit * (c * done + c * (c + 1) / 2)
            q2 += unit * c * c
            lane.pieces = [(entry, c)]
        else:
            a += lane.gemm(b, 0)
            lane.pieces = []
        k = max(1, int(k))
        lane.seg_a, lane.seg_q, lane.seg_k, lane.t0, lane.state = a, q2 / 2, k, now, _SEG
        self.push(now + k * a + q2 / 2 * k * (k - 1), _END, lane, lane.version)

    def interrupt(self, lane: _Lane, now: float) -> None:
        """A request arrived at a lane in a run: end the run at the first step boundary at or after ``now``
        so that the next iteration can take it."""
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
        self.push(lane.t0 + k * a + q * k * (k - 1), _END, lane, lane.version)

    def on_end(self, lane: _Lane, now: float) -> None:
        """A lane's iteration or run of k iterations ended: decode tokens generated, chunks done, prompts that
        completed start decoding (aggregated) or send their KV cache (disaggregated)."""
        k, b = lane.seg_k, lane.b
        lane.busy += k * lane.seg_a + lane.seg_q * k * (k - 1)
        if b:
            self.account(lane, b, lane.t0, now, k)
            lane.steps += k
            lane.ctx += b * k
            self.finish_due(lane, now)
        for entry, c in lane.pieces:
            entry[1] -= c * k
            lane.pending -= c * k
            if entry[1] == 0:
                lane.pre.remove(entry)
                self.prompt_done(lane, entry[0], now)
        lane.pieces = []
        lane.state = _IDLE
        self.start(lane, now)

    def prompt_done(self, lane: _Lane, r: int, now: float) -> None:
        if lane.role == _PREFILL:
            self.transfer(lane, r, now)
            return
        self.first[r] = now
        if self.out[r] <= 1:
            self.finish_request(lane, r, now)
            return
        heapq.heappush(lane.heap, (lane.steps + self.out[r] - 1, r))
        lane.b += 1
        lane.ctx += self.inp[r] + 1

    def finish_due(self, lane: _Lane, now: float) -> None:
        heap, inp, out = lane.heap, self.inp, self.out
        while heap and heap[0][0] <= lane.steps:
            _, r = heapq.heappop(heap)
            lane.b -= 1
            lane.ctx -= inp[r] + out[r]
            self.finish_request(lane, r, now)

    # -- KV transfers ----------------------------------------------------------------------------------

    def transfer(self, lane: _Lane, r: int, now: float) -> None:
        """The prompt's KV cache over the link, FIFO per prefill lane."""
        x_time = self.inp[r] * lane.dm.kv_per_token / self.plan.link_bandwidth + self.plan.link_latency
        begin = now if now > lane.link_free else lane.link_free
        lane.link_free = begin + x_time
        self.push(lane.link_free, _KV, (r, lane))

    def on_kv(self, r: int, src: _Lane, now: float) -> None:
        """The KV cache arrived at the decode pool: the prefill lane's room is freed, the request decodes."""
        src.kv[0] -= self.inp[r]
        for ln in (src, *src.siblings):
            if ln.state == _IDLE and ln.waiting:
                self.start(ln, now)
        self.first[r] = now
        if self.out[r] <= 1 or self.only == "prefill":
            self.finish_request(None, r, now, ttft_only=self.only == "prefill")
            return
        conv = self.stream.first_of[r]
        lane = self.home_back.get(conv) or self.pick(self.back, lambda ln: (ln.b + len(ln.waiting), ln.kv[0]))
        if self.stream.next_turn[r] >= 0:
            self.home_back[conv] = lane
        else:
            self.home_back.pop(conv, None)
        self.arrive(lane, r, now)

    # -- metrics ---------------------------------------------------------------------------------------

    def finish_request(self, lane: _Lane | None, r: int, now: float, ttft_only: bool = False) -> None:
        """The request's last token at ``now``: its KV room on ``lane`` is freed (None: it held none); the SLO
        judged; the conversation's next turn scheduled."""
        self.finish[r] = now
        if lane is not None:
            lane.kv[0] -= self.inp[r] + self.out[r]
            for sib in lane.siblings:       # room freed for the instance's other lanes
                if sib.state == _IDLE and sib.waiting:
                    self.start(sib, now)
        if self.measured[r]:
            o = self.out[r]
            tp = (now - self.first[r]) / (o - 1) if o > 1 and not ttft_only else 0.0
            if self.first[r] - self.arrival[r] > self.slo.ttft or tp > self.slo.tpot:
                self.misses += 1
                if self.misses > self.allowed:
                    self.stopped = True
        nt = self.stream.next_turn[r]
        if nt >= 0:
            self.arrival[nt] = now + self.stream.think[nt]
            self.push(self.arrival[nt], _ARRIVE, nt)

    def account(self, lane: _Lane, b: int, t0: float, t1: float, k: int) -> None:
        """The decode batch over the measured window (Little's law), and the run's step times as per-token
        inter-token latencies (the first, middle and last step of a run, each for a third of its tokens)."""
        if lane.role == _PREFILL:
            return
        lo, hi = (t0 if t0 > self.win_lo else self.win_lo), (t1 if t1 < self.win_hi else self.win_hi)
        if hi > lo:
            self.batch_area += b * (hi - lo)
            a, q = lane.seg_a, lane.seg_q
            for i in {0, (k - 1) // 2, k - 1}:
                self.itl.append((a + 2 * q * i, b * k / len({0, (k - 1) // 2, k - 1})))

    def run(self) -> None:
        events, pop = self.events, heapq.heappop
        while events and not self.stopped:
            now, kind, _, x, version = pop(events)
            if kind == _ARRIVE:
                self.on_arrival(x, now)
            elif kind == _KV:
                self.on_kv(x[0], x[1], now)
            elif version == x.version:
                self.last = now
                self.on_end(x, now)

    def result(self) -> SimResult:
        import numpy as np

        arrival, first, finish, out, only = self.arrival, self.first, self.finish, self.out, self.only
        start_t = min((a for a in arrival if a == a), default=0.0)
        span = max(self.last, max((f for f in finish if f == f), default=0.0)) - start_t
        idx = [r for r in range(self.n) if self.measured[r]]
        ttft = np.array([first[r] - arrival[r] if first[r] == first[r] else math.inf for r in idx])
        tpot = np.array([((finish[r] - first[r]) / (out[r] - 1) if out[r] > 1 and only != "prefill" else 0.0)
                         if finish[r] == finish[r] else math.inf for r in idx])
        e2e = np.array([finish[r] - arrival[r] if finish[r] == finish[r] else math.inf for r in idx])
        ok = (ttft <= self.slo.ttft) & (tpot <= self.slo.tpot)
        dec_lanes = self.back if self.disagg and only is None else self.front
        window = self.win_hi - self.win_lo
        mean_batch = self.batch_area / window / len(dec_lanes) if dec_lanes and window > 0 else 0.0
        drift = _drift(ttft)
        return SimResult(ttft=ttft, tpot=tpot, e2e=e2e, slo=self.slo,
                         attainment=float(ok.mean()) if len(idx) else 0.0, requests=self.n, measured=len(idx),
                         rate=self.rate, span=span,
                         output_tokens=int(sum(out[r] for r in idx if finish[r] == finish[r])),
                         utilization=self.utilization(span), mean_batch=mean_batch, stopped=self.stopped,
                         source=self.stream.source, index=idx, itl=_itl(self.itl, self.plan.jitter),
                         steady=drift <= STEADY_DRIFT and not self.stopped, drift=drift)

    def utilization(self, span: float) -> dict[str, float]:
        pools = {None: (("prefill", self.front), ("decode", self.back)) if self.disagg else (("both", self.front),),
                 "prefill": (("prefill", self.front),), "decode": (("decode", self.front),)}[self.only]
        return {name: min(1.0, sum(ln.busy for ln in pool) / (len(pool) * span))
                for name, pool in pools if pool and span > 0}


def _drift(ttft) -> float:
    """Mean TTFT of the last third of the measured requests (by arrival) over the first third's: a queue that
    is still growing shows as a ratio well above 1."""
    import numpy as np

    finite = ttft[np.isfinite(ttft)] if len(ttft) else ttft
    if len(ttft) < 30 or len(finite) < len(ttft):
        return math.inf if len(finite) < len(ttft) else 1.0
    third = len(ttft) // 3
    early, late = float(ttft[:third].mean()), float(ttft[-third:].mean())
    return late / early if early > 0 else 1.0


def _itl(points: list[tuple[float, float]], jitter: float):
    """The per-token step times as (seconds, weight) arrays; with a step-time jitter (coefficient of variation
    from the measured spread) each point is spread over +-1.28 CV (the 10th and 90th percentiles of a normal)."""
    import numpy as np

    if not points:
        return (np.zeros(0), np.zeros(0))
    t = np.array([p[0] for p in points])
    w = np.array([p[1] for p in points])
    if jitter > 0:
        t = np.concatenate([t * (1 - 1.28 * jitter), t, t * (1 + 1.28 * jitter)])
        w = np.concatenate([w * 0.25, w * 0.5, w * 0.25])
    return (t, w)


def _weighted_percentile(itl, q: float) -> float:
    import numpy as np

    if itl is None or not len(itl[0]):
        return math.inf
    t, w = itl
    order = np.argsort(t)
    cum = np.cumsum(w[order])
    return float(t[order][min(len(t) - 1, int(np.searchsorted(cum, q / 100 * cum[-1])))])


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
