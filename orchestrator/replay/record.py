"""What a replay needs of a recorded run, as one JSON document (a *replay record*).

A replay record is pure data: the recorded agents' handshakes and, per step instance, each
attempt's session with its turns (the prompt, the frames the agent sent and our answers to its
requests, the answer to the prompt) and the changes the instance harvested. The run store makes
one (:func:`orchestrator.runs.replay.replay_record`), ``orchestrator replay --save`` writes one
beside a test, and the replay agent (:mod:`orchestrator.replay.agent`) plays one. This module
reads and writes the format and checks it; it does no I/O but :func:`load_record` and
:meth:`ReplayRecord.dump`.

The JSON form (``format`` and ``version`` first; unknown keys are ignored, a newer ``version``
is refused)::

    {"format": "acp-orchestrator/replay-record", "version": 1,
     "run": {"runId", "kind", "cwd", "pipeline", "pipelineDigest", "pipelineSource",
             "inputs", "options"},
     "agents": {LABEL: {"initialize": <the initialize result>}},
     "steps": {KEY: [<Session>, ...]}}          # one per attempt, in order

    Session: {"agent": LABEL, "attempt": N, "source": "claude#2", "sessionId": ID,
              "new": <the session/new result>, "turns": [<Turn>, ...],
              "changes": [<Change>, ...], "complete": true|false,
              "cwd": <the session/new cwd> | null,      # optional
              "opening": [<Frame>, ...]}                # optional
    Turn:    {"t": <seconds since the transcript began, when the prompt was sent>,
              "prompt": [<ContentBlock>, ...], "frames": [<Frame>, ...],
              "response": {"result": {...}} | {"error": {...}} | null, "cut": true|false}
    Frame:   {"t": <seconds since the prompt>, "dir": "recv"|"send", "msg": <the frame>}
    Change:  {"path", "kind": "write"|"delete", "data": <base64> | null, "mode": int | null,
              "base": <sha256> | null | "unknown"}     # base: optional, "unknown" if missing

``frames`` holds, in wire order, what the agent sent during the turn about this session (its
notifications and requests: ``recv``) and our answers to those requests (``send``); the
prompt's own answer is ``response`` (null when the record has none: the agent died, or the run
was interrupted). ``cut`` marks a turn whose frames were cut by the per-turn storage cap, and a
session that is not ``complete`` lacks something a replay needs (its reason is in ``why``): both
are *not replayable*. ``changes`` are the instance's own harvested changes (what its turns
changed, against what it forked from), on the session of the attempt that produced them.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import orjson
from attrs import field, frozen

from ..errors import UsageError

__all__ = [
    "BASE_UNKNOWN",
    "FORMAT",
    "VERSION",
    "RecordedChange",
    "RecordedFrame",
    "RecordedSession",
    "RecordedTurn",
    "ReplayRecord",
    "load_record",
]

#: the ``format`` of a replay record document
FORMAT = "acp-orchestrator/replay-record"
#: the version this code writes and the newest it reads
VERSION = 1
#: a change's ``base`` when the record does not say what the recording found
BASE_UNKNOWN = "unknown"

JsonObject = dict[str, Any]


def _tuple(items: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(items)


@frozen
class RecordedFrame:
    """One frame of a turn: what the agent sent (``recv``) or what we answered (``send``)."""

    #: seconds since the turn's prompt was sent
    t: float
    dir: Literal["recv", "send"]
    msg: JsonObject

    def to_json(self) -> JsonObject:
        return {"t": self.t, "dir": self.dir, "msg": self.msg}

    @classmethod
    def from_json(cls, value: Any) -> RecordedFrame:
        obj = _object(value, "a frame")
        direction = obj.get("dir")
        if direction not in ("recv", "send"):
            raise _bad(f"a frame's dir is {direction!r}, not 'recv' or 'send'")
        return cls(
            _number(obj.get("t"), "a frame's t"),
            direction,
            _object(obj.get("msg"), "a frame's msg"),
        )


@frozen
class RecordedTurn:
    """One prompt turn of a recorded session."""

    #: seconds since the transcript began, when the prompt was sent
    t: float
    #: the prompt's content blocks, as sent
    prompt: tuple[JsonObject, ...] = field(converter=_tuple)
    frames: tuple[RecordedFrame, ...] = field(converter=_tuple, default=())
    #: the answer to ``session/prompt``: ``{"result": ...}`` or ``{"error": ...}``; None: none
    #: was recorded
    response: JsonObject | None = None
    #: whether the per-turn storage cap cut this turn's frames (not replayable)
    cut: bool = False

    @property
    def prompt_text(self) -> str:
        """The prompt's text blocks, joined with newlines (what a divergence compares)."""
        return "\n".join(
            str(block.get("text", "")) for block in self.prompt if block.get("type") == "text"
        )

    def to_json(self) -> JsonObject:
        return {
            "t": self.t,
            "prompt": list(self.prompt),
            "frames": [frame.to_json() for frame in self.frames],
            "response": self.response,
            "cut": self.cut,
        }

    @classmethod
    def from_json(cls, value: Any) -> RecordedTurn:
        obj = _object(value, "a turn")
        prompt = obj.get("prompt")
        if not isinstance(prompt, list) or not all(isinstance(b, dict) for b in prompt):
            raise _bad("a turn's prompt is not a list of content blocks")
        frames = obj.get("frames", [])
        if not isinstance(frames, list):
            raise _bad("a turn's frames are not a list")
        response = obj.get("response")
        if response is not None:
            response = _object(response, "a turn's response")
        return cls(
            _number(obj.get("t"), "a turn's t"),
            prompt,
            [RecordedFrame.from_json(f) for f in frames],
            response,
            bool(obj.get("cut", False)),
        )


@frozen
class RecordedChange:
    """One path the instance changed: its new content and mode, or its deletion."""

    path: str
    kind: Literal["write", "delete"]
    #: the new content (None for a deletion)
    data: bytes | None = None
    #: the file's mode bits as stored (None: a regular file of the default mode)
    mode: int | None = None
    #: what the recording found there before the change: the file's SHA-256 (hex), None if
    #: there was no file, :data:`BASE_UNKNOWN` if the record does not say; a replay makes
    #: the change only over what the recording found
    base: str | None = BASE_UNKNOWN

    def to_json(self) -> JsonObject:
        encoded = None if self.data is None else base64.b64encode(self.data).decode("ascii")
        return {
            "path": self.path,
            "kind": self.kind,
            "data": encoded,
            "mode": self.mode,
            "base": self.base,
        }

    @classmethod
    def from_json(cls, value: Any) -> RecordedChange:
        obj = _object(value, "a change")
        path = obj.get("path")
        kind = obj.get("kind")
        if not isinstance(path, str) or not path:
            raise _bad("a change has no path")
        if kind not in ("write", "delete"):
            raise _bad(f"the change of {path!r} has kind {kind!r}, not 'write' or 'delete'")
        raw = obj.get("data")
        if kind == "write" and not isinstance(raw, str):
            raise _bad(f"the change of {path!r} writes no data")
        try:
            data = None if raw is None else base64.b64decode(raw, validate=True)
        except ValueError:
            raise _bad(f"the change of {path!r} holds data that is not base64") from None
        mode = obj.get("mode")
        if mode is not None and (not isinstance(mode, int) or isinstance(mode, bool)):
            raise _bad(f"the change of {path!r} has a mode that is not a number")
        base = obj.get("base", BASE_UNKNOWN)
        if base is not None and not isinstance(base, str):
            raise _bad(f"the change of {path!r} has a base that is not a digest")
        return cls(path, kind, data, mode, base)


@frozen
class RecordedSession:
    """One attempt of a step instance: its agent's session, turns and harvested changes."""

    #: the agent's label in the run (the pipeline's name for it: ``claude``, ``alice``)
    agent: str
    attempt: int
    #: the process whose transcript held it (``claude``, ``claude#2``)
    source: str
    session_id: str
    #: the ``session/new`` result as recorded (None: not recorded)
    new: JsonObject | None = None
    turns: tuple[RecordedTurn, ...] = field(converter=_tuple, default=())
    changes: tuple[RecordedChange, ...] = field(converter=_tuple, default=())
    #: whether the record holds what a replay of this session needs
    complete: bool = True
    #: why it is not complete (None when it is)
    why: str | None = None
    #: the session's cwd as recorded (the ``cwd`` of its ``session/new``): a replay maps the
    #: paths of the recorded frames under it to the cwd of the session now (None: not recorded;
    #: the run's cwd stands in)
    cwd: str | None = None
    #: the notifications the agent sent about the session before its first prompt (its
    #: commands, modes: ``available_commands_update`` and the like), ``t`` from the session's
    #: opening
    opening: tuple[RecordedFrame, ...] = field(converter=_tuple, default=())

    @property
    def replayable(self) -> bool:
        """Complete, and no turn cut by the storage cap."""
        return self.complete and not any(turn.cut for turn in self.turns)

    def to_json(self) -> JsonObject:
        return {
            "agent": self.agent,
            "attempt": self.attempt,
            "source": self.source,
            "sessionId": self.session_id,
            "new": self.new,
            "turns": [turn.to_json() for turn in self.turns],
            "changes": [change.to_json() for change in self.changes],
            "complete": self.complete,
            "why": self.why,
            "cwd": self.cwd,
            "opening": [frame.to_json() for frame in self.opening],
        }

    @classmethod
    def from_json(cls, value: Any) -> RecordedSession:
        obj = _object(value, "a session")
        agent, source, session_id = obj.get("agent"), obj.get("source"), obj.get("sessionId")
        for name, item in (("agent", agent), ("source", source), ("sessionId", session_id)):
            if not isinstance(item, str):
                raise _bad(f"a session's {name} is not a string")
        attempt = obj.get("attempt", 1)
        if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 1:
            raise _bad("a session's attempt is not a positive number")
        new = obj.get("new")
        turns = obj.get("turns", [])
        changes = obj.get("changes", [])
        if not isinstance(turns, list) or not isinstance(changes, list):
            raise _bad("a session's turns or changes are not lists")
        why = obj.get("why")
        cwd = obj.get("cwd")
        if cwd is not None and not isinstance(cwd, str):
            raise _bad("a session's cwd is not a string")
        opening = obj.get("opening", [])
        if not isinstance(opening, list):
            raise _bad("a session's opening frames are not a list")
        return cls(
            str(agent),
            attempt,
            str(source),
            str(session_id),
            None if new is None else _object(new, "a session's new"),
            [RecordedTurn.from_json(turn) for turn in turns],
            [RecordedChange.from_json(change) for change in changes],
            bool(obj.get("complete", True)),
            None if why is None else str(why),
            cwd,
            [RecordedFrame.from_json(frame) for frame in opening],
        )


@frozen
class ReplayRecord:
    """A recorded run, as much of it as a replay needs (see the module doc)."""

    #: the run as recorded: runId, kind, cwd, pipeline, pipelineDigest, pipelineSource,
    #: inputs, options
    run: JsonObject
    #: per agent label: ``{"initialize": <result>}``
    agents: Mapping[str, JsonObject]
    #: per step instance key: its sessions, one per attempt, in order
    steps: Mapping[str, tuple[RecordedSession, ...]]

    @property
    def run_id(self) -> str:
        return str(self.run.get("runId", ""))

    def sessions_of(self, agent: str) -> dict[str, tuple[RecordedSession, ...]]:
        """The step instances served by ``agent``, each with its attempts."""
        return {
            key: sessions
            for key, sessions in self.steps.items()
            if any(session.agent == agent for session in sessions)
        }

    def to_json(self) -> JsonObject:
        return {
            "format": FORMAT,
            "version": VERSION,
            "run": self.run,
            "agents": dict(self.agents),
            "steps": {key: [s.to_json() for s in sessions] for key, sessions in self.steps.items()},
        }

    def dumps(self) -> bytes:
        """The record as JSON bytes (keys in order, for a diff-friendly file)."""
        return orjson.dumps(self.to_json(), option=orjson.OPT_INDENT_2)

    def dump(self, path: str | os.PathLike[str]) -> None:
        """Write the record to ``path`` (replaced whole: a temporary file, then a rename)."""
        target = os.fspath(path)
        temporary = f"{target}.tmp{os.getpid()}"
        with open(temporary, "wb") as out:
            out.write(self.dumps())
        os.replace(temporary, target)

    @classmethod
    def from_json(cls, value: Any) -> ReplayRecord:
        """A record from its JSON form (:class:`~orchestrator.errors.UsageError` if not one)."""
        obj = _object(value, "a replay record")
        if obj.get("format") != FORMAT:
            raise _bad(f"it is not a replay record (format {obj.get('format')!r})")
        version = obj.get("version")
        if not isinstance(version, int) or version > VERSION or version < 1:
            raise _bad(
                f"it has version {version!r}; this orchestrator reads up to version {VERSION}"
            )
        run = _object(obj.get("run", {}), "the record's run")
        agents_raw = _object(obj.get("agents", {}), "the record's agents")
        steps_raw = _object(obj.get("steps", {}), "the record's steps")
        agents = {str(k): _object(v, f"agent {k!r}") for k, v in agents_raw.items()}
        steps: dict[str, tuple[RecordedSession, ...]] = {}
        for key, sessions in steps_raw.items():
            if not isinstance(sessions, list):
                raise _bad(f"step {key!r} does not hold a list of sessions")
            steps[str(key)] = tuple(RecordedSession.from_json(s) for s in sessions)
        return cls(run, agents, steps)


def load_record(path: str | os.PathLike[str]) -> ReplayRecord:
    """Read a replay record file; :class:`~orchestrator.errors.UsageError` names what is wrong."""
    name = os.fspath(path)
    try:
        with open(name, "rb") as source:
            data = source.read()
    except OSError as e:
        raise UsageError(f"cannot read the replay record {name}: {e.strerror or e}") from None
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise UsageError(f"the replay record {name} is not JSON: {e}") from None
    try:
        return ReplayRecord.from_json(value)
    except UsageError as e:
        raise UsageError(f"the replay record {name}: {e}") from None


def _bad(message: str) -> UsageError:
    return UsageError(message)


def _object(value: Any, what: str) -> JsonObject:
    if not isinstance(value, dict):
        raise _bad(f"{what} is not a JSON object")
    return value


def _number(value: Any, what: str) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise _bad(f"{what} is not a number")
    return float(value)
