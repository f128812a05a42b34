"""What the command line prints: one JSON object for scripts, versioned; text made safe for
people's terminals.

Every ``--json`` object carries ``schemaVersion``; its shape is described by the JSON Schema
shipped in the package (``orchestrator/schemas/output.schema.json``, :func:`output_schema`).
The version changes when a field is removed or changes meaning; added fields keep it.

Human output goes through :func:`terminal_text` (or :func:`say`): whatever an agent, a file or a
file name holds, no control character reaches the terminal raw.
"""

from __future__ import annotations

import io
import json
import re
import sys
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..runs.default_policy import DefaultRejections

__all__ = [
    "SCHEMA_VERSION",
    "emit_json",
    "output_schema",
    "pipe_safe_stdout",
    "say",
    "say_default_policy_note",
    "terminal_text",
]

#: the version of the ``--json`` objects' shape
SCHEMA_VERSION = 1


def emit_json(obj: Any) -> None:
    """Print ``obj`` as the command's one JSON object on stdout, with ``schemaVersion`` first."""
    import orjson

    body = {"schemaVersion": SCHEMA_VERSION, **obj}
    sys.stdout.buffer.write(orjson.dumps(body, option=orjson.OPT_INDENT_2) + b"\n")
    sys.stdout.flush()


def output_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of every ``--json`` object."""
    from importlib import resources  # not at import: the commands that print JSON need none

    text = resources.files("orchestrator").joinpath("schemas/output.schema.json").read_text()
    schema: dict[str, Any] = json.loads(text)
    return schema


class _ReaderMayLeave(io.FileIO):
    """Standard output's file descriptor, written to as long as someone reads it.

    When the reader goes away (``orchestrator runs | head -1``), a write fails with EPIPE
    (Python ignores SIGPIPE); here that write, and every later one, is dropped as if written:
    the rest of the output has no reader, and the command's work and exit code stand.
    """

    gone = False

    def write(self, data: Any) -> int:
        size = memoryview(data).nbytes
        if self.gone:
            return size
        try:
            return super().write(data)
        except BrokenPipeError:
            self.gone = True
            return size


def pipe_safe_stdout() -> None:
    """Make ``sys.stdout`` safe against a reader that goes away: an ``orchestrator`` command
    never fails, nor prints a traceback, because its output is no longer read.

    The new stream writes to the same descriptor, with the same encoding, error handler and
    buffering (line-buffered on a terminal); call it before anything is printed.
    """
    old = sys.stdout
    try:
        fd = old.fileno()
    except (AttributeError, OSError, ValueError):  # no descriptor (replaced by a caller)
        return
    raw = _ReaderMayLeave(fd, "w", closefd=False)
    sys.stdout = io.TextIOWrapper(
        io.BufferedWriter(raw),
        encoding=old.encoding,
        errors=old.errors,
        line_buffering=bool(old.line_buffering),
    )


# C0 controls but newline and tab, a carriage return not ending a line (``\r\n`` is a line end a
# terminal shows as one), DEL and the C1 controls: the characters a terminal acts on (moves the
# cursor, erases lines, sets titles, starts escape sequences) instead of showing them
_CONTROL = re.compile("\r(?!\n)|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def _visible(match: re.Match[str]) -> str:
    char = match.group()
    if char == "\r":
        return "\\r"
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x80 else f"\\u{code:04x}"


def terminal_text(text: str) -> str:
    """``text`` made safe to write to a terminal: each control character a terminal would act
    on is shown as an escape instead.

    Text from agents, files and file names reaches the terminal in human output (diffs, the
    streamed reply, tool call titles, summaries, errors); written raw, an escape sequence in it
    could erase or rewrite lines on screen and hide a change from review. Newline and tab stay,
    and so does ``\\r`` before ``\\n`` (a CRLF line end, so a diff stays a patch); a lone
    ``\\r`` shows as ``\\r``, every other C0 control and DEL as ``\\xHH`` (ESC is ``\\x1b``), a C1
    control (U+0080 to U+009F) as ``\\uHHHH``. Everything else, all printable Unicode text
    included, is left as it is.
    """
    return _CONTROL.sub(_visible, text) if _CONTROL.search(text) else text


def say(text: str, file: IO[str] | None = None, *, flush: bool = False) -> None:
    """Print one piece of human output (``text`` and a newline) made safe by
    :func:`terminal_text`, on ``file`` (default: stdout)."""
    print(terminal_text(text), file=file or sys.stdout, flush=flush)


def say_default_policy_note(rejections: DefaultRejections, file: IO[str] | None = None) -> None:
    """End a run's human output with a line saying how many permission requests were rejected
    because no policy was given (nothing when none were), and the option that allows edits
    when it would: not for the rejections of steps a resume reused, which keep their result."""
    if not rejections.message:
        return
    advice = "; --policy edit allows edits" if rejections.fresh else ""
    say(f"{rejections.message}{advice}", file)
