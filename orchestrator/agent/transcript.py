"""Wire transcripts: every frame both ways, with time and direction, as ND-JSON.

Each line is ``{"dir": "send"|"recv", "t": <seconds since start>, "msg": <the frame>}``; a frame
that is not valid JSON is kept as a string under ``raw`` instead of ``msg``. Lines are written
from the frame bytes as received or sent, without decoding them again.

With ``max_turn_bytes`` a turn's part of the transcript (from a ``session/prompt`` we send to
the next one) keeps its first lines within that many bytes; the frames after them are dropped
and counted, and where the part ends a line ``{"dir": "cut", "t", "frames", "bytes", "limit"}``
says how many frames (of how many bytes of transcript lines) were left out.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import IO, Literal

import orjson

from ..mcp import redact_frame

__all__ = ["TranscriptWriter"]

# how our own encoder starts a session/prompt request: {"jsonrpc":"2.0","id":N,"method":...
_PROMPT_METHOD = b',"method":"session/prompt"'
# session/new, load and resume carry the MCP servers, whose secrets a transcript leaves out
_SESSION_METHOD = b',"method":"session/'


class TranscriptWriter:
    """Appends frames to a transcript file; use as a JSON-RPC connection's frame observer."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        agent: str | None = None,
        max_turn_bytes: int | None = None,
    ):
        self.path = os.fspath(path)
        self.agent = agent
        #: the most bytes of transcript lines kept per turn (None: all); see the module doc
        self.max_turn_bytes = max_turn_bytes
        # the agent's part of every line, encoded once
        self._agent = b',"agent":' + orjson.dumps(agent) if agent is not None else b""
        self._file: IO[bytes] | None = None
        self._start = time.monotonic()
        self.frames = 0
        #: frames left out over the turn limit, in all
        self.dropped_frames = 0
        # the turn's part so far: bytes written, and frames and bytes dropped
        self._turn_bytes = 0
        self._cut_frames = 0
        self._cut_bytes = 0

    def open(self) -> None:
        """Open (truncate) the file; called before the first frame."""
        self._file = open(self.path, "wb", buffering=1 << 20)  # noqa: SIM115 - closed by close()
        self._start = time.monotonic()

    def __call__(
        self, direction: Literal["send", "recv"], frame: bytes, valid: bool = True
    ) -> None:
        """Record one frame (the connection calls this for every line, both ways).

        ``valid`` says whether the frame is JSON (the connection parsed it already): a frame
        that is not is kept as a string under ``raw``.
        """
        if self._file is None:
            self.open()
        assert self._file is not None
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
        if self._keeps(len(line)):
            self._file.write(line)
        self.frames += 1

    def recv_batch(self, frames: Sequence[bytes], valid: Sequence[bool]) -> None:
        """Record frames received together (one read), with one time; the connection's fast
        path for a flood: one write for the batch, no call per frame."""
        if not all(valid):
            for frame, ok in zip(frames, valid, strict=True):
                self("recv", frame, ok)
            return
        if self._file is None:
            self.open()
        assert self._file is not None
        elapsed = time.monotonic() - self._start
        head = b'{"dir":"recv","t":%.6f%s,"msg":' % (elapsed, self._agent)
        self.frames += len(frames)
        if self._cut_frames:  # the turn's part is full: the rest of a flood is only counted
            self._cut_frames += len(frames)
            self._cut_bytes += len(frames) * (len(head) + 2) + sum(map(len, frames))
            self.dropped_frames += len(frames)
            return
        lines = [head + frame + b"}\n" for frame in frames]
        limit = self.max_turn_bytes
        if limit is not None and self._turn_bytes + sum(map(len, lines)) > limit:
            lines = [line for line in lines if self._keeps(len(line))]
        else:
            self._turn_bytes += sum(map(len, lines))
        self._file.write(b"".join(lines))

    def _keeps(self, size: int) -> bool:
        """Whether a line of ``size`` bytes fits in the turn's part (once one does not, none
        does until the next turn); a line left out is counted."""
        limit = self.max_turn_bytes
        if limit is None:
            return True
        if not self._cut_frames and self._turn_bytes + size <= limit:
            self._turn_bytes += size
            return True
        self._cut_frames += 1
        self._cut_bytes += size
        self.dropped_frames += 1
        return False

    def _new_turn(self) -> None:
        """A turn starts: say what the last one left out, and count afresh."""
        self._note_cut()
        self._turn_bytes = 0

    def _note_cut(self) -> None:
        if not self._cut_frames or self._file is None:
            return
        note = {
            "dir": "cut",
            "t": round(time.monotonic() - self._start, 6),
            **({"agent": self.agent} if self.agent is not None else {}),
            "frames": self._cut_frames,
            "bytes": self._cut_bytes,
            "limit": self.max_turn_bytes,
        }
        self._file.write(orjson.dumps(note) + b"\n")
        self._cut_frames = self._cut_bytes = 0

    def close(self) -> None:
        """Flush and close the file (first saying what the last turn left out, if anything)."""
        if self._file is not None:
            self._note_cut()
            self._file.close()
            self._file = None
