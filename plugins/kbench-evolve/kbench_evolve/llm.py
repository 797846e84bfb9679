"""Model calls through litellm: every provider error classified, capped backoff, token and cost accounting.

litellm is imported here, lazily, with ``LITELLM_LOCAL_MODEL_COST_MAP=True`` so that importing it
touches no network. Each failed call is classified (:func:`classify`) and logged with a timestamp
in ``llm-errors.jsonl``:

- ``transient`` (rate limit, timeout, connection, 5xx): retried with exponential backoff capped at
  ``max_backoff``; when the retries run out :class:`~kbench_evolve.engine.LLMUnavailable` pauses
  the run (or, ``--unattended``, makes it wait and try again), the lineage untouched;
- ``overflow`` (the context window is exceeded): the caller's ``compact`` shrinks the conversation
  and the call is made again; when nothing is left to shrink it becomes ``fatal``;
- ``fatal`` (bad credentials, unknown model, bad request, ...): :class:`~kbench_evolve.engine.ProviderRejected`,
  exit 2 with the provider's message; the run's state is saved and ``resume`` (maybe with another
  ``--model``) continues it.

Before the first call :func:`preflight` refuses a model whose API key variable is not set, and a
``--max-cost`` budget for a model whose price nobody knows (neither litellm's table, litellm custom
pricing, nor ``--price-input/--price-output``): an unpriced call is counted as unknown, never as $0.

Every call has a wall-clock deadline kbench enforces (``--llm-timeout``, not only httpx's per-read timeout, which
a provider sending a byte every few seconds never trips): the call runs in a thread the caller stops waiting for
at the deadline, and the HTTP client litellm uses for OpenAI-compatible providers (``litellm.client_session``)
stops reading a reply's body at the deadline and beyond :data:`REPLY_BYTES` (an 80 MB reply is never read
whole). Every number a provider reports (token counts, cost) is bounded and typed before use (:func:`_count`).
"""
from __future__ import annotations

import math
import os
import threading
import time
from typing import Any, Callable

from kbench.api import BadInput

from kbench_evolve.engine import LLMUnavailable, ProviderRejected
from kbench_evolve.store import append_jsonl, now_iso

KEY_HINT = ("export the provider's key variable (ANTHROPIC_API_KEY, OPENAI_API_KEY, ...); a local "
            "OpenAI-compatible server that checks no key still needs OPENAI_API_KEY set to any value")


def import_litellm():
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    litellm.suppress_debug_info = True
    return litellm


def classify(litellm, exc: BaseException) -> str:
    """``transient``, ``overflow`` or ``fatal`` for an exception of ``litellm.completion``."""
    if isinstance(exc, litellm.ContextWindowExceededError):
        return "overflow"
    transient = (litellm.RateLimitError, litellm.Timeout, litellm.APIConnectionError,
                 litellm.ServiceUnavailableError, litellm.InternalServerError, litellm.BadGatewayError)
    if isinstance(exc, transient):
        return "transient"
    if isinstance(exc, (litellm.BadRequestError, litellm.AuthenticationError, litellm.PermissionDeniedError,
                        litellm.NotFoundError, litellm.UnprocessableEntityError)):
        text = str(exc).lower()
        if any(w in text for w in ("context length", "context window", "maximum context", "too many tokens",
                                   "prompt is too long")):
            return "overflow"
        return "fatal"
    status = getattr(exc, "status_code", None)
    if isinstance(status, int):
        return "transient" if status >= 500 or status in (408, 409, 429) else "fatal"
    if isinstance(exc, (TimeoutError, ConnectionError, ReplyTooLarge)) or _caused_by(exc, (TimeoutError,
                                                                                            ReplyTooLarge)):
        return "transient"
    return "fatal"  # a configuration error of the client (no key, bad URL): retrying cannot fix it


def _caused_by(exc: BaseException, kinds: tuple[type, ...]) -> bool:
    """Whether ``exc`` wraps (``__cause__``/``__context__``, a few levels) an exception of ``kinds``."""
    seen = 0
    inner = exc.__cause__ or exc.__context__
    while inner is not None and seen < 8:
        if isinstance(inner, kinds):
            return True
        inner, seen = inner.__cause__ or inner.__context__, seen + 1
    return False


def valid_text(value: Any) -> str | None:
    """A provider's string as valid text: a lone UTF-16 surrogate (which no file or hash accepts) becomes U+FFFD,
    a non-string its ``str``; None stays None."""
    if value is None:
        return None
    text = value if isinstance(value, str) else str(value)
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


#: a reply's text and one tool call's arguments are kept up to this many characters (a tool's longest argument is
#: 400,000): a provider's 300 MB reply would otherwise be stored, resent, and make state.json unreadable
REPLY_CHARS = 500_000
#: tool calls of one reply kept at most (the agent runs far fewer: kbench_evolve.tools.Limits)
REPLY_CALLS = 256


def _kept(text: str | None, limit: int = REPLY_CHARS) -> str | None:
    if text is None or len(text) <= limit:
        return text
    return text[:limit] + f"\n[... {len(text) - limit} more characters cut]"


def message_to_dict(message: Any) -> dict[str, Any]:
    """An assistant message as a plain dict (what we store and send back next turn), its text valid Unicode
    and bounded (:data:`REPLY_CHARS`, :data:`REPLY_CALLS`)."""
    out: dict[str, Any] = {"role": "assistant", "content": _kept(valid_text(getattr(message, "content", None)))}
    calls = list(getattr(message, "tool_calls", None) or [])
    if calls:
        out["tool_calls"] = []
        seen: set[str] = set()
        for i, c in enumerate(calls[:REPLY_CALLS]):
            fn = getattr(c, "function", None)
            cid = (valid_text(getattr(c, "id", None)) or "")[:128] or f"call_{i}"
            cid = cid if cid not in seen else f"{cid}_{i}"  # each call answered under its own id
            seen.add(cid)
            out["tool_calls"].append({"id": cid,
                                      "type": "function",
                                      "function": {"name": (valid_text(getattr(fn, "name", None)) or "")[:128],
                                                   "arguments": _kept(valid_text(getattr(fn, "arguments", None)))
                                                   or "{}"}})
    return out


def redacted(messages: list[dict[str, Any]], values: list[str]) -> list[dict[str, Any]]:
    """A copy of ``messages`` whose every string (contents, text parts, tool-call arguments) has the secrets'
    values replaced by ``[redacted]``; ``messages`` itself unchanged."""
    from kbench_evolve.prompt import redact

    if not values:
        return messages

    def clean(x: Any) -> Any:
        if isinstance(x, str):
            return redact(x, values)
        if isinstance(x, list):
            return [clean(v) for v in x]
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        return x

    return [clean(m) for m in messages]


#: the largest token count taken from a provider; beyond it the count is not believed (and estimated instead)
MAX_COUNT = 10**15


def _count(value: Any) -> int | None:
    """A token count a provider reported: a whole number in [0, MAX_COUNT), else None (missing, negative, NaN,
    infinite, 10**400, a string that is not a plain number, a list...). Never raises."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 0 <= value < MAX_COUNT else None
    if isinstance(value, float):
        return int(value) if math.isfinite(value) and 0 <= value < MAX_COUNT else None
    if isinstance(value, str):
        text = value.strip()
        if 0 < len(text) <= 16 and text.isascii() and text.isdigit():
            return int(text)
        try:
            number = float(text) if len(text) <= 32 else math.nan
        except ValueError:
            return None
        return int(number) if math.isfinite(number) and 0 <= number < MAX_COUNT else None
    return None


def _cost(value: Any) -> float | None:
    """A cost computed from a provider's numbers: a finite float >= 0 (negative is 0), else None (unknown)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    if not math.isfinite(number):
        return None
    return max(0.0, number)


# -- the call's deadline and the reply's size, enforced where the body is read ------------------------------------

#: bytes of one reply's body read at most (the text kept is REPLY_CHARS characters; JSON escapes, tool calls and
#: the envelope around it fit well within)
REPLY_BYTES = 16 * 2**20
#: seconds past the deadline the caller waits for the call's thread before it stops waiting
DEADLINE_SLACK = 0.25

_current = threading.local()  # the deadline and byte limit of the call made in this thread


class ReplyTooLarge(Exception):
    """A reply's body went past :data:`REPLY_BYTES`: the rest is not read."""


class CallDeadline(TimeoutError):
    """A model call ran past the deadline kbench sets for it (classified transient, like a provider timeout)."""


def _bounded_client():
    """An httpx client whose transport stops reading a reply at its call's deadline and past REPLY_BYTES."""
    import httpx

    class BoundedStream(httpx.SyncByteStream):
        def __init__(self, inner, deadline: float | None, limit: int) -> None:
            self.inner, self.deadline, self.limit = inner, deadline, limit

        def __iter__(self):
            size = 0
            for chunk in self.inner:
                size += len(chunk)
                if self.deadline is not None and time.monotonic() > self.deadline:
                    raise httpx.ReadTimeout("the model call's deadline passed while the reply was being read")
                if size > self.limit:
                    raise ReplyTooLarge(f"the provider's reply is larger than {self.limit:,} bytes; the rest was "
                                        f"not read")
                yield chunk

        def close(self) -> None:
            close = getattr(self.inner, "close", None)
            if close is not None:
                close()

    class BoundedTransport(httpx.BaseTransport):
        def __init__(self) -> None:
            self.inner = httpx.HTTPTransport()

        def handle_request(self, request):
            response = self.inner.handle_request(request)
            deadline = getattr(_current, "deadline", None)
            limit = getattr(_current, "limit", REPLY_BYTES)
            response.stream = BoundedStream(response.stream, deadline, limit)
            return response

        def close(self) -> None:
            self.inner.close()

    return httpx.Client(transport=BoundedTransport())


_client_lock = threading.Lock()


def install_bounded_client(litellm) -> None:
    """Make litellm's OpenAI-compatible calls read replies through :func:`_bounded_client` (once; a client the
    user set is left alone)."""
    with _client_lock:
        if getattr(litellm, "client_session", None) is None:
            litellm.client_session = _bounded_client()
            litellm.client_session._kbench_bounded = True


def call_with_deadline(fn: Callable[..., Any], kwargs: dict[str, Any], seconds: float) -> Any:
    """``fn(**kwargs)`` in a thread, given up at ``seconds`` (+ :data:`DEADLINE_SLACK`): :class:`CallDeadline`.
    The thread's reads stop at the deadline too (the bounded client), so a call given up does not read on."""
    deadline = time.monotonic() + seconds
    box: dict[str, Any] = {}

    def run() -> None:
        _current.deadline, _current.limit = deadline, REPLY_BYTES
        try:
            box["value"] = fn(**kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            if time.monotonic() >= deadline:  # the read stopped at the deadline: say so, whatever wrapped it
                late = CallDeadline(f"no whole reply within the call's deadline of {seconds:g} s (--llm-timeout)")
                late.__cause__ = exc
                exc = late
            box["error"] = exc

    thread = threading.Thread(target=run, name="kbench-evolve-model-call", daemon=True)
    thread.start()
    thread.join(max(0.0, deadline - time.monotonic()) + DEADLINE_SLACK)
    if thread.is_alive():
        raise CallDeadline(f"no whole reply within the call's deadline of {seconds:g} s (--llm-timeout)")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def uses_cache_control(model: str) -> bool:
    """Providers that cache a prompt prefix only where the request marks it (Anthropic's models);
    OpenAI-style providers cache long prefixes automatically."""
    m = model.lower()
    return m.startswith(("anthropic/", "bedrock/anthropic", "vertex_ai/claude")) or m.startswith("claude")


def with_cache_control(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A copy with ``cache_control`` breakpoints on the system prompt, the brief and the newest message
    (at most 3 of Anthropic's 4): each call then re-reads the conversation so far from the cache."""
    out = [dict(m) for m in messages]
    marks = {0, 1, len(out) - 1} if len(out) > 1 else {0}
    for i in sorted(marks):
        m = out[i]
        if isinstance(m.get("content"), str) and m["content"]:
            m["content"] = [{"type": "text", "text": m["content"], "cache_control": {"type": "ephemeral"}}]
    return out


def model_priced(litellm, model: str) -> bool:
    try:
        info = litellm.get_model_info(model)
    except Exception:  # noqa: BLE001 - litellm raises for models it does not know
        return False
    return bool(info.get("input_cost_per_token") or info.get("output_cost_per_token"))


def preflight(model: str, api_base: str | None, *, max_cost: float | None,
              prices: tuple[float, float] | None) -> None:
    """Refuse at once what would otherwise fail later: a missing API key, an unpriced model under --max-cost."""
    litellm = import_litellm()
    if model.startswith("kbench-replay/"):
        return
    try:
        env = litellm.validate_environment(model=model, api_base=api_base)
    except Exception:  # noqa: BLE001 - a provider litellm cannot check: the first call will say
        env = {"missing_keys": []}
    missing = [k for k in env.get("missing_keys") or []
               if not (api_base and k.upper().endswith(("_API_BASE", "_BASE_URL", "_BASE")))]
    if missing:
        raise BadInput(f"no API key for model {model}: {', '.join(missing)} is not set", where="--model",
                       fix=KEY_HINT)
    if max_cost is not None and prices is None and not model_priced(litellm, model):
        raise BadInput(f"--max-cost needs the price of {model}, which litellm's price table does not know "
                       f"(a self-hosted or new model): its cost would be unknown and the budget never reached",
                       where="--max-cost",
                       fix="give --price-input and --price-output (USD per million tokens; 0 for a free local "
                           "model), register the model with litellm custom pricing, or use --max-tokens")


class LLMClient:
    """One model, with the run's budgets: every call is accounted in ``ctx.spent``."""

    def __init__(self, ctx, *, model: str, api_base: str | None = None, timeout: float = 120.0,
                 retries: int = 4, backoff: float = 2.0, max_backoff: float = 300.0,
                 price_input: float | None = None, price_output: float | None = None,
                 sleep: Callable[[float], None] = time.sleep, **_ignored: Any) -> None:
        self.ctx = ctx
        self.model = model
        self.api_base = api_base
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.prices = (price_input, price_output) if price_input is not None and price_output is not None else None
        self.sleep = sleep
        self.last_call: dict[str, Any] = {}
        from kbench_evolve.prompt import secret_values

        # values of secret-looking variables (the environment's, a .env here or above the lineage): never sent
        self.secrets = secret_values(places=[os.getcwd(), ctx.lineage.root])
        # a run saved by an older kbench may hold negative counts (a provider's negative usage): never below zero
        ctx.spent.tokens = max(0, int(ctx.spent.tokens or 0))
        ctx.spent.cost = max(0.0, float(ctx.spent.cost or 0.0))

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, *,
                 compact: Callable[[list[dict[str, Any]]], bool] | None = None) -> dict[str, Any]:
        """One model reply as a message dict. ``compact(messages)`` shrinks the conversation in place
        after a context overflow (True when it removed something)."""
        litellm = import_litellm()
        last: BaseException | None = None
        attempt = 0
        overflows = 0
        while attempt <= self.retries:
            self.ctx.check_budget()
            sent = redacted(messages, self.secrets)
            kwargs: dict[str, Any] = {"model": self.model, "timeout": self.timeout, "num_retries": 0,
                                      "max_retries": 0,
                                      "messages": with_cache_control(sent) if uses_cache_control(self.model) else sent}
            if tools:
                kwargs["tools"] = tools
            if self.api_base:
                kwargs["api_base"] = self.api_base
            started = time.time()
            install_bounded_client(litellm)
            try:
                response = call_with_deadline(litellm.completion, kwargs, self.timeout)
            except Exception as exc:  # noqa: BLE001 - every provider error is classified below
                kind = classify(litellm, exc)
                self._log_error(exc, attempt, kind)
                if kind == "overflow" and compact is not None and overflows < 4 and compact(messages):
                    overflows += 1
                    self.ctx.echo(f"  ! context window exceeded: conversation compacted, call repeated "
                                  f"({_short(exc)})")
                    continue
                if kind in ("fatal", "overflow"):
                    what = "context window exceeded and nothing left to compact" if kind == "overflow" else \
                        "the model provider refused the request"
                    raise ProviderRejected(f"{what} ({type(exc).__name__}): {_short(exc, 400)}",
                                           where="--model",
                                           fix=f"check --model ({self.model}), --api-base and the key "
                                               f"({KEY_HINT}); then `kbench evolve resume "
                                               f"{self.ctx.lineage.name}`, which may change --model") from None
                last = exc
                if attempt < self.retries:
                    wait = min(self.backoff * 2 ** attempt, self.max_backoff)
                    self.ctx.echo(f"  ! model call failed ({type(exc).__name__}: {_short(exc, 120)}); "
                                  f"retry {attempt + 1}/{self.retries} in {wait:.0f} s")
                    self.sleep(wait)
                attempt += 1
                continue
            try:
                reply = message_to_dict(response.choices[0].message)
            except (AttributeError, IndexError, TypeError) as exc:  # no choices, no message: a broken reply
                reply = {"role": "assistant", "content": f"(the provider's reply had no message: {type(exc).__name__})"}
            self._account(litellm, response, started, sent, reply)
            return reply
        raise LLMUnavailable(f"model {self.model} unavailable after {self.retries + 1} attempts: "
                             f"{type(last).__name__}: {_short(last, 200)}")

    def _account(self, litellm, response, started: float, sent: list[dict[str, Any]], reply: dict[str, Any]) -> None:
        """Count the call's tokens and cost. A count the provider did not report, or reported as zero, negative
        or not a number, is estimated from the text (litellm's token counter) and the call is marked
        ``usage_estimated``; tokens and costs are never below zero."""
        usage = getattr(response, "usage", None)
        prompt, completion = _count(getattr(usage, "prompt_tokens", None)), _count(getattr(usage, "completion_tokens", None))
        estimated = not prompt or completion is None or (completion == 0 and _reply_text(reply))
        if estimated:
            prompt = prompt or self._estimate(litellm, messages=sent)
            if completion is None or completion == 0:
                completion = self._estimate(litellm, text=_reply_text(reply)) if _reply_text(reply) else 0
        details = getattr(usage, "prompt_tokens_details", None)
        cached = _count(getattr(details, "cached_tokens", None)) or _count(getattr(usage, "cache_read_input_tokens", None)) or 0
        cost: float | None
        if self.prices is not None:
            cost = (prompt * self.prices[0] + completion * self.prices[1]) / 1e6
        else:
            try:
                if estimated:
                    cost = sum(litellm.cost_per_token(model=self.model, prompt_tokens=prompt,
                                                      completion_tokens=completion))
                else:
                    cost = litellm.completion_cost(completion_response=response, model=self.model)
            except Exception:  # noqa: BLE001 - an unpriced model: tokens still count, cost is unknown
                cost = None
        cost = _cost(cost)  # NaN, infinite or not a number: unknown, not counted; negative: 0
        spent = self.ctx.spent
        spent.tokens += prompt + completion
        if cost is None:
            spent.unpriced_calls += 1
        else:
            spent.cost += cost
        if estimated:
            usage_state = self.ctx.state.setdefault("usage", {})
            usage_state["estimated_calls"] = int(usage_state.get("estimated_calls") or 0) + 1
            self.ctx.echo(f"  ! the provider reported no usable token counts ({_short(usage, 120)}); "
                          f"estimated from the text: {prompt} + {completion} tokens")
        self.last_call = {"time": now_iso(), "latency_s": round(time.time() - started, 3), "model": self.model,
                          "prompt_tokens": prompt, "completion_tokens": completion, "cached_tokens": cached,
                          "cost": cost, **({"usage_estimated": True} if estimated else {})}
        self.ctx.save()

    def _estimate(self, litellm, **what: Any) -> int:
        try:
            return max(0, int(litellm.token_counter(model=self.model, **what)))
        except Exception:  # noqa: BLE001 - a tokenizer litellm cannot load: about 4 characters a token
            text = what.get("text") or " ".join(str(m.get("content") or "") for m in what.get("messages") or [])
            return max(1, len(text) // 4)

    def _log_error(self, exc: BaseException, attempt: int, kind: str) -> None:
        append_jsonl(self.ctx.lineage.root / "llm-errors.jsonl",
                     {"time": now_iso(), "model": self.model, "attempt": attempt, "kind": kind,
                      "error": type(exc).__name__, "status_code": getattr(exc, "status_code", None),
                      "message": str(exc)[:500]})


def _reply_text(reply: dict[str, Any]) -> str:
    """What the model wrote: its text and its tool calls (for estimating the completion's tokens)."""
    calls = " ".join(f"{c['function']['name']} {c['function']['arguments']}" for c in reply.get("tool_calls") or [])
    return ((reply.get("content") or "") + " " + calls).strip()


def _short(exc: Any, n: int = 200) -> str:
    """An error's message on one line, without a traceback a library put inside it (litellm quotes one)."""
    text = str(exc).split("Traceback (most recent call last)")[0]
    return " ".join(text.split())[:n]


def tool_schema(name: str, description: str, properties: dict[str, Any] | None = None,
                required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description,
                                             "parameters": {"type": "object", "properties": properties or {},
                                                            "required": list(required)}}}

