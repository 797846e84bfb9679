"""Model calls through litellm: retries with backoff, timeouts, token and cost accounting.

litellm is imported here, lazily, with ``LITELLM_LOCAL_MODEL_COST_MAP=True`` so that importing it
touches no network. Transient errors (rate limits, timeouts, connection and server errors) are
retried with exponential backoff; when the retries run out the call raises
:class:`~kbench_evolve.engine.LLMUnavailable`, which pauses the run without touching the lineage.
The model and key come from ``--model`` / ``KBENCH_EVOLVE_MODEL`` and the provider's usual
environment variable (``ANTHROPIC_API_KEY``, ``OPENAI_API_KEY``, ...), read by litellm itself.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any

from kbench.errors import BadInput

from kbench_evolve.engine import LLMUnavailable


def import_litellm():
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    litellm.suppress_debug_info = True
    return litellm


def _transient(litellm) -> tuple[type[BaseException], ...]:
    return (litellm.RateLimitError, litellm.Timeout, litellm.APIConnectionError,
            litellm.ServiceUnavailableError, litellm.InternalServerError)


def message_to_dict(message: Any) -> dict[str, Any]:
    """An assistant message as a plain dict (what we store and send back next turn)."""
    out: dict[str, Any] = {"role": "assistant", "content": getattr(message, "content", None)}
    calls = getattr(message, "tool_calls", None) or []
    if calls:
        out["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.function.name, "arguments": c.function.arguments or "{}"}}
                             for c in calls]
    return out


class LLMClient:
    """One model, with the run's budgets: every call is accounted in ``ctx.spent``."""

    def __init__(self, ctx, *, model: str, api_base: str | None = None, timeout: float = 120.0,
                 retries: int = 4, backoff: float = 2.0, **_ignored: Any) -> None:
        self.ctx = ctx
        self.model = model
        self.api_base = api_base
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.cost_known = True

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        litellm = import_litellm()
        transient = _transient(litellm)
        last: BaseException | None = None
        for attempt in range(self.retries + 1):
            self.ctx.check_budget()
            kwargs: dict[str, Any] = {"model": self.model, "messages": messages, "timeout": self.timeout,
                                      "num_retries": 0}
            if tools:
                kwargs["tools"] = tools
            if self.api_base:
                kwargs["api_base"] = self.api_base
            try:
                response = litellm.completion(**kwargs)
            except transient as exc:
                last = exc
                self._log_error(exc, attempt)
                if attempt < self.retries:
                    wait = self.backoff * 2 ** attempt
                    self.ctx.echo(f"  ! model call failed ({type(exc).__name__}: {str(exc)[:120]}); "
                                  f"retry {attempt + 1}/{self.retries} in {wait:.0f} s")
                    time.sleep(wait)
                continue
            except litellm.AuthenticationError as exc:
                raise BadInput(f"the model provider refused the credentials: {str(exc)[:200]}", where="--model",
                               fix="set the provider's key variable (e.g. ANTHROPIC_API_KEY, OPENAI_API_KEY)") from exc
            except litellm.APIError as exc:  # anything else the provider says: pause, do not crash
                last = exc
                self._log_error(exc, attempt)
                break
            self._account(litellm, response)
            return message_to_dict(response.choices[0].message)
        raise LLMUnavailable(f"model {self.model} unavailable after {self.retries + 1} attempts: "
                             f"{type(last).__name__}: {str(last)[:200]}")

    def _account(self, litellm, response) -> None:
        usage = getattr(response, "usage", None)
        tokens = int(getattr(usage, "total_tokens", 0) or 0)
        try:
            cost = float(litellm.completion_cost(completion_response=response, model=self.model) or 0.0)
        except Exception:  # noqa: BLE001 - an unpriced model: tokens still count, cost is unknown
            cost, self.cost_known = 0.0, False
        self.ctx.spent.tokens += tokens
        self.ctx.spent.cost += cost
        self.ctx.save()

    def _log_error(self, exc: BaseException, attempt: int) -> None:
        path = self.ctx.lineage.root / "llm-errors.jsonl"
        from kbench_evolve.store import append_jsonl

        append_jsonl(path, {"model": self.model, "attempt": attempt, "error": type(exc).__name__,
                            "message": str(exc)[:500]})


def tool_schema(name: str, description: str, properties: dict[str, Any] | None = None,
                required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description,
                                             "parameters": {"type": "object", "properties": properties or {},
                                                            "required": list(required)}}}


def parse_arguments(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError("tool arguments must be a JSON object")
    return value
