"""An ACP agent built on the official Python SDK (``agent-client-protocol``), for interop tests.

Run as ``python tests/agents/sdk_agent.py [--require-auth] [--state-dir DIR]``; it speaks ACP
v1 on stdin/stdout. It is an independent implementation of the agent side: whatever our client
gets right against it, it did not get right by agreeing with itself.

Behaviour (the contract the interop tests rely on):

- ``initialize``: protocol version 1, ``agentInfo.name`` "sdk-agent", ``loadSession``, image,
  audio and embedded context prompts, one auth method ``sdk-login``.
- ``--require-auth``: ``session/new`` and ``session/load`` fail with -32000 until
  ``authenticate`` with ``sdk-login``; another method id is -32602.
- ``session/new``: modes ``ask`` (current) and ``code``; config options ``model`` (select,
  category ``model``: ``sdk-small`` current, ``sdk-large``) and ``effort`` (select, category
  ``thought_level``: ``low`` current, ``high``).
- ``session/load``: replays the session's history (``user_message_chunk`` per prompt block,
  ``agent_message_chunk`` per reply chunk) before answering. History lives in memory, and also
  in ``--state-dir`` when given, so a restarted agent can load it. Unknown session ids: -32002.
- ``session/set_mode``: sends ``current_mode_update``; ``session/set_config_option`` returns
  all config options. Unknown ids or values: -32602.
- ``session/prompt``: one ``agent_message_chunk`` "received: text, image(image/png), ...",
  then the command's chunks, then ``usage_update``, then ``end_turn`` (``cancelled`` if a
  ``session/cancel`` arrived during the turn). Commands (the first text block):
  ``ask permission`` (tool call ``perm-1``, then ``session/request_permission`` with options
  ``sdk-allow-once``/``sdk-allow-always``/``sdk-reject-once``/``sdk-reject-always``, then a
  chunk "permission: selected <id>" or "permission: cancelled"); ``read <abs path>`` (the file's
  content as one chunk, via ``fs/read_text_file``); ``write <abs path>`` + newline + content
  (via ``fs/write_text_file``, then "wrote <path>"); ``wait for cancel`` (waits up to 30 s for
  ``session/cancel``). A failed client call becomes a chunk "<method> failed: <message>
  (<code>)".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import uuid
from pathlib import Path
from typing import Any, Literal, cast

import acp
from acp import schema as s

AUTH_METHOD = "sdk-login"
MODES = {"ask": "Ask before acting", "code": "Write code"}
Category = Literal["model", "thought_level"]
CONFIG_CHOICES: dict[str, tuple[str, Category, list[str]]] = {
    # id: (name, category, values; the first is the default)
    "model": ("Model", "model", ["sdk-small", "sdk-large"]),
    "effort": ("Effort", "thought_level", ["low", "high"]),
}
CONTEXT_SIZE = 200_000
PERMISSION_OPTIONS = [
    s.PermissionOption(option_id="sdk-allow-once", name="Allow once", kind="allow_once"),
    s.PermissionOption(option_id="sdk-allow-always", name="Always allow", kind="allow_always"),
    s.PermissionOption(option_id="sdk-reject-once", name="Reject", kind="reject_once"),
    s.PermissionOption(option_id="sdk-reject-always", name="Always reject", kind="reject_always"),
]


class ClientCallFailed(Exception):
    """The client answered one of our requests with an error; the message says which."""


class Session:
    """One conversation: its settings and the history that ``session/load`` replays."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.mode = "ask"
        self.config = {key: values[0] for key, (_, _, values) in CONFIG_CHOICES.items()}
        self.history: list[tuple[str, dict[str, Any]]] = []  # (role, ContentBlock wire JSON)
        self.cancelled = asyncio.Event()
        self.used_tokens = 0

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "config": self.config, "history": self.history}

    @classmethod
    def from_json(cls, session_id: str, data: dict[str, Any]) -> Session:
        session = cls(session_id)
        session.mode = data["mode"]
        session.config = data["config"]
        session.history = [(role, block) for role, block in data["history"]]
        return session


def describe(block: Any) -> str:
    """A short label for one received content block."""
    if isinstance(block, s.ImageContentBlock | s.AudioContentBlock):
        return f"{block.type}({block.mime_type})"
    if isinstance(block, s.ResourceContentBlock):
        return f"resource_link({block.uri})"
    if isinstance(block, s.EmbeddedResourceContentBlock):
        kind = "text" if isinstance(block.resource, s.TextResourceContents) else "blob"
        return f"resource({kind} {block.resource.uri})"
    return str(block.type)


class SdkAgent:
    """The agent; the SDK calls these methods with the request's fields as keyword arguments."""

    def __init__(self, *, require_auth: bool, state_dir: Path | None) -> None:
        self._authenticated = not require_auth
        self._state_dir = state_dir
        self._sessions: dict[str, Session] = {}
        self._client: Any = None
        self._fs: Any = None

    def on_connect(self, conn: Any) -> None:
        self._client = conn

    async def initialize(
        self, protocol_version: int, client_capabilities: Any = None, **kwargs: Any
    ) -> s.InitializeResponse:
        self._fs = client_capabilities.fs if client_capabilities is not None else None
        return s.InitializeResponse(
            protocol_version=1,
            agent_capabilities=s.AgentCapabilities(
                load_session=True,
                prompt_capabilities=s.PromptCapabilities(
                    image=True, audio=True, embedded_context=True
                ),
            ),
            auth_methods=[
                s.AuthMethodAgent(id=AUTH_METHOD, name="SDK login", description="Always works")
            ],
            agent_info=s.Implementation(name="sdk-agent", title="SDK test agent", version="1.0"),
        )

    async def authenticate(self, method_id: str, **kwargs: Any) -> s.AuthenticateResponse:
        if method_id != AUTH_METHOD:
            raise acp.RequestError.invalid_params({"methodId": method_id})
        self._authenticated = True
        return s.AuthenticateResponse()

    async def new_session(self, cwd: str, **kwargs: Any) -> s.NewSessionResponse:
        self._check_auth()
        session = Session(uuid.uuid4().hex)
        self._sessions[session.session_id] = session
        self._save(session)
        return s.NewSessionResponse(
            session_id=session.session_id,
            modes=self._modes(session),
            config_options=self._config_options(session),
        )

    async def load_session(self, cwd: str, session_id: str, **kwargs: Any) -> s.LoadSessionResponse:
        self._check_auth()
        session = self._sessions.get(session_id) or self._restore(session_id)
        for role, block in session.history:
            update = {"sessionUpdate": f"{role}_message_chunk", "content": block}
            model = s.UserMessageChunk if role == "user" else s.AgentMessageChunk
            await self._client.session_update(session_id, model.model_validate(update))
        return s.LoadSessionResponse(
            modes=self._modes(session), config_options=self._config_options(session)
        )

    async def set_session_mode(
        self, session_id: str, mode_id: str, **kwargs: Any
    ) -> s.SetSessionModeResponse:
        session = self._session(session_id)
        if mode_id not in MODES:
            raise acp.RequestError.invalid_params({"modeId": mode_id})
        session.mode = mode_id
        self._save(session)
        update = s.CurrentModeUpdate(session_update="current_mode_update", current_mode_id=mode_id)
        await self._client.session_update(session_id, update)
        return s.SetSessionModeResponse()

    async def set_config_option(
        self, config_id: str, session_id: str, value: str | bool, **kwargs: Any
    ) -> s.SetSessionConfigOptionResponse:
        session = self._session(session_id)
        if config_id not in CONFIG_CHOICES:
            raise acp.RequestError.invalid_params({"configId": config_id})
        if value not in CONFIG_CHOICES[config_id][2]:
            raise acp.RequestError.invalid_params({"value": value})
        session.config[config_id] = str(value)
        self._save(session)
        return s.SetSessionConfigOptionResponse(config_options=self._config_options(session))

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        if session_id in self._sessions:
            self._sessions[session_id].cancelled.set()

    async def prompt(self, session_id: str, prompt: list[Any], **kwargs: Any) -> s.PromptResponse:
        session = self._session(session_id)
        session.cancelled.clear()
        for block in prompt:
            session.history.append(("user", block.model_dump(mode="json", by_alias=True)))
        await self._say(session, "received: " + ", ".join(describe(b) for b in prompt))
        first_text = next((b.text for b in prompt if isinstance(b, s.TextContentBlock)), "")
        try:
            await self._run_command(session, first_text.strip())
        except ClientCallFailed as exc:
            await self._say(session, str(exc))
        usage = s.UsageUpdate(
            session_update="usage_update", used=session.used_tokens, size=CONTEXT_SIZE
        )
        await self._client.session_update(session_id, usage)
        self._save(session)
        if session.cancelled.is_set():
            return s.PromptResponse(stop_reason="cancelled")
        return s.PromptResponse(stop_reason="end_turn")

    async def _run_command(self, session: Session, text: str) -> None:
        sid = session.session_id
        if text == "ask permission":
            await self._ask_permission(session)
        elif text.startswith("read /"):
            if not (self._fs and self._fs.read_text_file):
                await self._say(session, "fs/read_text_file not advertised by the client")
                return
            path = text.removeprefix("read ").strip()
            response = await self._call("fs/read_text_file", self._client.read_text_file(sid, path))
            await self._say(session, response.content)
        elif text.startswith("write /"):
            if not (self._fs and self._fs.write_text_file):
                await self._say(session, "fs/write_text_file not advertised by the client")
                return
            path, _, content = text.removeprefix("write ").partition("\n")
            call = self._client.write_text_file(sid, path.strip(), content)
            await self._call("fs/write_text_file", call)
            await self._say(session, f"wrote {path.strip()}")
        elif text == "wait for cancel":
            try:
                await asyncio.wait_for(session.cancelled.wait(), timeout=30)
            except TimeoutError:
                await self._say(session, "no cancel arrived")

    async def _ask_permission(self, session: Session) -> None:
        sid = session.session_id
        start = acp.start_tool_call(
            "perm-1", "Run a guarded step", kind="execute", status="pending"
        )
        await self._client.session_update(sid, start)
        tool_call = s.ToolCallUpdate(
            tool_call_id="perm-1", title="Run a guarded step", kind="execute", status="pending"
        )
        call = self._client.request_permission(sid, tool_call, PERMISSION_OPTIONS)
        response = await self._call("session/request_permission", call)
        outcome = response.outcome
        selected = None if isinstance(outcome, s.DeniedOutcome) else outcome.option_id
        allowed = selected is not None and selected.startswith("sdk-allow")
        done = acp.update_tool_call("perm-1", status="completed" if allowed else "failed")
        await self._client.session_update(sid, done)
        await self._say(
            session, f"permission: selected {selected}" if selected else "permission: cancelled"
        )

    async def _call(self, method: str, call: Any) -> Any:
        """Await a request to the client; an error answer becomes :class:`ClientCallFailed`."""
        try:
            return await call
        except acp.RequestError as exc:
            raise ClientCallFailed(f"{method} failed: {exc} ({exc.code})") from exc

    async def _say(self, session: Session, text: str) -> None:
        session.history.append(
            ("agent", acp.text_block(text).model_dump(mode="json", by_alias=True))
        )
        session.used_tokens += len(text.split())
        await self._client.session_update(session.session_id, acp.update_agent_message_text(text))

    def _check_auth(self) -> None:
        if not self._authenticated:
            raise acp.RequestError.auth_required({"authMethods": [AUTH_METHOD]})

    def _session(self, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None:
            raise acp.RequestError.resource_not_found(session_id)
        return session

    def _restore(self, session_id: str) -> Session:
        path = self._state_dir / f"{session_id}.json" if self._state_dir else None
        if path is None or not path.is_file():
            raise acp.RequestError.resource_not_found(session_id)
        session = Session.from_json(session_id, json.loads(path.read_text("utf-8")))
        self._sessions[session_id] = session
        return session

    def _save(self, session: Session) -> None:
        if self._state_dir is not None:
            self._state_dir.mkdir(parents=True, exist_ok=True)
            path = self._state_dir / f"{session.session_id}.json"
            path.write_text(json.dumps(session.to_json()), "utf-8")

    @staticmethod
    def _modes(session: Session) -> s.SessionModeState:
        modes = [s.SessionMode(id=key, name=key.title(), description=d) for key, d in MODES.items()]
        return s.SessionModeState(current_mode_id=session.mode, available_modes=modes)

    @staticmethod
    def _config_options(
        session: Session,
    ) -> list[s.SessionConfigOptionSelect | s.SessionConfigOptionBoolean]:
        return [
            s.SessionConfigOptionSelect(
                type="select",
                id=key,
                name=name,
                category=category,
                current_value=session.config[key],
                options=[s.SessionConfigSelectOption(value=v, name=v) for v in values],
            )
            for key, (name, category, values) in CONFIG_CHOICES.items()
        ]


def main() -> None:
    """Parse the command line and serve one client on stdin/stdout until EOF."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--require-auth", action="store_true", help="demand authenticate first")
    parser.add_argument("--state-dir", type=Path, help="keep session history here for reloads")
    args = parser.parse_args()
    agent = SdkAgent(require_auth=args.require_auth, state_dir=args.state_dir)
    asyncio.run(acp.run_agent(cast("acp.Agent", agent)))


if __name__ == "__main__":
    main()
