"""A scripted ACP v1 agent, to test ACP clients offline (in memory or as a subprocess).

It plays an :class:`~orchestrator.testing.script.AgentScript` (see that module for the
script format) and keeps its own small JSON-RPC code, independent of the orchestrator's
client, so a framing bug in the client cannot be mirrored here.

- In memory: ``record = await serve_scripted_agent(stream, script)`` serves one
  connection over any ``trio.abc.Stream`` (e.g. one end of
  ``trio.testing.memory_stream_pair()``) and returns when the stream closes.
- As a process: ``python -m orchestrator.testing.scripted_agent SCRIPT.json`` speaks on
  stdin/stdout and logs to stderr; ``scripted_agent_command(script, directory)`` writes
  the script there and returns that command line.

The end of the client's stream ends the agent at once, running turns included, as real
agents do when their stdin closes. The client's requests are served while a turn runs (a
``session/cancel`` or any answer can arrive while the turn waits): ``session/prompt`` and
``session/load`` run as tasks; other requests are answered in arrival order.

The record
----------
Everything the agent received and decided is an event: a JSON object with an ``"event"``
key, kept in :class:`AgentRecord` and appended as JSON lines to the script's
``record_path`` (if set). Events and their fields:

``recv`` {message} every JSON message received; ``parse_error`` {line};
``line_too_long``; ``initialize`` {protocolVersion, clientCapabilities, clientInfo};
``authenticate`` {methodId, ok}; ``logout``; ``session_new`` / ``session_load`` /
``session_resume`` {sessionId, cwd, mcpServers}; ``session_list`` {cwd};
``session_close`` / ``session_delete`` {sessionId}; ``set_mode`` {sessionId, modeId};
``set_config_option`` {sessionId, configId, value}; ``method_not_found`` {method};
``notification_ignored`` {method}; ``cancel_request`` {requestId};
``prompt`` {sessionId, turn (index or -1), text, prompt}; ``cancel`` {sessionId, running};
``turn_end`` {sessionId, stopReason | error, cancelled};
``response`` {id, method, result | error, late} for every answer to the agent's own
requests (``late``: the agent had stopped waiting, e.g. after a cancel);
``unexpected_response`` {message}; ``permission`` {sessionId, toolCallId, decision
(allow | reject | cancelled | invalid), optionId, optionKind, answer};
``fs_read`` {sessionId, path, content | error}; ``fs_write`` {sessionId, path, content,
result | error}; ``disk_write`` {path | error}; ``disk_delete`` {path, existed};
``terminal`` {sessionId, command, terminalId, exitStatus, output, truncated, killed,
cancelled | error, stage}; ``request`` {method, result | error}; ``stderr`` {text};
``eof``; ``peer_gone``; ``crash`` {exit_code}; ``exit`` {exit_code}.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Literal

import attrs
import orjson
import structlog
import trio
from attrs import define, field

from orchestrator.errors import (
    AuthRequired,
    InvalidParams,
    InvalidRequest,
    JsonRpcError,
    MethodNotFound,
    ParseError,
    UsageError,
)
from orchestrator.testing.script import (
    AgentScript,
    AskPermission,
    Crash,
    DeleteDisk,
    Flood,
    HugeLine,
    JsonObject,
    Notify,
    PermissionToolCall,
    Plan,
    Raw,
    ReadFile,
    Request,
    Say,
    Sleep,
    Stall,
    Step,
    Terminal,
    Think,
    ToolCall,
    ToolUpdate,
    Turn,
    Update,
    Usage,
    UserMessage,
    WriteDisk,
    WriteFile,
    terminal_content,
)

__all__ = ["MAX_LINE_BYTES", "AgentRecord", "scripted_agent_command", "serve_scripted_agent"]

log = structlog.get_logger(__name__)

MAX_LINE_BYTES = 64 * 1024 * 1024
"""Longest line the agent accepts from the client; longer ones are dropped (-32600)."""

_RECEIVE_SIZE = 65536
_FLOOD_BATCH_BYTES = 1 << 20
_CLEANUP_GRACE = 2.0  # seconds to kill/release a terminal after a cancel


@define
class AgentRecord:
    """What a scripted agent received and decided: a list of JSON events (see module docs)."""

    events: list[JsonObject] = field(factory=list)
    """Every event, in order."""
    exit_code: int | None = None
    """The exit status the agent ended with (0 after a normal EOF); None while it runs."""
    _sink: IO[bytes] | None = field(default=None, repr=False)
    _changed: trio.Event = field(factory=trio.Event, repr=False)

    def add(self, event: str, **fields: Any) -> JsonObject:
        """Append an event (and write it to the record file, if any)."""
        entry: JsonObject = {"event": event, **fields}
        self.events.append(entry)
        if self._sink is not None:
            # Synchronous on purpose: tiny appends that must survive an abrupt exit.
            self._sink.write(orjson.dumps(entry) + b"\n")
            self._sink.flush()
        self._changed.set()
        self._changed = trio.Event()
        return entry

    def of(self, event: str) -> list[JsonObject]:
        """All events of one kind."""
        return [e for e in self.events if e["event"] == event]

    def first(self, event: str) -> JsonObject:
        """The first event of one kind; raises LookupError if there is none."""
        for e in self.events:
            if e["event"] == event:
                return e
        raise LookupError(f"no {event!r} event in the record")

    async def wait_for(self, event: str, count: int = 1) -> JsonObject:
        """Wait until ``count`` events of one kind were recorded; return the last of them."""
        while len(found := self.of(event)) < count:
            await self._changed.wait()
        return found[count - 1]

    @classmethod
    def from_jsonl(cls, path: str | os.PathLike[str]) -> AgentRecord:
        """Load the record a subprocess agent wrote to its ``record_path``."""
        lines = Path(path).read_bytes().splitlines()
        return cls(events=[orjson.loads(line) for line in lines if line.strip()])


async def serve_scripted_agent(
    stream: trio.abc.Stream, script: AgentScript, *, record: AgentRecord | None = None
) -> AgentRecord:
    """Play ``script`` as the agent side of ``stream`` until it closes; return the record.

    Pass your own ``record`` to watch events while the agent runs (``record.wait_for``).
    A ``crash`` step or ``exit_at_start`` closes the stream abruptly and sets
    ``record.exit_code``.
    """
    return await _serve(stream, script, record or AgentRecord(), _log_stderr)


def scripted_agent_command(script: AgentScript, directory: Path) -> list[str]:
    """Write ``script`` as JSON into ``directory`` and return the command that runs it."""
    data = orjson.dumps(script.to_json(), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)
    path = Path(directory) / f"agent-script-{hashlib.sha256(data).hexdigest()[:16]}.json"
    path.write_bytes(data)
    return [sys.executable, "-m", "orchestrator.testing.scripted_agent", str(path)]


# --------------------------------------------------------------------------- internals


class _Crash(Exception):
    def __init__(self, exit_code: int, stderr: str):
        super().__init__(f"scripted crash with exit code {exit_code}")
        self.exit_code = exit_code
        self.stderr = stderr


class _PeerGone(Exception):
    """The client closed its side while the agent was writing."""


class _LineSplitter:
    """Sans-I/O: bytes in, complete lines out (None stands for a dropped oversized line)."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._buf = bytearray()
        self._scanned = 0
        self._dropping = False

    def feed(self, data: bytes | bytearray) -> list[bytes | None]:
        self._buf += data
        lines: list[bytes | None] = []
        while (end := self._buf.find(b"\n", self._scanned)) >= 0:
            line = bytes(self._buf[:end])
            del self._buf[: end + 1]
            self._scanned = 0
            oversized = self._dropping or len(line) > self._limit
            self._dropping = False
            lines.append(None if oversized else line)
        self._scanned = len(self._buf)
        if self._scanned > self._limit:
            self._buf.clear()
            self._scanned = 0
            self._dropping = True
        return lines

    def close(self) -> list[bytes | None]:
        rest = bytes(self._buf)
        self._buf.clear()
        return [None] if self._dropping else ([rest] if rest.strip() else [])


@define
class _Pending:
    method: str
    done: trio.Event = field(factory=trio.Event)
    reply: JsonObject = field(factory=dict)
    abandoned: bool = False


@define
class _TurnState:
    ignore_cancel: bool
    scope: trio.CancelScope = field(factory=trio.CancelScope)
    cancel_requested: bool = False


@define
class _Session:
    id: str
    cwd: str
    mode: str | None
    config: list[JsonObject]
    prompts: int = 0
    turn: _TurnState | None = None

    def resolve(self, path: str) -> str:
        return os.path.join(self.cwd, path)


def _log_stderr(text: str) -> None:
    log.info("scripted agent stderr", text=text)


def _write_stderr(text: str) -> None:
    sys.stderr.write(text if text.endswith("\n") else text + "\n")
    sys.stderr.flush()


def _split(text: str, pieces: int) -> list[str]:
    n = max(1, min(pieces, len(text)))
    return [text[i * len(text) // n : (i + 1) * len(text) // n] for i in range(n)]


def _outcome(reply: JsonObject) -> JsonObject:
    return {"error": reply["error"]} if "error" in reply else {"result": reply.get("result")}


def _text_chunk(kind: str, text: str) -> JsonObject:
    return {"sessionUpdate": kind, "content": {"type": "text", "text": text}}


def _id_key(value: Any) -> tuple[str, Any]:
    return (type(value).__name__, value)  # 0, 0.0, False and "0" are different ids


def _abs_path(value: Any) -> str:
    if not isinstance(value, str) or not os.path.isabs(value):
        raise InvalidParams("cwd must be an absolute path")
    return value


def _str_param(params: JsonObject, name: str) -> str:
    value = params.get(name)
    if not isinstance(value, str):
        raise InvalidParams(f"{name} must be a string")
    return value


async def _serve(
    stream: trio.abc.Stream,
    script: AgentScript,
    record: AgentRecord,
    stderr: Callable[[str], None],
) -> AgentRecord:
    sink = open(script.record_path, "ab") if script.record_path else None  # noqa: ASYNC230, SIM115
    record._sink = sink
    try:
        await _Agent(stream, script, record, stderr).run()
    finally:
        record._sink = None
        if sink is not None:
            sink.close()
    return record


@define
class _Agent:
    stream: trio.abc.Stream
    script: AgentScript
    record: AgentRecord
    stderr: Callable[[str], None]
    sessions: dict[str, _Session] = field(factory=dict)
    pending: dict[tuple[str, Any], _Pending] = field(factory=dict)
    next_id: int = 0
    next_session: int = 1
    authenticated: bool = False
    lock: trio.Lock = field(factory=trio.Lock)
    nursery: trio.Nursery | None = None

    # ------------------------------------------------------------------ lifecycle

    async def run(self) -> None:
        crash: _Crash | None = None
        try:
            if self.script.exit_at_start is not None:
                ex = self.script.exit_at_start
                if ex.wait_for_initialize:
                    await self._read_first_message()
                crash = _Crash(ex.exit_code, ex.stderr)
            else:
                async with trio.open_nursery() as nursery:
                    self.nursery = nursery
                    await self._read_loop()
                    self.record.add("eof")
                    nursery.cancel_scope.cancel()
        except* _Crash as group:
            crash = _first_leaf(group)
        except* _PeerGone:
            self.record.add("peer_gone")
        if crash is not None:
            if crash.stderr:
                self.record.add("stderr", text=crash.stderr)
                self.stderr(crash.stderr)
            self.record.add(
                "crash" if self.script.exit_at_start is None else "exit", exit_code=crash.exit_code
            )
            self.record.exit_code = crash.exit_code
            await trio.aclose_forcefully(self.stream)
            return
        self.record.exit_code = 0
        with trio.move_on_after(_CLEANUP_GRACE, shield=True):
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await self.stream.aclose()

    async def _read_first_message(self) -> None:
        splitter = _LineSplitter(MAX_LINE_BYTES)
        while data := await self._receive():
            for line in splitter.feed(data):
                if line is not None and line.strip():
                    self.record.add("recv", message=_loads_or_text(line))
                    return

    async def _receive(self) -> bytes | bytearray:
        try:
            return await self.stream.receive_some(_RECEIVE_SIZE)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return b""

    async def _read_loop(self) -> None:
        splitter = _LineSplitter(MAX_LINE_BYTES)
        while data := await self._receive():
            for line in splitter.feed(data):
                await self._handle_line(line)
        for line in splitter.close():
            await self._handle_line(line)

    # ------------------------------------------------------------------ wire

    async def _send_bytes(self, data: bytes) -> None:
        async with self.lock:
            with trio.CancelScope(shield=True):
                try:
                    await self.stream.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    raise _PeerGone from exc

    async def _send(self, message: JsonObject) -> None:
        await self._send_bytes(orjson.dumps(message) + b"\n")

    async def _reply(self, req_id: Any, result: JsonObject) -> None:
        await self._send({"jsonrpc": "2.0", "id": req_id, "result": result})

    async def _reply_error(self, req_id: Any, error: JsonRpcError) -> None:
        await self._send({"jsonrpc": "2.0", "id": req_id, "error": error.to_error_object()})

    async def _update(self, session: _Session, update: JsonObject) -> None:
        params = {"sessionId": session.id, "update": update}
        await self._send({"jsonrpc": "2.0", "method": "session/update", "params": params})

    async def _request(self, method: str, params: Any) -> JsonObject:
        """Send one of the agent's own requests; return the answer message."""
        n = self.next_id
        self.next_id += 1
        req_id: int | str = n if self.script.id_style == "int" else str(uuid.UUID(int=n, version=4))
        pending = _Pending(method)
        self.pending[_id_key(req_id)] = pending
        message: JsonObject = {"jsonrpc": "2.0", "id": req_id, "method": method}
        if params is not None:
            message["params"] = params
        await self._send(message)
        try:
            await pending.done.wait()
        finally:
            # Still pending: remember, so that the late answer is recorded as such.
            pending.abandoned = not pending.done.is_set()
        return pending.reply

    # ------------------------------------------------------------------ incoming

    async def _handle_line(self, line: bytes | None) -> None:
        if line is None:
            self.record.add("line_too_long")
            await self._reply_error(None, InvalidRequest("message too large"))
            return
        if not line.strip():
            return
        try:
            message = orjson.loads(line)
        except orjson.JSONDecodeError:
            self.record.add("parse_error", line=line[:500].decode("utf-8", "replace"))
            await self._reply_error(None, ParseError())
            return
        self.record.add("recv", message=message)
        if not isinstance(message, dict):
            await self._reply_error(None, InvalidRequest("a message must be a JSON object"))
            return
        method = message.get("method")
        if method is None and "id" in message and ("result" in message or "error" in message):
            self._on_response(message)
        elif not isinstance(method, str):
            await self._reply_error(message.get("id"), InvalidRequest("method must be a string"))
        elif "id" in message:
            await self._on_request(message["id"], method, message.get("params"))
        else:
            await self._on_notification(method, message.get("params"))

    def _on_response(self, message: JsonObject) -> None:
        pending = self.pending.pop(_id_key(message["id"]), None)
        if pending is None:
            self.record.add("unexpected_response", message=message)
            return
        pending.reply = message
        self.record.add(
            "response",
            id=message["id"],
            method=pending.method,
            late=pending.abandoned,
            **_outcome(message),
        )
        pending.done.set()

    async def _on_request(self, req_id: Any, method: str, params: Any) -> None:
        handler = self._handlers().get(method)
        try:
            if handler is None:
                self.record.add("method_not_found", method=method)
                raise MethodNotFound(f"method not found: {method}")
            if params is None:
                params = {}
            if not isinstance(params, dict):
                raise InvalidParams("params must be an object")
            result = await handler(req_id, params)
        except JsonRpcError as exc:
            await self._reply_error(req_id, exc)
            return
        if result is not None:
            await self._reply(req_id, result)

    async def _on_notification(self, method: str, params: Any) -> None:
        params = params if isinstance(params, dict) else {}
        if method == "session/cancel":
            session_id = params.get("sessionId")
            session = self.sessions.get(session_id) if isinstance(session_id, str) else None
            turn = session.turn if session else None
            self.record.add("cancel", sessionId=session_id, running=turn is not None)
            if turn is not None:
                turn.cancel_requested = True
                if not turn.ignore_cancel:
                    turn.scope.cancel()
        elif method == "$/cancel_request":
            self.record.add("cancel_request", requestId=params.get("requestId"))
        else:
            self.record.add("notification_ignored", method=method)

    # ------------------------------------------------------------------ client -> agent methods

    def _handlers(self) -> dict[str, Callable[[Any, JsonObject], Any]]:
        return {
            "initialize": self._initialize,
            "authenticate": self._authenticate,
            "logout": self._logout,
            "session/new": self._session_new,
            "session/load": self._session_load,
            "session/list": self._session_list,
            "session/resume": self._session_resume,
            "session/close": self._session_close,
            "session/delete": self._session_delete,
            "session/set_mode": self._set_mode,
            "session/set_config_option": self._set_config_option,
            "session/prompt": self._prompt,
        }

    async def _initialize(self, _: Any, params: JsonObject) -> JsonObject:
        version = params.get("protocolVersion")
        if not isinstance(version, int) or isinstance(version, bool):
            raise InvalidParams("protocolVersion must be an integer")
        self.record.add(
            "initialize",
            protocolVersion=version,
            clientCapabilities=params.get("clientCapabilities"),
            clientInfo=params.get("clientInfo"),
        )
        if self.script.initialize_delay:
            await trio.sleep(self.script.initialize_delay)
        s, c = self.script, self.script.capabilities
        gates = {
            "list": c.session_list,
            "resume": c.session_resume,
            "close": c.session_close,
            "delete": c.session_delete,
        }
        info: JsonObject = {"name": s.name, "version": s.version}
        if s.title is not None:
            info["title"] = s.title
        return {
            "protocolVersion": s.protocol_version,
            "agentCapabilities": {
                "loadSession": c.load_session,
                "promptCapabilities": {
                    "image": c.image,
                    "audio": c.audio,
                    "embeddedContext": c.embedded_context,
                },
                "mcpCapabilities": {"http": c.mcp_http, "sse": c.mcp_sse},
                "sessionCapabilities": {name: {} for name, on in gates.items() if on},
                "auth": {"logout": {}} if c.logout else {},
            },
            "authMethods": [m.to_json() for m in s.auth_methods],
            "agentInfo": info,
        }

    async def _authenticate(self, _: Any, params: JsonObject) -> JsonObject:
        method_id = _str_param(params, "methodId")
        ok = method_id in {m.id for m in self.script.auth_methods}
        self.record.add("authenticate", methodId=method_id, ok=ok)
        if not ok:
            raise InvalidParams(f"unknown auth method: {method_id}")
        self.authenticated = True
        return {}

    async def _logout(self, _: Any, params: JsonObject) -> JsonObject:
        self._gate(self.script.capabilities.logout, "logout")
        self.record.add("logout")
        self.authenticated = False
        return {}

    def _gate(self, enabled: bool, method: str) -> None:
        if not enabled:
            self.record.add("method_not_found", method=method)
            raise MethodNotFound(f"method not advertised: {method}")

    def _check_auth(self) -> None:
        if self.script.require_auth and not self.authenticated:
            raise AuthRequired("authenticate first")

    def _open_session(self, session_id: str, cwd: str) -> _Session:
        s = self.script
        current = s.current_mode or (s.modes[0].id if s.modes else None)
        config = [{"type": o.type, **o.to_json()} for o in s.config_options]  # type is required
        session = _Session(session_id, cwd, current, config)
        self.sessions[session_id] = session
        return session

    def _session_state(self, session: _Session) -> JsonObject:
        state: JsonObject = {}
        if self.script.modes:
            modes = [m.to_json() for m in self.script.modes]
            state["modes"] = {"currentModeId": session.mode, "availableModes": modes}
        if session.config:
            state["configOptions"] = session.config
        return state

    def _session_params(self, event: str, params: JsonObject, new: bool) -> _Session:
        self._check_auth()
        cwd = _abs_path(params.get("cwd"))
        servers = params.get("mcpServers")
        if not isinstance(servers, list) and (event != "session_resume" or servers is not None):
            raise InvalidParams("mcpServers must be an array")
        if new:
            session_id = f"{self.script.session_id_prefix}{self.next_session}"
            self.next_session += 1
        else:
            session_id = _str_param(params, "sessionId")
        self.record.add(event, sessionId=session_id, cwd=cwd, mcpServers=servers)
        return self._open_session(session_id, cwd)

    async def _session_new(self, _: Any, params: JsonObject) -> JsonObject:
        session = self._session_params("session_new", params, new=True)
        return {"sessionId": session.id, **self._session_state(session)}

    async def _session_load(self, req_id: Any, params: JsonObject) -> None:
        self._gate(self.script.capabilities.load_session, "session/load")
        session = self._session_params("session_load", params, new=False)
        assert self.nursery is not None
        self.nursery.start_soon(self._replay_history, req_id, session)

    async def _replay_history(self, req_id: Any, session: _Session) -> None:
        await self._run_steps(session, self.script.load_history, _TurnState(ignore_cancel=True))
        await self._reply(req_id, self._session_state(session))

    async def _session_resume(self, _: Any, params: JsonObject) -> JsonObject:
        self._gate(self.script.capabilities.session_resume, "session/resume")
        session = self._session_params("session_resume", params, new=False)
        return self._session_state(session)

    async def _session_list(self, _: Any, params: JsonObject) -> JsonObject:
        self._gate(self.script.capabilities.session_list, "session/list")
        cwd = params.get("cwd")
        self.record.add("session_list", cwd=cwd)
        found = [s for s in self.sessions.values() if cwd is None or s.cwd == cwd]
        return {"sessions": [{"sessionId": s.id, "cwd": s.cwd} for s in found]}

    def _session(self, params: JsonObject) -> _Session:
        session_id = _str_param(params, "sessionId")
        if session_id not in self.sessions:
            raise InvalidParams(f"unknown session: {session_id}")
        return self.sessions[session_id]

    async def _session_close(self, _: Any, params: JsonObject) -> JsonObject:
        self._gate(self.script.capabilities.session_close, "session/close")
        session = self._session(params)
        self.record.add("session_close", sessionId=session.id)
        if session.turn is not None:
            session.turn.cancel_requested = True
            session.turn.scope.cancel()
        del self.sessions[session.id]
        return {}

    async def _session_delete(self, _: Any, params: JsonObject) -> JsonObject:
        self._gate(self.script.capabilities.session_delete, "session/delete")
        session_id = _str_param(params, "sessionId")
        self.record.add("session_delete", sessionId=session_id)
        self.sessions.pop(session_id, None)
        return {}

    async def _set_mode(self, _: Any, params: JsonObject) -> JsonObject:
        session = self._session(params)
        mode_id = _str_param(params, "modeId")
        if mode_id not in {m.id for m in self.script.modes}:
            raise InvalidParams(f"unknown mode: {mode_id}")
        self.record.add("set_mode", sessionId=session.id, modeId=mode_id)
        session.mode = mode_id
        await self._update(
            session, {"sessionUpdate": "current_mode_update", "currentModeId": mode_id}
        )
        return {}

    async def _set_config_option(self, _: Any, params: JsonObject) -> JsonObject:
        session = self._session(params)
        config_id = _str_param(params, "configId")
        value = params.get("value")
        option = next((o for o in session.config if o["id"] == config_id), None)
        if option is None:
            raise InvalidParams(f"unknown config option: {config_id}")
        if option.get("type", "select") == "boolean":
            valid = isinstance(value, bool)
        else:
            valid = value in {v["value"] for v in option.get("options", [])}
        if not valid:
            raise InvalidParams(f"invalid value for {config_id}: {value!r}")
        self.record.add("set_config_option", sessionId=session.id, configId=config_id, value=value)
        option["currentValue"] = value
        return {"configOptions": session.config}

    async def _prompt(self, req_id: Any, params: JsonObject) -> None:
        session = self._session(params)
        blocks = params.get("prompt")
        if not isinstance(blocks, list) or not all(isinstance(b, dict) for b in blocks):
            raise InvalidParams("prompt must be an array of content blocks")
        c = self.script.capabilities
        allowed = {"image": c.image, "audio": c.audio, "resource": c.embedded_context}
        for block in blocks:
            if not allowed.get(block.get("type"), True):
                raise InvalidParams(f"prompt capability not advertised: {block.get('type')}")
        if session.turn is not None:
            raise InvalidRequest("a prompt is already running in this session")
        text = "\n".join(b["text"] for b in blocks if b.get("type") == "text" and "text" in b)
        index, turn = self._pick_turn(session, text)
        self.record.add("prompt", sessionId=session.id, turn=index, text=text, prompt=blocks)
        # Set before the task starts, so that a cancel right behind the prompt finds it.
        session.turn = _TurnState(ignore_cancel=turn.ignore_cancel)
        assert self.nursery is not None
        self.nursery.start_soon(self._run_turn, req_id, session, turn, session.turn)

    def _pick_turn(self, session: _Session, text: str) -> tuple[int, Turn]:
        turns = self.script.turns
        for i, turn in enumerate(turns):
            if turn.when_prompt_contains is not None and turn.when_prompt_contains in text:
                return i, turn
        ordered = [(i, t) for i, t in enumerate(turns) if t.when_prompt_contains is None]
        if not ordered:
            return -1, Turn()
        pick = ordered[min(session.prompts, len(ordered) - 1)]
        session.prompts += 1
        return pick

    # ------------------------------------------------------------------ turns

    async def _run_turn(
        self, req_id: Any, session: _Session, turn: Turn, state: _TurnState
    ) -> None:
        stop_reason: str = turn.stop_reason
        with state.scope:
            ended = await self._run_steps(session, turn.steps, state)
            if ended is not None:
                stop_reason = ended
        cancelled = state.scope.cancelled_caught or (
            state.cancel_requested and not turn.ignore_cancel
        )
        if session.turn is state:
            session.turn = None
        if cancelled:
            stop_reason = turn.cancel_stop_reason
        if turn.error is not None and not cancelled:
            error = turn.error
            self.record.add(
                "turn_end", sessionId=session.id, error=error.to_json(), cancelled=False
            )
            await self._reply_error(
                req_id, JsonRpcError(error.message, error.data, code=error.code)
            )
        else:
            self.record.add(
                "turn_end", sessionId=session.id, stopReason=stop_reason, cancelled=cancelled
            )
            await self._reply(req_id, {"stopReason": stop_reason})
        after = _TurnState(ignore_cancel=True)
        await self._run_steps(session, turn.updates_after_response, after)

    async def _run_steps(
        self, session: _Session, steps: tuple[Step, ...], state: _TurnState
    ) -> str | None:
        """Run steps in order; a stop reason if one of them ended the turn early."""
        for step in steps:
            await trio.lowlevel.checkpoint_if_cancelled()
            ended = await self._run_step(session, step, state)
            if ended is not None:
                return ended
        return None

    async def _run_step(self, session: _Session, step: Step, state: _TurnState) -> str | None:
        match step:
            case Say() | Think():
                kind = "agent_message_chunk" if isinstance(step, Say) else "agent_thought_chunk"
                for piece in _split(step.text, step.chunks):
                    await self._update(session, _text_chunk(kind, piece))
            case UserMessage():
                await self._update(session, _text_chunk("user_message_chunk", step.text))
            case Plan():
                entries = [attrs.asdict(e) for e in step.entries]  # every field is required
                await self._update(session, {"sessionUpdate": "plan", "entries": entries})
            case ToolCall():
                await self._update(session, {"sessionUpdate": "tool_call"} | _tool_fields(step))
            case ToolUpdate():
                patch = {"sessionUpdate": "tool_call_update"} | _tool_fields(step)
                await self._update(session, patch)
            case Usage():
                usage = {"sessionUpdate": "usage_update", "used": step.used, "size": step.size}
                if step.cost is not None:
                    usage["cost"] = {"amount": step.cost, "currency": step.currency}
                await self._update(session, usage)
            case Update():
                await self._update(session, dict(step.update))
            case AskPermission():
                return await self._ask_permission(session, step)
            case ReadFile():
                await self._read_file(session, step)
            case WriteFile():
                await self._write_file(session, session.resolve(step.path), step.content)
            case WriteDisk():
                await self._write_disk(session, step)
            case DeleteDisk():
                target = trio.Path(session.resolve(step.path))
                try:
                    await target.unlink()
                except FileNotFoundError:
                    self.record.add("disk_delete", path=str(target), existed=False)
                else:
                    self.record.add("disk_delete", path=str(target), existed=True)
            case Terminal():
                await self._terminal(session, step, state)
            case Request():
                reply = await self._request(step.method, step.params)
                self.record.add("request", method=step.method, **_outcome(reply))
            case Notify():
                note: JsonObject = {"jsonrpc": "2.0", "method": step.method}
                if step.params is not None:
                    note["params"] = step.params
                await self._send(note)
            case HugeLine():
                await self._send_bytes(self._huge_line(session, step.size_bytes))
            case Raw():
                text = step.text if step.text.endswith("\n") else step.text + "\n"
                await self._send_bytes(text.encode())
            case Sleep():
                await trio.sleep(step.seconds)
            case Stall():
                await trio.sleep_forever()
            case Crash():
                raise _Crash(step.exit_code, step.stderr)
            case Flood():
                await self._flood(session, step)
        return None

    def _huge_line(self, session: _Session, size: int) -> bytes:
        update = _text_chunk("agent_message_chunk", "")
        message = {
            "jsonrpc": "2.0",
            "method": "session/update",
            "params": {"sessionId": session.id, "update": update},
        }
        padding = max(0, size - len(orjson.dumps(message)) - 1)
        update["content"]["text"] = "x" * padding
        return orjson.dumps(message) + b"\n"

    async def _flood(self, session: _Session, step: Flood) -> None:
        params = {"sessionId": session.id, "update": _text_chunk("agent_message_chunk", step.text)}
        line = (
            orjson.dumps({"jsonrpc": "2.0", "method": "session/update", "params": params}) + b"\n"
        )
        per_batch = max(1, _FLOOD_BATCH_BYTES // len(line))
        left = step.count
        while left > 0:
            n = min(left, per_batch)
            await self._send_bytes(line * n)
            left -= n

    async def _ask_permission(self, session: _Session, step: AskPermission) -> str | None:
        tc = step.tool_call
        tool = _tool_fields(tc)
        options = [o.to_json() for o in step.options]
        params = {"sessionId": session.id, "toolCall": tool, "options": options}
        reply = await self._request("session/request_permission", params)
        result = reply.get("result")
        outcome = result.get("outcome") if isinstance(result, dict) else None
        kinds = {o.option_id: o.kind for o in step.options}
        option_id = outcome.get("optionId") if isinstance(outcome, dict) else None
        option_kind = kinds.get(option_id) if isinstance(option_id, str) else None
        if isinstance(outcome, dict) and outcome.get("outcome") == "cancelled":
            decision = "cancelled"
        elif option_kind is not None:
            decision = "allow" if option_kind.startswith("allow") else "reject"
        else:
            decision = "invalid"
        self.record.add(
            "permission",
            sessionId=session.id,
            toolCallId=tc.id,
            decision=decision,
            optionId=option_id,
            optionKind=option_kind,
            answer=_outcome(reply),
        )
        if decision == "cancelled":
            return "cancelled"
        if decision == "allow" or step.on_reject == "continue":
            return None
        return step.on_reject

    async def _read_file(self, session: _Session, step: ReadFile) -> None:
        path = session.resolve(step.path)
        params: JsonObject = {"sessionId": session.id, "path": path}
        if step.line is not None:
            params["line"] = step.line
        if step.limit is not None:
            params["limit"] = step.limit
        reply = await self._request("fs/read_text_file", params)
        result = reply.get("result")
        content = result.get("content") if isinstance(result, dict) else None
        if not isinstance(content, str):
            self.record.add(
                "fs_read",
                sessionId=session.id,
                path=path,
                error=reply.get("error", {"message": "no content", "result": result}),
            )
            return
        self.record.add("fs_read", sessionId=session.id, path=path, content=content)
        if step.then_write is not None:
            await self._write_file(session, path, step.then_write.apply(content))

    async def _write_file(self, session: _Session, path: str, content: str) -> None:
        params = {"sessionId": session.id, "path": path, "content": content}
        reply = await self._request("fs/write_text_file", params)
        self.record.add(
            "fs_write", sessionId=session.id, path=path, content=content, **_outcome(reply)
        )

    async def _write_disk(self, session: _Session, step: WriteDisk) -> None:
        target = trio.Path(session.resolve(step.path))
        try:
            await target.parent.mkdir(parents=True, exist_ok=True)
            await target.write_bytes(step.content.encode())
        except OSError as exc:
            self.record.add("disk_write", path=str(target), error=str(exc))
        else:
            self.record.add("disk_write", path=str(target))

    async def _terminal(self, session: _Session, step: Terminal, state: _TurnState) -> None:
        params: JsonObject = {"sessionId": session.id, "command": step.command}
        if step.args is not None:
            params["args"] = list(step.args)
        if step.env:
            params["env"] = [{"name": k, "value": v} for k, v in step.env.items()]
        if step.cwd is not None:
            params["cwd"] = session.resolve(step.cwd)
        if step.output_byte_limit is not None:
            params["outputByteLimit"] = step.output_byte_limit
        event: JsonObject = {"sessionId": session.id, "command": step.command}
        created = await self._request("terminal/create", params)
        result = created.get("result")
        terminal_id = result.get("terminalId") if isinstance(result, dict) else None
        if not isinstance(terminal_id, str):
            self.record.add("terminal", **event, stage="create", **_outcome(created))
            return
        event["terminalId"] = terminal_id
        ids = {"sessionId": session.id, "terminalId": terminal_id}
        title = " ".join([step.command, *(step.args or ())])
        if step.tool_call_id is not None:
            embed = ToolCall(
                step.tool_call_id,
                title,
                kind="execute",
                status="in_progress",
                content=(terminal_content(terminal_id),),
                raw_input={"command": title},
            )
            await self._run_step(session, embed, state)
        try:
            timeout = step.timeout if step.timeout is not None else math.inf
            with trio.move_on_after(timeout) as timer:
                await self._request("terminal/wait_for_exit", ids)
            if timer.cancelled_caught:
                await self._request("terminal/kill", ids)
            output = await self._request("terminal/output", ids)
        except trio.Cancelled:
            if state.cancel_requested:  # a session/cancel, not the end of the connection
                with trio.move_on_after(_CLEANUP_GRACE, shield=True):
                    await self._request("terminal/kill", ids)
                    await self._request("terminal/release", ids)
                self.record.add("terminal", **event, cancelled=True)
            raise
        await self._request("terminal/release", ids)
        out = output.get("result")
        if not isinstance(out, dict):
            self.record.add("terminal", **event, stage="output", **_outcome(output))
            return
        exit_status = out.get("exitStatus")
        self.record.add(
            "terminal",
            **event,
            exitStatus=exit_status,
            output=out.get("output"),
            truncated=out.get("truncated"),
            killed=timer.cancelled_caught,
        )
        if step.tool_call_id is not None:
            code = exit_status.get("exitCode") if isinstance(exit_status, dict) else None
            status: Literal["completed", "failed"] = "completed" if code == 0 else "failed"
            raw_output = {"exitCode": code, "output": out.get("output")}
            done = ToolUpdate(step.tool_call_id, status=status, raw_output=raw_output)
            await self._run_step(session, done, state)


def _tool_fields(tool: ToolCall | ToolUpdate | PermissionToolCall) -> JsonObject:
    """A tool call's ACP fields, without the unset ones (and the empty ones, but in a patch)."""
    fields: JsonObject = {
        "title": tool.title,
        "kind": tool.kind,
        "status": tool.status,
        "locations": None if tool.locations is None else [loc.to_json() for loc in tool.locations],
        "content": None if tool.content is None else list(tool.content),
        "rawInput": getattr(tool, "raw_input", None),
        "rawOutput": getattr(tool, "raw_output", None),
    }
    keep_empty = isinstance(tool, ToolUpdate)
    kept = {k: v for k, v in fields.items() if v is not None and (keep_empty or v != [])}
    return {"toolCallId": tool.id} | kept


def _first_leaf(group: BaseExceptionGroup[_Crash]) -> _Crash:
    first = group.exceptions[0]
    return first if isinstance(first, _Crash) else _first_leaf(first)


def _loads_or_text(line: bytes) -> Any:
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        return line[:500].decode("utf-8", "replace")


# --------------------------------------------------------------------------- subprocess


async def _serve_stdio(script: AgentScript) -> AgentRecord:
    stream = trio.StapledStream(trio.lowlevel.FdStream(1), trio.lowlevel.FdStream(0))
    return await _serve(stream, script, AgentRecord(), _write_stderr)


def main(argv: list[str] | None = None) -> int:
    """Run the agent on stdin/stdout: ``python -m orchestrator.testing.scripted_agent SCRIPT``."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        _write_stderr("usage: python -m orchestrator.testing.scripted_agent SCRIPT.json")
        return 2
    # stdout carries the protocol: log lines must go to stderr.
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    try:
        script = AgentScript.from_json(orjson.loads(Path(args[0]).read_bytes()))
    except (OSError, orjson.JSONDecodeError, UsageError) as exc:
        _write_stderr(f"scripted agent: cannot load {args[0]}: {exc}")
        return 2
    _write_stderr(f"scripted agent {script.name} {script.version} (pid {os.getpid()}) ready")
    record = trio.run(_serve_stdio, script)
    return record.exit_code or 0


if __name__ == "__main__":
    sys.exit(main())
