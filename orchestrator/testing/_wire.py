"""The scripted agent's wire: its record, a sans-I/O line splitter and a line writer.

Private to :mod:`orchestrator.testing.scripted_agent`, which documents the record's events
and re-exports :class:`AgentRecord` and :data:`MAX_LINE_BYTES`.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import IO, Any, Literal

import orjson
import trio
from attrs import define, field

from orchestrator.errors import JsonRpcError
from orchestrator.testing.script import JsonObject

__all__ = [
    "MAX_LINE_BYTES",
    "AgentRecord",
    "FloodAnswers",
    "LineSplitter",
    "PeerGone",
    "Pending",
    "Wire",
    "id_key",
    "loads_or_text",
    "outcome_of",
]


def _dumps(obj: Any) -> bytes:
    """``obj`` as compact JSON; a string holding a lone surrogate (which orjson refuses) is
    written with its ``\\uXXXX`` escape, as a JavaScript peer writes it."""
    try:
        return orjson.dumps(obj)
    except orjson.JSONEncodeError:
        return json.dumps(obj, separators=(",", ":")).encode("ascii")


MAX_LINE_BYTES = 64 * 1024 * 1024
"""Longest line the agent accepts from the client; longer ones are dropped (-32600)."""

_RECEIVE_SIZE = 65536


@define
class AgentRecord:
    """What a scripted agent received and decided: a list of JSON events.

    The events are documented in :mod:`orchestrator.testing.scripted_agent`.
    """

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
            self._sink.write(_dumps(entry) + b"\n")
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


class PeerGone(Exception):
    """The client closed its side while the agent was writing."""


class LineSplitter:
    """Sans-I/O: bytes in, complete lines out (None stands for a dropped oversized line)."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._buf = bytearray()
        self._scanned = 0
        self._dropping = False

    def feed(self, data: bytes | bytearray) -> list[bytes | None]:
        """The lines that ``data`` completes."""
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
        """At the end of the input: the unterminated last line, if any."""
        rest = bytes(self._buf)
        self._buf.clear()
        return [None] if self._dropping else ([rest] if rest.strip() else [])


@define
class Pending:
    """One of the agent's own requests, waiting for its answer."""

    method: str
    done: trio.Event = field(factory=trio.Event)
    reply: JsonObject = field(factory=dict)
    abandoned: bool = False


@define
class FloodAnswers:
    """The answers to a ``flood_requests`` step read so far."""

    expected: int
    answered: int = 0
    errors: int = 0
    done: trio.Event = field(factory=trio.Event)


@define
class Wire:
    """The agent's side of the stream: reads, locked writes, and its own requests' answers."""

    stream: trio.abc.Stream
    record: AgentRecord
    #: ids of the agent's own requests: "int" counts from 0, "string" gives UUID-like text
    id_style: Literal["int", "string"] = "int"
    pending: dict[tuple[str, Any], Pending] = field(factory=dict)
    next_id: int = 0
    lock: trio.Lock = field(factory=trio.Lock)
    #: the answers to the running ``flood_requests`` step, counted instead of recorded
    flood: FloodAnswers | None = None
    #: false once the agent stopped reading the client (for good)
    reading: bool = True

    async def receive(self) -> bytes | bytearray:
        """The next bytes from the client; empty at its end (or when the stream broke).

        After :meth:`stop_reading` it never returns.
        """
        if not self.reading:
            await trio.sleep_forever()
        try:
            data = await self.stream.receive_some(_RECEIVE_SIZE)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return b""
        if not self.reading:  # it stopped reading while this read waited: never heard
            await trio.sleep_forever()
        return data

    async def send_bytes(self, data: bytes) -> None:
        """Write ``data`` whole; raises :class:`PeerGone` when the client is gone."""
        async with self.lock:
            with trio.CancelScope(shield=True):
                try:
                    await self.stream.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    raise PeerGone from exc

    async def send(self, message: JsonObject) -> None:
        """Write one JSON-RPC message as a line."""
        await self.send_bytes(_dumps(message) + b"\n")

    async def reply(self, req_id: Any, result: JsonObject) -> None:
        """Answer a client request with ``result``."""
        await self.send({"jsonrpc": "2.0", "id": req_id, "result": result})

    async def reply_error(self, req_id: Any, error: JsonRpcError) -> None:
        """Answer a client request with an error."""
        await self.send({"jsonrpc": "2.0", "id": req_id, "error": error.to_error_object()})

    async def update(self, session_id: str, update: JsonObject) -> None:
        """Send a ``session/update`` notification."""
        params = {"sessionId": session_id, "update": update}
        await self.send({"jsonrpc": "2.0", "method": "session/update", "params": params})

    async def request(self, method: str, params: Any) -> JsonObject:
        """Send one of the agent's own requests; return the answer message."""
        n = self.next_id
        self.next_id += 1
        req_id: int | str = n if self.id_style == "int" else str(uuid.UUID(int=n, version=4))
        pending = Pending(method)
        self.pending[id_key(req_id)] = pending
        message: JsonObject = {"jsonrpc": "2.0", "id": req_id, "method": method}
        if params is not None:
            message["params"] = params
        await self.send(message)
        try:
            await pending.done.wait()
        finally:
            # Still pending: remember, so that the late answer is recorded as such.
            pending.abandoned = not pending.done.is_set()
        return pending.reply

    def stop_reading(self) -> None:
        """Hear nothing more from the client (not even what a read under way brings)."""
        self.reading = False

    def on_response(self, message: JsonObject) -> None:
        """Deliver a client's answer to the request waiting for it, and record it."""
        flood = self.flood
        if flood is not None and str(message["id"]).startswith("flood-"):
            flood.answered += 1
            flood.errors += "error" in message
            if flood.answered >= flood.expected:
                flood.done.set()
            return
        pending = self.pending.pop(id_key(message["id"]), None)
        if pending is None:
            self.record.add("unexpected_response", message=message)
            return
        pending.reply = message
        self.record.add(
            "response",
            id=message["id"],
            method=pending.method,
            late=pending.abandoned,
            **outcome_of(message),
        )
        pending.done.set()


def outcome_of(reply: JsonObject) -> JsonObject:
    """An answer message's ``result`` or ``error``, as record fields."""
    return {"error": reply["error"]} if "error" in reply else {"result": reply.get("result")}


def id_key(value: Any) -> tuple[str, Any]:
    """A request id as a dict key."""
    return (type(value).__name__, value)  # 0, 0.0, False and "0" are different ids


def loads_or_text(line: bytes) -> Any:
    """A line as JSON, or (when it is not) as the start of its text."""
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        return line[:500].decode("utf-8", "replace")
