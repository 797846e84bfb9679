"""The judge: the trusted side that decides every record (docs/integrity.md).

:mod:`kbench.judge.judge` (one record through a worker's channel), :mod:`kbench.judge.inputs` (input keys
from the run's secret), :mod:`kbench.judge.verify` (correctness verdicts), :mod:`kbench.judge.accounting`
(the parent's clock against the worker's samples), :mod:`kbench.judge.replies` (what a reply must hold),
:mod:`kbench.judge.policy` (the suite's integrity settings and the static checks of a kernel's source),
:mod:`kbench.judge.context` (the run's context and a new record). Nothing here imports candidate code.
"""
from __future__ import annotations

from kbench.judge.context import RunContext, new_record, new_secret
from kbench.judge.verify import CheckFailed, relative_l2

__all__ = ["RunContext", "new_record", "new_secret", "CheckFailed", "relative_l2", "judge"]


def judge(*args, **kwargs):
    """:func:`kbench.judge.judge.judge` (imported on first use)."""
    from kbench.judge.judge import judge as run

    return run(*args, **kwargs)
