"""Wire transcripts: every frame both ways, with time and direction, as ND-JSON.

Each line is ``{"dir": "send"|"recv", "t": <seconds since start>, "msg": <the frame>}``; a frame
that is not valid JSON is kept as a string under ``raw`` instead of ``msg``. Lines are written
from the frame bytes as received or sent, without decoding them again.
"""

from __future__ import annotations

import os
import time
from typing import IO, Literal

import orjson

__all__ = ["TranscriptWriter"]


class TranscriptWriter:
    """Appends frames to a transcript file; use as a JSON-RPC connection's frame observer."""

    def __init__(self, path: str | os.PathLike[str], *, agent: str | None = None):
        self.path = os.fspath(path)
        self.agent = agent
        self._file: IO[bytes] | None = None
        self._start = time.monotonic()
        self.frames = 0

    def open(self) -> None:
        """Open (truncate) the file; called before the first frame."""
        self._file = open(self.path, "wb", buffering=1 << 20)  # noqa: SIM115 - closed by close()
        self._start = time.monotonic()

    def __call__(self, direction: Literal["send", "recv"], frame: bytes) -> None:
        """Record one frame (the connection calls this for every line, both ways)."""
        if self._file is None:
            self.open()
        assert self._file is not None
        elapsed = time.monotonic() - self._start
        head = b'{"dir":"%s","t":%.6f' % (direction.encode(), elapsed)
        if self.agent is not None:
            head += b',"agent":' + orjson.dumps(self.agent)
        # what we send was encoded by us, so only received frames need checking for bad JSON
        if direction == "recv" and not _is_json(frame):
            line = head + b',"raw":' + orjson.dumps(frame.decode("utf-8", "replace")) + b"}\n"
        else:
            line = head + b',"msg":' + frame + b"}\n"
        self._file.write(line)
        self.frames += 1

    def close(self) -> None:
        """Flush and close the file."""
        if self._file is not None:
            self._file.close()
            self._file = None


def _is_json(frame: bytes) -> bool:
    try:
        orjson.loads(frame)
    except orjson.JSONDecodeError:
        return False
    return True
