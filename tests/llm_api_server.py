"""A real local HTTP server speaking the Anthropic Messages API (`/v1/messages`) and the
OpenAI chat completions API (`/v1/chat/completions`), with scripted replies and errors.

Tests queue `Reply` objects; each request takes the next one (a plain success once the
queue is empty) and is recorded with its headers and JSON body.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ANTHROPIC_PATH = "/v1/messages"
OPENAI_PATH = "/v1/chat/completions"


@dataclass
class Reply:
    """One scripted answer: a success (`text`, usage) or an error (`status` >= 400),
    optionally delayed, with extra headers, or a raw (malformed) body."""

    text: str = "ok"
    input_tokens: int = 11
    output_tokens: int = 7
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    raw_body: bytes | None = None


@dataclass
class Request:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


def _anthropic_body(reply: Reply, model: str) -> dict[str, Any]:
    if reply.status >= 400:
        kind = "rate_limit_error" if reply.status == 429 else "api_error"
        return {"type": "error", "error": {"type": kind, "message": f"scripted {reply.status}"}}
    return {
        "id": "msg_test",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": reply.text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": reply.input_tokens, "output_tokens": reply.output_tokens},
    }


def _openai_body(reply: Reply, model: str) -> dict[str, Any]:
    if reply.status >= 400:
        return {"error": {"message": f"scripted {reply.status}", "type": "server_error"}}
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": reply.text},
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": reply.input_tokens,
            "completion_tokens": reply.output_tokens,
            "total_tokens": reply.input_tokens + reply.output_tokens,
        },
    }


class ScriptedAPIServer:
    """127.0.0.1 on an ephemeral port, in a daemon thread; use as a context manager."""

    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._server.block_on_close = False
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def script(self, *replies: Reply) -> None:
        self.replies.extend(replies)

    def __enter__(self) -> ScriptedAPIServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _next(self, request: Request) -> Reply:
        with self._lock:
            self.requests.append(request)
            return self.replies.popleft() if self.replies else Reply()

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                headers = {k.lower(): v for k, v in self.headers.items()}
                reply = server._next(Request(self.path, headers, body))
                if self.path not in (ANTHROPIC_PATH, OPENAI_PATH):
                    reply = Reply(status=404, raw_body=b'{"error": "no such endpoint"}')
                time.sleep(reply.delay_s)
                make = _anthropic_body if self.path == ANTHROPIC_PATH else _openai_body
                payload = reply.raw_body or json.dumps(make(reply, body.get("model", ""))).encode()
                try:
                    self.send_response(reply.status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(payload)))
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client timed out and hung up, as the test intended

            def log_message(self, format: str, *args: Any) -> None:
                return

        return Handler
