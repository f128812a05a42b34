"""One ACP connection, as the client: handshake, sessions, turns, and the services we serve.

:func:`open_agent` starts an agent process and completes ``initialize``;
:func:`open_agent_on_stream` does the same over any :class:`trio.abc.Stream` (tests, or an agent
reached another way). The returned :class:`AgentConnection` opens :class:`AcpSession` objects,
whose :meth:`AcpSession.prompt` runs one turn and returns its :class:`TurnResult`.

Inbound requests (permission, fs, terminal, elicitation) run concurrently with the pending
``session/prompt``, as agents expect. A prompt's result is delivered only after every update
that preceded its response on the wire.
"""

from __future__ import annotations

import math
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, cast

import attrs
import structlog
import trio
from attrs import define, field, frozen

from .._util import grace_period, grace_periods_ended, single_error
from ..errors import (
    AgentExited,
    AgentHung,
    AgentStartError,
    AuthenticationError,
    AuthRequired,
    CapabilityNotSupported,
    ConnectionClosed,
    InvalidParams,
    MethodNotFound,
    OrchestratorError,
    ProtocolVersionMismatch,
    TurnTimeout,
    UsageError,
)
from ..jsonrpc.connection import JsonRpcConnection
from ..protocol import types as t
from ..protocol.codec import converter, structure, unstructure
from .content import PromptInput, check_prompt_capabilities, to_blocks
from .process import AgentProcess, open_agent_process
from .services import (
    ClientServices,
    DeclineElicitation,
    PermissionRecord,
    SessionContext,
)
from .transcript import TranscriptWriter
from .turn import TurnAccumulator, TurnResult

__all__ = [
    "AcpSession",
    "AgentConnection",
    "ClientOptions",
    "Turn",
    "open_agent",
    "open_agent_on_stream",
]

log = structlog.get_logger(__name__)

CLIENT_INFO = t.Implementation(name="acp-orchestrator", title="ACP Orchestrator", version="0.1.0")
UpdateCallback = Callable[[t.SessionUpdate], None]
# The updates that change the session's own state, besides being part of a turn.
_SESSION_STATE_UPDATES = (t.CurrentModeUpdate, t.ConfigOptionUpdate)


@frozen
class ClientOptions:
    """How the client behaves towards one agent."""

    #: the protocol version we speak (and send in ``initialize``)
    protocol_version: int = t.PROTOCOL_VERSION
    #: seconds allowed for ``initialize`` (real agents started with npx can be slow)
    init_timeout: float = 120.0
    #: the auth method id to use when the agent answers -32000; None: the only one offered
    auth_method: str | None = None
    #: after session/cancel, how long a turn may take to end before the agent counts as hung
    cancel_grace: float = 10.0
    #: when the caller is cancelled mid-turn (Ctrl-C), how long the agent may take to end the
    #: turn after session/cancel before the caller goes on (at most ``cancel_grace``)
    interrupt_grace: float = 2.0
    #: the client info sent in ``initialize``
    client_info: t.Implementation = CLIENT_INFO
    #: keep message and thought chunks in ``TurnResult.updates`` (their text is always kept)
    keep_chunks: bool = False


@define(eq=False)
class Turn:
    """A prompt turn in flight; iterate :meth:`updates` for its updates live."""

    session: AcpSession
    accumulator: TurnAccumulator = field(factory=TurnAccumulator)
    result: TurnResult | None = None
    on_update: UpdateCallback | None = None
    _send: trio.MemorySendChannel[t.SessionUpdate] | None = None
    _receive: trio.MemoryReceiveChannel[t.SessionUpdate] | None = None
    _done: trio.Event = field(factory=trio.Event)
    #: the session/prompt call: shielded from the caller's cancellation, cancelled on giving up
    _call: trio.CancelScope = field(factory=lambda: trio.CancelScope(shield=True))
    #: whether session/prompt was sent (or is next in line to be)
    _sent: bool = False
    #: whether the caller left the turn before it ended (see AcpSession._end_abandoned)
    _left: bool = False
    _last_activity: float = 0.0
    #: set by an idle watchdog; reading the clock per update costs floods ~5%
    _track_activity: bool = False
    #: cancel scopes of the permission requests that arrived during the turn and have no
    #: record yet; the result waits for them
    _open_permissions: set[trio.CancelScope] = field(factory=set)
    _permissions_recorded: trio.Event | None = None

    def _add(self, update: t.SessionUpdate) -> None:
        self.accumulator.add(update)
        if self._track_activity:
            self._last_activity = trio.current_time()
        if self.on_update is not None:
            self.on_update(update)
        if self._send is not None:
            # unbounded on purpose: a bounded channel would stall the read loop, and a consumer
            # awaiting another request on this connection would then deadlock
            self._send.send_nowait(update)

    def _withdraw_permissions(self) -> None:
        # The agent ended the turn: nobody waits for an answer to what it still asked.
        for scope in self._open_permissions:
            scope.cancel()

    def _permission_recorded(self, scope: trio.CancelScope) -> None:
        self._open_permissions.discard(scope)
        if not self._open_permissions and self._permissions_recorded is not None:
            self._permissions_recorded.set()

    async def _wait_permissions_recorded(self) -> None:
        """Wait until every permission request of the turn has its record in the accumulator.

        The prompt's response can be read before a handler has run at all, or while a service
        still winds down a withdrawn request: their records belong in the result all the same.
        """
        if self._open_permissions:
            self._permissions_recorded = trio.Event()
            await self._permissions_recorded.wait()

    def _finish(self) -> None:
        if self._send is not None:
            self._send.close()
        self._done.set()

    async def updates(self) -> AsyncIterator[t.SessionUpdate]:
        """The turn's updates as they arrive; ends when the turn ends.

        A turn from :meth:`AcpSession.open_turn` streams every update from its start. On other
        turns a late subscriber first gets ``result.updates`` so far (no chunks, unless kept).
        """
        if self._receive is None:
            self._send, self._receive = trio.open_memory_channel[t.SessionUpdate](math.inf)
            for update in self.accumulator.updates:  # what arrived before we subscribed
                self._send.send_nowait(update)
            if self._done.is_set():
                self._send.close()
        async with self._receive:
            async for update in self._receive:
                yield update


def _fold_text_chunk(turn: Turn | None, raw: Any) -> bool:
    """Fold a plain text chunk straight into ``turn``'s text, when nothing needs it typed.

    Decoding is lazy: a message or thought chunk holding just a text block, in a turn with no
    ``on_update`` callback, no live subscriber and no kept chunks, only ever adds its text, so
    no typed value is built for it. Anything else (other fields, other content, a turn that
    wants the values) returns False and takes the typed path.
    """
    if turn is None or turn.on_update is not None or turn._send is not None:
        return False
    if raw.__class__ is not dict or len(raw) != 2:
        return False
    kind = raw.get("sessionUpdate")
    if kind == "agent_message_chunk":
        into = turn.accumulator.text
    elif kind == "agent_thought_chunk":
        into = turn.accumulator.thoughts
    else:
        return False
    block = raw.get("content")
    if block.__class__ is not dict or len(block) != 2 or block.get("type") != "text":
        return False
    text = block.get("text")
    if text.__class__ is not str or turn.accumulator.keep_chunks:
        return False
    into.append(text)
    if turn._track_activity:
        turn._last_activity = trio.current_time()
    return True


@define(eq=False)
class AcpSession:
    """One ACP session on a connection."""

    connection: AgentConnection
    session_id: str
    cwd: str
    services: ClientServices
    step: str | None = None
    modes: t.SessionModeState | None = None
    config_options: list[t.SessionConfigOption] = field(factory=list)
    #: updates that arrived outside any turn (history replay, late notifications)
    background_updates: list[t.SessionUpdate] = field(factory=list)
    #: every permission decision in this session, in order
    permissions: list[PermissionRecord] = field(factory=list)
    #: what the latest turn produced, set when it ends, also when its caller left it early
    #: (cancelled, Ctrl-C, an error); ``stop_reason`` is None if the agent never ended it
    last_result: TurnResult | None = None
    turns: int = 0
    _turn: Turn | None = None
    _pending_permissions: set[trio.CancelScope] = field(factory=set)
    _cancelling: bool = False

    def _configured(
        self, modes: t.SessionModeState | None, options: list[t.SessionConfigOption] | None
    ) -> AcpSession:
        """Take the modes and config options an agent reported when the session opened."""
        self.modes = modes
        self.config_options = list(options or [])
        return self

    @property
    def context(self) -> SessionContext:
        """What services see of this session."""
        conn = self.connection
        return SessionContext(conn.agent or conn.name, self.session_id, self.cwd, self.step)

    @property
    def current_mode(self) -> str | None:
        """The current mode id, if the agent has modes."""
        return self.modes.current_mode_id if self.modes else None

    # ------------------------------------------------------------------ turns

    def _on_update(self, update: t.SessionUpdate) -> None:
        # one isinstance call for the common case, an update that changes no session state
        if isinstance(update, _SESSION_STATE_UPDATES):
            if isinstance(update, t.CurrentModeUpdate):
                if self.modes is not None:
                    self.modes = t.SessionModeState(
                        current_mode_id=update.current_mode_id,
                        available_modes=self.modes.available_modes,
                    )
            else:
                self.config_options = list(update.config_options)
        turn = self._turn
        if turn is not None:
            turn._add(update)
        else:
            self.background_updates.append(update)

    async def prompt(
        self,
        prompt: PromptInput,
        *,
        timeout: float | None = None,
        idle_timeout: float | None = None,
        on_update: UpdateCallback | None = None,
    ) -> TurnResult:
        """Run one turn and return what it produced.

        ``timeout`` bounds the whole turn and ``idle_timeout`` the silence between updates;
        past either the turn is cancelled, and if it still does not end within the cancel
        grace the agent counts as hung (:class:`TurnTimeout`).

        If the caller is cancelled (Ctrl-C) the turn is ended the ACP way first: shielded,
        ``session/cancel`` goes out (pending permission requests are answered ``cancelled``)
        and the agent gets ``ClientOptions.interrupt_grace`` to end the turn; then
        ``trio.Cancelled`` propagates, and :attr:`last_result` holds what the turn produced.
        """
        async with self._open_turn(prompt, on_update=on_update, live=False) as turn:
            await self._watch(turn, timeout, idle_timeout)
        assert turn.result is not None
        return turn.result

    def open_turn(
        self, prompt: PromptInput, *, on_update: UpdateCallback | None = None
    ) -> AbstractAsyncContextManager[Turn]:
        """Start a turn; inside the block, iterate ``turn.updates()``; on exit it has ended.

        Every update of the turn is streamed to ``turn.updates()``, chunks included. A block
        left early (cancelled, or an error) ends the running turn as :meth:`prompt` does;
        ``turn.result`` then holds what it produced.
        """
        return self._open_turn(prompt, on_update=on_update, live=True)

    @asynccontextmanager
    async def _open_turn(
        self, prompt: PromptInput, *, on_update: UpdateCallback | None, live: bool
    ) -> AsyncIterator[Turn]:
        if self._turn is not None:
            raise UsageError(f"session {self.session_id} already has a turn running")
        blocks = to_blocks(prompt)
        caps = self.connection.agent_capabilities.prompt_capabilities
        check_prompt_capabilities(blocks, caps, agent=self.connection.name)
        turn = Turn(
            self,
            TurnAccumulator(keep_chunks=self.connection.options.keep_chunks),
            on_update=on_update,
        )
        if live:  # subscribed from the start, so nothing needs replaying
            turn._send, turn._receive = trio.open_memory_channel[t.SessionUpdate](math.inf)
        turn._last_activity = trio.current_time()
        self._turn = turn
        self._cancelling = False
        self.turns += 1
        self.last_result = None
        params = t.PromptRequest(session_id=self.session_id, prompt=blocks)
        try:
            with single_error():
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._run_turn, turn, params)
                    try:
                        yield turn
                        await turn._done.wait()
                    except BaseException:
                        await self._end_abandoned(turn)
                        raise
        finally:
            self._turn = None
            turn._finish()
            if turn.result is None and turn._sent and (turn._left or turn._call.cancel_called):
                # left or given up before the agent ended it: what it did until then
                turn.result = turn.accumulator.result(None)
            self.last_result = turn.result

    def _detach(self, turn: Turn) -> None:
        # the prompt's response arrived: what follows it on the wire is outside the turn
        if self._turn is turn:
            self._turn = None
        turn._withdraw_permissions()

    async def _run_turn(self, turn: Turn, params: t.PromptRequest) -> None:
        try:
            # A turn ends with session/cancel and the agent's answer (see _end_abandoned),
            # never by dropping the request: the call is shielded from the caller's
            # cancellation, and giving up on it sends no $/cancel_request.
            with turn._call:
                turn._sent = True
                raw = await self.connection.call(
                    "session/prompt",
                    params,
                    on_response=lambda: self._detach(turn),
                    notify_cancel=False,
                )
                response = structure(raw, t.PromptResponse)
                await turn._wait_permissions_recorded()
                turn.result = turn.accumulator.result(response.stop_reason, response.usage)
        except OrchestratorError as e:
            if not turn._left:
                raise
            # the caller has left with its own exception (Cancelled): this one only ends the turn
            log.debug(
                "turn ended with an error after its caller left",
                agent=self.connection.name,
                error=str(e),
            )
        finally:
            turn._finish()

    async def _end_abandoned(self, turn: Turn) -> None:
        """The caller left a running turn (cancelled, Ctrl-C, an error): end it the ACP way.

        Shielded, for at most the interrupt grace (a second Ctrl-C ends it at once):
        ``session/cancel`` unless already sent, then wait for the agent to end the turn. Then
        the prompt is given up. A prompt not sent yet is simply not sent.
        """
        if turn._done.is_set() or turn._call.cancel_called:
            return  # ended, or given up already (a hung turn after a timeout)
        turn._left = True
        if not turn._sent:
            turn._call.cancel()
            return
        options = self.connection.options
        with grace_period(min(options.cancel_grace, options.interrupt_grace)):
            if not self._cancelling:
                try:
                    await self.cancel()
                except OrchestratorError as e:  # the connection is gone: so is the turn
                    log.debug("session/cancel not sent", agent=self.connection.name, error=str(e))
            await turn._done.wait()
        if not turn._done.is_set():
            log.warning(
                "turn abandoned: the agent did not end it after session/cancel",
                agent=self.connection.name,
                session=self.session_id,
                grace_cut_short=grace_periods_ended(),
            )
        turn._call.cancel()

    async def _watch(self, turn: Turn, timeout: float | None, idle: float | None) -> None:
        if timeout is None and idle is None:
            await turn._done.wait()
            return
        deadline = trio.current_time() + timeout if timeout is not None else math.inf
        turn._track_activity = idle is not None
        while not turn._done.is_set():
            idle_deadline = turn._last_activity + idle if idle is not None else math.inf
            limit = min(deadline, idle_deadline)
            with trio.move_on_at(limit):
                await turn._done.wait()
                return
            if trio.current_time() >= deadline or (
                idle is not None and trio.current_time() >= turn._last_activity + idle
            ):
                what = "total" if trio.current_time() >= deadline else "idle"
                log.warning("turn timed out", agent=self.connection.name, kind=what)
                await self.cancel()
                await self._wait_after_cancel(
                    turn, f"turn exceeded its {what} timeout", TurnTimeout
                )
                timed_out = TurnTimeout(
                    f"turn exceeded its {what} timeout and was cancelled",
                    agent=self.connection.name,
                )
                timed_out.unresponsive = False  # it answered the cancel
                raise timed_out

    async def _wait_after_cancel(
        self, turn: Turn, why: str, error: type[AgentHung] = AgentHung
    ) -> None:
        with trio.move_on_after(self.connection.options.cancel_grace) as scope:
            await turn._done.wait()
        if scope.cancelled_caught:
            turn._call.cancel()  # given up: the turn's block ends without waiting again
            raise error(
                f"{why}; no response {self.connection.options.cancel_grace:g}s after "
                "session/cancel",
                agent=self.connection.name,
            )

    async def cancel(self) -> None:
        """Send ``session/cancel``; pending permission requests are answered ``cancelled``.

        Their ``cancelled`` records are in the turn's result, however late the services make
        them. A request the agent leaves pending when it ends a turn is withdrawn the same way.

        The turn then ends with the agent's stop reason (``cancelled``, or ``end_turn`` from
        agents that ignore the hint); :meth:`prompt` waits at most the cancel grace for it.
        """
        self._cancelling = True
        if self._turn is not None:
            self._turn.accumulator.cancel_requested = True
        for scope in list(self._pending_permissions):
            scope.cancel()
        await self.connection.notify(
            "session/cancel", t.CancelNotification(session_id=self.session_id)
        )
        kill = getattr(self.services.terminal, "kill_session", None)
        if kill is not None:  # the turn is over: so are the commands it started
            await kill(self.session_id)

    async def release(self) -> None:
        """Free what the services hold for this session (terminals, remembered answers)."""
        release = getattr(self.services.terminal, "release_session", None)
        if release is not None:
            await release(self.session_id)
        forget = getattr(self.services.permission, "forget_session", None)
        if forget is not None:
            forget(self.session_id)

    async def wait_turn_end(self) -> None:
        """After :meth:`cancel`: wait for the turn to end, at most the cancel grace."""
        if self._turn is not None:
            await self._wait_after_cancel(self._turn, "cancelled")

    # ------------------------------------------------------------------ modes and options

    async def set_mode(self, mode_id: str) -> None:
        """Switch the session's mode (``session/set_mode``)."""
        if self.modes is not None and mode_id not in {m.id for m in self.modes.available_modes}:
            known = ", ".join(m.id for m in self.modes.available_modes)
            raise UsageError(f"unknown mode {mode_id!r}; the agent offers: {known}")
        await self.connection.call(
            "session/set_mode", t.SetSessionModeRequest(session_id=self.session_id, mode_id=mode_id)
        )
        if self.modes is not None:
            self.modes = t.SessionModeState(
                current_mode_id=mode_id, available_modes=self.modes.available_modes
            )

    async def set_config_option(self, config_id: str, value: str | bool) -> None:
        """Set a config option; the agent answers with the full, updated list."""
        request: t.SetSessionConfigOptionRequest
        if isinstance(value, bool):
            request = t.BooleanSetSessionConfigOptionRequest(
                session_id=self.session_id, config_id=config_id, value=value
            )
        else:
            request = t.SetSessionConfigOptionRequestValueId(
                session_id=self.session_id, config_id=config_id, value=value
            )
        raw = await self.connection.call("session/set_config_option", request)
        self.config_options = list(structure(raw, t.SetSessionConfigOptionResponse).config_options)

    def option_by_category(self, category: str) -> t.SessionConfigOption | None:
        """The config option of a category (``model``, ``mode``, ``thought_level``...)."""
        for option in self.config_options:
            if getattr(option, "category", None) == category:
                return option
        return None

    async def set_model(self, model: str) -> None:
        """Choose the model: the value (or name) of an option of the ``model`` config option."""
        option = self.option_by_category("model")
        if not isinstance(option, t.SessionConfigSelect):
            raise CapabilityNotSupported(
                "the agent offers no model selector", agent=self.connection.name
            )
        choices = _select_values(option)  # value -> display name
        value = (
            model if model in choices else next((v for v, n in choices.items() if n == model), None)
        )
        if value is None:
            raise UsageError(f"unknown model {model!r}; the agent offers: {', '.join(choices)}")
        await self.set_config_option(option.id, value)


def _select_values(option: t.SessionConfigSelect) -> dict[str, str]:
    values: dict[str, str] = {}
    for item in option.options:
        if isinstance(item, t.SessionConfigSelectGroup):
            values.update({o.value: o.name for o in item.options})
        else:
            values[item.value] = item.name
    return values


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
            )
        self.init = init
        info = init.agent_info
        log.info(
            "agent initialized",
            agent=self.name,
            agent_name=info.name if info else None,
            version=info.version if info else None,
        )
        return init

    async def authenticate(self, method_id: str | None = None) -> None:
        """Authenticate with ``method_id``, the configured method, or the only one offered."""
        methods = [m for m in self.auth_methods if not isinstance(m, t.UnknownAuthMethod)]
        ids = [m.id for m in methods]
        chosen = method_id or self.options.auth_method
        if chosen is None:
            if len(ids) != 1:
                listed = ", ".join(ids) if ids else "none"
                raise AuthenticationError(
                    f"authentication required; choose a method (offered: {listed})",
                    agent=self.name,
                )
            chosen = ids[0]
        elif ids and chosen not in ids:
            raise AuthenticationError(
                f"auth method {chosen!r} not offered (offered: {', '.join(ids)})", agent=self.name
            )
        try:
            await self.call("authenticate", t.AuthenticateRequest(method_id=chosen))
        except OrchestratorError as e:
            if isinstance(e, ConnectionClosed):
                raise
            raise AuthenticationError(f"authenticate({chosen}) failed: {e}", agent=self.name) from e
        self._authenticated = True
        log.info("authenticated", agent=self.name, method=chosen)

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
    ) -> AcpSession:
        """Open a session in ``cwd`` (made absolute); authenticates first if the agent asks."""
        path = os.path.abspath(cwd)
        request = t.NewSessionRequest(cwd=path, mcp_servers=list(mcp_servers))
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
        session = self._session_for(params)
        if session.services.fs is None:
            raise MethodNotFound("fs/read_text_file is not offered by this client")
        request = structure(params, t.ReadTextFileRequest)
        return unstructure(await session.services.fs.read_text_file(request, session.context))

    def _fs_nowait(self, params: Any, method: str, request_type: type[Any]) -> Any:
        """Serve an fs request with the service's ``*_nowait`` ``method``, in the read loop.

        A service without it (or no fs service at all) leaves the request to the async handler.
        """
        session = self._session_for(params)
        serve = getattr(session.services.fs, method, None)
        if serve is None:
            raise trio.WouldBlock
        return unstructure(serve(structure(params, request_type), session.context))

    async def _on_fs_write(self, params: Any) -> Any:
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
            return unstructure(await getattr(service, name)(request, session.context))

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


@asynccontextmanager
async def open_agent_on_stream(
    stream: trio.abc.Stream,
    *,
    name: str = "agent",
    services: ClientServices | None = None,
    options: ClientOptions | None = None,
    transcript: TranscriptWriter | None = None,
    extensions: Mapping[str, Callable[[Any], Any]] | None = None,
    close_error: Callable[[str], Any] | None = None,
    max_message_size: int = 64 * 2**20,
) -> AsyncIterator[AgentConnection]:
    """An initialized connection to an agent reached over ``stream``."""
    options = options or ClientOptions()
    rpc = JsonRpcConnection(
        stream,
        name=name,
        max_message_size=max_message_size,
        frame_observer=transcript,
        close_error=close_error,
    )
    conn = AgentConnection(name, rpc, options, services or ClientServices())
    conn.install_handlers(extensions)
    # The read loop (and the agent's requests it serves) is shielded until the block is left:
    # a turn whose caller is cancelled (Ctrl-C) must still hear the agent end it.
    serving = trio.CancelScope(shield=True)

    async def serve(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with serving:
            await rpc.serve(task_status=task_status)

    try:
        with single_error():
            async with trio.open_nursery() as nursery:
                await nursery.start(serve)
                try:
                    try:
                        with trio.fail_after(options.init_timeout):
                            await conn.initialize()
                    except trio.TooSlowError:
                        raise AgentStartError(
                            f"no answer to initialize within {options.init_timeout:g}s",
                            agent=name,
                        ) from None
                    yield conn
                finally:
                    serving.cancel()
                    nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            for session in list(conn.sessions.values()):
                await session.release()
            await rpc.aclose()


@asynccontextmanager
async def open_agent(
    command: Sequence[str] | str,
    *,
    name: str | None = None,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    services: ClientServices | None = None,
    options: ClientOptions | None = None,
    transcript: TranscriptWriter | None = None,
    extensions: Mapping[str, Callable[[Any], Any]] | None = None,
    term_grace: float = 2.0,
    max_message_size: int = 64 * 2**20,
) -> AsyncIterator[AgentConnection]:
    """Start an agent process and yield its initialized connection.

    On exit, normal or not, the agent gets the shutdown ladder (stdin closed, SIGTERM, SIGKILL
    to its process group), so no process outlives the block.
    """
    label = name or _label(command)
    async with open_agent_process(
        command, name=label, env=env, cwd=cwd, stdin_close_grace=term_grace, term_grace=term_grace
    ) as proc:
        initialized = False
        try:
            async with open_agent_on_stream(
                proc.stream,
                name=label,
                services=services,
                options=options,
                transcript=transcript,
                extensions=extensions,
                close_error=proc.exit_error,
                max_message_size=max_message_size,
            ) as conn:
                initialized = True
                conn.pid = proc.pid
                conn.process = proc
                yield conn
        except AgentExited as e:
            if initialized:
                raise
            raise AgentStartError(f"exited before completing initialize: {e}", agent=label) from e
        finally:
            if transcript is not None:
                transcript.close()


def _label(command: Sequence[str] | str) -> str:
    first = command.split()[0] if isinstance(command, str) else command[0]
    return os.path.basename(first) or "agent"
