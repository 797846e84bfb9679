"""A litellm provider that replays a script of model responses: offline tests and demos.

Registered in ``litellm.custom_provider_map`` as provider ``kbench-replay``; the model id is
``kbench-replay/script`` (priced with a nominal cost so cost tracking is exercised). Each script
item is one response::

    {"content": "text"}
    {"tool_calls": [{"name": "write_candidate", "arguments": {"patch": "..."}}], "content": "why"}
    {"error": "rate_limit" | "timeout" | "connection" | "server", "message": "..."}
    {"usage": {"prompt_tokens": 900, "completion_tokens": 100}, ...}   (optional, any item)

The position in the script is kept in a file, so a killed and resumed run continues the script.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PROVIDER = "kbench-replay"
MODEL = f"{PROVIDER}/script"
PRICE = {"input_cost_per_token": 1e-6, "output_cost_per_token": 4e-6}


def _error(litellm, kind: str, message: str) -> Exception:
    if kind == "rate_limit":
        return litellm.RateLimitError(message, llm_provider=PROVIDER, model=MODEL)
    if kind == "timeout":
        return litellm.Timeout(message, model=MODEL, llm_provider=PROVIDER)
    if kind == "connection":
        return litellm.APIConnectionError(message, llm_provider=PROVIDER, model=MODEL)
    return litellm.InternalServerError(message, llm_provider=PROVIDER, model=MODEL)


def make_provider(script: list[dict[str, Any]], position_file: Path | None = None):
    from kbench_evolve.llm import import_litellm

    litellm = import_litellm()
    from litellm import CustomLLM, ModelResponse
    from litellm.types.utils import ChatCompletionMessageToolCall, Choices, Function, Message, Usage

    class Replay(CustomLLM):
        def __init__(self) -> None:
            super().__init__()
            self.script = script
            self.position_file = position_file
            self.requests: list[list[dict[str, Any]]] = []  # messages of every call, for tests

        @property
        def position(self) -> int:
            if self.position_file and self.position_file.is_file():
                return int(json.loads(self.position_file.read_text())["position"])
            return getattr(self, "_pos", 0)

        def _advance(self, value: int) -> None:
            self._pos = value
            if self.position_file:
                from kbench_evolve.store import atomic_write_text

                atomic_write_text(self.position_file, json.dumps({"position": value}))

        def completion(self, model, messages, *args, **kwargs):
            self.requests.append(list(messages))
            pos = self.position
            if pos >= len(self.script):
                raise _error(litellm, "server", "replay script exhausted")
            item = self.script[pos]
            self._advance(pos + 1)
            if "error" in item:
                raise _error(litellm, item["error"], item.get("message", item["error"]))
            calls = [ChatCompletionMessageToolCall(id=f"call_{pos}_{i}", type="function",
                                                   function=Function(name=c["name"],
                                                                     arguments=json.dumps(c.get("arguments", {}))))
                     for i, c in enumerate(item.get("tool_calls", []))]
            message = Message(role="assistant", content=item.get("content"), tool_calls=calls or None)
            prompt = sum(len(str(m.get("content") or "")) for m in messages) // 4
            usage = item.get("usage", {"prompt_tokens": prompt, "completion_tokens": 50})
            return ModelResponse(model=MODEL, choices=[Choices(index=0, message=message,
                                                               finish_reason="tool_calls" if calls else "stop")],
                                 usage=Usage(prompt_tokens=usage["prompt_tokens"],
                                             completion_tokens=usage["completion_tokens"],
                                             total_tokens=usage["prompt_tokens"] + usage["completion_tokens"]))

    provider = Replay()
    litellm.custom_provider_map = [p for p in litellm.custom_provider_map if p.get("provider") != PROVIDER]
    litellm.custom_provider_map.append({"provider": PROVIDER, "custom_handler": provider})
    from litellm.utils import custom_llm_setup

    custom_llm_setup()
    litellm.register_model({MODEL: {**PRICE, "litellm_provider": PROVIDER, "mode": "chat", "max_tokens": 8192}})
    return provider


def install_script(path: str | Path, position_file: Path | None = None):
    from kbench.api import read_json

    script = read_json(path, limit=64 * 2**20, what="LLM script")
    return make_provider(script, position_file)
