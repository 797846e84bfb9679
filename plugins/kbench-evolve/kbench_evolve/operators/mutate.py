"""``mutate``: the classical baseline. Perturbs the champion's declared TUNABLES; no model, offline.

Hill climbing on the choice lists: first every untried neighbour (one knob one step along its
``choices``), then two-step jumps, then random settings; each candidate goes through
``ctx.submit`` like any other, so it is committed only when the harness measures it faster.
"""
from __future__ import annotations

import itertools

from kbench_evolve import source as src
from kbench_evolve.operators import Operator


def neighbours(tunables: dict[str, dict], reach: int) -> list[dict]:
    """Settings that move one knob ``reach`` steps (either way) along its choices."""
    current = {k: spec["default"] for k, spec in tunables.items()}
    out = []
    for name, spec in tunables.items():
        choices = list(spec.get("choices") or [])
        if spec["default"] not in choices:
            continue
        i = choices.index(spec["default"])
        for j in (i - reach, i + reach):
            if 0 <= j < len(choices):
                out.append({**current, name: choices[j]})
    return out


class MutateOperator(Operator):
    name = "mutate"
    description = "perturb the kernel's declared TUNABLES (no LLM; the classical baseline)"

    def proposals(self, ctx, source: str) -> list[dict]:
        tun = src.tunables(source)
        rng = ctx.rng()
        first = neighbours(tun, 1)
        rng.shuffle(first)
        second = neighbours(tun, 2)
        rng.shuffle(second)
        grid = [dict(zip(tun, combo)) for combo in itertools.product(*(s.get("choices") or [s["default"]]
                                                                        for s in tun.values()))]
        rng.shuffle(grid)
        return first + second + grid

    def vary(self, ctx) -> str:
        champion = ctx.champion()
        source = champion.source
        if not src.tunables(source):
            return "exhausted: the champion declares no TUNABLES to mutate"
        current = {k: s["default"] for k, s in src.tunables(source).items()}
        tried = 0
        for settings in self.proposals(ctx, source):
            if settings == current:
                continue
            candidate = src.with_tunables(source, settings)
            if ctx.attempted(src.sha(candidate)):
                continue
            if ctx.steps_left() <= 0:  # before the step: a resumed variation may have spent them all already
                return f"no commit in {tried} candidates (step budget)"
            ctx.step()
            tried += 1
            changes = ", ".join(f"{k} {current[k]} -> {v}" for k, v in settings.items() if v != current[k])
            result = ctx.submit(candidate, rationale=f"mutate: {changes}", extra={"tunables": settings})
            if result.committed:
                return f"committed {result.version.label} ({changes})"
        return f"exhausted: every setting of the declared choices has been tried ({tried} new this time)"
