"""Wire transcripts: every frame both ways, with time and direction, as ND-JSON.

Each line is ``{"dir": "send"|"recv", "t": <seconds since start>, "msg": <the frame>}``; a frame
that is not valid JSON is kept as a string under ``raw`` instead of ``msg``. Lines are written
from the frame bytes as received or sent, without decoding them again.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import IO, Literal

import orjson

__all__ = ["TranscriptWriter"]


class TranscriptWriter:
    """Appends frames to a transcript file; use as a JSON-RPC connection's frame observer."""

    def __init__(self, path: str | os.PathLike[str], *, agent: str | None = None):
        self.path = os.fspath(path)
        self.agent = agent
        # the agent's part of every line, encoded once
        self._agent = b',"agent":' + orjson.dumps(agent) if agent is not None else b""
        self._file: IO[bytes] | None = None
        self._start = time.monotonic()
        self.frames = 0

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
        elapsed = time.monotonic() - self._start
        head = b'{"dir":"%s","t":%.6f%s' % (direction.encode(), elapsed, self._agent)
        if valid:
            line = head + b',"msg":' + frame + b"}\n"
        else:
            line = head + b',"raw":' + orjson.dumps(frame.decode("utf-8", "replace")) + b"}\n"
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
        self._file.write(b"".join([head + frame + b"}\n" for frame in frames]))
        self.frames += len(frames)

    def close(self) -> None:
        """Flush and close the file."""
        if self._file is not None:
            self._file.close()
            self._file = None
