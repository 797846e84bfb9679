"""The worker side: everything a (sandboxed) worker process imports to run candidate code.

:mod:`kbench.worker.main` (entry point and request loop), :mod:`kbench.worker.calls` (the call runner),
:mod:`kbench.worker.watches` (harness snapshot, thread and operator watches), :mod:`kbench.worker.guard`
(the audit hook). It reports facts and never judges; it never imports :mod:`kbench.judge`, :mod:`kbench.run`
or SciPy.
"""
