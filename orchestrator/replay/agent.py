"""The replay agent: an ACP agent that plays a recorded agent's sessions back.

From a :class:`~orchestrator.replay.record.ReplayRecord` and an agent label it answers
``initialize`` and ``session/new`` as the recorded agent did, and on each prompt plays the
recorded turn against the client it talks to now: notifications are sent again, requests (fs
reads and writes, terminals, permissions) are issued again and their answers compared with the
recorded ones, the recorded disk changes the agent made behind the client's back are written
into the session's cwd, and the prompt gets the recorded answer. What differs is reported as a
:class:`~orchestrator.replay._divergence.Divergence`; ``strict`` stops the turn at the first.

Run it as ``python -m orchestrator.replay RECORD.json --agent LABEL`` (ACP over
stdin/stdout), or in memory with :func:`serve_replay_agent`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import orjson
import trio
from attrs import define, field

from .._log import get_logger
from ..agent.session import STEP_META_KEY
from ..errors import InvalidParams, JsonRpcError, UsageError
from ..jsonrpc.connection import JsonRpcConnection
from . import _frames
from ._disk import apply_change, confined, found_digests
from ._divergence import (
    NOT_REPLAYABLE,
    Divergence,
    DivergenceKind,
    diverged_error,
    short,
)
from .record import BASE_UNKNOWN, RecordedChange, RecordedSession, RecordedTurn, ReplayRecord

__all__ = ["ReplayAgent", "Timing", "run_replay_agent", "serve_replay_agent"]

log = get_logger(__name__)

Timing = Literal["fast", "recorded"]
#: the mode of a file a change creates without a recorded mode (the vfs's default)
#: permission option kinds that grant
_GRANTING = ("allow_once", "allow_always")
#: requests that change the branch or run a program: after a refusal the record cannot say
#: what the agent would have done instead, and these are what a refusal is meant to stop
_ACTING = ("fs/write_text_file", "terminal/create")


class _Stop(Exception):
    """A strict replay met a divergence: the turn ends with it."""

    def __init__(self, divergence: Divergence) -> None:
        super().__init__(divergence.detail)
        self.divergence = divergence


@define(eq=False)
class _Live:
    """A session opened by the client, and the recorded session it plays."""

    session_id: str
    recorded: RecordedSession
    #: the step key the client named (None: picked in record order)
    step: str | None
    cwd: Path
    #: the session's cwd in the record (paths under it are mapped to ``cwd``), or None
    recorded_cwd: str | None = None
    #: the next turn's index
    turn: int = 0
    #: recorded terminal id -> the live one
    terminals: dict[str, str] = field(factory=dict)
    #: the running turn's cancel scope (session/cancel ends it)
    running: trio.CancelScope | None = None
    #: requests the record shows granted that were refused now, in any turn so far: the
    #: agent would not have made its disk changes
    refused: list[str] = field(factory=list)
    #: what the paths of the recorded disk changes held before the first turn (see
    #: :func:`~orchestrator.replay._disk.found_digests`); None until then
    found: dict[str, str | None] | None = None


@define(eq=False)
class _TurnState:
    """What one replayed turn found so far."""

    live: _Live
    index: int
    #: fs/write_text_file requests that succeeded now: absolute path -> content
    written: dict[str, str] = field(factory=dict)


@define(eq=False)
class ReplayAgent:
    """The replay agent's state over one connection."""

    rpc: JsonRpcConnection
    record: ReplayRecord
    agent: str
    strict: bool = False
    timing: Timing = "fast"
    on_divergence: Callable[[Divergence], None] | None = None
    sessions: dict[str, _Live] = field(factory=dict)
    #: how many times each step key was opened
    _opened: dict[str, int] = field(factory=dict)
    #: the recorded sessions served so far (by identity)
    _used: set[int] = field(factory=set)
    #: how many times the replay waited for a frame's recorded time
    waits: int = 0

    def __attrs_post_init__(self) -> None:
        _check_agent(self.record, self.agent)

    def install(self) -> None:
        """Register the ACP methods the agent serves."""
        self.rpc.on_request("initialize", self._initialize)
        self.rpc.on_request("session/new", self._new_session)
        self.rpc.on_request("session/prompt", self._prompt)
        self.rpc.on_request("session/set_mode", self._accept)
        self.rpc.on_request("session/set_config_option", self._set_config_option)
        self.rpc.on_request("session/close", self._close)
        self.rpc.on_notification("session/cancel", self._cancel)

    # ------------------------------------------------------------------ sessions

    async def _initialize(self, params: Any) -> Any:
        return self.record.agents[self.agent].get("initialize") or {"protocolVersion": 1}

    def _pick(self, key: str | None) -> tuple[str | None, RecordedSession]:
        """The recorded session a new session plays, and its step key.

        The k-th session/new naming step ``key`` plays that step's k-th recorded attempt (past
        the last, the last again); a key the record lacks (a step or an item added since) is
        refused, never served another instance's session; without a key, the next recorded
        session of the agent not served yet, in record order.
        """
        if key is not None:
            attempts = [s for s in self.record.steps.get(key, ()) if s.agent == self.agent]
            if not attempts:
                detail = f"the record has no session of agent {self.agent!r} for step {key}"
                divergence = Divergence(key, 1, 0, "not-replayable", detail)
                log.warning("replay diverged", kind="not-replayable", step=key, detail=detail)
                if self.on_divergence is not None:
                    self.on_divergence(divergence)
                raise JsonRpcError(detail, code=NOT_REPLAYABLE)
            k = self._opened.get(key, 0)
            self._opened[key] = k + 1
            chosen = attempts[min(k, len(attempts) - 1)]
            self._used.add(id(chosen))
            return key, chosen
        for step, sessions in self.record.steps.items():
            for session in sessions:
                if session.agent == self.agent and id(session) not in self._used:
                    self._used.add(id(session))
                    return step, session
        raise JsonRpcError(
            f"the record holds no more sessions of agent {self.agent!r} to replay",
            code=NOT_REPLAYABLE,
        )

    async def _new_session(self, params: Any) -> Any:
        if not isinstance(params, dict):
            raise InvalidParams("session/new needs params")
        cwd = params.get("cwd")
        if not isinstance(cwd, str) or not os.path.isabs(cwd):
            raise InvalidParams("cwd must be an absolute path")
        meta = params.get("_meta")
        key = None
        if isinstance(meta, dict) and isinstance(meta.get(STEP_META_KEY), dict):
            step = meta[STEP_META_KEY].get("step")
            key = step if isinstance(step, str) else None
        step_key, recorded = self._pick(key)
        session_id = recorded.session_id
        n = 1
        while session_id in self.sessions:
            n += 1
            session_id = f"{recorded.session_id}~{n}"
        recorded_cwd = recorded.cwd or self.record.run.get("cwd")
        self.sessions[session_id] = _Live(
            session_id,
            recorded,
            step_key,
            Path(cwd),
            recorded_cwd if isinstance(recorded_cwd, str) and recorded_cwd != cwd else None,
        )
        result = dict(recorded.new or {})
        result["sessionId"] = session_id
        log.info("session opened", session=session_id, step=step_key, attempt=recorded.attempt)
        return result

    def _session(self, params: Any) -> _Live:
        live = self.sessions.get(str(params.get("sessionId"))) if isinstance(params, dict) else None
        if live is None:
            raise InvalidParams("unknown session")
        return live

    async def _accept(self, params: Any) -> Any:
        self._session(params)
        return {}

    async def _set_config_option(self, params: Any) -> Any:
        live = self._session(params)
        options = (live.recorded.new or {}).get("configOptions")
        return {"configOptions": options if isinstance(options, list) else []}

    async def _close(self, params: Any) -> Any:
        live = self._session(params)
        if live.running is not None:
            live.running.cancel()
        del self.sessions[live.session_id]
        return {}

    def _cancel(self, params: Any) -> None:
        live = self.sessions.get(str(params.get("sessionId"))) if isinstance(params, dict) else None
        if live is not None and live.running is not None:
            live.running.cancel()

    # ------------------------------------------------------------------ the turn

    def _report(
        self,
        state: _TurnState,
        kind: DivergenceKind,
        detail: str,
        recorded: Any = None,
        now: Any = None,
    ) -> None:
        """Report a divergence; under ``strict`` it ends the turn."""
        live = state.live
        divergence = Divergence(
            live.step, live.recorded.attempt, state.index, kind, detail, short(recorded), short(now)
        )
        log.warning("replay diverged", kind=kind, step=live.step, detail=detail)
        if self.on_divergence is not None:
            self.on_divergence(divergence)
        if self.strict:
            raise _Stop(divergence)

    async def _prompt(self, params: Any) -> Any:
        live = self._session(params)
        if live.running is not None:
            raise InvalidParams("a turn is already running in this session")
        index = live.turn
        live.turn += 1
        state = _TurnState(live, index)
        turns = live.recorded.turns
        where = f"turn {index + 1} of step {live.step or live.session_id}"
        if index >= len(turns):
            why = f"the record has {len(turns)} turn(s)"
        elif not live.recorded.complete:
            why = live.recorded.why or "the record of the session is not complete"
        elif turns[index].cut:
            why = "its frames were cut by the per-turn storage cap"
        elif turns[index].response is None:
            why = "the record has no answer to its prompt"
        else:
            why = None
        if why is not None:
            message = f"{where} is not replayable: {why}"
            with contextlib.suppress(_Stop):  # the error says it either way
                self._report(state, "not-replayable", message)
            raise JsonRpcError(message, code=NOT_REPLAYABLE)
        turn = turns[index]
        scope = live.running = trio.CancelScope()
        try:
            with scope:
                if index == 0:
                    # what the recorded disk changes will land on, before any frame changes it
                    paths = [change.path for change in _changes(live)]
                    live.found = await trio.to_thread.run_sync(found_digests, live.cwd, paths)
                    # what the agent said of the session before its first prompt (its
                    # commands): the client has the session now, so these find it
                    for frame in live.recorded.opening:
                        method = frame.msg.get("method")
                        if isinstance(method, str) and "id" not in frame.msg:
                            said = self._live_params(live, frame.msg.get("params"))
                            await self.rpc.notify(method, said)
                await self._play(state, turn, params.get("prompt"), last=index == len(turns) - 1)
        except _Stop as stop:
            raise diverged_error(stop.divergence) from None
        finally:
            live.running = None
        if scope.cancelled_caught:
            return {"stopReason": "cancelled"}
        response = turn.response or {}
        if "error" in response:
            raise JsonRpcError.from_error_object(response["error"])
        return response.get("result")

    async def _play(
        self, state: _TurnState, turn: RecordedTurn, prompt: Any, *, last: bool
    ) -> None:
        """The turn's frames, then its disk writes."""
        now_text = _frames.prompt_text(prompt)
        if now_text != turn.prompt_text:
            self._report(
                state, "prompt", "the prompt is not the recorded one", turn.prompt_text, now_text
            )
        answers = _frames.answers(turn)
        start = trio.current_time()
        for i, frame in enumerate(turn.frames):
            if frame.dir != "recv":
                continue
            msg = frame.msg
            method = msg.get("method")
            if not isinstance(method, str):
                continue  # the agent's answer to a request of ours: nothing to play
            if self.timing == "recorded" and start + frame.t > trio.current_time():
                self.waits += 1
                await trio.sleep_until(start + frame.t)
            if "id" in msg and state.live.refused and self._withheld(state, method, msg):
                continue
            params = self._live_params(state.live, msg.get("params"))
            if "id" not in msg:
                await self.rpc.notify(method, params)
                continue
            try:
                result: Any = await self.rpc.request(method, params)
                error: JsonRpcError | None = None
            except JsonRpcError as e:
                result, error = None, e
            self._compare(state, method, msg.get("params"), params, answers.get(i), result, error)
        if state.live.refused:
            if last and _changes(state.live):
                self._report(
                    state,
                    "disk",
                    "the recorded disk changes were not applied: " + "; ".join(state.live.refused),
                    [c.path for c in _changes(state.live)],
                    None,
                )
            return
        if last:
            await self._apply_changes(state)

    def _withheld(self, state: _TurnState, method: str, msg: dict[str, Any]) -> bool:
        """Whether a recorded request is not sent, a request the record shows granted having
        been refused before it in this session: writes and commands are not played past a
        refusal (the agent would not have made them), nor the calls on a terminal whose
        creation was not played."""
        if method in _ACTING:
            params = msg.get("params")
            what = params.get("path") or params.get("command") if isinstance(params, dict) else None
            self._report(
                state,
                "request",
                f"{method} not sent: {state.live.refused[0]} before it",
                what,
                None,
            )
            return True
        params = msg.get("params")
        terminal = params.get("terminalId") if isinstance(params, dict) else None
        return (
            method.startswith("terminal/")
            and isinstance(terminal, str)
            and terminal not in state.live.terminals
        )

    def _live_params(self, live: _Live, params: Any) -> Any:
        """A recorded frame's params with the live session id, terminal ids and paths."""
        if not isinstance(params, dict):
            return params
        mapped = _frames.mapped(params, live.terminals, live.recorded_cwd, str(live.cwd))
        if "sessionId" in mapped:
            mapped["sessionId"] = live.session_id
        return mapped

    def _compare(
        self,
        state: _TurnState,
        method: str,
        recorded_params: Any,
        params: Any,
        answer: dict[str, Any] | None,
        result: Any,
        error: JsonRpcError | None,
    ) -> None:
        """Compare the answer a re-issued request got with the recorded one."""
        if error is None and method == "fs/write_text_file" and isinstance(params, dict):
            path, content = params.get("path"), params.get("content")
            if isinstance(path, str) and isinstance(content, str):
                state.written[os.path.normpath(path)] = content
        if answer is None:
            return  # the record has no answer to compare with
        recorded_error = answer.get("error")
        recorded_result = answer.get("result")
        if method == "terminal/create" and error is None and isinstance(result, dict):
            old = (
                (recorded_result or {}).get("terminalId")
                if isinstance(recorded_result, dict)
                else None
            )
            new = result.get("terminalId")
            if isinstance(old, str) and isinstance(new, str):
                state.live.terminals[old] = new
        if (recorded_error is None) != (error is None):
            if error is not None:
                state.live.refused.append(f"{method} was answered with an error: {error.message}")
                self._report(
                    state,
                    "request",
                    f"{method} answered an error where the record has a result: {error.message}",
                    recorded_result,
                    error.to_error_object(),
                )
            else:
                self._report(
                    state,
                    "request",
                    f"{method} answered a result where the record has an error",
                    recorded_error,
                    result,
                )
            return
        if error is not None or not isinstance(result, dict):
            return
        recorded = recorded_result if isinstance(recorded_result, dict) else {}
        if method == "fs/read_text_file":
            if recorded.get("content") != result.get("content"):
                path = params.get("path") if isinstance(params, dict) else None
                self._report(
                    state,
                    "fs-read",
                    f"reading {path} returned other content",
                    recorded.get("content"),
                    result.get("content"),
                )
        elif method == "session/request_permission":
            options = recorded_params.get("options") if isinstance(recorded_params, dict) else None
            was, now = _frames.chosen(recorded, options), _frames.chosen(result, options)
            if was != now:
                if was in _GRANTING and now not in _GRANTING:
                    state.live.refused.append(f"the permission was answered {now}")
                self._report(
                    state,
                    "permission",
                    f"the permission was answered {now}, the record has {was}",
                    was,
                    now,
                )
        elif method == "terminal/wait_for_exit":
            was_exit, now_exit = _frames.status(recorded), _frames.status(result)
            if was_exit != now_exit:
                self._report(state, "terminal", "the command ended otherwise", was_exit, now_exit)
        elif method == "terminal/output":
            if recorded.get("output") != result.get("output"):
                self._report(
                    state,
                    "terminal",
                    "the command's output differs",
                    recorded.get("output"),
                    result.get("output"),
                )
            if _frames.status(recorded.get("exitStatus")) != _frames.status(
                result.get("exitStatus")
            ):
                self._report(
                    state,
                    "terminal",
                    "the command ended otherwise",
                    recorded.get("exitStatus"),
                    result.get("exitStatus"),
                )

    # ------------------------------------------------------------------ disk writes

    async def _apply_changes(self, state: _TurnState) -> None:
        """Write the session's recorded own changes into its cwd (confined to it)."""
        live = state.live
        for change in _changes(live):
            target = os.path.normpath(os.path.join(live.cwd, change.path))
            if change.kind == "write" and change.data is not None and change.mode is None:
                written = state.written.get(target)
                if written is not None and written.encode("utf-8") == change.data:
                    continue  # a re-issued fs/write_text_file made it already
            problem = confined(live.cwd, change.path)
            now = live.found.get(change.path) if live.found is not None else None
            if problem is None and change.base == BASE_UNKNOWN and now is not None:
                # the record does not say what was there: nothing there is overwritten or
                # deleted (a path with nothing there now takes a write)
                problem = (
                    f"the record does not say what {change.path} held, and it holds something "
                    "now: the recorded change was not made"
                )
            elif problem is None and change.base != BASE_UNKNOWN and now != change.base:
                # the agent wrote over what it found: never over something else
                problem = (
                    f"{change.path} holds other content than the recording found there: "
                    "the recorded change was not made"
                )
            if problem is None:
                try:
                    await trio.to_thread.run_sync(apply_change, live.cwd, change)
                except OSError as e:
                    problem = f"cannot change {change.path}: {e.strerror or e}"
            if problem is not None:
                self._report(state, "disk", problem, change.path, None)


def _check_agent(record: ReplayRecord, agent: str) -> None:
    if agent not in record.agents:
        known = ", ".join(sorted(record.agents)) or "none"
        raise UsageError(f"the record has no agent {agent!r} (it has: {known})")


def _changes(live: _Live) -> Sequence[RecordedChange]:
    """The recorded own changes of a live session's recorded session."""
    return live.recorded.changes


async def serve_replay_agent(
    stream: trio.abc.Stream,
    record: ReplayRecord,
    agent: str,
    *,
    strict: bool = False,
    timing: Timing = "fast",
    divergences: Callable[[Divergence], None] | None = None,
) -> None:
    """Serve the replay agent of ``agent`` in ``record`` over ``stream`` until it closes.

    :class:`~orchestrator.errors.UsageError` if the record has no such agent.
    """
    rpc = JsonRpcConnection(stream, name="client")
    ReplayAgent(rpc, record, agent, strict, timing, divergences).install()
    await rpc.serve()


def run_replay_agent(
    record: ReplayRecord,
    agent: str,
    *,
    strict: bool = False,
    timing: Timing = "fast",
    divergences: str | None = None,
) -> None:
    """Serve ``agent`` of ``record`` on stdin/stdout until the client closes the connection;
    each divergence appended to the file ``divergences`` as a JSON line (flushed at once).

    :class:`~orchestrator.errors.UsageError` if the record has no such agent, ``OSError`` if
    the divergences file cannot be opened (both before anything is served).
    """
    _check_agent(record, agent)
    out = open(divergences, "ab") if divergences else None  # noqa: SIM115

    def report(divergence: Divergence) -> None:
        if out is not None:
            out.write(orjson.dumps(divergence.to_json()) + b"\n")
            out.flush()

    async def run() -> None:
        stream = trio.StapledStream(trio.lowlevel.FdStream(1), trio.lowlevel.FdStream(0))
        await serve_replay_agent(
            stream, record, agent, strict=strict, timing=timing, divergences=report
        )

    try:
        trio.run(run)
    finally:
        if out is not None:
            out.close()
