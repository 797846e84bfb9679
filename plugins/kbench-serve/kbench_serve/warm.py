"""Warm workers: the judge's workers started ahead of time, so an evaluation does not wait for them.

Most of a small CPU evaluation is spent starting processes: the candidate's sandboxed worker (bubblewrap, an
interpreter, kbench's plugins), the trusted worker that runs the baseline, a sandboxed worker for the held-out
check. A pool asks :func:`kbench.run.pool.new_worker` for each worker it lacks; this source answers with one
started earlier with exactly the same setup (:class:`kbench.protocol.WorkerSetup`: device, op, limits, sandbox)
that has never been given a job, so it is as clean as a fresh start: a worker that ran one candidate's code is
closed by its pool as always and never comes back here. The slot refills after writing each verdict, so starts
happen between evaluations, never beside a timed one, and the client does not wait for them.

Which setups to keep ready is learned from the evaluations: as many of each as one evaluation asked for.
"""
from __future__ import annotations

import threading
from collections import Counter


class WarmWorkers:
    def __init__(self, *, max_setups: int = 8) -> None:
        self.ready: dict = {}          # setup -> [started, unused Worker]
        self.want: Counter = Counter()  # setup -> how many one evaluation asked for (the most seen)
        self.asked: Counter = Counter()  # (slot thread, setup) -> how many its evaluation in progress asked for
        self.max_setups = max_setups
        self.lock = threading.Lock()
        self.handed = self.missed = 0

    def __call__(self, setup, label):
        """kbench.run.pool's worker source: a ready worker for ``setup``, or None (the pool starts one)."""
        with self.lock:
            key = (threading.get_ident(), setup)
            self.asked[key] += 1
            if self.asked[key] > self.want[setup] and (setup in self.want or len(self.want) < self.max_setups):
                self.want[setup] = self.asked[key]
            spares = self.ready.get(setup) or []
            while spares:
                worker = spares.pop()
                if worker.alive:
                    self.handed += 1
                    return worker
                worker.close()
            self.missed += 1
            return None

    def refill(self) -> None:
        """Start what the last evaluations showed they need (called by a slot between evaluations)."""
        from kbench.api import started_worker

        with self.lock:
            me = threading.get_ident()
            for key in [k for k in self.asked if k[0] == me]:
                del self.asked[key]
            todo = [(s, n - len(self.ready.get(s, []))) for s, n in self.want.items()]
        for setup, missing in todo:
            for _ in range(max(0, missing)):
                worker = started_worker(setup, "warm")
                if worker is None:  # the next evaluation starts its own and records why, if it fails too
                    continue
                with self.lock:
                    self.ready.setdefault(setup, []).append(worker)

    def close(self) -> None:
        with self.lock:
            workers = [w for spares in self.ready.values() for w in spares]
            self.ready.clear()
        for w in workers:
            w.close()

    def install(self) -> None:
        from kbench.api import set_worker_source

        set_worker_source(self)

    def uninstall(self) -> None:
        from kbench.api import set_worker_source

        set_worker_source(None)
