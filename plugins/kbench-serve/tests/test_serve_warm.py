"""Warm workers: an evaluation takes workers started ahead of time, and a worker that ran a candidate is
never handed out again."""
from __future__ import annotations

from serve_support import kernel, write_tasks
from kbench_serve.cascade import evaluate
from kbench_serve.tasks import load_tasks
from kbench_serve.warm import WarmWorkers


def _pids(report, backend):
    return {r["worker"]["pid"] for r in report["records"] if r["backend"] == backend and r.get("worker")}


def test_evaluations_take_ready_workers_and_never_a_used_one(tmp_path):
    task = load_tasks(write_tasks(tmp_path / "tasks", held_out=2))["tiny"]
    warm = WarmWorkers()
    warm.install()
    try:
        used: set[int] = set()
        outcome, _, first = evaluate(task, kernel("honest_numpy"))
        assert outcome == "passed" and warm.handed == 0  # nothing known yet: the first starts its own
        used |= _pids(first, "file:kernel")
        warm.refill()
        ready = {w.proc.pid for spares in warm.ready.values() for w in spares}
        # the candidate's sandboxed worker, the held-out check's and the baseline's trusted one
        assert len(ready) == 3 and not ready & used
        outcome, _, second = evaluate(task, "# again\n" + kernel("honest_numpy"))
        assert outcome == "passed" and warm.handed == 3
        candidate = _pids(second, "file:kernel")
        assert candidate <= ready and not candidate & used  # a ready worker, never the first candidate's
        used |= candidate
        warm.refill()
        again = {w.proc.pid for spares in warm.ready.values() for w in spares}
        assert len(again) == 3 and not again & used and not again & ready  # all fresh: the used ones closed
    finally:
        warm.uninstall()
        warm.close()
