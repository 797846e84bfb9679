"""A trusted backend's record made in this process, through the same messages as a worker's.

:class:`LocalChannel` is the judge's channel to a :class:`kbench.worker.calls.CallRunner` in this process, and
:func:`execute_in_process` judges one (backend, case) through it. :mod:`kbench.run.pool` runs trusted backends
so with ``--no-isolate``, and :mod:`kbench.run.forked` in its forked child; both import it from here (the pool
re-exports both names), so neither imports the other back (docs/architecture.md, "Layers").
"""
from __future__ import annotations

from typing import Any

from kbench.backends import Backend
from kbench.enums import Status
from kbench.judge.context import RunContext, new_record, skip_reason
from kbench.judge.policy import static_failure
from kbench.ops import Case
from kbench.protocol import as_sent


class LocalChannel:
    """The judge's channel to a :class:`kbench.worker.calls.CallRunner` in this process (trusted backends,
    ``--no-isolate``): the same requests, the replies through the same encoding as a worker's."""

    def __init__(self, runner, backend) -> None:
        self.runner, self.backend = runner, backend

    def start(self, payload: dict[str, Any], fd: int, timeout: float | None) -> Any:
        self.runner.attach(payload["layout"], fd)
        return self._handle(("job", payload), self.backend)

    def request(self, message: tuple, timeout: float | None) -> Any:
        return self._handle(message)

    def harness_twin(self) -> LocalChannel:
        """A runner in this process with no backend code (kbench.worker.calls.HarnessOnly): the harness's own
        cost of a batch, for the judge's parent clock (tests judge untrusted callables through this channel)."""
        from kbench.worker.calls import CallRunner, HarnessOnly

        return LocalChannel(CallRunner(self.runner.device, self.runner.op), HarnessOnly())

    def _handle(self, message: tuple, *backend) -> Any:
        """The runner's reply; a kernel's ``sys.exit`` is an ``error`` reply, as in a worker, never the caller's
        exit. (The timeout is not enforced here: a trusted callable runs in a forked child the pool kills,
        kbench.run.forked; ``--no-isolate`` runs in this process on purpose, for debugging.)"""
        try:
            return as_sent(self.runner.handle(message, *backend))
        except SystemExit as exc:
            return as_sent(("error", {"reason": f"the kernel called sys.exit({exc.code!r}) (SystemExit)"}))



def execute_in_process(ctx: RunContext, backend: Backend, case: Case, *,
                       timeout: float | None = None) -> dict[str, Any]:
    """One record for (backend, case), the kernel called in this process (trusted backends only), judged
    through the same messages as a worker's. Never raises for a backend's misbehaviour: it is recorded.
    ``timeout``: the judge stops sampling before it (the caller enforces it: kbench.run.forked)."""
    from kbench.judge.judge import judge
    from kbench.worker.calls import CallRunner
    from kbench.worker.watches import HarnessSnapshot

    skip = skip_reason(ctx, backend)
    if skip:
        rec = new_record(backend.name, case, ctx.device.name)
        rec.update(status=Status.SKIPPED.value, reason=skip)
        return rec
    static = static_failure(ctx.integrity, backend)
    if static:
        rec = new_record(backend.name, case, ctx.device.name)
        rec.update(status=Status.FAILED.value, reason=static, integrity={"checks": ["static"]})
        return rec
    snapshot = HarnessSnapshot(ctx.device) if ctx.integrity.check_harness else None
    runner = CallRunner(ctx.device, ctx.op, check_threads=ctx.integrity.check_threads, harness=snapshot)
    rec = judge(ctx, LocalChannel(runner, backend), backend.name, case, timeout=timeout, trusted=backend.trusted)
    if backend.source_path and ctx.integrity.static_applies(backend.trusted) and isinstance(rec.get("integrity"), dict):
        rec["integrity"]["checks"].insert(0, "static")
    return rec
