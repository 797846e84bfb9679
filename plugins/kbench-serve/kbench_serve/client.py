"""Clients of ``kbench serve``: :class:`Client` (sync) and :class:`AsyncClient`, on httpx.

Every submission carries an idempotency key (made here when the caller gives none), so a retry after a lost
connection or a 5xx returns the evaluation the first attempt created instead of queueing a second one.
Retries back off exponentially with jitter and honour ``Retry-After`` on 429 and 503.
"""
from __future__ import annotations

import asyncio
import random
import time
import uuid
from typing import Any

import httpx

RETRY_STATUS = (429, 502, 503, 504)
MAX_DELAY = 60.0  # seconds one retry waits at most, whatever Retry-After says


class ServeError(Exception):
    """The server refused the request (4xx other than 429), or retries ran out."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def _delay(attempt: int, backoff: float, response: httpx.Response | None) -> float:
    if response is not None and response.headers.get("Retry-After", "").isdigit():
        return min(MAX_DELAY, float(response.headers["Retry-After"]))
    return min(MAX_DELAY, backoff * (2 ** attempt) * (0.5 + random.random() / 2))


def _waiting(wait: float, timeout: float) -> dict[str, Any]:
    """A long poll's query and a read timeout that outlasts it."""
    return {"params": {"wait": wait}, "timeout": timeout + wait} if wait else {}


def _check(response: httpx.Response) -> dict[str, Any]:
    if response.status_code >= 400:
        try:
            detail = response.json().get("detail")
        except ValueError:
            detail = response.text[:500]
        raise ServeError(f"{response.request.method} {response.request.url.path}: {response.status_code}: {detail}",
                         response.status_code)
    return response.json()


class Client:
    """``Client("http://127.0.0.1:8787", token=...)``; ``evaluate(task, source)`` returns the finished
    evaluation (``outcome``, ``reward``, ``report``)."""

    def __init__(self, url: str = "http://127.0.0.1:8787", *, token: str | None = None, timeout: float = 30.0,
                 retries: int = 6, backoff: float = 0.25, http: httpx.Client | None = None) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = http or httpx.Client(base_url=url, timeout=timeout)  # ``http``: e.g. FastAPI's TestClient
        self.http.headers.update(headers)
        self.retries, self.backoff, self.timeout = retries, backoff, timeout

    def _request(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            response = None
            try:
                response = self.http.request(method, path, **kw)
                if response.status_code not in RETRY_STATUS:
                    return _check(response)
                last = ServeError(f"{response.status_code}: {response.text[:200]}", response.status_code)
            except httpx.TransportError as exc:
                last = exc
            if attempt < self.retries:
                time.sleep(_delay(attempt, self.backoff, response))
        raise ServeError(f"{method} {path}: gave up after {self.retries + 1} attempts: {last}",
                         getattr(last, "status", None))

    def tasks(self) -> list[dict[str, Any]]:
        return self._request("GET", "/v1/tasks")

    def submit(self, task: str, source: str, *, idempotency_key: str | None = None, force: bool = False,
               wait: float = 0.0) -> dict[str, Any]:
        body = {"task": task, "source": source, "idempotency_key": idempotency_key or uuid.uuid4().hex,
                "force": force}
        return self._request("POST", "/v1/evaluations", json=body, **_waiting(wait, self.timeout))

    def get(self, ev_id: str, *, wait: float = 0.0) -> dict[str, Any]:
        return self._request("GET", f"/v1/evaluations/{ev_id}", **_waiting(wait, self.timeout))

    def evaluate(self, task: str, source: str, *, deadline: float = 600.0, poll: float = 20.0,
                 **kw: Any) -> dict[str, Any]:
        """Submit and wait (long polls of ``poll`` seconds) until done or ``deadline`` seconds have passed."""
        end = time.monotonic() + deadline
        ev = self.submit(task, source, wait=min(poll, deadline), **kw)
        while ev["status"] != "done":
            left = end - time.monotonic()
            if left <= 0:
                raise ServeError(f"evaluation {ev['id']} not done within {deadline:g} s (still {ev['status']})")
            ev = self.get(ev["id"], wait=min(poll, left))
        return ev

    def health(self) -> dict[str, Any]:
        return self._request("GET", "/healthz")

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class AsyncClient:
    """The same calls as :class:`Client`, awaitable: many evaluations in flight from one rollout loop."""

    def __init__(self, url: str = "http://127.0.0.1:8787", *, token: str | None = None, timeout: float = 30.0,
                 retries: int = 6, backoff: float = 0.25) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.AsyncClient(base_url=url, headers=headers, timeout=timeout)
        self.retries, self.backoff, self.timeout = retries, backoff, timeout

    async def _request(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            response = None
            try:
                response = await self.http.request(method, path, **kw)
                if response.status_code not in RETRY_STATUS:
                    return _check(response)
                last = ServeError(f"{response.status_code}: {response.text[:200]}", response.status_code)
            except httpx.TransportError as exc:
                last = exc
            if attempt < self.retries:
                await asyncio.sleep(_delay(attempt, self.backoff, response))
        raise ServeError(f"{method} {path}: gave up after {self.retries + 1} attempts: {last}",
                         getattr(last, "status", None))

    async def tasks(self) -> list[dict[str, Any]]:
        return await self._request("GET", "/v1/tasks")

    async def submit(self, task: str, source: str, *, idempotency_key: str | None = None, force: bool = False,
                     wait: float = 0.0) -> dict[str, Any]:
        body = {"task": task, "source": source, "idempotency_key": idempotency_key or uuid.uuid4().hex,
                "force": force}
        return await self._request("POST", "/v1/evaluations", json=body, **_waiting(wait, self.timeout))

    async def get(self, ev_id: str, *, wait: float = 0.0) -> dict[str, Any]:
        return await self._request("GET", f"/v1/evaluations/{ev_id}", **_waiting(wait, self.timeout))

    async def evaluate(self, task: str, source: str, *, deadline: float = 600.0, poll: float = 20.0,
                       **kw: Any) -> dict[str, Any]:
        end = time.monotonic() + deadline
        ev = await self.submit(task, source, wait=min(poll, deadline), **kw)
        while ev["status"] != "done":
            left = end - time.monotonic()
            if left <= 0:
                raise ServeError(f"evaluation {ev['id']} not done within {deadline:g} s (still {ev['status']})")
            ev = await self.get(ev["id"], wait=min(poll, left))
        return ev

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()
