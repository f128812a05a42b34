"""Building a replay record (:class:`~orchestrator.replay.ReplayRecord`) of a recorded run.

:func:`replay_record` reads it from the run store: the run as recorded, each agent label's
``initialize`` answer, and per step instance one session per attempt (the session the store
says served it, found in its process's wire transcript) with its turns and the instance's own
changes. :func:`record_from_transcript` reads one from a ``--transcript`` file, which holds the
frames but no changes.

A process's transcript holds every session it served (``demo-1``, ``demo-2`` in one ``demo``
source), and two processes may both have a ``demo-1``: a session is looked for in its own
source only. A turn's frames are what the agent sent about the session between the prompt and
its answer (notifications and requests naming its ``sessionId``) and our answers to those
requests (matched by id, in wire order); the answer to the prompt is the turn's ``response``.
A turn the per-turn storage cap cut (a ``{"dir": "cut"}`` line written where its part of the
transcript ends) is marked ``cut``; a session whose transcript or handshake is missing is not
``complete``, its reason in ``why``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import orjson
import trio
from attrs import define, field

from ..errors import UsageError
from ..replay._frames import id_key
from ..replay.record import (
    RecordedChange,
    RecordedFrame,
    RecordedSession,
    RecordedTurn,
    ReplayRecord,
)
from ..state import state_directory
from ..store import RunStore, SessionRecord, StoredChange, open_run_store

__all__ = ["record_from_transcript", "replay_record"]

JsonObject = dict[str, Any]


async def replay_record(
    run_id: str, *, state_dir: str | os.PathLike[str] | None = None
) -> ReplayRecord:
    """The replay record of run ``run_id`` (its id or a unique prefix), from the run store.

    Raises :class:`~orchestrator.errors.RunNotFound` for an unknown run, and
    :class:`~orchestrator.errors.UsageError` for a batch run (its repositories' runs are the
    ones to replay).
    """
    async with open_run_store(state_directory(state_dir)) as store:
        return await _from_store(store, run_id)


async def _from_store(store: RunStore, run_id: str) -> ReplayRecord:
    record = await store.get_run(run_id)
    run_id = record.run_id
    if record.kind == "batch":
        raise UsageError(
            f"run {run_id} is a batch run: replay one of its repositories' runs instead"
        )
    run: JsonObject = {
        "runId": run_id,
        "kind": record.kind,
        "cwd": record.cwd,
        "pipeline": record.pipeline,
        "pipelineDigest": record.pipeline_digest,
        "pipelineSource": await store.pipeline_source(run_id),
        "inputs": dict(record.inputs),
        "options": dict(record.options),
    }
    sessions = await store.sessions(run_id)
    why_all: str | None = None
    if not sessions:
        # a run recorded before the store kept each attempt's session: its steps say the
        # last attempt's session id, not which process served it
        sessions, why_all = await _sessions_of_steps(store, run_id)
    sources = await store.transcript_sources(run_id)
    indexes: dict[str, _Transcript] = {}
    for source in sources:
        lines = await store.transcript(run_id, source)
        indexes[source] = await trio.to_thread.run_sync(_Transcript.of, lines)
    by_key: dict[str, list[SessionRecord]] = {}
    for session in sessions:
        by_key.setdefault(session.key, []).append(session)
    steps: dict[str, tuple[RecordedSession, ...]] = {}
    used: dict[tuple[str, str], int] = {}
    for key, attempts in by_key.items():
        attempts.sort(key=lambda s: s.attempt)
        own = await store.own_changes(run_id, key)
        made: list[RecordedSession] = []
        for i, session in enumerate(attempts):
            last = i == len(attempts) - 1
            # the k-th session of one id on one process is its k-th session/new
            nth = used.get((session.source, session.session_id), 0)
            used[(session.source, session.session_id)] = nth + 1
            made.append(
                _session(
                    session,
                    indexes.get(session.source),
                    nth,
                    _changes(own) if last else (),
                    why_all,
                )
            )
        steps[key] = tuple(made)
    agents: dict[str, JsonObject] = {}
    for session in sessions:
        if session.agent in agents:
            continue
        found = _initialize_of(session.agent, session.source, indexes)
        if found is not None:
            agents[session.agent] = {"initialize": found}
    return ReplayRecord(run, agents, steps)


async def _sessions_of_steps(
    store: RunStore, run_id: str
) -> tuple[list[SessionRecord], str | None]:
    """The sessions of a run whose attempts' sessions were not recorded (before v7 of the
    store): each agent step's last attempt, on the process
    (transcript) whose session/new answered its id if only one did."""
    sources = await store.transcript_sources(run_id)
    opened: dict[str, list[str]] = {}
    for source in sources:
        for line in await store.transcript(run_id, source):
            result = _result(line)
            if result is not None and isinstance(result.get("sessionId"), str):
                opened.setdefault(result["sessionId"], []).append(source)
    out: list[SessionRecord] = []
    for step in await store.steps(run_id):
        if step.agent is None or step.session_id is None:
            continue
        candidates = list(dict.fromkeys(opened.get(step.session_id, [])))
        source = candidates[0] if len(candidates) == 1 else step.agent
        out.append(
            SessionRecord(run_id, step.key, step.attempt, step.agent, source, step.session_id)
        )
    why = (
        "the run store does not say which session served each attempt, nor what it changed "
        "itself (a run recorded before it kept them)"
    )
    return out, why


def _changes(own: Sequence[StoredChange]) -> tuple[RecordedChange, ...]:
    out: list[RecordedChange] = []
    for change in own:
        if change.kind == "delete":
            out.append(RecordedChange(change.path, "delete", base=change.base_digest))
        elif change.kind == "write":
            out.append(
                RecordedChange(change.path, "write", change.data, change.mode, change.base_digest)
            )
    return tuple(out)


def _session(
    session: SessionRecord,
    transcript: _Transcript | None,
    nth: int,
    changes: Sequence[RecordedChange],
    why_all: str | None,
) -> RecordedSession:
    base = RecordedSession(
        agent=session.agent,
        attempt=session.attempt,
        source=session.source,
        session_id=session.session_id,
        changes=changes,
    )
    if transcript is None:
        return attrs.evolve(
            base,
            complete=False,
            why=f"the run store holds no wire transcript of {session.source}",
        )
    built = transcript.session(session.session_id, nth)
    why = built.why if built.why is not None else why_all
    return attrs.evolve(
        base,
        new=built.new,
        turns=built.turns,
        cwd=built.cwd,
        opening=built.opening,
        complete=why is None,
        why=why,
    )


def _initialize_of(agent: str, first: str, indexes: Mapping[str, _Transcript]) -> JsonObject | None:
    """The ``initialize`` result of ``agent``'s first process (``first``, else any of its)."""
    found = indexes.get(first)
    if found is not None and found.initialize is not None:
        return found.initialize
    for source, index in indexes.items():
        if source.partition("#")[0] == agent and index.initialize is not None:
            return index.initialize
    return None


# --------------------------------------------------------------------------- a transcript


@define
class _Built:
    """One session as a transcript holds it."""

    new: JsonObject | None = None
    turns: tuple[RecordedTurn, ...] = ()
    why: str | None = None
    #: the ``cwd`` its ``session/new`` asked for
    cwd: str | None = None
    #: the notifications about it before its first prompt
    opening: tuple[RecordedFrame, ...] = ()


@define
class _Prompt:
    index: int
    t: float
    id: Any
    prompt: list[JsonObject]


@define
class _Transcript:
    """One process's transcript, indexed by what a record needs of it."""

    lines: list[JsonObject]
    #: the ``initialize`` result, if answered
    initialize: JsonObject | None = None
    #: per session id: the ``session/new`` (load, resume) results that opened it, in order
    opened: dict[str, list[JsonObject]] = field(factory=dict)
    #: per session id: the ``cwd`` of each ``session/new`` (load, resume) that opened it
    cwds: dict[str, list[str | None]] = field(factory=dict)
    #: per session id: its prompts, in order
    prompts: dict[str, list[_Prompt]] = field(factory=dict)
    #: per id of a request we sent: the line indexes of the answers with that id (a run
    #: resumed on a new process appends its transcript to the same source: ids start over)
    answers: dict[Any, list[int]] = field(factory=dict)
    #: per id of a request the agent sent: the line indexes of our answers to it
    replies: dict[Any, list[int]] = field(factory=dict)
    #: the line indexes of the agent's frames naming a session, per session id
    frames: dict[str, list[int]] = field(factory=dict)
    #: the indexes of the prompts we sent (any session) and of the ``cut`` lines
    prompt_lines: list[int] = field(factory=list)
    cuts: list[int] = field(factory=list)

    @classmethod
    def of(cls, lines: list[JsonObject]) -> _Transcript:
        """Index ``lines`` (a transcript's decoded lines, in order). Blocking."""
        index = cls(lines)
        sent: dict[Any, str] = {}
        asked_cwd: dict[Any, str] = {}
        for i, line in enumerate(lines):
            direction = line.get("dir")
            if direction == "cut":
                index.cuts.append(i)
                continue
            msg = line.get("msg")
            if not isinstance(msg, dict):
                continue
            method = msg.get("method")
            has_id = "id" in msg and msg.get("id") is not None
            params = msg.get("params")
            session = params.get("sessionId") if isinstance(params, dict) else None
            if direction == "send" and isinstance(method, str) and has_id:
                ident = id_key(msg["id"])
                sent[ident] = method
                cwd = params.get("cwd") if isinstance(params, dict) else None
                if isinstance(cwd, str):
                    asked_cwd[ident] = cwd
                if method == "session/prompt" and isinstance(session, str):
                    prompt = params.get("prompt") if isinstance(params, dict) else None
                    blocks = (
                        [b for b in prompt if isinstance(b, dict)]
                        if isinstance(prompt, list)
                        else []
                    )
                    index.prompts.setdefault(session, []).append(
                        _Prompt(i, _time(line), ident, blocks)
                    )
                    index.prompt_lines.append(i)
            elif direction == "recv" and method is None and has_id:
                ident = id_key(msg["id"])
                index.answers.setdefault(ident, []).append(i)
                what = sent.get(ident)
                result = msg.get("result")
                if what == "initialize" and isinstance(result, dict):
                    index.initialize = index.initialize or result
                elif what in ("session/new", "session/load", "session/resume") and isinstance(
                    result, dict
                ):
                    opened = result.get("sessionId")
                    if what != "session/new":
                        opened = _param(lines, i, sent, ident) or opened
                    if isinstance(opened, str):
                        index.opened.setdefault(opened, []).append(result)
                        index.cwds.setdefault(opened, []).append(asked_cwd.get(ident))
            elif direction == "recv" and isinstance(method, str):
                if isinstance(session, str):
                    index.frames.setdefault(session, []).append(i)
            elif direction == "send" and method is None and has_id:
                index.replies.setdefault(id_key(msg["id"]), []).append(i)
        return index

    def session(self, session_id: str, nth: int) -> _Built:
        """The ``nth`` session of id ``session_id`` opened on this process (0: the first)."""
        opened = self.opened.get(session_id, [])
        if not opened:
            return _Built(why=f"no session/new answered session {session_id} in its transcript")
        new = opened[min(nth, len(opened) - 1)]
        cwds = self.cwds.get(session_id, [])
        cwd = cwds[min(nth, len(cwds) - 1)] if cwds else None
        prompts = self.prompts.get(session_id, [])
        if len(opened) > 1:
            # the same id opened again on this process (not what agents do): its turns cannot
            # be told apart by id; each opening takes its share in order
            prompts = self._of_opening(session_id, nth, prompts)
        frames = self.frames.get(session_id, [])
        opening: list[RecordedFrame] = []
        if len(opened) == 1:
            # what the agent said of the session before its first prompt (its commands)
            first = prompts[0].index if prompts else len(self.lines)
            opening = [
                RecordedFrame(0.0, "recv", self.lines[i]["msg"])
                for i in frames
                if i < first and "id" not in self.lines[i]["msg"]
            ]
        turns: list[RecordedTurn] = []
        for number, prompt in enumerate(prompts):
            end = next((i for i in self.answers.get(prompt.id, []) if i > prompt.index), None)
            following = prompts[number + 1].index if number + 1 < len(prompts) else None
            stop = end if end is not None else (following or len(self.lines))
            turns.append(self._turn(prompt, end, stop, frames))
        return _Built(new, tuple(turns), cwd=cwd, opening=tuple(opening))

    def _of_opening(self, session_id: str, nth: int, prompts: list[_Prompt]) -> list[_Prompt]:
        starts = [
            i
            for i, line in enumerate(self.lines)
            if line.get("dir") == "recv"
            and isinstance(line.get("msg"), dict)
            and isinstance(line["msg"].get("result"), dict)
            and line["msg"]["result"].get("sessionId") == session_id
        ]
        start = starts[min(nth, len(starts) - 1)]
        after = starts[nth + 1] if nth + 1 < len(starts) else len(self.lines)
        return [p for p in prompts if start < p.index < after]

    def _turn(
        self, prompt: _Prompt, end: int | None, stop: int, frames: Sequence[int]
    ) -> RecordedTurn:
        picked: list[int] = []
        for i in frames:
            if prompt.index < i < stop:
                picked.append(i)
                msg = self.lines[i]["msg"]
                if "id" in msg and msg.get("id") is not None:
                    # our answer: the first reply with its id after it (an agent may use an
                    # id again once answered)
                    replies = self.replies.get(id_key(msg["id"]), [])
                    picked.extend([r for r in replies if r > i][:1])
        recorded = [
            RecordedFrame(
                round(_time(self.lines[i]) - prompt.t, 6),
                "recv" if self.lines[i]["dir"] == "recv" else "send",
                self.lines[i]["msg"],
            )
            for i in sorted(set(picked))
        ]
        response: JsonObject | None = None
        if end is not None:
            answer = self.lines[end]["msg"]
            if "error" in answer:
                response = {"error": answer["error"]}
            else:
                response = {"result": answer.get("result")}
        return RecordedTurn(prompt.t, prompt.prompt, recorded, response, self._cut(prompt, end))

    def _cut(self, prompt: _Prompt, end: int | None) -> bool:
        """Whether a ``cut`` line says frames of this turn were left out.

        The transcript writes it where a turn's part ends: at the next prompt the process is
        sent (any session's), or at its end. So a cut line after the prompt, up to the first
        prompt sent after the answer, may be this turn's (a concurrent turn of another session
        on the process shares the part: it is marked too, which errs on the safe side).
        """
        if not self.cuts:
            return False
        after = end if end is not None else prompt.index
        limit = next((i for i in self.prompt_lines if i > after), len(self.lines))
        return any(prompt.index < c < limit for c in self.cuts)


def _param(lines: list[JsonObject], at: int, sent: Mapping[Any, str], ident: Any) -> Any:
    """The ``sessionId`` param of the request we sent with id ``ident`` (before ``at``)."""
    for line in reversed(lines[:at]):
        msg = line.get("msg")
        if (
            line.get("dir") == "send"
            and isinstance(msg, dict)
            and id_key(msg.get("id")) == ident
            and isinstance(msg.get("params"), dict)
        ):
            return msg["params"].get("sessionId")
    return None


def _time(line: Mapping[str, Any]) -> float:
    t = line.get("t")
    return float(t) if isinstance(t, int | float) and not isinstance(t, bool) else 0.0


def _result(line: Mapping[str, Any]) -> JsonObject | None:
    msg = line.get("msg")
    if line.get("dir") != "recv" or not isinstance(msg, dict):
        return None
    result = msg.get("result")
    return result if isinstance(result, dict) else None


# --------------------------------------------------------------------------- a transcript file


def record_from_transcript(path: str | os.PathLike[str]) -> ReplayRecord:
    """The replay record of a ``--transcript`` file (ND-JSON lines ``{"dir", "t", "agent",
    "msg"}``, several agents' lines mixed).

    Each agent process (the lines' ``agent``: ``demo``, ``demo#2``) is read as the store's
    transcripts are; its sessions become steps keyed ``"{agent}:{sessionId}"`` (the process
    label when two processes of one agent opened the same id), in the order they were opened,
    attempt 1 each. A transcript holds no harvested changes: a session's ``changes`` are empty
    (what an agent wrote to disk behind the client's back cannot be replayed from it), though
    the session is ``complete``. The record's ``run`` says only where it came from.

    Raises :class:`~orchestrator.errors.UsageError` for a file that cannot be read, a line
    that is not a JSON object (a last line cut short by a killed process is skipped), or a
    file with no session in it.
    """
    name = os.fspath(path)
    try:
        data = Path(name).read_bytes()
    except OSError as e:
        raise UsageError(f"cannot read the transcript {name}: {e.strerror or e}") from None
    raw = data.split(b"\n")
    by_source: dict[str, list[JsonObject]] = {}
    # where each line is in the file: the order sessions were opened in (each process's ``t``
    # counts from its own start, so times of two processes do not compare)
    position: dict[int, int] = {}
    for number, line in enumerate(raw, start=1):
        if not line.strip():
            continue
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError:
            if number == len(raw) and not data.endswith(b"\n"):
                continue  # the last line, cut short: the process was killed while writing it
            raise UsageError(
                f"the transcript {name}: line {number} is not JSON (is it a --transcript file?)"
            ) from None
        if not isinstance(value, dict) or value.get("dir") not in ("send", "recv", "cut"):
            raise UsageError(
                f"the transcript {name}: line {number} is not a transcript line "
                '({"dir", "t", "agent", "msg"})'
            )
        source = value.get("agent")
        position[id(value)] = number
        by_source.setdefault(source if isinstance(source, str) and source else "agent", []).append(
            value
        )
    steps: dict[str, tuple[RecordedSession, ...]] = {}
    agents: dict[str, JsonObject] = {}
    openings: list[tuple[int, str, RecordedSession]] = []
    for source, lines in by_source.items():
        index = _Transcript.of(lines)
        label = source.partition("#")[0]
        if index.initialize is not None and label not in agents:
            agents[label] = {"initialize": index.initialize}
        counts: dict[str, int] = {}
        for entry in lines:
            result = _result(entry)
            if result is None or not isinstance(result.get("sessionId"), str):
                continue
            session_id = result["sessionId"]
            if not any(result is r for r in index.opened.get(session_id, [])):
                continue  # not a session/new answer
            nth = counts.get(session_id, 0)
            counts[session_id] = nth + 1
            built = index.session(session_id, nth)
            session = RecordedSession(
                agent=label,
                attempt=1,
                source=source,
                session_id=session_id,
                new=built.new,
                turns=built.turns,
                complete=built.why is None,
                why=built.why,
                cwd=built.cwd,
                opening=built.opening,
            )
            openings.append((position[id(entry)], source, session))
    openings.sort(key=lambda item: item[0])
    for _, source, session in openings:
        key = f"{session.agent}:{session.session_id}"
        if key in steps:
            key = f"{source}:{session.session_id}"
        while key in steps:
            key += "'"
        steps[key] = (session,)
    if not steps:
        raise UsageError(f"the transcript {name} holds no agent session")
    run: JsonObject = {
        "runId": None,
        "kind": None,
        "cwd": None,
        "pipeline": None,
        "pipelineDigest": None,
        "pipelineSource": None,
        "inputs": {},
        "options": {"transcript": name},
    }
    return ReplayRecord(run, agents, steps)
