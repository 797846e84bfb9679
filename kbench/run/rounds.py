"""Rounds: a record's samples taken in several passes spread over the run, then pooled.

Why: on a shared machine a slow moment (another process, the scheduler, a frequency step) lasting a few tens of
milliseconds covers every sample of a small record, and a comparison of two runs of the same code then calls that
record slower. Split into ``rounds`` passes over a block of records (each pass with its share of the sampling
budget, :meth:`kbench.timing.TimingSettings.per_round`), a record meets a slow moment in one round, not all of
them, and the pooled median stays where the other rounds put it. asv measures in rounds for the same reason, and
Google Benchmark's random interleaving of repetitions is the same idea.

Each round is an ordinary job: worker, correctness trials, warm-up, timed batches, and for an untrusted kernel
every timed call checked and the clock accounted, so a round is judged as any record is. The runner asks for the
rounds of a block of records one pass after another (:func:`round_order`) and, once a record's rounds are back,
writes the one record :func:`merge_rounds` makes of them: the samples pooled, each round with the same weight
(:func:`equal_shares`), statistics and rates from the pool, each round's size, share, median and accounting under
``timing.rounds``. A round that does not pass is the record (its
failure is not averaged away); a record whose first round does not pass gets no other round.
"""
from __future__ import annotations

from typing import Any, Sequence

#: records measured round by round together: a round of one is as far from the next round of it as this many
#: records' rounds take (a few seconds on the smoke suite), while a record still comes out of every block
BLOCK = 32

#: accounting figures (kbench.judge.accounting) that add up over rounds
_ADDITIVE = ("parent_seconds", "sample_seconds", "batches", "untimed_forward_seconds", "empty_seconds",
             "empty_batches", "audit_batches", "unexplained_seconds", "allowed_seconds", "accounted_batches",
             "judged_seconds", "worker_sample_seconds", "raised_seconds", "raised_batches", "harness_seconds",
             "twin_seconds", "twin_batches")


def rounds_of(run: Any) -> int:
    """The rounds each record of a result was measured in (``selection.rounds``): 1 for runs made before rounds."""
    rounds = (run.get("selection") or {}).get("rounds")
    return rounds if isinstance(rounds, int) and not isinstance(rounds, bool) and rounds >= 1 else 1


def round_order(units: int, rounds: int, block: int = BLOCK) -> list[tuple[int, int]]:
    """The jobs of ``units`` records in ``rounds`` rounds, as (record index, round number from 1): block by
    block, in each block every record's round 1, then every record's round 2, ..."""
    if rounds <= 1:
        return [(u, 1) for u in range(units)]
    block = max(1, block)
    order = []
    for start in range(0, units, block):
        stop = min(units, start + block)
        order += [(u, k) for k in range(1, rounds + 1) for u in range(start, stop)]
    return order


def _sum_accounting(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    out = dict(parts[0])
    for key in _ADDITIVE:
        values = [p[key] for p in parts if isinstance(p.get(key), (int, float))]
        if values:
            out[key] = sum(values)
    for key, pooled in (("noisy", any), ("harness_twin", all)):  # flags: noisy in any round; a twin in every one
        flags = [p[key] for p in parts if isinstance(p.get(key), bool)]
        if flags:
            out[key] = pooled(flags)
    cpb = [p.get("calls_per_batch") for p in parts if isinstance(p.get("calls_per_batch"), int)]
    if cpb:
        out["calls_per_batch"] = max(cpb)
    if isinstance(out.get("parent_seconds"), (int, float)) and out["parent_seconds"] > 0:
        out["explained"] = out.get("sample_seconds", 0.0) / out["parent_seconds"]
    phases: dict[str, float] = {}
    for p in parts:
        for name, seconds in (p.get("phases") or {}).items():
            if isinstance(seconds, (int, float)):
                phases[name] = round(phases.get(name, 0.0) + seconds, 6)
    if phases:
        out["phases"] = phases
    return out


def equal_shares(rounds: Sequence[Sequence[float]]) -> list[list[float]]:
    """Each round's samples for the pool: as many from every round as the smallest round has, taken evenly over
    the round (its first and last among them). A round is one draw of the machine's state and its samples are
    alike, so every round weighs the same: a round in a slow, noisy moment keeps sampling until its time is up
    (up to ten times a quiet round's samples on the smoke suite) and, pooled whole, would outweigh the quiet
    ones and carry the median with it. Rounds without samples take no share."""
    sizes = [len(r) for r in rounds if len(r)]
    if not sizes:
        return [list(r) for r in rounds]
    k = min(sizes)
    out = []
    for r in rounds:
        n = len(r)
        if n <= k:
            out.append(list(r))
            continue
        # k indices spread evenly from 0 to n - 1, all different (k <= n)
        out.append([r[(i * (n - 1)) // (k - 1)] for i in range(k)] if k > 1 else [r[n // 2]])
    return out


def merge_rounds(parts: Sequence[dict[str, Any]], planned_rounds: int, *, hardware=None, op=None,
                 case=None) -> dict[str, Any]:
    """One record of a record's rounds (in round order). ``hardware``, ``op`` and ``case`` give the rates again
    from the pooled median (kbench.roofline.point); without them the first round's rates stay."""
    if planned_rounds <= 1 and len(parts) == 1:
        return parts[0]
    for k, part in enumerate(parts, 1):
        if part.get("status") != "passed":
            if k == 1:
                return part
            out = dict(part)
            out["reason"] = f"round {k} of {planned_rounds}: {part.get('reason') or part.get('status')}"
            return out
    from kbench.stats import summarize

    first = parts[0]
    timings = [p.get("timing") or {} for p in parts]
    taken = [list(t.get("samples") or []) for t in timings]
    shares = equal_shares(taken)
    samples = [s for share in shares for s in share]
    out = dict(first)
    timing = dict(timings[0])
    timing.update(
        samples=samples,
        stop_reason=timings[-1].get("stop_reason", timing.get("stop_reason")),
        warmup_calls=sum(int(t.get("warmup_calls") or 0) for t in timings),
        warmup_time=sum(float(t.get("warmup_time") or 0.0) for t in timings),
        sampling_time=sum(float(t.get("sampling_time") or 0.0) for t in timings),
        rounds=[{"samples": len(got), "pooled": len(share),
                 "median": (p.get("stats") or {}).get("median"),
                 "stop_reason": t.get("stop_reason"), "started": p.get("started"),
                 "accounting": t.get("accounting"),
                 **({"input_nonce": (p.get("integrity") or {})["input_nonce"]}
                    if "input_nonce" in (p.get("integrity") or {}) else {})}
                for p, t, got, share in zip(parts, timings, taken, shares)],
        rounds_planned=planned_rounds,
    )
    accountings = [t["accounting"] for t in timings if isinstance(t.get("accounting"), dict)]
    if accountings:
        timing["accounting"] = _sum_accounting(accountings)
    if any(t.get("below_min_samples") for t in timings):
        timing["below_min_samples"] = True
    else:
        timing.pop("below_min_samples", None)
    out["timing"] = timing
    out["stats"] = summarize(samples)
    correctness = [p.get("correctness") for p in parts if isinstance(p.get("correctness"), dict)]
    if correctness:  # the worst round's trials, and every round's error
        worst = max(correctness, key=lambda c: c.get("rel_l2") or 0.0)
        out["correctness"] = {**worst, "rounds_rel_l2": [c.get("rel_l2") for c in correctness]}
    if op is not None and case is not None and out["stats"]:
        from kbench.roofline.point import roofline_point

        metrics = roofline_point(hardware, str(case.dtype), op.flops(case), op.min_bytes(case),
                                 out["stats"]["median"])
        metrics["footprint"] = (first.get("metrics") or {}).get("footprint", op.footprint(case))
        out["metrics"] = metrics
    if parts[-1].get("telemetry") is not None:
        out["telemetry"] = parts[-1]["telemetry"]
    return out
