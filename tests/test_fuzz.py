"""Fuzzing the wire: the framer, the message classifier and the codec against hostile input.

What an agent sends is untrusted. These properties feed thousands of generated inputs
(deterministic: derandomized, no example database) and check that each layer either gives a
value or raises its own documented error, and that what it gives can be sent on again:

- the framer (``LineSplitter``) takes any bytes cut anywhere, keeps at most one line's worth
  of bytes, and gives exactly the lines a simple model of ND-JSON gives;
- valid frames come back equal however the stream is cut;
- ``decode_message`` gives a JSON value or a ``ParseError``, whatever the text (deep nesting,
  huge numbers, lone surrogate escapes, bytes that are not UTF-8), and the value encodes again;
- ``classify_message`` gives a message for any JSON value, and any answer built from it encodes;
- the codec turns any JSON given as an ACP method's params or result into a typed value or an
  ``InvalidParams``; a value encodes again, decodes to itself, and is schema-valid when the
  JSON it came from was.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import attrs
import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from schema_check import SchemaIndex
from test_codec import STABLE_DEFS, strategy_for

from orchestrator.errors import InvalidParams, InvalidRequest, JsonRpcError, ParseError
from orchestrator.jsonrpc.framing import LineSplitter, OversizedLine, decode_message, encode_message
from orchestrator.jsonrpc.messages import (
    ErrorResponse,
    InvalidMessage,
    Notification,
    Request,
    Response,
    classify_message,
    error_obj,
    result_obj,
)
from orchestrator.protocol import codec
from orchestrator.protocol import types as t
from orchestrator.protocol.methods import NOTIFICATIONS, REQUESTS

#: deterministic and reproducible in CI: the same examples on every run, no example database
FUZZ = settings(
    max_examples=600,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

SCHEMA = orjson.loads((Path(t.__file__).parent / "schema" / "schema.unstable.json").read_bytes())
INDEX = SchemaIndex.from_schema(SCHEMA)


# --------------------------------------------------------------------------- JSON strategies

ODD_STRINGS = st.sampled_from(
    ["", "\x00", "\n", "\r\n", "\u2028", "\ufeff", "\\", '"', "é", "😀", "\U0010ffff", " " * 3]
)
#: text without surrogates (a Python str holding one is not JSON text anyone can send)
TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=12) | ODD_STRINGS
NUMBERS = (
    st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([0, -0.0, 2**53 + 1, 1.7976931348623157e308, 5e-324, -(2**63)])
)
SCALARS = st.none() | st.booleans() | NUMBERS | TEXT
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=25,
)


def _nested(depth: int, kind: str) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value] if kind == "list" else {"a": value}
    return value


#: values nested deeper than any peer should send (and than orjson writes)
DEEP_VALUES = st.builds(_nested, st.integers(200, 400), st.sampled_from(["list", "dict"]))


def _text_of(value: Any) -> bytes:
    """``value`` as JSON text (the standard library writes any depth Python can hold)."""
    return json.dumps(value, ensure_ascii=False).encode()


@st.composite
def json_texts(draw: st.DrawFn) -> bytes:
    """JSON text a hostile peer might send: valid, deep, huge numbers, lone surrogates, cut."""
    kind = draw(st.sampled_from(["value", "deep", "number", "surrogate", "cut", "bytes"]))
    if kind == "value":
        return _text_of(draw(JSON_VALUES))
    if kind == "deep":
        depth = draw(st.integers(1, 3000))
        opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}")]))
        return (opener * depth + "1" + closer * depth).encode()
    if kind == "number":
        digits = draw(st.integers(1, 500))
        number = draw(
            st.sampled_from(
                ["1" + "0" * digits, "-" + "9" * digits, f"1e{digits}", f"1e-{digits}", "-0"]
            )
        )
        return f'{{"jsonrpc":"2.0","id":{number},"result":{number}}}'.encode()
    if kind == "surrogate":
        escape = draw(
            st.sampled_from(["\\ud800", "\\udfff", "\\ud83d", "\\ude00x", "\\udbff\\u0041"])
        )
        head = draw(TEXT).replace("\\", "").replace('"', "")
        return f'{{"jsonrpc":"2.0","method":"m","params":{{"t":"{head}{escape}"}}}}'.encode()
    if kind == "cut":
        text = _text_of(draw(JSON_VALUES))
        return text[: draw(st.integers(0, len(text)))]
    return draw(st.binary(max_size=60))


def _json_rpc_like() -> st.SearchStrategy[dict[str, Any]]:
    """Objects shaped like JSON-RPC messages, each member right, wrong or missing."""
    junk = JSON_VALUES
    return st.fixed_dictionaries(
        {},
        optional={
            "jsonrpc": st.just("2.0") | junk,
            "id": st.integers(-(2**63), 2**63) | TEXT | junk,
            "method": TEXT | junk,
            "params": st.dictionaries(TEXT, junk, max_size=3) | junk,
            "result": junk,
            "error": st.fixed_dictionaries(
                {}, optional={"code": st.integers() | junk, "message": TEXT | junk, "data": junk}
            )
            | junk,
        },
    )


def _depth(value: Any) -> int:
    """How deep ``value`` nests (iteratively: the value may be deeper than the stack)."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        children = (
            item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        )
        stack.extend((child, level + 1) for child in children)
    return deepest


def _sendable(value: Any) -> None:
    """Raise unless ``value`` can be written as JSON by the library's encoder.

    orjson writes 254 levels at most (it reads 1,024): a value the peer nested deeper is
    written by the standard library instead, which must then manage it as strict JSON.
    """
    if _depth(value) < 250:
        encode_message(value)
    else:
        json.dumps(value, ensure_ascii=False, allow_nan=False).encode()


# --------------------------------------------------------------------------- the framer


def _model_lines(data: bytes, limit: int) -> list[bytes | OversizedLine]:
    """ND-JSON lines as the framer documents them: the whole stream first, cut at newlines."""
    *complete, tail = data.split(b"\n")
    out: list[bytes | OversizedLine] = []
    for line in [*complete, tail] if tail else complete:
        if len(line) > limit:
            out.append(OversizedLine(len(line)))
            continue
        line = line.removesuffix(b"\r")
        if line and not line.isspace():
            out.append(line)
    return out


def _chunks(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


STREAM_BYTES = st.lists(
    st.binary(max_size=40)
    | st.sampled_from([b"\n", b"\r\n", b"\r", b" \n", b"\t\n", b"{}\n", b"\xff", b"\n\n\n"]),
    max_size=30,
).map(b"".join)


@FUZZ
@given(
    data=STREAM_BYTES,
    cuts=st.lists(st.integers(0, 2000), max_size=40),
    limit=st.integers(1, 64) | st.just(1 << 20),
)
@example(data=b"a\r", cuts=[], limit=1)  # the tail's size counts its \r, like a line's
@example(data=b"\r\n" * 3 + b"x" * 10, cuts=[1, 3, 5, 7], limit=4)
def test_the_framer_takes_any_bytes_cut_anywhere(data: bytes, cuts: list[int], limit: int) -> None:
    """Any bytes, cut anywhere: the framer raises nothing, never holds more than a line's worth
    (the limit), and gives exactly the lines of the whole stream."""
    splitter = LineSplitter(max_message_size=limit)
    out: list[bytes | OversizedLine] = []
    for chunk in _chunks(data, cuts):
        out += splitter.feed(chunk)
        held = sum(len(piece) for piece in splitter._pieces)
        assert held <= limit, f"the framer holds {held} bytes past its limit {limit}"
    tail = splitter.eof()
    if tail is not None:
        out.append(tail)
    assert out == _model_lines(data, limit)
    for line in out:
        assert isinstance(line, OversizedLine) or (len(line) <= limit and b"\n" not in line)


@FUZZ
@given(
    values=st.lists(JSON_VALUES, min_size=1, max_size=8),
    cuts=st.lists(st.integers(0, 5000), max_size=50),
)
def test_valid_frames_round_trip_through_any_chunking(values: list[Any], cuts: list[int]) -> None:
    """Frames written by encode_message come back equal, however the stream is cut."""
    data = b"".join(encode_message(v) for v in values)
    splitter = LineSplitter()
    lines: list[bytes | OversizedLine] = []
    for chunk in _chunks(data, cuts):
        lines += splitter.feed(chunk)
    assert splitter.eof() is None
    decoded = [decode_message(line) for line in lines if isinstance(line, bytes)]
    assert len(decoded) == len(lines)
    # orjson reads every number as written (-0.0 stays -0.0): compare the JSON text again
    assert [orjson.dumps(v) for v in decoded] == [orjson.dumps(v) for v in values]


# --------------------------------------------------------------------------- decode, classify


MESSAGES = (Request, Notification, Response, ErrorResponse, InvalidMessage)


def _answer_to(message: Any) -> bytes | None:
    """What a client would send back about ``message`` (the connection's answers)."""
    if isinstance(message, Request):
        return encode_message(result_obj(message.id, {"echo": message.params}))
    if isinstance(message, InvalidMessage):
        return encode_message(error_obj(message.id, InvalidRequest(message.reason)))
    if isinstance(message, ErrorResponse):
        return encode_message(error_obj(message.id, message.error))
    return None


@FUZZ
@given(text=json_texts())
@example(text=b'{"jsonrpc":"2.0","method":"m","params":{"t":"\\ud800"}}')
@example(text=b"[" * 5000 + b"]" * 5000)
@example(text=b'{"id":1e400,"result":' + b"9" * 400 + b"}")
@example(text=b"\xef\xbb\xbf\xff")
def test_any_text_decodes_to_json_or_a_parse_error(text: bytes) -> None:
    """decode_message gives a JSON value or a ParseError; never another error; the value is
    sendable again (no surrogates, no numbers JSON cannot write, no nesting past the limit)."""
    try:
        value = decode_message(text)
    except ParseError:
        return
    _sendable(value)  # no lone surrogate, no integer JSON writers refuse
    message = classify_message(value)
    assert isinstance(message, MESSAGES)
    answer = _answer_to(message)
    assert answer is None or answer.endswith(b"\n")


@FUZZ
@given(value=JSON_VALUES | _json_rpc_like() | DEEP_VALUES)
@example(value={"jsonrpc": "2.0", "id": True, "method": "m"})
@example(value={"jsonrpc": "2.0", "id": 1, "error": {"code": 2**70, "message": None}})
@example(value={"id": 1.0, "result": None})
def test_any_json_value_is_a_message(value: Any) -> None:
    """classify_message gives a message for any JSON value, with the types it promises."""
    message = classify_message(value)
    assert isinstance(message, MESSAGES)
    if isinstance(message, Request | Response):
        assert type(message.id) in (int, str)
    if isinstance(message, Request | Notification):
        assert type(message.method) is str
    if isinstance(message, ErrorResponse):
        assert isinstance(message.error, JsonRpcError)
        assert type(message.error.code) is int and type(message.error.message) is str
    if isinstance(message, InvalidMessage):
        assert message.id is None or type(message.id) in (int, str)
        assert message.reason


# --------------------------------------------------------------------------- the codec


def _def_name(tp: Any) -> str | None:
    """The schema def that ``tp`` (a class or a union alias) was generated from."""
    name = codec._type_name(tp)
    return name if name in SCHEMA["$defs"] else None


#: (method and side, type) of every params and result of the method table
CODEC_TYPES: list[tuple[str, Any]] = sorted(
    {
        (f"{name} {part}", tp)
        for name, info in {**REQUESTS, **NOTIFICATIONS}.items()
        for part, tp in (("params", info.params), ("result", info.result))
        if tp is not None
    },
    key=lambda item: item[0],
)


def _wire_names(tp: Any) -> list[str]:
    classes = [tp] if attrs.has(tp) else [a for a in getattr(tp, "__args__", ()) if attrs.has(a)]
    return sorted(
        {f.metadata["wire"] for c in classes for f in attrs.fields(c) if "wire" in f.metadata}
    )


@st.composite
def _mutated(draw: st.DrawFn, value: Any, keys: list[str], depth: int = 0) -> Any:
    """``value`` with some members dropped, retyped, replaced by junk or added."""
    choice = draw(st.integers(0, 9))
    if choice == 0:
        return draw(JSON_VALUES)
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            fate = draw(st.integers(0, 5))
            if fate == 0:
                continue  # dropped
            out[key] = item if fate > 2 or depth > 6 else draw(_mutated(item, keys, depth + 1))
        for _ in range(draw(st.integers(0, 2))):
            key = draw(st.sampled_from(keys) | TEXT) if keys else draw(TEXT)
            out[key] = draw(JSON_VALUES)
        return out
    if isinstance(value, list):
        items = [
            item if draw(st.booleans()) or depth > 6 else draw(_mutated(item, keys, depth + 1))
            for item in value
        ]
        return items + draw(st.lists(JSON_VALUES, max_size=1))
    return value if choice > 3 else draw(JSON_VALUES)


@st.composite
def codec_inputs(draw: st.DrawFn, tp: Any) -> Any:
    """JSON given as a value of ``tp``: a valid one mutated, or an object of its wire names."""
    keys = _wire_names(tp)
    if draw(st.booleans()):
        # schema-valid values where the stable schema has the type, else any the codec writes
        valid = codec.unstructure(draw(strategy_for(tp, codec._type_name(tp) in STABLE_DEFS)))
        return draw(_mutated(valid, keys))
    return draw(
        st.dictionaries(st.sampled_from(keys) | TEXT if keys else TEXT, JSON_VALUES, max_size=5)
    )


def _check_codec(tp: Any, value: Any) -> None:
    try:
        typed = codec.structure(value, tp)
    except InvalidParams:
        return
    wire = codec.unstructure(typed)
    _sendable(wire)
    assert codec.structure(wire, tp) == typed
    name = _def_name(tp)
    if name is not None and INDEX.fault(name, value) is None:
        fault = INDEX.fault(name, wire)
        assert fault is None, f"valid {name} re-encoded invalid at {fault[0]}: {fault[1]}"


@pytest.mark.parametrize(("where", "tp"), CODEC_TYPES, ids=[w for w, _ in CODEC_TYPES])
@settings(FUZZ, max_examples=25)
@given(data=st.data())
def test_the_codec_gives_a_typed_value_or_invalid_params(
    where: str, tp: Any, data: st.DataObject
) -> None:
    """Any JSON as a method's params or result: a typed value or InvalidParams, nothing else;
    the value encodes to JSON, decodes to itself, and is schema-valid if its JSON was."""
    _check_codec(tp, data.draw(codec_inputs(tp)))


@FUZZ
@given(value=DEEP_VALUES, where=st.sampled_from(["_meta", "rawInput"]))
def test_deep_opaque_values_pass_the_codec(value: Any, where: str) -> None:
    """A value nested deeper than orjson writes, inside an opaque field, raises nothing."""
    update = {"sessionUpdate": "tool_call", "toolCallId": "t", "title": "x", where: {"v": value}}
    _check_codec(t.SessionNotification, {"sessionId": "s", "update": update})
