"""Shapes nobody chose (docs/fuzz.md).

:mod:`kbench.fuzz.space` (an op's whole parameter space as Hypothesis strategies), :mod:`kbench.fuzz.checker`
(one case checked for correctness through the judge and sandbox of ``kbench run``, one worker kept for a
whole fuzz run), :mod:`kbench.fuzz.engine` (search within a budget, shrink a failure, the repro suite) and
:mod:`kbench.fuzz.heldout` (held-out shapes near a suite's, drawn from a secret, for everything that scores
a kernel). Hypothesis is imported by the first three only: the held-out check stays light.
"""
