"""The parent's clock against the worker's samples: every reported figure is bounded by what the parent saw.

For each batch the judge knows its own wall time ``W`` (request sent to reply read, on CLOCK_MONOTONIC) and
the worker reports the batch's window and per-call samples. Checked for every backend:

* the window lies inside the parent's interval; on a host clock each call's stamps lie inside the window,
  in order, and each sample fits its stamps; on a device clock the samples add up to no more than the window;
* so no reported sample, and no sum of them, can exceed what the parent measured.

And, for untrusted kernels, the other direction: samples cannot be reported *shorter* than they were. The
same loop is run with an empty call (the inputs still generated, the outputs still poisoned, shadowed and
scanned, the cache still flushed) before, after and every :data:`EMPTY_EVERY` timed batches; its parent wall
time ``E(n)`` for
``n`` calls is what the loop costs without a kernel. A record's samples add up when, over its timed batches,

    sum(W - sum(samples)) <= sum(LOAD_FACTOR * E(n)) + JITTER_FRACTION * sum(W) + ACCOUNTING_FLOOR

(summed, so a burst of machine load that hits one or two batches is diluted in the whole, while a forger who
shortens every sample fails however its batches fall), after up to :data:`AUDIT_PAIRS` extra empty/timed pairs
when it does not. ``E(n)`` is measured at the same ``n`` (it holds the round trip once: the floor is per record,
not per batch), and an untrusted kernel's ``n`` comes from the parent's clock (kbench.judge.judge), so a kernel
cannot buy one-call batches, each with a round trip to hide in. So a kernel can under-report by at most
``(LOAD_FACTOR - 1) * E(n)`` per batch on average plus ``JITTER_FRACTION`` of its batches' time and
``ACCOUNTING_FLOOR`` per record (docs/integrity.md
states the bound).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kbench.judge.verify import CheckFailed

#: how much machine load may inflate the empty loop's cost before time counts as unexplained (2: an honest
#: kernel on a 2-core machine running two other measuring processes stays inside; see docs/integrity.md)
LOAD_FACTOR = 2.0
#: an empty batch is measured again after this many timed batches, so the loop's cost follows the load (4: the
#: allowance has no per-batch floor since issue 33, so the loop's cost must follow the load closely; an empty
#: batch costs a few percent of a timed one)
EMPTY_EVERY = 4
#: unexplained time (s) per record always allowed, once (not per batch): scheduling jitter that the empty
#: batches, measured at other moments, did not see
ACCOUNTING_FLOOR = 0.005
#: share of the timed batches' parent time always allowed unexplained: the scheduler's preemptions of the worker
#: grow with the time a batch is exposed to them (a 2-core machine running a test suite in two processes left an
#: honest kernel 9.8% of its parent time unexplained over 9 batches against 2x its empty loop). A forger hides at
#: most this share more; the 5x under-reporting of the red team's clock attacks is far beyond it
JITTER_FRACTION = 0.05
#: extra empty/timed batch pairs measured before samples that do not add up fail a record
AUDIT_PAIRS = 4
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
    """The parent's figures of one record's timed and empty batches (``timing.accounting`` in the record)."""

    enforce: bool                                   # untrusted: samples must explain the parent's time
    timed: list[tuple[int, float, float]] = field(default_factory=list)    # (calls, parent s, samples s)
    empty: list[tuple[int, float]] = field(default_factory=list)           # (calls, parent s)
    forward_seconds: float = 0.0                    # untimed forwards of split cases, parent-measured
    audits: int = 0

    def loop_cost(self, calls: int) -> float | None:
        """The empty loop's parent time for ``calls`` calls: the most expensive measurement at that size; else
        the smallest measured size above it (the loop only grows with its calls), else the largest below it
        scaled up (its round trip is then counted more than once: generous, never short)."""
        if not self.empty:
            return None
        same = [wall for n, wall in self.empty if n == calls]
        if same:
            return max(same)
        above = [n for n, _ in self.empty if n > calls]
        if above:
            size = min(above)
            return max(wall for n, wall in self.empty if n == size)
        size = max(n for n, _ in self.empty)
        return max(wall for n, wall in self.empty if n == size) * calls / max(size, 1)

    def adds_up(self, calls: int, wall: float, sampled: float) -> bool:
        cost = self.loop_cost(calls)
        if cost is None:
            return True
        return wall - sampled <= LOAD_FACTOR * cost

    def unexplained(self) -> tuple[float, float]:
        """(the parent's time the samples leave unexplained, what the empty loop and the floor allow), summed."""
        gap = sum(wall - sampled for _, wall, sampled in self.timed)
        allowed = (sum(LOAD_FACTOR * (self.loop_cost(n) or 0.0) for n, _, _ in self.timed) + ACCOUNTING_FLOOR
                   + JITTER_FRACTION * sum(wall for _, wall, _ in self.timed))
        return gap, allowed

    def accounted(self) -> bool:
        if not self.enforce or not self.timed or not self.empty:
            return True
        gap, allowed = self.unexplained()
        return gap <= allowed

    def summary(self) -> dict[str, Any]:
        walls = sum(w for _, w, _ in self.timed)
        sampled = sum(s for _, _, s in self.timed)
        out: dict[str, Any] = {"parent_seconds": walls, "sample_seconds": sampled,
                               "explained": sampled / walls if walls > 0 else 1.0,
                               "batches": len(self.timed), "calls_per_batch": max((n for n, _, _ in self.timed),
                                                                                  default=0)}
        if self.forward_seconds:
            out["untimed_forward_seconds"] = self.forward_seconds
        if self.empty:
            gap, allowed = self.unexplained()
            out.update(empty_seconds=sum(w for _, w in self.empty), empty_batches=len(self.empty),
                       audit_batches=self.audits, unexplained_seconds=gap, allowed_seconds=allowed,
                       accounted_batches=sum(self.adds_up(*b) for b in self.timed))
        return out

    def verdict(self) -> None:
        if self.accounted():
            return
        gap, allowed = self.unexplained()
        walls = sum(w for _, w, _ in self.timed)
        sampled = sum(s for _, _, s in self.timed)
        raise CheckFailed(f"samples do not add up: over {len(self.timed)} batches the worker's samples left "
                          f"{gap:.3g} s of the parent's time unexplained, more than the {allowed:.3g} s that "
                          f"{LOAD_FACTOR:g}x the same loop with an empty call, {JITTER_FRACTION:.0%} of the parent's "
                          f"time and {ACCOUNTING_FLOOR * 1e3:g} ms a record allow ({sampled:.3g} s of samples in "
                          f"{walls:.3g} s; empty loop "
                          f"{self.loop_cost(1) or 0:.3g} s per call): timers patched or samples forged")
