"""Newline-delimited JSON framing, without I/O.

:class:`LineSplitter` turns the bytes read from a stream into complete lines; it knows nothing
about where the bytes come from (see python-trio/trio#796 for why a splitter should be its own
sans-I/O object). :func:`encode_message` and :func:`decode_message` convert between JSON values
and the bytes of one frame.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, NoReturn

import orjson
from attrs import define, field, frozen

from orchestrator.errors import ParseError

__all__ = [
    "DEFAULT_MAX_MESSAGE_SIZE",
    "LineSplitter",
    "OversizedLine",
    "decode_message",
    "encode_message",
    "excerpt",
    "scrubbed_keys",
]

DEFAULT_MAX_MESSAGE_SIZE = 64 * 2**20
"""The default limit for one line (64 MiB); real agents send single lines of 500+ KB."""


@frozen
class OversizedLine:
    """A line longer than the limit; its bytes were dropped as they arrived."""

    size: int
    """How many bytes the line had (without its newline), counted while discarding it."""


@define
class LineSplitter:
    """Split a byte stream into lines, one JSON message per line.

    ``feed`` returns the complete lines found so far, each without its ``"\\n"`` or a ``"\\r"``
    before it; blank lines are skipped. A line longer than ``max_message_size`` bytes is not
    buffered: from the moment it passes the limit its bytes are discarded up to the next newline,
    and a single :class:`OversizedLine` takes its place in the output. The stream goes on.
    """

    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    # A line that spans chunks is kept as a list of pieces and joined once, so a huge line
    # arriving in many small chunks costs linear time.
    _pieces: list[bytes] = field(init=False, factory=list)
    _buffered: int = field(init=False, default=0)
    _discarding: bool = field(init=False, default=False)
    _discarded: int = field(init=False, default=0)

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes | OversizedLine]:
        """Add received bytes; return the lines they complete, in order."""
        # Trio's memory streams hand out bytearrays; lines must be immutable bytes.
        data = data if isinstance(data, bytes) else bytes(data)
        out: list[bytes | OversizedLine] = []
        limit = self.max_message_size
        start = 0
        if self._discarding:
            nl = data.find(b"\n")
            if nl < 0:
                self._discarded += len(data)
                return out
            out.append(OversizedLine(self._discarded + nl))
            self._discarding = False
            self._discarded = 0
            start = nl + 1

        first_nl = data.find(b"\n", start)
        if first_nl < 0:
            self._keep(data, start)
            return out

        # The first line completes whatever was buffered from earlier chunks.
        first = data[start:first_nl]
        if self._pieces:
            size = self._buffered + len(first)
            if size > limit:
                out.append(OversizedLine(size))
                first = b""
            else:
                self._pieces.append(first)
                first = b"".join(self._pieces)
            self._pieces = []
            self._buffered = 0
        elif len(first) > limit:
            out.append(OversizedLine(len(first)))
            first = b""
        if first.endswith(b"\r"):
            first = first[:-1]
        if first and not first.isspace():
            out.append(first)

        last_nl = data.rfind(b"\n")
        if last_nl > first_nl:
            body = data[first_nl + 1 : last_nl]
            lines = body.split(b"\n")
            if len(body) > limit:
                # Rare (a chunk bigger than the limit): check each line's raw size.
                for line in lines:
                    if len(line) > limit:
                        out.append(OversizedLine(len(line)))
                        continue
                    if line.endswith(b"\r"):
                        line = line[:-1]
                    if line and not line.isspace():
                        out.append(line)
            else:
                if b"\r" in body:
                    lines = [line[:-1] if line.endswith(b"\r") else line for line in lines]
                out.extend([line for line in lines if line and not line.isspace()])
        self._keep(data, last_nl + 1)
        return out

    def eof(self) -> bytes | OversizedLine | None:
        """The stream ended: return a last line that had no newline, if there is one."""
        if self._discarding:
            size = self._discarded
            self._discarding = False
            self._discarded = 0
            return OversizedLine(size)
        if not self._pieces:
            return None
        line = b"".join(self._pieces)
        self._pieces = []
        self._buffered = 0
        if line.endswith(b"\r"):
            line = line[:-1]
        if not line or line.isspace():
            return None
        return line

    def _keep(self, data: bytes, start: int) -> None:
        """Buffer ``data[start:]``, the beginning of a line, or start discarding it."""
        size = len(data) - start
        if size <= 0:
            return
        total = self._buffered + size
        if total > self.max_message_size:
            self._pieces = []
            self._buffered = 0
            self._discarding = True
            self._discarded = total
        else:
            self._pieces.append(data[start:] if start else data)
            self._buffered = total


def encode_message(obj: Any) -> bytes:
    """One frame: ``obj`` as compact UTF-8 JSON followed by ``"\\n"``.

    Raises :exc:`TypeError` (``orjson.JSONEncodeError``) if ``obj`` is not JSON-serializable.
    """
    return orjson.dumps(obj, option=orjson.OPT_APPEND_NEWLINE)


def decode_message(line: bytes | bytearray | memoryview) -> Any:
    """The JSON value in one frame; :class:`~orchestrator.errors.ParseError` if it is not JSON."""
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        return _decode_tolerantly(line, exc)


#: how many characters of a line that is not JSON :func:`excerpt` shows
EXCERPT_CHARS = 80


def excerpt(line: bytes | bytearray | memoryview, limit: int = EXCERPT_CHARS) -> str:
    """The start of a received ``line``, fit to quote in a message: in double quotes, at most
    ``limit`` characters (``...`` after the quote marks a cut), each character that is not
    printable (a control, a newline) escaped as Python writes it, each byte that is not UTF-8
    as ``\\xHH`` and a backslash doubled; the text is the peer's, so nothing in it may act on
    a terminal or pass for our own words."""
    head = bytes(line[: limit * 4 + 4])  # UTF-8 takes at most 4 bytes a character
    text = head.decode("utf-8", "surrogateescape").removesuffix("\n").removesuffix("\r")
    cut = len(text) > limit or len(head) < len(line)
    shown = "".join(_escaped(char) for char in text[:limit])
    return f'"{shown}"' + ("..." if cut else "")


def _escaped(char: str) -> str:
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that is not UTF-8, held by surrogateescape
        return f"\\x{code - 0xDC00:02x}"
    if char == "\\":
        return "\\\\"
    if char.isprintable():
        return char
    return repr(char)[1:-1]


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"number {text[:40]} is infinity as a double")
    return value


def _int_as_orjson_reads_it(text: str) -> int | float:
    # orjson gives a float for an integer outside 64 bits (and writes no such int): the slow
    # path must give the same value, or the first store or transcript of it fails
    value = int(text)
    return value if _INT_MIN <= value <= _UINT_MAX else _finite_float(text)


_INT_MIN = -(2**63)
_UINT_MAX = 2**64 - 1


def _decode_tolerantly(line: bytes | bytearray | memoryview, error: Exception) -> Any:
    """The slow path after orjson refused a line.

    orjson rejects lone UTF-16 surrogate escapes such as ``"\\ud83d"``, which JavaScript peers
    emit when they cut a string in the middle of a pair; the standard library accepts them. Lone
    surrogates are then replaced by U+FFFD so the value can be encoded again later, and
    :func:`scrubbed_keys` names the keys of an object whose strings were. Numbers read
    as orjson reads them: an integer outside 64 bits is a float, one that overflows a double is
    refused.
    """
    try:
        text = bytes(line).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ParseError(f"invalid UTF-8: {exc}") from exc
    try:
        value = json.loads(
            text.removeprefix("\ufeff"),
            parse_constant=_reject_constant,
            parse_float=_finite_float,
            parse_int=_int_as_orjson_reads_it,
        )
        return _scrub_surrogates(value)
    except (ValueError, RecursionError):
        raise ParseError(f"invalid JSON: {error}") from error


_SURROGATE = re.compile("[\ud800-\udfff]")


class _ScrubbedObject(dict[str, Any]):
    """A JSON object some of whose string values held lone surrogates (now U+FFFD)."""

    scrubbed: frozenset[str] = frozenset()


def scrubbed_keys(value: Any) -> frozenset[str]:
    """The keys of the decoded JSON object ``value`` whose string values held lone surrogates,
    replaced by U+FFFD (see :func:`decode_message`): where that changes a meaning (a file's
    name), the value must be refused rather than used. Empty for anything else."""
    return value.scrubbed if isinstance(value, _ScrubbedObject) else frozenset()


def _scrub_surrogates(value: Any) -> Any:
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [_scrub_surrogates(item) for item in value]
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        keys: set[str] = set()
        for k, v in value.items():
            key, clean = _scrub_surrogates(k), _scrub_surrogates(v)
            if isinstance(v, str) and clean != v:
                keys.add(key)
            out[key] = clean
        if not keys:
            return out
        obj = _ScrubbedObject(out)
        obj.scrubbed = frozenset(keys)
        return obj
    return value
