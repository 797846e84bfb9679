"""A scripted OpenAI-compatible chat-completions server on 127.0.0.1, for tests through litellm's HTTP path.

Each POST to ``/v1/chat/completions`` takes the next scripted item (``reply(...)`` or ``error(...)``)
unless its model is in ``reject`` (then 404, as a provider answers for an unknown model). Every
request body is kept in ``requests``.
"""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def reply(content: str | None = None, tool_calls: list[tuple[str, dict]] = (), *, prompt_tokens: int = 1000,
          completion_tokens: int = 100) -> tuple[int, dict[str, Any]]:
    calls = [{"id": f"call_{i}_{name}", "type": "function",
              "function": {"name": name, "arguments": json.dumps(args)}} for i, (name, args) in enumerate(tool_calls)]
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    return 200, {"id": "chatcmpl-test", "object": "chat.completion", "created": 1700000000, "model": "scripted",
                 "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
                 "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                           "total_tokens": prompt_tokens + completion_tokens}}


def error(status: int, message: str, code: str | None = None) -> tuple[int, dict[str, Any]]:
    return status, {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}


def drip(seconds_per_byte: float = 2.0, size: int = 10_000):
    """A provider that sends its headers at once, then the body one byte every ``seconds_per_byte`` (never a
    read timeout, a body that would take hours)."""
    import time

    def respond(handler) -> None:
        body = json.dumps(reply("GIVE UP: slow")[1]).encode().ljust(size)
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        try:
            for i in range(len(body)):
                handler.wfile.write(body[i:i + 1])
                handler.wfile.flush()
                time.sleep(seconds_per_byte)
        except OSError:  # the client hung up: what a deadline does
            pass

    return respond


def huge(size: int = 80 * 2**20):
    """A provider whose reply is ``size`` bytes (its content mostly one long string), sent in 1 MiB pieces made
    once (the server itself never holds the whole body)."""
    def respond(handler) -> None:
        head = json.dumps(reply("x")[1]).encode()
        cut = head.index(b'"x"') + 2  # inside the content string, after its "x"
        piece = b"y" * (1 << 20)
        filler = size - len(head)
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(head) + filler))
        handler.end_headers()
        try:
            handler.wfile.write(head[:cut])
            while filler > 0:
                handler.wfile.write(piece[:filler])
                filler -= len(piece)
            handler.wfile.write(head[cut:])
        except OSError:  # the client stopped reading: what the bound does
            pass

    return respond


CONTEXT_OVERFLOW = error(400, "This model's maximum context length is 8192 tokens. However, your messages "
                              "resulted in 9100 tokens. Please reduce the length of the messages.",
                         "context_length_exceeded")


class ScriptedOpenAI:
    def __init__(self, script: list[tuple[int, dict]], *, reject: tuple[str, ...] = ()) -> None:
        self.script = list(script)
        self.reject = reject
        self.requests: list[dict[str, Any]] = []
        self.arrivals: list[float] = []  # time.monotonic() of each request's arrival (its body read)
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                server.requests.append(body)
                server.arrivals.append(time.monotonic())
                if not self.path.endswith("/chat/completions"):
                    status, payload = error(404, f"no route {self.path}")
                elif body.get("model") in server.reject:
                    status, payload = error(404, f"The model `{body['model']}` does not exist or you do not "
                                                 f"have access to it.", "model_not_found")
                elif not server.script:
                    status, payload = error(500, "the test script is exhausted")
                else:
                    item = server.script.pop(0)
                    if callable(item):  # a misbehaving provider: writes its own response
                        item(self)
                        return
                    status, payload = item
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):  # quiet
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> ScriptedOpenAI:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
