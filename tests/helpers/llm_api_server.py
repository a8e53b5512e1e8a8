"""A real local HTTP server speaking the Anthropic Messages API (`/v1/messages`) and the
OpenAI chat completions API (`/v1/chat/completions`), with scripted replies and errors.

Tests queue `Reply` objects; each request takes the next one (a plain success once the
queue is empty) and is recorded with its headers and JSON body. A request with
`"stream": true` is answered with server-sent events, as the real APIs do: the text in
pieces, optionally slowly (`piece_delay_s`) or stalling after some pieces (`stall_after`)
until the client hangs up or the server stops; `hangups` counts clients that hung up.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from htam_engine.llm import Provider, RetryPolicy, make_provider

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
    tool_input: dict[str, Any] | None = None  # Anthropic: answer with this tool call
    finish: str = "stop"  # "length": cut off at max_tokens (Anthropic: "max_tokens")
    piece_delay_s: float = 0.0
    stall_after: int | None = None
    stall_silent: bool = False  # stall without a byte (else SSE comments keep it alive)
    usage: bool = True  # OpenAI stream: send the usage chunk when asked for it
    message: str = ""  # the error message (default: "scripted <status>")
    reasoning: str = ""  # OpenAI stream: chain of thought first, as reasoning_content


@dataclass
class Request:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


def _anthropic_body(reply: Reply, model: str) -> dict[str, Any]:
    if reply.status >= 400:
        kind = "rate_limit_error" if reply.status == 429 else "api_error"
        message = reply.message or f"scripted {reply.status}"
        return {"type": "error", "error": {"type": kind, "message": message}}
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
        message = reply.message or f"scripted {reply.status}"
        return {"error": {"message": message, "type": "server_error"}}
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


PIECE = 8  # characters per streamed piece


def _pieces(text: str) -> list[str]:
    return [text[i : i + PIECE] for i in range(0, len(text), PIECE)] or [""]


def _openai_events(reply: Reply, body: dict[str, Any]) -> list[dict[str, Any]]:
    head = {"id": "chatcmpl-test", "object": "chat.completion.chunk", "created": 0}
    head["model"] = body.get("model", "")

    def chunk(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    thinking = _pieces(reply.reasoning) if reply.reasoning else []
    events = [chunk({"content": None, "reasoning_content": p}, None) for p in thinking]
    events += [chunk({"role": "assistant", "content": p}, None) for p in _pieces(reply.text)]
    events.append(chunk({}, reply.finish))
    if reply.usage and (body.get("stream_options") or {}).get("include_usage"):
        usage = {"prompt_tokens": reply.input_tokens, "completion_tokens": reply.output_tokens}
        usage["total_tokens"] = reply.input_tokens + reply.output_tokens
        events.append({**head, "choices": [], "usage": usage})
    return events


def _anthropic_events(reply: Reply, body: dict[str, Any]) -> list[dict[str, Any]]:
    message = _anthropic_body(reply, body.get("model", "")) | {"content": []}
    message["usage"] = {"input_tokens": reply.input_tokens, "output_tokens": 1}
    if reply.tool_input is not None:
        name = (body.get("tool_choice") or {}).get("name", "tool")
        block = {"type": "tool_use", "id": "toolu_test", "name": name, "input": {}}
        text = json.dumps(reply.tool_input)
        deltas = [{"type": "input_json_delta", "partial_json": p} for p in _pieces(text)]
    else:
        block = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": p} for p in _pieces(reply.text)]
    stop = "max_tokens" if reply.finish == "length" else "end_turn"
    return [
        {"type": "message_start", "message": message},
        {"type": "content_block_start", "index": 0, "content_block": block},
        *({"type": "content_block_delta", "index": 0, "delta": d} for d in deltas),
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop, "stop_sequence": None},
            "usage": {"output_tokens": reply.output_tokens},
        },
        {"type": "message_stop"},
    ]


def sse(event: dict[str, Any], anthropic: bool) -> bytes:
    name = f"event: {event['type']}\n" if anthropic else ""
    return f"{name}data: {json.dumps(event)}\n\n".encode()


class ScriptedAPIServer:
    """127.0.0.1 on an ephemeral port, in a daemon thread; use as a context manager."""

    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.requests: list[Request] = []
        self.hangups = 0
        self.in_flight = 0
        self.max_in_flight = 0  # the most requests served at once (best-of-k is parallel)
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._server.block_on_close = False
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

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
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()

    def _next(self, request: Request) -> Reply:
        with self._lock:
            self.requests.append(request)
            return self.replies.popleft() if self.replies else Reply()

    def _hung_up(self) -> None:
        with self._lock:
            self.hangups += 1

    def _stream(self, handler: BaseHTTPRequestHandler, reply: Reply, body: dict[str, Any]) -> None:
        """Server-sent events, one piece at a time; a stall waits until the client hangs
        up (the next write fails) or the server stops."""
        anthropic = handler.path == ANTHROPIC_PATH
        events = (_anthropic_events if anthropic else _openai_events)(reply, body)
        payloads = [sse(event, anthropic) for event in events]
        if not anthropic:
            payloads.append(b"data: [DONE]\n\n")
        handler.send_response(200)
        handler.send_header("content-type", "text/event-stream")
        handler.end_headers()
        for index, payload in enumerate(payloads):
            if reply.stall_after is not None and index >= reply.stall_after:
                while not self._stopping.wait(0.05):
                    if not reply.stall_silent:
                        handler.wfile.write(b": ping\n\n")  # an SSE comment: no data
                        handler.wfile.flush()
                return
            handler.wfile.write(payload)
            handler.wfile.flush()
            time.sleep(reply.piece_delay_s)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                headers = {k.lower(): v for k, v in self.headers.items()}
                reply = server._next(Request(self.path, headers, body))
                with server._lock:
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    self._answer(reply, body)
                finally:
                    with server._lock:
                        server.in_flight -= 1

            def _answer(self, reply: Reply, body: dict[str, Any]) -> None:
                if self.path not in (ANTHROPIC_PATH, OPENAI_PATH):
                    reply = Reply(status=404, raw_body=b'{"error": "no such endpoint"}')
                time.sleep(reply.delay_s)
                try:
                    if body.get("stream") and reply.status < 400 and reply.raw_body is None:
                        server._stream(self, reply, body)
                        return
                except (BrokenPipeError, ConnectionResetError):
                    server._hung_up()
                    return
                make = _anthropic_body if self.path == ANTHROPIC_PATH else _openai_body
                payload = reply.raw_body or json.dumps(make(reply, body.get("model", ""))).encode()
                try:
                    self.send_response(reply.status)
                    streamed = body.get("stream") and reply.status < 400
                    kind = "text/event-stream" if streamed else "application/json"
                    self.send_header("content-type", kind)
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


KEYS = {"anthropic": "ANTHROPIC_API_KEY", "openai": "OPENAI_API_KEY"}


def sdk_provider(kind: str, server: ScriptedAPIServer, **options: Any) -> Provider:
    """A real provider (official SDK) of `kind` talking to `server`: no cache, fast
    retries unless `options` (make_provider's keywords) say otherwise."""
    env = {KEYS[kind]: "sk-test-0123456789abcdef", **options.pop("env", {})}
    url = server.url if kind == "anthropic" else server.url + "/v1"
    options.setdefault("cache", False)
    options.setdefault("retry", RetryPolicy(attempts=3, base_s=0.01, sleep=lambda _s: None))
    made, _line = make_provider(kind, base_url=url, env=env, **options)
    assert made is not None
    return made
