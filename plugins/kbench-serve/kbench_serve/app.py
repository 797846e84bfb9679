"""The HTTP service: a FastAPI app over the durable queue (:mod:`kbench_serve.store`) and the slots that run
evaluations (:mod:`kbench_serve.cascade`), one evaluation per slot at a time.

Limits are enforced before a request reaches a handler: the body (size, 413; time to arrive, 408) by
:class:`BodyLimit`, bearer tokens by the ``principal`` dependency, then a per-token rate (429) and the queue's
bound (429, Retry-After). Memory does not grow with the queue: a queued evaluation is a SQLite row.
"""
from __future__ import annotations

import asyncio
import hmac
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Query, Request, Response
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, Field, field_validator

from kbench_serve.store import Store
from kbench_serve.tasks import Task

ANONYMOUS = "local"  # the one principal of a server without tokens (loopback only)


@dataclass
class Settings:
    """What ``kbench serve`` was told; every limit has a default that keeps a loopback server safe."""

    db: str = "kbench-serve.sqlite"
    tokens: dict[str, str] = field(default_factory=dict)  # token -> principal name
    slots: int = 1                # evaluations at once (one per device; CPU timings share cores, keep 1)
    max_queue: int = 10_000       # queued evaluations at most; more: 429
    max_body: int = 1_048_576     # bytes of a request body; more: 413
    body_timeout: float = 10.0    # seconds a body may take to arrive; longer: 408
    rate: float = 10.0            # evaluations per second per token, sustained
    burst: int = 100              # evaluations a token may submit at once
    max_wait: float = 600.0       # seconds a synchronous request may wait for its verdict
    warm: bool = True             # keep the judge's workers started between evaluations (kbench_serve.warm)


# --------------------------------------------------------------------------------------------------
# limits on the body, before any handler: pure ASGI, so nothing is parsed until the body is whole


class BodyLimit:
    """Reads a request's whole body under a size and a time limit, then hands it to the app; 413 or 408
    otherwise. A slow client cannot hold a handler (or a thread) while it trickles bytes."""

    def __init__(self, app, *, max_body: int, timeout: float) -> None:
        self.app, self.max_body, self.timeout = app, max_body, timeout

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE"):
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            return await _plain(send, 413, f"the body is over the limit of {self.max_body} bytes")
        chunks, size = [], 0
        deadline = time.monotonic() + self.timeout
        while True:
            left = deadline - time.monotonic()
            try:
                message = await asyncio.wait_for(receive(), timeout=max(left, 0.001))
            except asyncio.TimeoutError:
                return await _plain(send, 408, f"the body did not arrive within {self.timeout:g} s")
            if message["type"] == "http.disconnect":
                return None
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_body:
                return await _plain(send, 413, f"the body is over the limit of {self.max_body} bytes")
            chunks.append(body)
            if not message.get("more_body", False):
                break
        whole = b"".join(chunks)
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": whole, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)


async def _plain(send, status: int, detail: str) -> None:
    import json

    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


class TokenBucket:
    """Per-principal rate: ``rate`` per second sustained, ``burst`` at once."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, burst
        self.state: dict[str, tuple[float, float]] = {}
        self.lock = threading.Lock()

    def take(self, who: str) -> float:
        """0 when allowed, else the seconds until one more is."""
        now = time.monotonic()
        with self.lock:
            level, last = self.state.get(who, (float(self.burst), now))
            level = min(float(self.burst), level + (now - last) * self.rate)
            if level >= 1.0:
                self.state[who] = (level - 1.0, now)
                return 0.0
            self.state[who] = (level, now)
            return (1.0 - level) / self.rate


# --------------------------------------------------------------------------------------------------
# the request and response bodies (the OpenAPI description is made from these)


class EvaluationRequest(BaseModel):
    task: str = Field(min_length=1, max_length=64, description="a task id of GET /v1/tasks")
    source: str = Field(min_length=1, description="the kernel file's text (docs/backends.md, Kernel files)")
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=128,
                                        description="the same key again returns the same evaluation")
    force: bool = Field(default=False, description="measure again even if this source was judged for this task")

    @field_validator("task", "source", "idempotency_key")
    @classmethod
    def _utf8(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise ValueError(f"not valid UTF-8 text: {exc.reason} at character {exc.start} "
                                 f"(a lone surrogate escape such as \\ud800?)") from None
        return value


class Evaluation(BaseModel):
    id: str
    task: str
    status: str = Field(description="queued, running or done")
    outcome: str | None = Field(default=None, description="passed, or the stage that failed, or error")
    reward: float | None = None
    created: float
    finished: float | None = None
    cached_from: str | None = None
    report: dict[str, Any] | None = Field(default=None, description="stages, reward, reward_ci, records")


def _public(row: dict[str, Any]) -> dict[str, Any]:
    import json

    report = json.loads(row["report"]) if row.get("report") else None
    return {"id": row["id"], "task": row["task"], "status": row["status"], "outcome": row["outcome"],
            "reward": row["reward"], "created": row["created"], "finished": row["finished"],
            "cached_from": row["cached_from"], "report": report}


# --------------------------------------------------------------------------------------------------
# the service: queue, slots, metrics


class Service:
    """The queue's consumers (``slots`` threads) and what the handlers share with them."""

    def __init__(self, tasks: dict[str, Task], settings: Settings) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.tasks, self.settings = tasks, settings
        self.store = Store(settings.db)
        self.recovered = self.store.recover()
        self.wake = threading.Condition()
        self.stopping = threading.Event()
        self.order: OrderedDict[str, None] = OrderedDict()  # principals, least recently served first
        self.waiters: dict[str, list[tuple[asyncio.AbstractEventLoop, asyncio.Future]]] = {}
        self.waiters_lock = threading.Lock()
        self.threads: list[threading.Thread] = []
        self.running = 0
        self.registry = CollectorRegistry()
        self.queue_gauge = Gauge("kbench_serve_queue_depth", "evaluations queued", registry=self.registry)
        self.queue_gauge.set_function(lambda: self.store.queued())
        Gauge("kbench_serve_running", "evaluations running", registry=self.registry).set_function(lambda: self.running)
        buckets = (0.25, 0.5, 1, 1.5, 2, 3, 5, 8, 13, 21, 34, 60, 120, 300)
        self.latency = Histogram("kbench_serve_latency_seconds", "submission to verdict", registry=self.registry,
                                 buckets=buckets)
        self.run_time = Histogram("kbench_serve_evaluation_seconds", "time in a slot", registry=self.registry,
                                  buckets=buckets)
        self.outcomes = Counter("kbench_serve_outcomes_total", "verdicts by the stage that decided (passed: all)",
                                ["stage"], registry=self.registry)
        self.refused = Counter("kbench_serve_refused_total", "requests refused", ["why"], registry=self.registry)
        self.mean_run = 2.0  # seconds per evaluation, for Retry-After
        self.warm = None

    # -- slots ----------------------------------------------------------------------------------------

    def start(self) -> None:
        self._warm()
        if self.settings.warm:
            from kbench_serve.warm import WarmWorkers

            self.warm = WarmWorkers()
            self.warm.install()
        for i in range(self.settings.slots):
            t = threading.Thread(target=self._slot, name=f"kbench-serve-slot-{i}", daemon=True)
            t.start()
            self.threads.append(t)

    def _warm(self) -> None:
        """Import the judge and load the plugins: the first evaluation does not pay for them."""
        import kbench.api as kb

        kb.get_plugin_manager()
        for name in ("score_kernel", "plan_run", "run_suite", "static_check"):  # their modules imported now
            getattr(kb, name)

    def stop(self) -> None:
        self.stopping.set()
        with self.wake:
            self.wake.notify_all()
        for t in self.threads:
            t.join(timeout=1)
        if self.warm is not None:
            self.warm.uninstall()
            self.warm.close()

    def _slot(self) -> None:
        import sys
        import traceback

        while not self.stopping.is_set():
            try:
                self._one()
            except Exception:  # noqa: BLE001 - the database or the host failed us: say so, keep the slot alive
                print("kbench serve: a slot failed outside any evaluation (it goes on):", file=sys.stderr)
                traceback.print_exc()
                self.stopping.wait(1.0)

    def _one(self) -> None:
        """Claim one evaluation, run it, write its verdict once (or wait a moment when none is queued)."""
        from kbench_serve.cascade import HarnessFailure, evaluate

        with self.wake:
            row = self.store.claim(list(self.order))
            if row is None:
                self.wake.wait(timeout=1.0)
                return
            self.order.pop(row["principal"], None)
            self.order[row["principal"]] = None  # served now: last in line
        self.running += 1
        t0 = time.monotonic()
        task = self.tasks.get(row["task"])
        try:
            if task is None:
                outcome, reward, report = "error", None, {"stages": [{"stage": "server", "ok": False, "reason":
                                                          f"the task {row['task']!r} is no longer served"}]}
            else:
                outcome, reward, report = evaluate(task, row["source"])
        except HarnessFailure as exc:
            outcome, reward, report = "error", None, {"stages": [{"stage": "harness", "ok": False,
                                                                  "reason": str(exc)}], "retry": True}
        except Exception as exc:  # noqa: BLE001 - one evaluation, one verdict; the slot goes on
            outcome, reward, report = "error", None, {"stages": [{"stage": "server", "ok": False,
                                                                  "reason": f"{type(exc).__name__}: {exc}"}]}
        finally:
            self.running -= 1
        elapsed = time.monotonic() - t0
        self.mean_run = 0.8 * self.mean_run + 0.2 * elapsed
        if self.store.finish(row["id"], row["attempt"], outcome, reward, {**report, "status": "done"}):
            self.run_time.observe(elapsed)
            self.latency.observe(max(0.0, time.time() - row["created"]))
            self.outcomes.labels(outcome).inc()
        self._notify(row["id"])
        if self.warm is not None and not self.stopping.is_set():
            self.warm.refill()  # after the verdict is out: the client never waits for these starts

    def submitted(self) -> None:
        with self.wake:
            self.wake.notify()

    # -- waiting for a verdict --------------------------------------------------------------------------

    def _notify(self, ev_id: str) -> None:
        with self.waiters_lock:
            waiting = self.waiters.pop(ev_id, [])
        for loop, fut in waiting:
            try:
                loop.call_soon_threadsafe(lambda f=fut: f.done() or f.set_result(None))
            except RuntimeError:  # that request's event loop is gone (the server is stopping)
                pass

    async def wait(self, ev_id: str, principal: str, seconds: float) -> dict[str, Any] | None:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        with self.waiters_lock:
            self.waiters.setdefault(ev_id, []).append((loop, fut))
        row = self.store.get(ev_id, principal)  # after registering: a verdict in between is not missed
        if row is not None and row["status"] != "done" and seconds > 0:
            try:
                await asyncio.wait_for(fut, timeout=seconds)
            except asyncio.TimeoutError:
                pass
            row = self.store.get(ev_id, principal)
        with self.waiters_lock:
            left = [w for w in self.waiters.get(ev_id, []) if w[1] is not fut]
            if left:
                self.waiters[ev_id] = left
            else:
                self.waiters.pop(ev_id, None)
        return row

    def retry_after(self) -> int:
        queued = self.store.queued()
        # the time the queue ahead takes to drain, within [1 s, 5 min]: a client comes back to a shorter queue
        return min(300, max(1, int(self.mean_run * (queued + 1) / max(1, self.settings.slots))))


# --------------------------------------------------------------------------------------------------
# the app


def create_app(tasks: dict[str, Task], settings: Settings, *, start: bool = True) -> FastAPI:
    """The ASGI app (``start``: run the slots; tests of the HTTP edge alone leave them stopped)."""
    from contextlib import asynccontextmanager

    service = Service(tasks, settings)
    bucket = TokenBucket(settings.rate, settings.burst)
    bearer = HTTPBearer(auto_error=False)

    @asynccontextmanager
    async def lifespan(app):
        if start:
            service.start()
        yield
        service.stop()
        service.store.close()

    app = FastAPI(title="kbench serve", version="1", lifespan=lifespan,
                  description="kbench's judge as a service: submit a kernel file for a task, get a per-stage "
                              "report and a reward (docs/serve.md).")
    app.state.service = service
    app.add_middleware(BodyLimit, max_body=settings.max_body, timeout=settings.body_timeout)

    def principal(creds: HTTPAuthorizationCredentials | None = Depends(bearer)) -> str:
        if not settings.tokens:
            return ANONYMOUS
        if creds is None:
            raise HTTPException(401, "a bearer token is required (Authorization: Bearer TOKEN)",
                                headers={"WWW-Authenticate": "Bearer"})
        given = creds.credentials.encode("utf-8", "surrogateescape")
        for token, name in settings.tokens.items():
            if hmac.compare_digest(given, token.encode()):
                return name
        raise HTTPException(401, "unknown token", headers={"WWW-Authenticate": "Bearer"})

    def limited(why: str, detail: str, retry: float) -> HTTPException:
        service.refused.labels(why).inc()
        return HTTPException(429, detail, headers={"Retry-After": str(max(1, int(retry + 0.999)))})

    from fastapi.exceptions import RequestValidationError

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        # the errors without their `input`: a body is never echoed back (it may not even be encodable)
        errors = [{k: v for k, v in e.items() if k in ("type", "loc", "msg")} for e in exc.errors()]
        return JSONResponse({"detail": errors}, status_code=422)

    @app.exception_handler(UnicodeError)
    async def _unicode(request: Request, exc: UnicodeError):
        return JSONResponse({"detail": f"the request is not valid UTF-8: {exc}"}, status_code=400)

    @app.get("/healthz", tags=["service"])
    def healthz() -> dict[str, Any]:
        counts = service.store.counts()
        return {"status": "ok", "queued": counts.get("queued", 0), "running": service.running,
                "slots": settings.slots, "tasks": len(tasks)}

    @app.get("/metrics", tags=["service"], response_class=Response)
    def metrics() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return Response(generate_latest(service.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/tasks", tags=["tasks"])
    def list_tasks(who: str = Depends(principal)) -> list[dict[str, Any]]:
        return [t.public() for t in tasks.values()]

    @app.post("/v1/evaluations", tags=["evaluations"], status_code=202, response_model=Evaluation,
              responses={200: {"model": Evaluation, "description": "done: within `wait`, cached or a replay"},
                         429: {"description": "queue full or rate limit; see Retry-After"}})
    async def submit(body: EvaluationRequest, response: Response, who: str = Depends(principal),
                     wait: float = Query(0.0, ge=0.0, description="seconds to wait for the verdict")) -> Any:
        if body.task not in tasks:
            raise HTTPException(404, f"no task {body.task!r}; GET /v1/tasks lists them")
        if body.idempotency_key is None or service.store.get_key(who, body.idempotency_key) is None:
            retry = bucket.take(who)
            if retry:
                raise limited("rate", f"over the rate of {settings.rate:g} evaluations/s for this token", retry)
            if service.store.queued() >= settings.max_queue:
                raise limited("queue", f"the queue is full ({settings.max_queue} evaluations)", service.retry_after())
        row, created = await asyncio.to_thread(service.store.submit, who, body.task, body.source,
                                               idempotency_key=body.idempotency_key, force=body.force)
        if not created:
            response.headers["Idempotent-Replay"] = "true"
        if row["status"] == "queued":
            service.submitted()
        if wait > 0 and row["status"] != "done":
            row = await service.wait(row["id"], who, min(wait, settings.max_wait)) or row
        response.headers["Location"] = f"/v1/evaluations/{row['id']}"
        if row["status"] == "done" or not created:
            response.status_code = 200
        return _public(row)

    @app.get("/v1/evaluations/{ev_id}", tags=["evaluations"], response_model=Evaluation,
             responses={404: {"description": "no such evaluation of this token"}})
    async def get(ev_id: str, who: str = Depends(principal),
                  wait: float = Query(0.0, ge=0.0, description="seconds to wait for the verdict")) -> Any:
        row = (await service.wait(ev_id, who, min(wait, settings.max_wait)) if wait > 0
               else service.store.get(ev_id, who))
        if row is None:
            raise HTTPException(404, f"no evaluation {ev_id!r} for this token")
        return _public(row)

    return app


# --------------------------------------------------------------------------------------------------
# tokens and addresses


def read_tokens(file: str | None, env: str | None = None) -> dict[str, str]:
    """Tokens from ``file`` (one per line, ``NAME:TOKEN`` or a bare token; ``#`` comments) and from the
    environment variable ``KBENCH_SERVE_TOKENS`` (the same, comma separated). A bare token is named by a
    prefix of its hash: the name, never the token, is what the database keeps."""
    import hashlib

    from kbench.api import BadInput

    entries: list[tuple[str, str]] = []
    if file:
        try:
            text = Path(file).read_text(encoding="utf-8")
        except (OSError, UnicodeError) as exc:
            raise BadInput(f"cannot read the token file: {exc}", file=file, where="--tokens",
                           fix="one token per line, NAME:TOKEN or TOKEN") from None
        entries += [(f"{file}, line {i}", ln.strip()) for i, ln in enumerate(text.splitlines(), 1)
                    if ln.strip() and not ln.lstrip().startswith("#")]
    env = os.environ.get("KBENCH_SERVE_TOKENS", "") if env is None else env
    entries += [("KBENCH_SERVE_TOKENS", part.strip()) for part in env.split(",") if part.strip()]
    tokens: dict[str, str] = {}
    for where, entry in entries:
        name, sep, token = entry.partition(":")
        if not sep:
            name, token = "t-" + hashlib.sha256(entry.encode()).hexdigest()[:12], entry
        if len(token) < 16 or any(c.isspace() for c in token):
            raise BadInput("a token must be at least 16 characters without spaces", where=where,
                           fix="make one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'")
        tokens[token] = name
    return tokens


def is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
