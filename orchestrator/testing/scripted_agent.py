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
``spawn`` {argv, exitCode | pid | error};
``terminal`` {sessionId, command, terminalId, exitStatus, output, truncated, killed,
cancelled | error, stage}; ``request`` {method, result | error}; ``stderr`` {text};
``eof``; ``peer_gone``; ``crash`` {exit_code}; ``exit`` {exit_code}.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
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
from orchestrator.testing._steps import CLEANUP_GRACE, ScriptedCrash, Session, StepRunner, TurnState
from orchestrator.testing._wire import (
    MAX_LINE_BYTES,
    AgentRecord,
    LineSplitter,
    PeerGone,
    Wire,
    loads_or_text,
)
from orchestrator.testing.script import AgentScript, JsonObject, Turn

from .._log import get_logger

__all__ = ["MAX_LINE_BYTES", "AgentRecord", "scripted_agent_command", "serve_scripted_agent"]

log = get_logger(__name__)


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


def _log_stderr(text: str) -> None:
    log.info("scripted agent stderr", text=text)


def _write_stderr(text: str) -> None:
    sys.stderr.write(text if text.endswith("\n") else text + "\n")
    sys.stderr.flush()


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
        wire = Wire(stream, record, script.id_style)
        await _Agent(wire, StepRunner(wire, record), script, record, stderr).run()
    finally:
        record._sink = None
        if sink is not None:
            sink.close()
    return record


@define
class _Agent:
    wire: Wire
    steps: StepRunner
    script: AgentScript
    record: AgentRecord
    stderr: Callable[[str], None]
    sessions: dict[str, Session] = field(factory=dict)
    next_session: int = 1
    authenticated: bool = False
    nursery: trio.Nursery | None = None

    # ------------------------------------------------------------------ lifecycle

    async def run(self) -> None:
        crash: ScriptedCrash | None = None
        try:
            if self.script.exit_at_start is not None:
                ex = self.script.exit_at_start
                if ex.wait_for_initialize:
                    await self._read_first_message()
                crash = ScriptedCrash(ex.exit_code, ex.stderr)
            else:
                async with trio.open_nursery() as nursery:
                    self.nursery = nursery
                    await self._read_loop()
                    self.record.add("eof")
                    if self.script.ignore_stdin_close:
                        await trio.sleep_forever()  # until a signal ends the process
                    nursery.cancel_scope.cancel()
        except* ScriptedCrash as group:
            crash = _first_leaf(group)
        except* PeerGone:
            self.record.add("peer_gone")
        if crash is not None:
            if crash.stderr:
                self.record.add("stderr", text=crash.stderr)
                self.stderr(crash.stderr)
            self.record.add(
                "crash" if self.script.exit_at_start is None else "exit", exit_code=crash.exit_code
            )
            self.record.exit_code = crash.exit_code
            await trio.aclose_forcefully(self.wire.stream)
            return
        self.record.exit_code = 0
        with trio.move_on_after(CLEANUP_GRACE, shield=True):
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await self.wire.stream.aclose()

    async def _read_first_message(self) -> None:
        splitter = LineSplitter(MAX_LINE_BYTES)
        while data := await self.wire.receive():
            for line in splitter.feed(data):
                if line is not None and line.strip():
                    self.record.add("recv", message=loads_or_text(line))
                    return

    async def _read_loop(self) -> None:
        splitter = LineSplitter(MAX_LINE_BYTES)
        while data := await self.wire.receive():
            for line in splitter.feed(data):
                await self._handle_line(line)
        for line in splitter.close():
            await self._handle_line(line)

    # ------------------------------------------------------------------ incoming

    async def _handle_line(self, line: bytes | None) -> None:
        if line is None:
            self.record.add("line_too_long")
            await self.wire.reply_error(None, InvalidRequest("message too large"))
            return
        if not line.strip():
            return
        try:
            message = orjson.loads(line)
        except orjson.JSONDecodeError:
            self.record.add("parse_error", line=line[:500].decode("utf-8", "replace"))
            await self.wire.reply_error(None, ParseError())
            return
        self.record.add("recv", message=message)
        if not isinstance(message, dict):
            await self.wire.reply_error(None, InvalidRequest("a message must be a JSON object"))
            return
        method = message.get("method")
        if method is None and "id" in message and ("result" in message or "error" in message):
            self.wire.on_response(message)
        elif not isinstance(method, str):
            await self.wire.reply_error(
                message.get("id"), InvalidRequest("method must be a string")
            )
        elif "id" in message:
            await self._on_request(message["id"], method, message.get("params"))
        else:
            await self._on_notification(method, message.get("params"))

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
            await self.wire.reply_error(req_id, exc)
            return
        if result is not None:
            await self.wire.reply(req_id, result)

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

    def _open_session(self, session_id: str, cwd: str) -> Session:
        s = self.script
        current = s.current_mode or (s.modes[0].id if s.modes else None)
        config = [{"type": o.type, **o.to_json()} for o in s.config_options]  # type is required
        session = Session(session_id, cwd, current, config)
        self.sessions[session_id] = session
        return session

    def _session_state(self, session: Session) -> JsonObject:
        state: JsonObject = {}
        if self.script.modes:
            modes = [m.to_json() for m in self.script.modes]
            state["modes"] = {"currentModeId": session.mode, "availableModes": modes}
        if session.config:
            state["configOptions"] = session.config
        return state

    def _session_params(self, event: str, params: JsonObject, new: bool) -> Session:
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

    async def _replay_history(self, req_id: Any, session: Session) -> None:
        await self.steps.run_steps(session, self.script.load_history, TurnState(ignore_cancel=True))
        await self.wire.reply(req_id, self._session_state(session))

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

    def _session(self, params: JsonObject) -> Session:
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
        await self.wire.update(
            session.id, {"sessionUpdate": "current_mode_update", "currentModeId": mode_id}
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
        session.turn = TurnState(ignore_cancel=turn.ignore_cancel)
        assert self.nursery is not None
        self.nursery.start_soon(self.steps.run_turn, req_id, session, turn, session.turn)

    def _pick_turn(self, session: Session, text: str) -> tuple[int, Turn]:
        turns = self.script.turns
        for i, turn in enumerate(turns):
            if turn.matches(text):
                return i, turn
        ordered = [(i, t) for i, t in enumerate(turns) if not t.conditional]
        if not ordered:
            return -1, Turn()
        pick = ordered[min(session.prompts, len(ordered) - 1)]
        session.prompts += 1
        return pick


def _first_leaf(group: BaseExceptionGroup[ScriptedCrash]) -> ScriptedCrash:
    first = group.exceptions[0]
    return first if isinstance(first, ScriptedCrash) else _first_leaf(first)


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
    logging.basicConfig(stream=sys.stderr, level=logging.DEBUG)
    try:
        raw = Path(args[0]).read_bytes()
        try:
            document = orjson.loads(raw)
        except orjson.JSONDecodeError:
            # the standard library reads a lone surrogate escape, which orjson refuses: a
            # script may send one, as a JavaScript peer does
            document = json.loads(raw)
        script = AgentScript.from_json(document)
    except (OSError, ValueError, UsageError) as exc:
        _write_stderr(f"scripted agent: cannot load {args[0]}: {exc}")
        return 2
    _write_stderr(f"scripted agent {script.name} {script.version} (pid {os.getpid()}) ready")
    record = trio.run(_serve_stdio, script)
    return record.exit_code or 0


if __name__ == "__main__":
    sys.exit(main())
