"""One ACP connection, as the client: the handshake, sessions, and the services we serve.

An :class:`AgentConnection` is made by :func:`~orchestrator.agent.launch.open_agent` (or
``open_agent_on_stream``): it completes ``initialize`` (and ``authenticate`` when asked),
opens :class:`~orchestrator.agent.session.AcpSession` objects, and answers the agent's
requests (permission, fs, terminal, elicitation) with each session's services, concurrently
with the pending ``session/prompt``, as agents expect.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, cast

import attrs
import trio
from attrs import define, field

from .._log import get_logger
from ..errors import (
    AuthenticationError,
    AuthRequired,
    CapabilityNotSupported,
    CommandRefused,
    ConnectionClosed,
    FileNotFound,
    InvalidParams,
    LoginRequired,
    MethodNotFound,
    OrchestratorError,
    ProtocolVersionMismatch,
)
from ..jsonrpc.connection import JsonRpcConnection
from ..jsonrpc.framing import scrubbed_keys
from ..mcp import check_mcp_capabilities
from ..protocol import types as t
from ..protocol.codec import converter, structure, unstructure
from .process import AgentProcess
from .quirks import NO_QUIRKS, AppliedQuirks, quirks_for
from .services import (
    ClientServices,
    DeclineElicitation,
    PermissionRecord,
    SessionContext,
)
from .session import (
    STEP_META_KEY,
    AcpSession,
    ClientOptions,
    Turn,
    _fold_text_chunk,
)

__all__ = ["AgentConnection", "auth_method_facts"]

log = get_logger(__name__)


@define(eq=False)
class AgentConnection:
    """One initialized ACP connection to one agent."""

    name: str
    rpc: JsonRpcConnection
    options: ClientOptions
    services: ClientServices
    init: t.InitializeResponse | None = None
    sessions: dict[str, AcpSession] = field(factory=dict)
    pid: int | None = None
    #: the agent's name for audit records when ``name`` labels one of several processes
    #: (the supervisor's ``claude#2`` is agent ``claude``)
    agent: str | None = None
    #: the agent's process when it was started by :func:`open_agent`
    process: AgentProcess | None = None
    #: the quirks its ``initialize`` matched (:mod:`orchestrator.agent.quirks`)
    quirks: AppliedQuirks = NO_QUIRKS
    _authenticated: bool = False

    # ------------------------------------------------------------------ what the agent said

    @property
    def agent_info(self) -> t.Implementation | None:
        """The agent's name and version, if it sent them."""
        return self.init.agent_info if self.init else None

    @property
    def agent_capabilities(self) -> t.AgentCapabilities:
        """The agent's capabilities (empty if it advertised none)."""
        caps = self.init.agent_capabilities if self.init else None
        return caps if caps is not None else t.AgentCapabilities()

    @property
    def auth_methods(self) -> list[t.AuthMethod]:
        """The authentication methods the agent offers."""
        return list(self.init.auth_methods or []) if self.init else []

    # ------------------------------------------------------------------ calls

    async def call(
        self,
        method: str,
        params: Any,
        *,
        on_response: Callable[[], None] | None = None,
        notify_cancel: bool = True,
    ) -> Any:
        """Send a request (params as a generated type or plain JSON) and return the raw result.

        A cancelled caller withdraws the request with ``$/cancel_request`` unless
        ``notify_cancel`` is false (a turn is ended with ``session/cancel`` instead).
        """
        payload = params if isinstance(params, dict) or params is None else unstructure(params)
        return await self.rpc.request(
            method, payload, on_response=on_response, notify_cancel=notify_cancel
        )

    async def notify(self, method: str, params: Any) -> None:
        """Send a notification."""
        payload = params if isinstance(params, dict) or params is None else unstructure(params)
        await self.rpc.notify(method, payload)

    async def initialize(self) -> t.InitializeResponse:
        """The handshake: protocol version, capabilities, and what the agent offers."""
        request = t.InitializeRequest(
            protocol_version=self.options.protocol_version,
            client_capabilities=self.services.capabilities(),
            client_info=self.options.client_info,
        )
        raw = await self.call("initialize", request)
        init = structure(raw, t.InitializeResponse)
        if init.protocol_version != self.options.protocol_version:
            raise ProtocolVersionMismatch(
                f"agent speaks protocol version {init.protocol_version}, "
                f"we speak {self.options.protocol_version}",
                agent=self.name,
                response=init,
            )
        self.init = init
        info = init.agent_info
        self.quirks = quirks_for(info)
        log.info(
            "agent initialized",
            agent=self.name,
            agent_name=info.name if info else None,
            version=info.version if info else None,
            **({"quirks": list(self.quirks.ids)} if self.quirks.quirks else {}),
        )
        return init

    async def authenticate(self, method_id: str | None = None) -> None:
        """Authenticate with ``method_id``, the configured method, or the only one offered.

        Terminal methods are never sent (the spec forbids it: a person completes them in a
        terminal), so with none chosen the only non-terminal method offered is used. When
        none can be, :class:`~orchestrator.errors.LoginRequired` says at once which methods
        the agent offers and, for terminal ones, the command to run.
        """
        methods = [m for m in self.auth_methods if not isinstance(m, t.UnknownAuthMethod)]
        ids = [m.id for m in methods]
        chosen = method_id or self.options.auth_method
        if chosen is None:
            usable = [m.id for m in methods if not isinstance(m, t.AuthMethodTerminal)]
            if len(usable) != 1:
                raise self._login_required()
            chosen = usable[0]
        elif ids and chosen not in ids:
            raise AuthenticationError(
                f"auth method {chosen!r} not offered (offered: {', '.join(ids)})", agent=self.name
            )
        elif any(isinstance(m, t.AuthMethodTerminal) and m.id == chosen for m in methods):
            raise self._login_required()
        try:
            await self.call("authenticate", t.AuthenticateRequest(method_id=chosen))
        except OrchestratorError as e:
            if isinstance(e, ConnectionClosed):
                raise
            raise AuthenticationError(f"authenticate({chosen}) failed: {e}", agent=self.name) from e
        self._authenticated = True
        log.info("authenticated", agent=self.name, method=chosen)

    def _login_required(self) -> LoginRequired:
        """The error for an agent that needs a login no method here can complete."""
        argv = self.process.argv if self.process is not None else None
        offered = [auth_method_facts(m, argv) for m in self.auth_methods]
        if not offered:
            return LoginRequired(
                "authentication required, and the agent offers no auth method", agent=self.name
            )
        ids = ", ".join(m["id"] for m in offered)
        listed = "; ".join(_describe_method(m) for m in offered)
        steps = [m["command"] for m in offered if m["command"]]
        if steps:
            then = f"; log in with `{steps[0]}`, then start it again"
        else:
            then = "; choose one with the agent's auth_method"
        return LoginRequired(
            f"authentication required; offered: {ids} ({listed}){then}",
            agent=self.name,
            methods=offered,
        )

    async def _call_authenticated(self, method: str, params: Any) -> Any:
        try:
            return await self.call(method, params)
        except AuthRequired:
            if self._authenticated:
                raise
            await self.authenticate()
            return await self.call(method, params)

    def _require(self, supported: object, what: str) -> None:
        if not supported:
            raise CapabilityNotSupported(f"the agent does not support {what}", agent=self.name)

    # ------------------------------------------------------------------ sessions

    def _session(
        self, session_id: str, cwd: str, services: ClientServices | None, step: str | None
    ) -> AcpSession:
        session = AcpSession(self, session_id, cwd, services or self.services, step)
        self.sessions[session_id] = session
        return session

    async def new_session(
        self,
        cwd: str | os.PathLike[str],
        *,
        mcp_servers: Sequence[t.McpServer] = (),
        services: ClientServices | None = None,
        step: str | None = None,
        instance: str | None = None,
    ) -> AcpSession:
        """Open a session in ``cwd`` (made absolute); authenticates first if the agent asks.

        With :attr:`ClientOptions.step_meta`, the step instance a pipeline opens it for
        (``instance``: ``rename[a.py]``), else ``step``, goes to the agent in the request's
        ``_meta`` (under :data:`STEP_META_KEY`). The session's own ``step`` is ``step``: the
        step's name, which policies scope by.
        """
        check_mcp_capabilities(mcp_servers, self.agent_capabilities.mcp_capabilities, self.name)
        path = os.path.abspath(cwd)
        meta = None
        named = instance or step
        if self.options.step_meta and named is not None:
            meta = {STEP_META_KEY: {"step": named}}
        request = t.NewSessionRequest(cwd=path, mcp_servers=list(mcp_servers), meta=meta)
        raw = await self._call_authenticated("session/new", request)
        response = structure(raw, t.NewSessionResponse)
        session = self._session(response.session_id, path, services, step)
        session._configured(response.modes, response.config_options)
        log.info("session opened", agent=self.name, session=response.session_id, cwd=path)
        return session

    async def load_session(
        self,
        session_id: str,
        cwd: str | os.PathLike[str],
        *,
        mcp_servers: Sequence[t.McpServer] = (),
        services: ClientServices | None = None,
        step: str | None = None,
    ) -> AcpSession:
        """Load a past session; its replayed history lands in ``background_updates``."""
        self._require(self.agent_capabilities.load_session, "session/load")
        check_mcp_capabilities(mcp_servers, self.agent_capabilities.mcp_capabilities, self.name)
        path = os.path.abspath(cwd)
        session = self._session(session_id, path, services, step)
        request = t.LoadSessionRequest(
            session_id=session_id, cwd=path, mcp_servers=list(mcp_servers)
        )
        try:
            raw = await self._call_authenticated("session/load", request)
        except BaseException:
            self.sessions.pop(session_id, None)
            raise
        response = structure(raw, t.LoadSessionResponse)
        return session._configured(response.modes, response.config_options)

    async def resume_session(
        self,
        session_id: str,
        cwd: str | os.PathLike[str],
        *,
        mcp_servers: Sequence[t.McpServer] = (),
        services: ClientServices | None = None,
        step: str | None = None,
    ) -> AcpSession:
        """Resume a session without replaying its history (``session/resume``)."""
        caps = self.agent_capabilities.session_capabilities
        self._require(caps and caps.resume is not None, "session/resume")
        check_mcp_capabilities(mcp_servers, self.agent_capabilities.mcp_capabilities, self.name)
        path = os.path.abspath(cwd)
        request = t.ResumeSessionRequest(
            session_id=session_id, cwd=path, mcp_servers=list(mcp_servers)
        )
        raw = await self._call_authenticated("session/resume", request)
        response = structure(raw, t.ResumeSessionResponse)
        session = self._session(session_id, path, services, step)
        return session._configured(response.modes, response.config_options)

    async def list_sessions(
        self, cwd: str | os.PathLike[str] | None = None, cursor: str | None = None
    ) -> t.ListSessionsResponse:
        """One page of the agent's sessions (``session/list``)."""
        caps = self.agent_capabilities.session_capabilities
        self._require(caps and caps.list is not None, "session/list")
        request = t.ListSessionsRequest(cwd=os.path.abspath(cwd) if cwd else None, cursor=cursor)
        return structure(await self.call("session/list", request), t.ListSessionsResponse)

    async def close_session(self, session_id: str) -> None:
        """Close a session (``session/close``)."""
        caps = self.agent_capabilities.session_capabilities
        self._require(caps and caps.close is not None, "session/close")
        await self.call("session/close", t.CloseSessionRequest(session_id=session_id))
        self.sessions.pop(session_id, None)

    async def delete_session(self, session_id: str) -> None:
        """Delete a session (``session/delete``)."""
        caps = self.agent_capabilities.session_capabilities
        self._require(caps and caps.delete is not None, "session/delete")
        await self.call("session/delete", t.DeleteSessionRequest(session_id=session_id))
        self.sessions.pop(session_id, None)

    # ------------------------------------------------------------------ serving the agent

    def install_handlers(
        self, extensions: Mapping[str, Callable[[Any], Any]] | None = None
    ) -> None:
        """Route the agent's requests and notifications to this connection's services."""
        rpc = self.rpc
        update_hook = converter.get_structure_hook(t.SessionUpdate)
        sessions = self.sessions

        def on_update(params: Any) -> None:
            # the hot path of floods: no logging, one structure call, one dict lookup
            try:
                session = sessions.get(params["sessionId"])
                if session is not None and _fold_text_chunk(session._turn, params["update"]):
                    return
                update = update_hook(params["update"], None)
            except Exception as e:  # a malformed update must not end the connection
                log.warning("malformed session/update dropped", agent=self.name, error=str(e))
                return
            if session is not None:
                session._on_update(update)
            else:
                log.debug("update for unknown session", agent=self.name)

        rpc.on_notification("session/update", on_update)
        rpc.on_request("session/request_permission", self._on_permission)
        rpc.on_request(
            "fs/read_text_file",
            self._on_fs_read,
            nowait=lambda p: self._fs_nowait(p, "read_text_file_nowait", t.ReadTextFileRequest),
        )
        rpc.on_request(
            "fs/write_text_file",
            self._on_fs_write,
            nowait=lambda p: self._fs_nowait(p, "write_text_file_nowait", t.WriteTextFileRequest),
        )
        for name in ("create", "output", "wait_for_exit", "kill", "release"):
            rpc.on_request(f"terminal/{name}", self._terminal_handler(name))
        rpc.on_request("elicitation/create", self._on_elicitation)
        rpc.on_notification("elicitation/complete", lambda params: None)
        ext = dict(extensions or {})

        async def fallback_request(method: str, params: Any) -> Any:
            handler = ext.get(method)
            if handler is None:
                log.warning(
                    "undeclared agent request answered -32601", agent=self.name, method=method
                )
                raise MethodNotFound(f"method not found: {method}")
            result = handler(params)
            return await result if hasattr(result, "__await__") else result

        def fallback_notification(method: str, params: Any) -> Any:
            handler = ext.get(method)
            if handler is not None:
                return handler(params)  # an awaitable is awaited by the connection
            log.debug("unknown notification ignored", agent=self.name, method=method)
            return None

        rpc.set_fallback_request_handler(fallback_request)
        rpc.set_fallback_notification_handler(fallback_notification)

    def _session_for(self, params: Any) -> AcpSession:
        session_id = params.get("sessionId") if isinstance(params, dict) else None
        session = self.sessions.get(session_id) if isinstance(session_id, str) else None
        if session is None:
            raise InvalidParams(f"unknown session {session_id!r}")
        return session

    def _on_permission(self, params: Any) -> Awaitable[Any]:
        # Called in the read loop as the request arrives (JsonRpcConnection.on_request), so
        # the turn it belongs to, what that turn knows of its tool call and a cancel already
        # sent are taken in wire order, however late the handler itself gets to run.
        request = structure(params, t.RequestPermissionRequest)
        session = self._session_for(params)
        turn = session._turn
        request = _completed_request(request, turn)
        options = self.quirks.ordered_options(request.options)
        if options is not request.options:
            request = attrs.evolve(request, options=options)
        scope = trio.CancelScope()
        if session._cancelling:
            scope.cancel()
        session._pending_permissions.add(scope)
        if turn is not None:
            turn._open_permissions.add(scope)
        return self._serve_permission(request, session, session.context, turn, scope)

    async def _serve_permission(
        self,
        request: t.RequestPermissionRequest,
        session: AcpSession,
        ctx: SessionContext,
        turn: Turn | None,
        scope: trio.CancelScope,
    ) -> Any:
        try:
            return await self._decide_permission(request, session, ctx, turn, scope)
        finally:
            session._pending_permissions.discard(scope)
            if turn is not None:
                turn._permission_recorded(scope)

    async def _decide_permission(
        self,
        request: t.RequestPermissionRequest,
        session: AcpSession,
        ctx: SessionContext,
        turn: Turn | None,
        scope: trio.CancelScope,
    ) -> Any:
        with scope:
            decision = await session.services.permission.request_permission(request, ctx)
        service_record = None
        if scope.cancelled_caught:
            # the service's own record of the cancellation (with the paths and command it
            # saw) is the audit record; a service that keeps none gets a minimal one
            cancelled_record = getattr(session.services.permission, "cancelled_record", None)
            if cancelled_record is not None:
                service_record = cancelled_record(request, ctx)
        if scope.cancelled_caught and service_record is not None:
            record = service_record
            outcome: t.RequestPermissionOutcome = t.CancelledRequestPermissionOutcome()
        elif scope.cancelled_caught:
            record = PermissionRecord.from_request(
                request, ctx, verdict="cancelled", option_id=None, rule="cancelled"
            )
            outcome = t.CancelledRequestPermissionOutcome()
        else:
            record, outcome = decision.record, decision.outcome
            if record.verdict == "reject" and isinstance(outcome, t.SelectedPermissionOutcome):
                _check_not_allow(request, outcome.option_id)
        session.permissions.append(record)
        if turn is not None:
            turn.accumulator.permissions.append(record)
        log.debug(  # the permission service logs its own decisions
            "permission decided",
            agent=ctx.agent,
            session=ctx.session_id,
            tool_call=record.tool_call_id,
            verdict=record.verdict,
            option=record.option_id,
            rule=record.rule,
        )
        return unstructure(t.RequestPermissionResponse(outcome=outcome))

    async def _on_fs_read(self, params: Any) -> Any:
        _check_fs_path(params)
        session = self._session_for(params)
        if session.services.fs is None:
            raise MethodNotFound("fs/read_text_file is not offered by this client")
        request = structure(params, t.ReadTextFileRequest)
        try:
            return unstructure(await session.services.fs.read_text_file(request, session.context))
        except FileNotFound:
            if not self._missing_file_reads_empty(request):
                raise
            return {"content": ""}

    def _fs_nowait(self, params: Any, method: str, request_type: type[Any]) -> Any:
        """Serve an fs request with the service's ``*_nowait`` ``method``, in the read loop.

        A service without it (or no fs service at all) leaves the request to the async handler.
        """
        _check_fs_path(params)
        session = self._session_for(params)
        serve = getattr(session.services.fs, method, None)
        if serve is None:
            raise trio.WouldBlock
        request = structure(params, request_type)
        try:
            return unstructure(serve(request, session.context))
        except FileNotFound:
            if request_type is not t.ReadTextFileRequest or not self._missing_file_reads_empty(
                request
            ):
                raise
            return {"content": ""}

    def _missing_file_reads_empty(self, request: t.ReadTextFileRequest) -> bool:
        """Whether a read of a missing file answers empty content rather than the error: only
        for an agent with that quirk. The fs service raises ``FileNotFound`` only for a path it
        allows that names nothing; refused paths and directories stay other errors."""
        if not self.quirks.has("missing-file-reads-empty"):
            return False
        log.debug("missing file read as empty (agent quirk)", agent=self.name, path=request.path)
        return True

    async def _on_fs_write(self, params: Any) -> Any:
        _check_fs_path(params)
        session = self._session_for(params)
        if session.services.fs is None:
            raise MethodNotFound("fs/write_text_file is not offered by this client")
        request = structure(params, t.WriteTextFileRequest)
        response = await session.services.fs.write_text_file(request, session.context)
        return unstructure(response)  # an object ({}), never null

    def _terminal_handler(self, name: str) -> Callable[[Any], Any]:
        request_types: dict[str, Any] = {
            "create": t.CreateTerminalRequest,
            "output": t.TerminalOutputRequest,
            "wait_for_exit": t.WaitForTerminalExitRequest,
            "kill": t.KillTerminalRequest,
            "release": t.ReleaseTerminalRequest,
        }

        async def handle(params: Any) -> Any:
            session = self._session_for(params)
            service = session.services.terminal
            if service is None:
                raise MethodNotFound(f"terminal/{name} is not offered by this client")
            request = structure(params, request_types[name])
            try:
                return unstructure(await getattr(service, name)(request, session.context))
            except CommandRefused as refused:
                # the policy's refusal is a permission decision like the others: audited
                if isinstance(refused.record, PermissionRecord):
                    session.audit(refused.record)
                raise

        return handle

    async def _on_elicitation(self, params: Any) -> Any:
        request = structure(params, t.CreateElicitationRequest)
        session = None
        if isinstance(params, dict) and isinstance(params.get("sessionId"), str):
            session = self.sessions.get(params["sessionId"])
        services = session.services if session else self.services
        service = services.elicitation or DeclineElicitation()
        ctx = session.context if session else SessionContext(self.name, "", "")
        return unstructure(await service.create_elicitation(request, ctx))

    def statistics(self) -> dict[str, Any]:
        """Counts of this connection: sessions, turns, and the JSON-RPC layer's figures."""
        return {
            "sessions": len(self.sessions),
            "turns": sum(s.turns for s in self.sessions.values()),
            "rpc": self.rpc.statistics(),
        }


def _completed_request(
    request: t.RequestPermissionRequest, turn: Turn | None
) -> t.RequestPermissionRequest:
    """The request with what the turn already knows of its tool call filled in.

    Some agents (Claude Code's adapter) send the tool call's kind, title and locations in the
    ``tool_call`` update and leave them out of the permission request; a policy deciding by
    kind or path needs them.
    """
    call = request.tool_call
    if turn is None or (call.kind is not None and call.title is not None and call.locations):
        return request
    known = turn.accumulator.tool_calls.get(call.tool_call_id)
    if known is None:
        return request
    filled = attrs.evolve(
        call,
        kind=call.kind if call.kind is not None else cast(Any, known.kind),
        title=call.title if call.title is not None else known.title,
        locations=call.locations if call.locations else (known.locations or call.locations),
        raw_input=call.raw_input if call.raw_input is not None else known.raw_input,
    )
    return attrs.evolve(request, tool_call=filled)


def _check_not_allow(request: t.RequestPermissionRequest, option_id: str) -> None:
    for option in request.options:
        if option.option_id == option_id and option.kind.startswith("allow"):
            raise AssertionError(f"a reject verdict chose the allow option {option_id!r}")


def _check_fs_path(params: Any) -> None:
    """Refuse an fs request whose path held a lone surrogate: the framing made it U+FFFD,
    which would name another file."""
    if "path" in scrubbed_keys(params):
        raise InvalidParams(
            f"path {params['path']!r} is not valid Unicode (a lone surrogate); "
            "nothing was read or written",
            {"path": params["path"]},
        )


def auth_method_facts(method: t.AuthMethod, argv: Sequence[str] | None) -> dict[str, Any]:
    """What a person needs to know of one auth method: ``id``, ``name``, ``description``,
    ``type`` and, for a terminal login, the ``command`` to run: the agent's command line with
    the method's arguments appended and its variables set (as the schema says), or the
    ``terminal-auth`` command older agents put in ``_meta``."""
    raw = unstructure(method)
    raw = raw if isinstance(raw, dict) else {}
    kind = raw.get("type") or "agent"
    command: str | None = None
    meta = raw.get("_meta") if isinstance(raw.get("_meta"), dict) else {}
    legacy = meta.get("terminal-auth") if isinstance(meta, dict) else None
    if kind == "terminal" and argv:
        env = raw.get("env")
        pairs = [f"{k}={v}" for k, v in env.items()] if isinstance(env, dict) else []
        args = [str(a) for a in raw.get("args") or ()]
        command = shlex.join([*pairs, *argv, *args])
    elif isinstance(legacy, dict) and isinstance(legacy.get("command"), str):
        args = [str(a) for a in legacy.get("args") or ()]
        command = shlex.join([legacy["command"], *args])
    return {
        "id": str(raw.get("id", "")),
        "name": str(raw.get("name", "")),
        "description": raw.get("description"),
        "type": str(kind),
        "command": command,
    }


def _describe_method(method: Mapping[str, Any]) -> str:
    text = f"{method['id']}: {method['name'] or method['id']}"
    if method["description"]:
        text += f", {method['description']}"
    return text
