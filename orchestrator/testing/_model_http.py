"""The HTTP side of the model server: routes, proxy refusal, OpenAI, Anthropic, Gemini answers.

Part of :mod:`orchestrator.testing.model_server` (import from there).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from orchestrator.testing import _model_gemini as gemini
from orchestrator.testing._model_script import (
    Api,
    ModelRequest,
    Reply,
    Stall,
    ToolChoice,
)

from .._log import get_logger

if TYPE_CHECKING:
    from orchestrator.testing.model_server import ModelServer

log = get_logger(__name__)


class _Httpd(ThreadingHTTPServer):
    daemon_threads = True
    model: ModelServer

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(address, handler)
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            self._open.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._open_lock:
            self._open.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        """Shut down every open connection (keep-alive readers would linger otherwise)."""
        with self._open_lock:
            sockets = list(self._open)
        for sock in sockets:
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def _estimate_tokens(value: Any) -> int:
    return max(1, len(json.dumps(value, ensure_ascii=False)) // 4)


def _token_counts(body: Mapping[str, Any], text: str, call: ToolChoice | None) -> tuple[int, int]:
    """Estimated input and output tokens of an answer (about four characters a token)."""
    return _estimate_tokens(body.get("messages")), max(1, len(text) // 4 + (20 if call else 0))


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Httpd

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http", line=format % args)

    @property
    def model(self) -> ModelServer:
        return self.server.model

    # ---- dispatch

    def _proxy_form(self) -> bool:
        """Refuse CONNECT and absolute-URI requests: nothing is forwarded anywhere."""
        if self.command == "CONNECT" or "://" in self.path.split("?", 1)[0]:
            self.model._record_refused(self.command, self.path)
            self.close_connection = True
            self._send_json(403, {"error": {"message": "proxying is refused"}}, close=True)
            return True
        return False

    def do_CONNECT(self) -> None:
        """A proxy tunnel request: refused."""
        self._proxy_form()

    def do_GET(self) -> None:
        """``/v1/models`` and a health check."""
        if self._proxy_form():
            return
        path = urlsplit(self.path).path.rstrip("/")
        if path in ("/v1/models", "/models"):
            models = [{"id": "scripted-model", "object": "model", "created": 0, "owned_by": "test"}]
            self._send_json(200, {"object": "list", "data": models})
        elif path in ("", "/health"):
            self._send_json(200, {"ok": True})
        else:
            self._send_json(404, {"error": {"message": f"no route {path}"}})

    def do_HEAD(self) -> None:
        """Some clients probe the base URL."""
        if self._proxy_form():
            return
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        """The model APIs."""
        if self._proxy_form():
            return
        path = urlsplit(self.path).path.rstrip("/")
        try:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw or b"{}")
        except (ValueError, OSError):
            self._send_json(400, {"error": {"message": "invalid JSON body"}})
            return
        if not isinstance(body, dict):
            self._send_json(400, {"error": {"message": "the body must be an object"}})
            return
        if path.endswith(gemini.COUNT):
            self._send_json(200, {"totalTokens": gemini.estimate_tokens(body)})
            return
        if path.endswith("/messages/count_tokens"):
            self._send_json(200, {"input_tokens": _estimate_tokens(body.get("messages"))})
            return
        api: Api
        if gemini.is_gemini_path(path):
            api = "gemini"
        elif path.endswith("/chat/completions"):
            api = "openai"
        elif path.endswith("/messages"):
            api = "anthropic"
        else:
            self._send_json(404, {"error": {"message": f"no route {path}"}})
            return
        headers = {k.lower(): v for k, v in self.headers.items()}
        request = ModelRequest(api, path, headers, body, self.model._now())
        decided = self.model._decide(request)
        if api == "openai":
            self._answer_openai(decided)
        elif api == "gemini":
            self._answer_gemini(decided)
        else:
            self._answer_anthropic(decided)

    # ---- plumbing

    def _send_json(self, status: int, obj: Any, *, close: bool = False) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if close:
            self.send_header("Connection", "close")
        self.end_headers()
        with suppress(OSError):
            self.wfile.write(data)
            self.wfile.flush()

    def _start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _end_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _stream(self, events: Iterator[bytes], stall: bool) -> None:
        try:
            self._start_stream()
            for event in events:
                self._chunk(event)
            if stall:
                self.model._stall(self)
                self.close_connection = True
                return
            self._end_stream()
        except OSError:
            self.close_connection = True  # the client went away mid-stream

    # ---- OpenAI

    def _answer_openai(self, request: ModelRequest) -> None:
        body = request.body
        model = str(body.get("model") or "scripted-model")
        text, call = _reply_parts(request, self.model.plain_text)
        prompt_tokens, completion_tokens = _token_counts(body, text, call)
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        finish = "tool_calls" if call else "stop"
        ident, created = self.model._new_id("chatcmpl-"), int(time.time())
        stall = isinstance(request.action, Stall)
        call_id = self.model._new_id("call_") if call else ""
        if not request.stream:
            if stall:
                self.model._stall(self)
                self.close_connection = True
                return
            message: dict[str, Any] = {"role": "assistant", "content": text or None}
            if call:
                message["tool_calls"] = [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
                    }
                ]
            self._send_json(
                200,
                {
                    "id": ident,
                    "object": "chat.completion",
                    "created": created,
                    "model": model,
                    "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                    "usage": usage,
                },
            )
            return
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and bool(options.get("include_usage"))

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
            obj = {
                "id": ident,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
            }
            return b"data: " + json.dumps(obj).encode() + b"\n\n"

        def events() -> Iterator[bytes]:
            yield chunk({"role": "assistant", "content": ""})
            if text:
                for piece in _pieces(text, self.model.chunk):
                    yield chunk({"content": piece})
            if stall:
                return
            if call:
                head = {"index": 0, "id": call_id, "type": "function"}
                yield chunk(
                    {"tool_calls": [{**head, "function": {"name": call.name, "arguments": ""}}]}
                )
                for piece in _pieces(json.dumps(call.arguments), self.model.chunk):
                    yield chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
            yield chunk({}, finish)
            if include_usage:
                last = {
                    "id": ident,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": model,
                    "choices": [],
                    "usage": usage,
                }
                yield b"data: " + json.dumps(last).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"

        self._stream(events(), stall)

    # ---- Gemini

    def _answer_gemini(self, request: ModelRequest) -> None:
        """Answer ``:generateContent`` or ``:streamGenerateContent``."""
        text, call = _reply_parts(request, self.model.plain_text)
        stall = isinstance(request.action, Stall)
        facts: dict[str, Any] = {
            "model": gemini.model_name(request.path),
            "ident": self.model._new_id("resp_"),
            "call_id": self.model._new_id("call_") if call else "",
            "tokens": gemini.estimate_tokens(request.body),
        }
        if request.stream:
            events = gemini.stream_events(text, call, chunk=self.model.chunk, stall=stall, **facts)
            self._stream(events, stall)
        elif stall:
            self.model._stall(self)
            self.close_connection = True
        else:
            self._send_json(200, gemini.whole_answer(text, call, **facts))

    # ---- Anthropic

    def _answer_anthropic(self, request: ModelRequest) -> None:
        body = request.body
        model = str(body.get("model") or "scripted-model")
        text, call = _reply_parts(request, self.model.plain_text)
        input_tokens, output_tokens = _token_counts(body, text, call)
        stop_reason = "tool_use" if call else "end_turn"
        ident = self.model._new_id("msg_")
        tool_id = self.model._new_id("toolu_") if call else ""
        stall = isinstance(request.action, Stall)
        if not request.stream:
            if stall:
                self.model._stall(self)
                self.close_connection = True
                return
            content: list[dict[str, Any]] = []
            if text:
                content.append({"type": "text", "text": text})
            if call:
                content.append(
                    {"type": "tool_use", "id": tool_id, "name": call.name, "input": call.arguments}
                )
            self._send_json(
                200,
                {
                    "id": ident,
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": content,
                    "stop_reason": stop_reason,
                    "stop_sequence": None,
                    "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
                },
            )
            return

        def event(name: str, data: dict[str, Any]) -> bytes:
            return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()

        def events() -> Iterator[bytes]:
            start: dict[str, Any] = {
                "id": ident,
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": input_tokens, "output_tokens": 1},
            }
            yield event("message_start", {"type": "message_start", "message": start})
            yield event("ping", {"type": "ping"})
            index = 0
            if text:
                yield event(
                    "content_block_start",
                    {
                        "type": "content_block_start",
                        "index": index,
                        "content_block": {"type": "text", "text": ""},
                    },
                )
                for piece in _pieces(text, self.model.chunk):
                    yield event(
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": index,
                            "delta": {"type": "text_delta", "text": piece},
                        },
                    )
                if not stall:
                    yield event(
                        "content_block_stop", {"type": "content_block_stop", "index": index}
                    )
                index += 1
            if stall:
                return
            if call:
                block = {"type": "tool_use", "id": tool_id, "name": call.name, "input": {}}
                yield event(
                    "content_block_start",
                    {"type": "content_block_start", "index": index, "content_block": block},
                )
                for piece in _pieces(json.dumps(call.arguments), self.model.chunk):
                    yield event(
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": index,
                            "delta": {"type": "input_json_delta", "partial_json": piece},
                        },
                    )
                yield event("content_block_stop", {"type": "content_block_stop", "index": index})
            yield event(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                    "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
                },
            )
            yield event("message_stop", {"type": "message_stop"})

        self._stream(events(), stall)


def _reply_parts(request: ModelRequest, plain: str) -> tuple[str, ToolChoice | None]:
    """The text and the tool call of the answer."""
    action = request.action
    if action is None:
        return plain, None
    if isinstance(action, Reply | Stall):
        return action.text, None
    call = request.tool_call
    return "", call
