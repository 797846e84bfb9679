"""Adaptive sampling: the harness times, backends never do.

Like nvbench's cold measurement: warm-up first, then one sample at a time with the device's
``before_sample`` (cache flush) outside the timed region, rotating input buffers, and a stop rule
on the relative standard error of the mean after a minimum time and sample count, bounded by a
time limit. Every sample and the stop reason are kept.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Callable, Mapping, Sequence

from kbench.devices import Device
from kbench.stats import rel_standard_error


#: How kbench makes a time, as a number that changes when a change to kbench moves the times it reports for the
#: same kernel on the same machine (a new ruler, not a faster or slower kernel). Result files record it
#: (``environment.measuring_method``); a history keeps the runs of each method apart (kbench.history), so an
#: upgrade of kbench is never reported as a regression of the kernels. 1: each call timed in the backend's own
#: process (to 2026-11-30); 2: the parent judges: inputs drawn from a per-run secret, batches of calls timed on
#: the parent's clock and checked against the worker's samples (result files with ``input_secrets``); 3: an
#: untrusted kernel's samples derived from the parent's clock less a harness twin's cost (``timing.samples_kind``
#: "parent"), its worker stopped between batches.
MEASURING_METHOD = 3


@dataclass(frozen=True)
class TimingSettings:
    warmup_calls: int = 1          # at least this many untimed calls
    warmup_time: float = 0.05      # and at least this long (s) of untimed calls
    min_samples: int = 10
    max_samples: int = 100_000
    min_time: float = 0.2          # seconds of samples before the noise target may stop sampling
    max_time: float = 3.0          # stop sampling after this long (s), whatever the noise
    target_rel_se: float = 0.005   # stop when stderr(mean)/mean falls below this
    rotate: int = 3                # accepted and ignored: every timed call gets inputs generated just before it
    energy_seconds: float = 0.0    # after the samples, a sustained loop this long for energy and clocks (0: none)
    #: a record's samples are taken in this many rounds spread over the run (kbench.run.rounds): a slow moment
    #: of the machine then meets one round of a record, not all of its samples
    rounds: int = 1

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None, base: TimingSettings | None = None) -> TimingSettings:
        values = asdict(base or cls())
        names = {f.name for f in fields(cls)}
        values.update({k: v for k, v in (data or {}).items() if k in names})
        for k, v in values.items():  # JSON Schema's integers include 2.0: counts are ints here (range(), [:n])
            if isinstance(cls.__dataclass_fields__[k].default, int) and isinstance(v, float) and v.is_integer():
                values[k] = int(v)
        return cls(**values)

    def per_round(self) -> TimingSettings:
        """What one round of ``rounds`` runs: the sampling budget shared out (``min_time``, ``max_time``,
        ``min_samples``, ``max_samples`` and the warm-up time divided; the noise target of one round is
        sqrt(rounds) looser, so that the rounds pooled meet ``target_rel_se``). One round: these settings."""
        r = self.rounds
        if r <= 1:
            return self
        return replace(self, warmup_time=self.warmup_time / r, min_samples=max(2, math.ceil(self.min_samples / r)),
                       max_samples=max(2, math.ceil(self.max_samples / r)), min_time=self.min_time / r,
                       max_time=self.max_time / r, target_rel_se=min(1.0, self.target_rel_se * math.sqrt(r)),
                       rounds=1)


@dataclass
class Timing:
    samples: list[float]
    stop_reason: str               # noise_target | time_limit | max_samples
    warmup_calls: int
    warmup_time: float
    sampling_time: float           # wall time of the sampling loop, overhead included
    below_min_samples: bool = False  # stopped at the hard time limit before reaching min_samples

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        if not self.below_min_samples:
            out.pop("below_min_samples")
        return out


def measure(device: Device, calls: Sequence[Callable[[], Any]], settings: TimingSettings,
            on_sample: Callable[[int, float], None] | None = None) -> Timing:
    """Time ``calls`` (one per rotating input set) until the stop rule says enough."""
    clock = time.perf_counter
    start = clock()
    n_warm = 0
    while n_warm < max(settings.warmup_calls, 1) or clock() - start < settings.warmup_time:
        calls[n_warm % len(calls)]()
        device.synchronize()
        n_warm += 1
    warm_time = clock() - start

    samples: list[float] = []
    begin = clock()
    spent = 0.0
    reason = "max_samples"
    while len(samples) < settings.max_samples:
        device.before_sample()
        t = device.time_call(calls[len(samples) % len(calls)])
        samples.append(t)
        spent += t
        elapsed = clock() - begin
        if on_sample is not None:
            on_sample(len(samples), t)
        if len(samples) >= settings.min_samples and spent >= settings.min_time:
            if rel_standard_error(samples) < settings.target_rel_se:
                reason = "noise_target"
                break
        if elapsed >= settings.max_time and len(samples) >= 2:
            reason = "time_limit"
            break
    return Timing(samples, reason, n_warm, warm_time, clock() - begin)


def estimated_seconds(settings: TimingSettings) -> float:
    return settings.warmup_time + settings.max_time if math.isfinite(settings.max_time) else math.inf
