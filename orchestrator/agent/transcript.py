"""Wire transcripts: every frame both ways, with time and direction, as ND-JSON.

Each line is ``{"dir": "send"|"recv", "t": <seconds since start>, "msg": <the frame>}``; a frame
that is not valid JSON is kept as a string under ``raw`` instead of ``msg``. Lines are written
from the frame bytes as received or sent, without decoding them again.

With ``max_turn_bytes`` a turn's part of the transcript (from a ``session/prompt`` we send to
the next one) keeps its first lines within that many bytes; the frames after them are dropped
and counted, and where the part ends a line ``{"dir": "cut", "t", "frames", "bytes", "limit"}``
says how many frames (of how many bytes of transcript lines) were left out. What is left out
is ``session/update`` notifications (what floods): after the cut a turn still keeps every
response to our own requests (the ``session/prompt`` one, with its ``stopReason``, among
them: one per request we send), and the other requests and responses both ways (the
agent's requests, our answers) within another ``max_turn_bytes``; a turn's part is thus
at most twice ``max_turn_bytes`` and the answers to our requests.

Lines reach the file as they happen: a :class:`TranscriptFile` holds them in a bounded buffer
that its :meth:`~TranscriptFile.run` task writes out once the frames pause for ``quiet``
seconds, and at the latest ``flush_after`` seconds after the first line it holds; a buffer
past ``max_buffer`` bytes is written at once. A flood costs a write per ``max_buffer`` bytes
(or per ``flush_after``), never one per frame; a killed process leaves every line older than
``flush_after`` in the file.
"""

from __future__ import annotations

import operator
import os
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from itertools import repeat
from typing import Literal

import orjson
import trio

from .._log import get_logger
from ..mcp import redact_frame

__all__ = [
    "TranscriptFile",
    "TranscriptWriter",
    "flushing_transcript_file",
    "open_transcript_file",
]

log = get_logger(__name__)

# how our own encoder starts a session/prompt request: {"jsonrpc":"2.0","id":N,"method":...
_PROMPT_METHOD = b',"method":"session/prompt"'
# what a session/update notification holds, as any encoder writes it: a frame without it is
# no update, and one with it is taken for one (only frames past a turn's cut are looked at)
_UPDATE = b'"session/update"'
# session/new, load and resume carry the MCP servers, whose secrets a transcript leaves out
_SESSION_METHOD = b',"method":"session/'

#: seconds a line may wait in the buffer, at most
FLUSH_AFTER = 0.1
#: seconds without a new line after which the buffer is written at once
QUIET = 0.01
#: bytes the buffer holds before it is written at once
MAX_BUFFER = 1 << 20


class TranscriptFile:
    """An ND-JSON file written in batches as lines come (see the module doc).

    :meth:`write` only buffers (or writes a full buffer); :meth:`run`, a task in the nursery
    of whoever produces the lines, writes the rest on time and once more when cancelled;
    :meth:`close` writes what is left. A file that cannot be opened or written (disk full,
    say) is reported once, as a warning; what follows is dropped, the caller goes on.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        append: bool = False,
        flush_after: float = FLUSH_AFTER,
        quiet: float = QUIET,
        max_buffer: int = MAX_BUFFER,
        fd: int | None = None,
    ):
        self.path = os.fspath(path)
        #: whether opening keeps what the file holds (else it is truncated)
        self.append = append
        self.flush_after = flush_after
        self.quiet = quiet
        self.max_buffer = max_buffer
        #: why the file could not be written (what came after was dropped), or None
        self.error: OSError | None = None
        #: write system calls made so far
        self.writes = 0
        # ``fd``: the file opened already (by whoever checked it); closed by :meth:`close`
        self._fd: int | None = fd
        # the buffer, allocated at the first line and let go at close (a closed file's
        # object may live on in a reference cycle until a full garbage collection: a batch
        # of many runs would hold a megabyte per agent session until then), and how much of
        # it holds lines
        self._buffer = bytearray()
        self._used = 0
        # lines taken so far: the flusher tells a pause by this count not moving
        self._taken = 0
        self._pending = trio.Event()

    def open(self) -> None:
        """Open the file now (else the first write does)."""
        if self._fd is not None or self.error is not None:
            return
        flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC
        flags |= os.O_APPEND if self.append else os.O_TRUNC
        try:
            self._fd = os.open(self.path, flags, 0o666)
        except OSError as e:
            self._failed(e)

    def write(self, data: bytes) -> None:
        """Take whole lines; they reach the file within ``flush_after`` seconds."""
        if self.error is not None:
            return
        size = len(data)
        if self._used + size > self.max_buffer:
            self.flush()
            if size >= self.max_buffer:  # as large as the buffer: straight to the file
                self._write(data)
                self._taken += 1
                return
        if not self._buffer:
            self._buffer = bytearray(self.max_buffer)
        first = not self._used
        self._buffer[self._used : self._used + size] = data  # in place: no allocation
        self._used += size
        self._taken += 1
        if first:
            self._pending.set()

    def flush(self) -> None:
        """Write what the buffer holds now."""
        if not self._used:
            return
        used, self._used = self._used, 0
        with memoryview(self._buffer) as view:
            self._write(view[:used])

    def _write(self, data: bytes | memoryview) -> None:
        if self._fd is None:
            self.open()
            if self._fd is None:
                return
        try:
            with memoryview(data) as view:
                while view:
                    self.writes += 1
                    view = view[os.write(self._fd, view) :]
        except OSError as e:
            self._failed(e)

    async def run(self) -> None:
        """Write lines out on time until cancelled, then write what is left; run it in the
        nursery of the lines' producer, so that it never outlives it."""
        try:
            while True:
                await self._pending.wait()
                self._pending = trio.Event()
                deadline = trio.current_time() + self.flush_after
                while self._used:
                    now = trio.current_time()
                    if now >= deadline:
                        break
                    taken = self._taken
                    await trio.sleep_until(min(deadline, now + self.quiet))
                    if self._taken == taken:  # a pause: the producer went quiet
                        break
                self.flush()
        finally:
            # no checkpoint: a cancelled task still writes out its buffer (bounded)
            self.flush()

    def close(self) -> None:
        """Write what is left and close the file."""
        self.flush()
        self._buffer = bytearray()
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                os.close(fd)
            except OSError as e:
                self._failed(e)

    def _failed(self, error: OSError) -> None:
        self._used = 0
        if self.error is None:
            self.error = error
            log.warning(
                "cannot write the transcript; the rest of it is left out",
                path=self.path,
                error=str(error),
            )


@asynccontextmanager
async def open_transcript_file(
    path: str | os.PathLike[str], *, append: bool = False
) -> AsyncIterator[TranscriptFile]:
    """A :class:`TranscriptFile` whose flushing task runs for the block; written out and
    closed at its end, however it ends (see :func:`flushing_transcript_file`)."""
    async with flushing_transcript_file(TranscriptFile(path, append=append)) as out:
        yield out


@asynccontextmanager
async def flushing_transcript_file(out: TranscriptFile) -> AsyncIterator[TranscriptFile]:
    """Runs the flushing task of ``out`` (opened already, or opened by its first write) for
    the block; ``out`` is written out and closed at its end, however it ends.

    The task is shielded until the block is left: lines of work that goes on after a cancel
    (turns ended the ACP way on Ctrl-C) still reach the file on time.
    """
    flushing = trio.CancelScope(shield=True)

    async def write() -> None:
        with flushing:
            await out.run()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(write)
            try:
                yield out
            finally:
                flushing.cancel()
    finally:
        out.close()


class TranscriptWriter:
    """Writes frames to a transcript file; use as a JSON-RPC connection's frame observer.

    Its lines go to its own file (truncated when opened) and, with ``copy_to``, also to that
    file (shared with other writers, say, and closed by its owner). They reach the files as
    they happen while :meth:`run` runs (:func:`~orchestrator.agent.launch.open_agent` runs it
    for the connection's life); :meth:`close` writes the rest.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        agent: str | None = None,
        max_turn_bytes: int | None = None,
        copy_to: TranscriptFile | None = None,
    ):
        self.path = os.fspath(path)
        self.agent = agent
        #: another file that gets every line too, or None
        self.copy_to = copy_to
        self._out = TranscriptFile(self.path)
        self._opened = False
        #: the most bytes of transcript lines kept per turn (None: all); see the module doc
        self.max_turn_bytes = max_turn_bytes
        # the agent's part of every line, encoded once
        self._agent = b',"agent":' + orjson.dumps(agent) if agent is not None else b""
        self._start = time.monotonic()
        self.frames = 0
        #: frames left out over the turn limit, in all
        self.dropped_frames = 0
        # the turn's part so far: bytes written, and frames and bytes dropped
        self._turn_bytes = 0
        self._cut_frames = 0
        self._cut_bytes = 0
        # whether the turn's part is full, and the bytes of requests and responses kept since
        self._full = False
        self._past_cut_bytes = 0

    @property
    def error(self) -> OSError | None:
        """Why the file could not be written (the rest was left out), or None."""
        return self._out.error

    def open(self) -> None:
        """Open (truncate) the file; called before the first frame."""
        self._out.open()
        self._opened = True
        self._start = time.monotonic()

    async def run(self) -> None:
        """Write lines out as they come until cancelled (see :class:`TranscriptFile`)."""
        await self._out.run()

    def _write(self, data: bytes) -> None:
        self._out.write(data)
        if self.copy_to is not None:
            self.copy_to.write(data)

    def __call__(
        self, direction: Literal["send", "recv"], frame: bytes, valid: bool = True
    ) -> None:
        """Record one frame (the connection calls this for every line, both ways).

        ``valid`` says whether the frame is JSON (the connection parsed it already): a frame
        that is not is kept as a string under ``raw``.
        """
        if not self._opened:
            self.open()
        if direction == "send":
            if _PROMPT_METHOD in frame[:64]:
                self._new_turn()
            elif _SESSION_METHOD in frame[:64]:
                frame = redact_frame(frame)  # MCP servers' secrets go to the agent only
        elapsed = time.monotonic() - self._start
        head = b'{"dir":"%s","t":%.6f%s' % (direction.encode(), elapsed, self._agent)
        if valid:
            line = head + b',"msg":' + frame + b"}\n"
        else:
            line = head + b',"raw":' + orjson.dumps(frame.decode("utf-8", "replace")) + b"}\n"
        if self._keeps(len(line), direction, frame):
            self._write(line)
        self.frames += 1

    def recv_batch(self, frames: Sequence[bytes], valid: Sequence[bool]) -> None:
        """Record frames received together (one read), with one time; the connection's fast
        path for a flood: one write for the batch, no call per frame."""
        if not all(valid):
            for frame, ok in zip(frames, valid, strict=True):
                self("recv", frame, ok)
            return
        if not self._opened:
            self.open()
        elapsed = time.monotonic() - self._start
        head = b'{"dir":"recv","t":%.6f%s,"msg":' % (elapsed, self._agent)
        self.frames += len(frames)
        if self._full:  # the turn's part is full: the updates of a flood are only counted
            # (``map`` over ``contains``: no Python frame per line of a flood)
            if not all(map(operator.contains, frames, repeat(_UPDATE))):
                pairs = zip([head + f + b"}\n" for f in frames], frames, strict=True)
                self._write(b"".join(ln for ln, f in pairs if self._keeps(len(ln), "recv", f)))
                return
            self._cut_frames += len(frames)
            self._cut_bytes += len(frames) * (len(head) + 2) + sum(map(len, frames))
            self.dropped_frames += len(frames)
            return
        # the batch's lines in one join: the head between frames, no object per line
        data = head + (b"}\n" + head).join(frames) + b"}\n"
        limit = self.max_turn_bytes
        if limit is not None and self._turn_bytes + len(data) > limit:
            kept = [(head + frame + b"}\n", frame) for frame in frames]
            data = b"".join(line for line, frame in kept if self._keeps(len(line), "recv", frame))
        else:
            self._turn_bytes += len(data)
        self._write(data)

    def _keeps(self, size: int, direction: Literal["send", "recv"], frame: bytes) -> bool:
        """Whether the line of ``frame`` (``size`` bytes) is kept: while it fits in the turn's
        part; once one does not, only what :meth:`_keeps_past_cut` keeps until the next turn.
        A line left out is counted."""
        limit = self.max_turn_bytes
        if limit is None:
            return True
        if not self._full and self._turn_bytes + size <= limit:
            self._turn_bytes += size
            return True
        self._full = True
        if self._keeps_past_cut(size, direction, frame, limit):
            return True
        self._cut_frames += 1
        self._cut_bytes += size
        self.dropped_frames += 1
        return False

    def _keeps_past_cut(
        self, size: int, direction: Literal["send", "recv"], frame: bytes, limit: int
    ) -> bool:
        """Whether a frame past the turn's cut is kept: never an update; always a response to
        our own request (the turn's end is what a reader wants most); other requests and
        responses within another ``limit`` bytes."""
        if _UPDATE in frame:
            return False
        if direction == "recv" and _is_response(frame):
            return True
        if self._past_cut_bytes + size <= limit:
            self._past_cut_bytes += size
            return True
        return False

    def _new_turn(self) -> None:
        """A turn starts: say what the last one left out, and count afresh."""
        self._note_cut()
        self._turn_bytes = 0
        self._full = False
        self._past_cut_bytes = 0

    def _note_cut(self) -> None:
        if not self._cut_frames or not self._opened:
            return
        note = {
            "dir": "cut",
            "t": round(time.monotonic() - self._start, 6),
            **({"agent": self.agent} if self.agent is not None else {}),
            "frames": self._cut_frames,
            "bytes": self._cut_bytes,
            "limit": self.max_turn_bytes,
        }
        self._write(orjson.dumps(note) + b"\n")
        self._cut_frames = self._cut_bytes = 0

    def close(self) -> None:
        """Write out and close the file (first saying what the last turn left out, if
        anything); ``copy_to`` stays open."""
        if self._opened:
            self._note_cut()
            self._out.close()
            self._opened = False


def _is_response(frame: bytes) -> bool:
    """Whether ``frame`` is a JSON-RPC response (an id, no method)."""
    try:
        msg = orjson.loads(frame)
    except orjson.JSONDecodeError:
        return False
    return isinstance(msg, dict) and "id" in msg and "method" not in msg
