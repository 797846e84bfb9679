"""The parent's clock against the worker's samples: every reported figure is bounded by what the parent saw.

For each batch the judge knows its own wall time ``W`` (request sent to reply read, on CLOCK_MONOTONIC) and
the worker reports the batch's window and per-call samples. Checked for every backend (:func:`check_clock`):

* the window lies inside the parent's interval; on a host clock each call's stamps lie inside the window,
  in order, and each sample fits its stamps; on a device clock the samples add up to no more than the window;
* so no reported sample, and no sum of them, can exceed what the parent measured. Failing this is evidence a
  busy machine cannot produce (a stamp outside the interval the parent saw the request take): "forged".

For an untrusted kernel the worker is assumed compromised, so its samples cannot be believed when they are
*short* either. Its time is the parent's (:class:`Accounting`): for each timed batch,

    credited = max(sum(worker samples), W - H(n))

where ``H(n)`` is the harness's own cost of a batch of ``n`` calls, measured by a **harness twin** (a worker of
the same setup that has never run candidate code, running the same loop with an empty call, while the
candidate's worker is stopped: kbench.judge.judge) as its parent time less its own samples, the *smallest* such
figure at that size in the record (so a moment of load on the twin can only make the kernel look slower). The
record keeps each batch's mean ``credited / n`` as the sample of each of its calls (``timing.samples_kind``
"parent"): a per-call spread from a compromised worker could put a batch's time on one call and lower the
median; the worker's samples only ever raise a batch's figure (when they add up to more than ``W - H(n)``).
Nothing here fails a record: time the machine stole is noise, never a verdict (``noisy`` flags a record whose
parent time exceeded its worker's samples by more than :data:`NOISY_SHARE`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kbench.judge.verify import CheckFailed

#: a twin measurement of the harness is taken after each of the first TWIN_FIRST timed batches of a size, then
#: after every TWIN_EVERY-th (H(n) is the smallest seen: more measurements can only lower it)
TWIN_FIRST = 3
TWIN_EVERY = 4
#: a record whose credited time exceeds its worker's samples by more than this share is flagged ``noisy``
NOISY_SHARE = 0.05
#: a sample may exceed its stamps by this much (clock granularity, a device's events vs the host's marks)
STAMP_SLACK = 1e-4


def check_clock(kind: str, samples: list[float], window: tuple[int, int], stamps: list[tuple[int, int]] | None,
                sent: int, received: int, host_clock: bool) -> None:
    """Raise CheckFailed unless the batch's times fit inside the parent's own interval (module doc)."""
    begin, end = window
    if not sent <= begin <= end <= received:
        raise CheckFailed(f"samples do not add up: a {kind} batch claims to run outside the parent's clock "
                          f"window (timers patched or samples forged)")
    span = (end - begin) * 1e-9
    if host_clock:
        if stamps is None:
            raise CheckFailed(f"samples do not add up: a {kind} batch on a host clock came without stamps")
        last = begin
        for i, (t, (a, b)) in enumerate(zip(samples, stamps)):
            if not last <= a <= b <= end:
                raise CheckFailed(f"samples do not add up: call {i + 1} of a {kind} batch claims to run outside "
                                  f"the batch's window on the parent's clock (timers patched or samples forged)")
            if t > (b - a) * 1e-9 + STAMP_SLACK:
                raise CheckFailed(f"samples do not add up: call {i + 1} of a {kind} batch reports {t:.3g} s in "
                                  f"{(b - a) * 1e-9:.3g} s of its own stamps")
            last = b
    elif sum(samples) > span + STAMP_SLACK * max(len(samples), 1):
        raise CheckFailed(f"samples do not add up: a {kind} batch reports {sum(samples):.3g} s of samples in a "
                          f"window of {span:.3g} s")


@dataclass
class Accounting:
    """The parent's figures of one record's timed batches (``timing.accounting`` in the record)."""

    parent_clock: bool                              # untrusted: samples derived from the parent's clock
    #: (calls, parent s, worker's samples s, credited s, harness cost subtracted s)
    timed: list[tuple[int, float, float, float, float]] = field(default_factory=list)
    harness: list[tuple[int, float]] = field(default_factory=list)              # (calls, twin's harness cost s)
    twin: bool = False                              # a harness twin measured H(n) (else H = 0: the parent's W)
    forward_seconds: float = 0.0                    # untimed forwards of split cases, parent-measured

    def harness_cost(self, calls: int) -> float:
        """H(calls): the twin's smallest harness cost at that size; else the largest measured size below it
        (a smaller loop costs no more), else the smallest above scaled down by calls/size (its fixed part then
        counts less than once). Never above what the harness costs: an overestimate would hide kernel work."""
        if not self.harness:
            return 0.0
        same = [h for n, h in self.harness if n == calls]
        if same:
            return max(0.0, min(same))
        below = [n for n, _ in self.harness if n < calls]
        if below:
            size = max(below)
            return max(0.0, min(h for n, h in self.harness if n == size))
        size = min(n for n, _ in self.harness)
        return max(0.0, min(h for n, h in self.harness if n == size) * calls / size)

    def credit(self, calls: int, wall: float, samples: list[float]) -> list[float]:
        """A timed batch's samples as the record keeps them: for a kernel judged on the parent's clock, the batch's
        mean, ``max(sum(samples), wall - H(calls)) / calls``, once per call (a per-call spread reported by a
        compromised worker could put a batch's whole time on one call and lower the median; a mean it cannot
        lower: asv's and do_bench's samples are such means); otherwise the worker's samples as reported."""
        worker = float(sum(samples))
        credited = worker
        out = list(samples)
        harness = self.harness_cost(calls) if self.parent_clock else 0.0
        if self.parent_clock:
            credited = max(worker, wall - harness)
            out = [credited / max(len(samples), 1)] * len(samples)
        self.timed.append((calls, wall, worker, credited, harness))
        return out

    def batch_means(self) -> list[float]:
        """One figure per timed batch (credited seconds per call): the noise of a record judged on the parent's
        clock is the spread of these, not of the repeated means."""
        return [t[3] / max(t[0], 1) for t in self.timed]

    def summary(self) -> dict[str, Any]:
        walls = sum(t[1] for t in self.timed)
        worker = sum(t[2] for t in self.timed)
        credited = sum(t[3] for t in self.timed)
        out: dict[str, Any] = {"parent_seconds": walls, "sample_seconds": credited,
                               "explained": credited / walls if walls > 0 else 1.0,
                               "batches": len(self.timed), "calls_per_batch": max((t[0] for t in self.timed),
                                                                                  default=0)}
        if self.forward_seconds:
            out["untimed_forward_seconds"] = self.forward_seconds
        if self.parent_clock:
            out.update(worker_sample_seconds=worker, raised_seconds=credited - worker,
                       raised_batches=sum(t[3] > t[2] + 1e-12 for t in self.timed),
                       harness_seconds=sum(t[4] for t in self.timed),
                       twin_seconds=sum(h for _, h in self.harness), twin_batches=len(self.harness),
                       harness_twin=self.twin,
                       noisy=bool(worker > 0 and credited > worker * (1 + NOISY_SHARE)))
        return out
