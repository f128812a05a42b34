"""File names between bytes and text: the one place where a name crosses (a pure leaf).

A name on disk is bytes, and need not be UTF-8 (``caf\\xe9.txt`` written by a latin-1 tool).
Inside the orchestrator a name is a ``str`` as the ``os`` module gives it: decoded with the
filesystem encoding, each byte that does not decode held as a lone surrogate
(``surrogateescape``), so :func:`name_bytes` gives back the exact bytes. Such a ``str`` cannot go
into JSON or into SQLite text, nor can an agent send one, so wherever a name leaves as text it
takes one of these forms, made here and nowhere else:

- **display** (:func:`display_name`, read back by :func:`parse_name`): the name's UTF-8 text,
  each byte that is not part of valid UTF-8 written ``\\xHH`` (two lowercase hex digits), and a
  backslash doubled where it stands before another backslash or before ``x`` and two hex digits.
  Every name has exactly one display, and every display reads back to its exact name: the file
  named by the byte ``0xe9`` shows as ``caf\\xe9.txt``, one whose name holds the four characters
  ``\\xe9`` shows as ``caf\\\\xe9.txt``. A name that is plain UTF-8 without such a backslash
  displays as itself. Paths that agents send (``fs/*`` requests) are read this way, so the agent
  can name any file by the text it was shown.
- **JSON objects** (:func:`name_json`, read back by :func:`name_from_json`): ``path`` in the
  display form, plus ``pathBytes``, the exact bytes in base64, whenever the display is not the
  name's own UTF-8 text. Any field naming a file or a link target does the same (``symlink`` /
  ``symlinkBytes``).
- **git quoting** (:func:`git_quote`, :func:`git_unquote`): patches and diffs name files as git
  does with ``core.quotePath``: C-quoted with octal escapes, so ``git apply`` finds the file.
- **the run store** (:func:`name_column`, :func:`name_from_column`): text when the name is
  UTF-8, else its bytes (a BLOB).

Free text that merely may hold names (a terminal's output) is decoded by :func:`decode_text`,
which shows an undecodable byte as ``\\xHH`` too, so a name the agent reads there is a name it
can send back.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "LOGGED_NAME_CHARS",
    "decode_text",
    "display_name",
    "display_names",
    "git_quote",
    "git_unquote",
    "is_plain",
    "is_utf8",
    "logged_name",
    "name_bytes",
    "name_column",
    "name_from_column",
    "name_from_json",
    "name_json",
    "name_of",
    "one_line",
    "parse_name",
]

# the lone surrogates that surrogateescape decoding makes of the bytes 0x80..0xff
_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")
# a backslash before another backslash, a byte shown as an escape, or x and two hex digits:
# left as one backslash it would read as the start of an escape
_AMBIGUOUS_BACKSLASH = re.compile(r"\\(?=\\|[\udc80-\udcff]|x[0-9a-fA-F]{2})")
# what parse_name reads as an escape: a doubled backslash, or a byte 0x80..0xff
_ESCAPE = re.compile(r"\\\\|\\x[89a-fA-F][0-9a-fA-F]")
_GIT_ESCAPES = {7: "\\a", 8: "\\b", 9: "\\t", 10: "\\n", 11: "\\v", 12: "\\f", 13: "\\r"}
_GIT_UNESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}


def name_bytes(name: str | bytes) -> bytes:
    """The exact bytes of ``name`` (a name as the ``os`` module gives it)."""
    return name if isinstance(name, bytes) else os.fsencode(name)


def name_of(raw: bytes) -> str:
    """The name, as the ``os`` module would give it, of the bytes ``raw``."""
    return os.fsdecode(raw)


def _utf8(name: str | bytes) -> str:
    """The name as UTF-8 text, each undecodable byte a lone surrogate."""
    if isinstance(name, str) and name.isascii():
        return name
    try:
        raw = name_bytes(name)
    except UnicodeEncodeError:  # not a name the os module made (a stray surrogate): shown whole
        raw = name.encode("utf-8", "surrogatepass") if isinstance(name, str) else name
    return raw.decode("utf-8", "surrogateescape")


def display_name(name: str | bytes) -> str:
    """The display form of ``name``: valid text that :func:`parse_name` reads back exactly."""
    if isinstance(name, str) and name.isascii() and "\\" not in name:
        return name  # the common case, unchanged in any encoding
    text = _utf8(name)
    if "\\" in text:
        text = _AMBIGUOUS_BACKSLASH.sub(r"\\\\", text)
    return _ESCAPED_BYTE.sub(lambda m: f"\\x{ord(m.group()) - 0xDC00:02x}", text)


#: How much of a name a log line shows (:func:`logged_name`).
LOGGED_NAME_CHARS = 200


def logged_name(name: str | bytes) -> str:
    """The display form of ``name`` (:func:`display_name`) bounded for a log line: an agent
    may send a path of any length, and a line must stay readable. A longer one is cut at
    :data:`LOGGED_NAME_CHARS` characters, with an ellipsis and its whole length."""
    text = display_name(name)
    if len(text) <= LOGGED_NAME_CHARS:
        return text
    return f"{text[:LOGGED_NAME_CHARS]}… ({len(text)} characters)"


def one_line(text: str) -> str:
    """A name's display form (:func:`display_name`) for a line of output: its line breaks and
    tabs escaped (``\\n``, ``\\r``, ``\\t``), so that a name made to hold them cannot start
    a line of its own (and pass for one the program wrote)."""
    if "\n" in text or "\r" in text or "\t" in text:
        return text.replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    return text


def display_names(names: Iterable[str | bytes]) -> list[str]:
    """The display forms of ``names`` (how a JSON list of paths gives them)."""
    return [display_name(name) for name in names]


def is_plain(name: str | bytes) -> bool:
    """Whether ``name`` is UTF-8 and displays as its own text (no ``pathBytes`` needed)."""
    if isinstance(name, str) and name.isascii() and "\\" not in name:
        return True
    text = _utf8(name)
    return _ESCAPED_BYTE.search(text) is None and _AMBIGUOUS_BACKSLASH.search(text) is None


def is_utf8(name: str | bytes) -> bool:
    """Whether ``name`` is UTF-8 text (so it can go as itself into JSON, SQLite or ACP)."""
    if isinstance(name, str) and name.isascii():
        return True
    return _ESCAPED_BYTE.search(_utf8(name)) is None


def parse_name(text: str) -> str:
    """The name whose display form is ``text`` (see the module's documentation).

    Text that is not a canonical display still reads as one name: a backslash that starts no
    escape stands for itself, and ``\\xHH`` escapes that spell valid UTF-8 are those characters.
    Raises :class:`ValueError` for text that is not valid Unicode (a lone surrogate).
    """
    try:
        if "\\" not in text:
            return name_of(text.encode("utf-8"))
        raw = bytearray()
        at = 0
        for m in _ESCAPE.finditer(text):
            raw += text[at : m.start()].encode("utf-8")
            token = m.group()
            raw += b"\\" if token == "\\\\" else bytes((int(token[2:], 16),))
            at = m.end()
        raw += text[at:].encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"not valid Unicode text: {text!r}") from e
    return name_of(bytes(raw))


def name_json(name: str | bytes, key: str = "path") -> dict[str, str]:
    """``{key: display}``, plus ``{key + "Bytes": base64}`` when the display is not plain."""
    if is_plain(name):
        return {key: display_name(name)}
    raw = name_bytes(name)
    return {key: display_name(raw), key + "Bytes": base64.b64encode(raw).decode("ascii")}


def name_from_json(obj: Mapping[str, Any], key: str = "path") -> str:
    """The name an object made by :func:`name_json` gives (``pathBytes`` first, else ``path``).

    Raises :class:`ValueError` for bad base64 or text, :class:`TypeError` when ``path`` is not
    a string.
    """
    exact = obj.get(key + "Bytes")
    if exact is not None:
        try:
            return name_of(base64.b64decode(str(exact), validate=True))
        except binascii.Error as e:
            raise ValueError(f"{key}Bytes is not base64: {exact!r}") from e
    shown = obj.get(key)
    if not isinstance(shown, str):
        raise TypeError(f"{key} is not a string in {dict(obj)!r}")
    return parse_name(shown)


def git_quote(name: str | bytes) -> str:
    """``name`` as git writes a path in a patch: C-quoted, octal escapes, when it needs it."""
    raw = name_bytes(name)
    if not any(c < 0x20 or c >= 0x7F or c in b'"\\' for c in raw):
        return raw.decode("ascii")
    out = []
    for c in raw:
        if c in _GIT_ESCAPES:
            out.append(_GIT_ESCAPES[c])
        elif c in b'"\\':
            out.append("\\" + chr(c))
        elif c < 0x20 or c >= 0x7F:
            out.append(f"\\{c:03o}")
        else:
            out.append(chr(c))
    return '"' + "".join(out) + '"'


def git_unquote(text: str) -> str:
    """The name of a path as git writes it (C-quoted or not); lenient with bad escapes."""
    if len(text) < 2 or text[0] != '"' or text[-1] != '"':
        return name_of(text.encode("utf-8", "replace"))  # git writes such a name as it is
    body = text[1:-1].encode("utf-8", "replace")
    raw = bytearray()
    i = 0
    while i < len(body):
        c = body[i]
        if c == 0x5C and i + 1 < len(body):  # a backslash
            nxt = chr(body[i + 1])
            digits = body[i + 1 : i + 4]
            if len(digits) == 3 and all(0x30 <= d <= 0x37 for d in digits):
                raw.append(int(digits, 8) & 0xFF)
                i += 4
                continue
            if nxt in _GIT_UNESCAPES:
                raw.append(_GIT_UNESCAPES[nxt])
                i += 2
                continue
        raw.append(c)
        i += 1
    return name_of(bytes(raw))


def decode_text(data: bytes) -> str:
    """Free text (a command's output) from bytes: each undecodable byte shown as ``\\xHH``."""
    return data.decode("utf-8", "backslashreplace")


def name_column(name: str) -> str | bytes:
    """How the run store keeps ``name``: its text when it is UTF-8, else its exact bytes."""
    if name.isascii():
        return name
    raw = name_bytes(name)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw


def name_from_column(value: str | bytes) -> str:
    """The name a run store column holds (see :func:`name_column`)."""
    if isinstance(value, bytes):
        return name_of(value)
    return value if value.isascii() else name_of(value.encode("utf-8"))
