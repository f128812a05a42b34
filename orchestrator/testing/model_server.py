"""A scripted model server: real agents talk to it instead of a model provider, offline.

It speaks enough of three HTTP APIs for real coding agents to run against it:

- OpenAI Chat Completions: ``POST /v1/chat/completions`` (and ``/chat/completions``),
  streaming (SSE chunks, tool calls with their arguments in pieces, a final usage chunk when
  ``stream_options.include_usage``) or not; ``GET /v1/models``;
- Anthropic Messages: ``POST /v1/messages`` streaming (``message_start``,
  ``content_block_start``/``_delta``/``_stop`` with ``text_delta`` and ``input_json_delta``,
  ``message_delta`` with the stop reason and usage, ``message_stop``) or not;
  ``POST /v1/messages/count_tokens``;
- the Gemini API (Gemini CLI): ``POST /v1beta/models/{model}:streamGenerateContent?alt=sse``
  (one server-sent event per response: text in pieces, then the ``functionCall`` part, the
  finish reason and ``usageMetadata``), ``:generateContent`` and ``:countTokens``.

What it answers is scripted. A :class:`Scenario` is chosen per request by a marker word in a
user message of the conversation, and its :attr:`Scenario.actions` are played one per model
request: the number of assistant messages after the marked user message is the index of the
action to play, so one server serves many sessions at once without any per-session state.
Actions are abstract (:class:`Read`, :class:`Edit`, :class:`Write`, :class:`Shell`,
:class:`Reply`, :class:`Stall`; :class:`Tool` calls any tool by name); the tool that carries
one is picked from the ``tools`` the request offers (each agent names its tools differently:
``read_file`` or ``Read`` or ``mcp__acp__Read``) and its arguments are filled from the tool's
JSON schema. Paths are relative to the session's directory, which is read from the request
(agents state it in their system prompt). Requests without tools (titles, summaries,
suggestions) get a short plain text.

Every request is recorded (:attr:`ModelServer.requests`). Requests in proxy form (an absolute URI
in the request line, or ``CONNECT host:port``) are refused with 403 and recorded in
:attr:`ModelServer.refused`: point ``HTTP_PROXY``/``HTTPS_PROXY``/``ALL_PROXY`` at the server to
prove that an agent sends nothing off the machine. The server binds to 127.0.0.1 only.

Use it from tests::

    edit = Scenario("MARKER-EDIT", (Edit("a.py", "x", "y"), Reply("done")))
    with serve_model_thread([edit]) as srv:
        env = {"OPENAI_BASE_URL": srv.url + "/v1", "ANTHROPIC_BASE_URL": srv.url,
               "GOOGLE_GEMINI_BASE_URL": srv.url}
        ...
    assert srv.requests

or from a shell: ``python -m orchestrator.testing.model_server --port 8765 [--scenarios F.json]``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import select
import socket
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from http.server import BaseHTTPRequestHandler
from urllib.parse import urlsplit

import trio
from attrs import define, field

from orchestrator.errors import UsageError
from orchestrator.testing._model_http import _Handler, _Httpd
from orchestrator.testing._model_script import (
    CWD_PATTERNS,
    TOOL_NAMES,
    Action,
    Edit,
    ModelRequest,
    Read,
    Refused,
    Reply,
    Rule,
    Scenario,
    Shell,
    Stall,
    Tool,
    ToolChoice,
    Write,
    _conversation,
    choose_tool,
    find_cwd,
    scenarios_from_json,
)

from .._log import get_logger

__all__ = [
    "CWD_PATTERNS",
    "LOCALHOST",
    "TOOL_NAMES",
    "Action",
    "Edit",
    "ModelRequest",
    "ModelServer",
    "Read",
    "Refused",
    "Reply",
    "Rule",
    "Scenario",
    "Shell",
    "Stall",
    "Tool",
    "ToolChoice",
    "UnsafeBind",
    "Write",
    "choose_tool",
    "find_cwd",
    "main",
    "open_model_server",
    "scenarios_from_json",
    "serve_model_thread",
]

log = get_logger(__name__)

#: the only address the server binds to
LOCALHOST = "127.0.0.1"


class UnsafeBind(UsageError):
    """The server was asked to listen on an address other than 127.0.0.1."""


# --------------------------------------------------------------------------- the server


@define
class ModelServer:
    """The scripted model server; :func:`serve_model_thread` runs one in a thread."""

    scenarios: Sequence[Scenario] = ()
    rules: Sequence[Rule] = ()
    #: text for requests without tools (titles, summaries...) and unmarked conversations
    plain_text: str = "OK"
    port: int = 0
    #: text delta size when streaming (small, so clients see several deltas)
    chunk: int = 12
    _requests: list[ModelRequest] = field(factory=list, init=False)
    _refused: list[Refused] = field(factory=list, init=False)
    _lock: threading.Lock = field(factory=threading.Lock, init=False)
    _httpd: _Httpd | None = field(default=None, init=False)
    _thread: threading.Thread | None = field(default=None, init=False)
    _closing: threading.Event = field(factory=threading.Event, init=False)
    _stalled: threading.Event = field(factory=threading.Event, init=False)
    _stalls_ended: list[str] = field(factory=list, init=False)
    _active_stalls: int = field(default=0, init=False)
    _stall_changed: threading.Condition = field(init=False)
    _ids: Iterator[int] = field(factory=itertools.count, init=False)
    _started: float = field(factory=time.monotonic, init=False)

    def __attrs_post_init__(self) -> None:
        self._stall_changed = threading.Condition(self._lock)

    # ---- lifecycle

    def start(self, host: str = LOCALHOST) -> None:
        """Bind and serve in a daemon thread (127.0.0.1 only)."""
        if host != LOCALHOST:
            raise UnsafeBind(f"the model server binds to {LOCALHOST} only, not {host!r}")
        httpd = _Httpd((LOCALHOST, self.port), _Handler)
        httpd.model = self
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="model-server",
            daemon=True,
        )
        self._thread.start()
        log.info("model server listening", url=self.url)

    def close(self) -> None:
        """Stop serving; stalled requests end and open connections are closed."""
        httpd = self._httpd
        if httpd is None:
            return
        self._closing.set()
        httpd.shutdown()
        httpd.close_connections()
        httpd.server_close()
        with self._stall_changed:
            # handler threads are daemons: wait for stalled ones to record how they ended
            self._stall_changed.wait_for(lambda: self._active_stalls == 0, timeout=10)
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._httpd = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` (no trailing slash, no ``/v1``)."""
        if self._httpd is None:
            raise UsageError("the model server is not running")
        return f"http://{LOCALHOST}:{self._httpd.server_address[1]}"

    # ---- what happened

    @property
    def requests(self) -> list[ModelRequest]:
        """Every model request so far, in arrival order."""
        with self._lock:
            return list(self._requests)

    @property
    def refused(self) -> list[Refused]:
        """Every proxy-form request refused so far."""
        with self._lock:
            return list(self._refused)

    @property
    def stalls_ended(self) -> list[str]:
        """How each stalled request ended: ``client closed`` or ``server closed``."""
        with self._lock:
            return list(self._stalls_ended)

    def tool_requests(self) -> list[ModelRequest]:
        """The requests that offered tools (the agent's main loop, not side requests)."""
        return [r for r in self.requests if r.tool_names]

    def wait_stalled(self, timeout: float | None = None) -> bool:
        """Block until some request stalls (or ``timeout``); whether one did."""
        return self._stalled.wait(timeout)

    def wait_stalls_ended(self, count: int = 1, timeout: float | None = None) -> bool:
        """Block until ``count`` stalled requests have ended (or ``timeout``); whether they did."""
        with self._stall_changed:
            return self._stall_changed.wait_for(lambda: len(self._stalls_ended) >= count, timeout)

    async def wait_for_stall(self) -> None:
        """Wait (in trio) until some request stalls; cancel it with a cancel scope."""
        while not self._stalled.is_set():
            await trio.to_thread.run_sync(self._stalled.wait, 0.5, abandon_on_cancel=True)

    # ---- deciding

    def _now(self) -> float:
        return round(time.monotonic() - self._started, 3)

    def _record_refused(self, method: str, target: str) -> None:
        if method == "CONNECT":
            host = target.rsplit(":", 1)[0].strip("[]")
        else:
            host = urlsplit(target).hostname or target
        with self._lock:
            self._refused.append(Refused(method, target, host, self._now()))
        log.warning("proxy request refused", method=method, target=target)

    def _decide(self, request: ModelRequest) -> ModelRequest:
        """The request with the scenario, step, action and tool call chosen for it."""
        chosen = self._choose(request)
        if chosen is None:
            decided = request
        else:
            name, step, action = chosen
            tool = choose_tool(action, request)
            if isinstance(action, Read | Edit | Write | Shell | Tool) and tool is None:
                # the agent offers no tool for it: say so instead of failing the turn
                log.warning("no tool for action", action=action, tools=request.tool_names)
                action = Reply(f"I have no tool to {type(action).__name__.lower()}.")
            decided = ModelRequest(
                api=request.api,
                path=request.path,
                headers=request.headers,
                body=request.body,
                t=request.t,
                scenario=name,
                step=step,
                action=action,
                tool_call=tool,
            )
        with self._lock:
            self._requests.append(decided)
        log.info(
            "model request",
            api=request.api,
            stream=request.stream,
            tools=request.tool_names,
            scenario=decided.scenario,
            step=decided.step,
            action=decided.action,
        )
        return decided

    def _choose(self, request: ModelRequest) -> tuple[str, int, Action] | None:
        if not request.tool_names:
            return None
        for rule in self.rules:
            if rule.when(request):
                return rule.name, 0, rule.action
        conversation = _conversation(request.api, request.body)
        last_role, last_text = conversation[-1] if conversation else ("", "")
        if last_role == "user" and not any(s.marker in last_text for s in self.scenarios):
            # a side request appended to a scripted conversation (a suggestion, a memory
            # extraction...): answering it with the script's next action would replay it
            return None
        for index in range(len(conversation) - 1, -1, -1):
            role, text = conversation[index]
            if role != "user":
                continue
            scenario = next((s for s in self.scenarios if s.marker in text), None)
            if scenario is None:
                continue
            step = sum(1 for r, _ in conversation[index + 1 :] if r == "assistant")
            if step < len(scenario.actions):
                return scenario.marker, step, scenario.actions[step]
            return scenario.marker, step, Reply(scenario.done)
        return None

    def _stall(self, handler: BaseHTTPRequestHandler) -> None:
        """Hold the request open until the client closes it or the server closes."""
        with self._stall_changed:
            self._active_stalls += 1
        self._stalled.set()
        reason = "server closed"
        while not self._closing.is_set():
            try:
                readable, _, _ = select.select([handler.connection], [], [], 0.05)
                if readable and not handler.connection.recv(1, socket.MSG_PEEK):
                    reason = "client closed"
                    break
            except (OSError, ValueError):
                reason = "client closed"
                break
        if self._closing.is_set():
            reason = "server closed"  # closing shuts the connections down: not the client
        with self._stall_changed:
            self._stalls_ended.append(reason)
            self._active_stalls -= 1
            self._stall_changed.notify_all()
        log.info("stalled request ended", reason=reason)

    def _new_id(self, prefix: str) -> str:
        return f"{prefix}{next(self._ids)}_{uuid.uuid4().hex[:8]}"


# --------------------------------------------------------------------------- running it


@contextmanager
def serve_model_thread(
    scenarios: Sequence[Scenario] = (),
    *,
    rules: Sequence[Rule] = (),
    plain_text: str = "OK",
    host: str = LOCALHOST,
    port: int = 0,
) -> Iterator[ModelServer]:
    """Run a :class:`ModelServer` in a background thread for the duration of the block."""
    server = ModelServer(scenarios, rules, plain_text=plain_text, port=port)
    server.start(host)
    try:
        yield server
    finally:
        server.close()


@asynccontextmanager
async def open_model_server(
    scenarios: Sequence[Scenario] = (),
    *,
    rules: Sequence[Rule] = (),
    plain_text: str = "OK",
    host: str = LOCALHOST,
    port: int = 0,
) -> AsyncIterator[ModelServer]:
    """:func:`serve_model_thread` for trio code: starting and stopping do not block the loop."""
    server = ModelServer(scenarios, rules, plain_text=plain_text, port=port)
    await trio.to_thread.run_sync(server.start, host)
    try:
        yield server
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(server.close)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m orchestrator.testing.model_server --port N [--scenarios FILE.json]``."""
    parser = argparse.ArgumentParser(
        prog="python -m orchestrator.testing.model_server",
        description="Serve scripted OpenAI, Anthropic and Gemini model APIs on 127.0.0.1.",
    )
    parser.add_argument("--port", type=int, default=0, help="port (default: a free one)")
    parser.add_argument("--scenarios", help="a JSON scenario file (see scenarios_from_json)")
    parser.add_argument("--text", default="OK", help="the reply to unscripted requests")
    args = parser.parse_args(argv)
    scenarios: list[Scenario] = []
    if args.scenarios:
        with open(args.scenarios, encoding="utf-8") as f:
            scenarios = scenarios_from_json(json.load(f))
    server = ModelServer(scenarios, plain_text=args.text, port=args.port)
    server.start()
    print(server.url, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0
    finally:
        server.close()


if __name__ == "__main__":
    sys.exit(main())
