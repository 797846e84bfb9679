"""The parent's run side: the runner (:mod:`kbench.run.runner`), executors (:mod:`kbench.run.executors`),
the worker pool (:mod:`kbench.run.pool`), the OS sandbox (:mod:`kbench.run.sandbox`) and the workers'
scratch directories (:mod:`kbench.run.scratch`). Where a job runs is decided here; how it is judged is
:mod:`kbench.judge`'s; what runs beside candidate code is :mod:`kbench.worker`'s."""
