"""An ACP session, as the client sees it: its turns, modes and config options.

:class:`AcpSession` (opened by an :class:`~orchestrator.agent.connection.AgentConnection`) runs
one turn at a time: :meth:`AcpSession.prompt` sends ``session/prompt`` and returns the turn's
:class:`~orchestrator.agent.turn.TurnResult`, built from the updates that preceded the
response. :class:`ClientOptions` are the client's limits and graces.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any

import trio
from attrs import define, field, frozen

from .._log import get_logger
from .._util import grace_period, grace_periods_ended, single_error
from ..errors import (
    AgentHung,
    CapabilityNotSupported,
    NotOffered,
    OrchestratorError,
    TurnTimeout,
    UsageError,
)
from ..jsonrpc.connection import DEFAULT_MAX_REQUESTS_IN_FLIGHT, DEFAULT_MAX_UNSENT_BYTES
from ..protocol import types as t
from ..protocol.codec import structure
from .content import PromptInput, check_prompt_capabilities, to_blocks
from .quirks import usage_from_quota
from .services import (
    ClientServices,
    PermissionRecord,
    SessionContext,
)
from .turn import TurnAccumulator, TurnResult

if TYPE_CHECKING:
    from .connection import AgentConnection

__all__ = [
    "CLIENT_INFO",
    "STEP_META_KEY",
    "AcpSession",
    "ClientOptions",
    "Turn",
]

log = get_logger(__name__)

#: the key of ``session/new``'s ``_meta`` under which :attr:`ClientOptions.step_meta` names
#: the step instance: ``{"acp-orchestrator": {"step": KEY}}``
STEP_META_KEY = "acp-orchestrator"
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
    #: the most requests of the agent in flight at once (being handled, or answered and the
    #: answers not read); past it the agent is cut off (:class:`~orchestrator.errors.
    #: BacklogExceeded`). None: no bound
    max_requests_in_flight: int | None = DEFAULT_MAX_REQUESTS_IN_FLIGHT
    #: the most bytes of answers waiting for the agent to read them; past it the agent is cut
    #: off the same way. None: no bound
    max_unsent_bytes: int | None = DEFAULT_MAX_UNSENT_BYTES
    #: send the step instance's key in ``session/new`` as
    #: ``"_meta": {"acp-orchestrator": {"step": KEY}}`` (a replay agent picks the recorded
    #: session by it); off by default, as a real agent has no use for it
    step_meta: bool = False


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
        name = conn.agent or conn.name
        return SessionContext(name, self.session_id, self.cwd, self.step, audit=self.audit)

    def audit(self, record: PermissionRecord) -> None:
        """Add a permission decision to this session's, and to the running turn's."""
        self.permissions.append(record)
        if self._turn is not None:
            self._turn.accumulator.permissions.append(record)

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
        reopen = getattr(self.services.terminal, "reopen_session", None)
        if reopen is not None:  # a turn cancelled before kept it from starting commands
            reopen(self.session_id)
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
                usage = response.usage
                if usage is None and self.connection.quirks.has("usage-from-meta-quota"):
                    usage = usage_from_quota(response.meta)
                turn.result = turn.accumulator.result(response.stop_reason, usage)
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
                # debug: the TurnTimeout raised below is the report (a step's failure)
                log.debug("turn timed out", agent=self.connection.name, kind=what)
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
        """Switch the session's mode: through its config option of category ``mode`` when the
        agent has one (the current way), else ``session/set_mode`` over the modes it reported.

        A mode it does not offer raises :class:`~orchestrator.errors.NotOffered` naming the
        ones it does; nothing is sent then.
        """
        option = self.option_by_category("mode")
        if isinstance(option, t.SessionConfigSelect):
            await self.set_config_option(option.id, self._choice(option, "mode", mode_id))
            return
        if self.modes is None:
            raise CapabilityNotSupported("the agent offers no modes", agent=self.connection.name)
        offered = [m.id for m in self.modes.available_modes]
        if mode_id not in offered:
            raise NotOffered("mode", mode_id, offered, self._label)
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
        """Choose the model: the value (or name) of an option of the ``model`` config option.

        A model it does not offer raises :class:`~orchestrator.errors.NotOffered` naming the
        ones it does; nothing is sent then.
        """
        option = self.option_by_category("model")
        if not isinstance(option, t.SessionConfigSelect):
            raise CapabilityNotSupported(
                "the agent offers no model selector", agent=self.connection.name
            )
        await self.set_config_option(option.id, self._choice(option, "model", model))

    def _choice(self, option: t.SessionConfigSelect, what: str, wanted: str) -> str:
        """The value of ``option`` that ``wanted`` names (its value, else its display name)."""
        choices = _select_values(option)  # value -> display name
        if wanted in choices:
            return wanted
        value = next((v for v, n in choices.items() if n == wanted), None)
        if value is None:
            raise NotOffered(what, wanted, list(choices), self._label)
        return value

    @property
    def _label(self) -> str | None:
        return self.connection.agent or self.connection.name or None

    def current_choice(self, category: str) -> str | None:
        """The current value of the select config option of ``category`` (``model``, ``mode``);
        for ``mode`` without such an option, the current legacy mode; else None."""
        option = self.option_by_category(category)
        if isinstance(option, t.SessionConfigSelect):
            return option.current_value
        return self.current_mode if category == "mode" else None


def _select_values(option: t.SessionConfigSelect) -> dict[str, str]:
    values: dict[str, str] = {}
    for item in option.options:
        if isinstance(item, t.SessionConfigSelectGroup):
            values.update({o.value: o.name for o in item.options})
        else:
            values[item.value] = item.name
    return values
