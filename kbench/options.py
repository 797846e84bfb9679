"""Numeric command-line options: finite and in range, or refused by click (exit 2) with the option's name.

click's ``FloatRange`` lets ``nan`` through (every comparison with NaN is false, so no bound is ever crossed) and
``inf`` where no maximum is set: ``--budget nan`` made a search whose deadline never came. Every numeric option of
kbench and its plugins takes one of these types instead.
"""
from __future__ import annotations

import math
from typing import Any

import click


class Finite(click.FloatRange):
    """A float in ``[min, max]`` (open ends as click's FloatRange) that is a finite number."""

    name = "finite number"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and value.strip().lower().lstrip("+-") in ("nan", "inf", "infinity"):
            self.fail(f"{value!r} is not a finite number; give a number such as 60", param, ctx)
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number; give a number such as 60", param, ctx)
        return number


#: the largest count an integer option takes where nothing smaller bounds it: beyond, a count is a typo
BIG_COUNT = 10**9


def count(min: int = 0, max: int = BIG_COUNT) -> click.IntRange:
    """An integer option in ``[min, max]``: huge values (``10**400``) refused, not carried into float arithmetic."""
    return click.IntRange(min=min, max=max)
