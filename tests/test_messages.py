"""Tests of orchestrator.jsonrpc.messages: classification and builders."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.errors import (
    AuthRequired,
    InternalError,
    InvalidParams,
    JsonRpcError,
    MethodNotFound,
)
from orchestrator.jsonrpc.messages import (
    ErrorResponse,
    InvalidMessage,
    Message,
    Notification,
    Request,
    Response,
    classify_message,
    error_obj,
    is_request_id,
    notification_obj,
    request_obj,
    result_obj,
)

V = {"jsonrpc": "2.0"}


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        ({**V, "id": 1, "method": "m", "params": {"a": 1}}, Request(1, "m", {"a": 1})),
        ({**V, "id": "abc", "method": "m"}, Request("abc", "m", None)),
        ({**V, "id": "0", "method": "m", "params": [1]}, Request("0", "m", [1])),
        ({**V, "id": 0, "method": "m"}, Request(0, "m")),
        ({"id": 5, "method": "m"}, Request(5, "m")),
        ({**V, "method": "session/update", "params": {}}, Notification("session/update", {})),
        ({**V, "method": "_ext/x"}, Notification("_ext/x")),
        ({**V, "id": None, "method": "n"}, Notification("n")),
        ({**V, "id": 3, "result": {"ok": True}}, Response(3, {"ok": True})),
        ({**V, "id": "3", "result": None}, Response("3", None)),
        ({**V, "id": 4}, Response(4, None)),
        ({"id": 7, "result": 1}, Response(7, 1)),
        ({**V, "id": 1.0, "method": "m"}, InvalidMessage(None, "")),
        ({**V, "id": True, "method": "m"}, InvalidMessage(None, "")),
        ({**V, "id": [1], "method": "m"}, InvalidMessage(None, "")),
        ({**V, "id": {"x": 1}, "method": "m"}, InvalidMessage(None, "")),
        ({**V, "id": 9, "method": 12}, InvalidMessage(9, "")),
        ({**V, "id": "q", "method": None}, InvalidMessage("q", "")),
        ({"jsonrpc": "1.0", "id": 2, "method": "m"}, InvalidMessage(2, "")),
        ({"jsonrpc": 2.0, "method": "m"}, InvalidMessage(None, "")),
        ({"jsonrpc": "1.0", "id": 2, "result": 1}, InvalidMessage(None, "")),
        ({**V, "id": 2.5, "result": 1}, InvalidMessage(None, "")),
        ({**V, "id": False, "result": 1}, InvalidMessage(None, "")),
        ({**V, "id": None, "result": 1}, InvalidMessage(None, "")),
        ({**V, "result": 1}, InvalidMessage(None, "")),
        ({**V, "id": 1.5, "error": {"code": 1, "message": "x"}}, InvalidMessage(None, "")),
        ({**V}, InvalidMessage(None, "")),
        ({}, InvalidMessage(None, "")),
        ([{**V, "method": "m"}], InvalidMessage(None, "batches are not supported")),
        ([], InvalidMessage(None, "batches are not supported")),
        ("text", InvalidMessage(None, "expected a JSON object, got a string")),
        (3, InvalidMessage(None, "expected a JSON object, got a number")),
        (None, InvalidMessage(None, "expected a JSON object, got null")),
        (True, InvalidMessage(None, "expected a JSON object, got a boolean")),
    ],
)
def test_classification_table(obj: Any, expected: Message) -> None:
    """Each decoded value is classified into the right message kind."""
    got = classify_message(obj)
    if isinstance(expected, InvalidMessage):
        assert isinstance(got, InvalidMessage)
        assert got.id == expected.id
        assert type(got.id) is type(expected.id)
        assert got.reason
        if expected.reason:
            assert got.reason == expected.reason
    else:
        assert got == expected
        if isinstance(expected, Request | Response):
            assert type(got.id) is type(expected.id)  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("error", "cls", "code"),
    [
        ({"code": -32601, "message": "nope"}, MethodNotFound, -32601),
        ({"code": -32602, "message": "bad", "data": {"f": 1}}, InvalidParams, -32602),
        ({"code": -32000, "message": "login"}, AuthRequired, -32000),
        ({"code": 42, "message": "custom"}, JsonRpcError, 42),
        ({"code": "x", "message": "odd"}, InternalError, -32603),
        ("garbage", InternalError, -32603),
    ],
)
def test_error_response_builds_the_matching_error(error: Any, cls: type, code: int) -> None:
    """An error response carries the JsonRpcError subclass for its code."""
    msg = classify_message({**V, "id": 1, "error": error})
    assert isinstance(msg, ErrorResponse)
    assert msg.id == 1
    assert type(msg.error) is cls
    assert msg.error.code == code


def test_error_response_keeps_message_and_data() -> None:
    """The error's message and data come from the error object."""
    msg = classify_message({**V, "id": "x", "error": {"code": -32602, "message": "m", "data": [1]}})
    assert isinstance(msg, ErrorResponse)
    assert msg.id == "x"
    assert msg.error.message == "m"
    assert msg.error.data == [1]


def test_error_response_with_null_id() -> None:
    """An error answering something unreadable has no id."""
    msg = classify_message({**V, "id": None, "error": {"code": -32700, "message": "Parse error"}})
    assert isinstance(msg, ErrorResponse)
    assert msg.id is None
    assert msg.error.code == -32700


def test_result_and_error_together_count_as_error() -> None:
    """A response carrying both members is treated as an error."""
    msg = classify_message({**V, "id": 1, "result": 1, "error": {"code": -32603, "message": "x"}})
    assert isinstance(msg, ErrorResponse)


def test_message_values_are_frozen() -> None:
    """Message values are immutable."""
    req = Request(1, "m")
    with pytest.raises(AttributeError):
        req.method = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("value", "ok"),
    [(0, True), (-1, True), ("", True), ("0", True), (True, False), (1.0, False), (None, False)],
)
def test_is_request_id(value: object, ok: bool) -> None:
    """Only ints (not bools) and strings are request ids."""
    assert is_request_id(value) is ok


def test_request_obj() -> None:
    """A request has jsonrpc, id, method and params (omitted when None)."""
    assert request_obj(0, "m", {"a": 1}) == {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "m",
        "params": {"a": 1},
    }
    assert request_obj("7", "m", None) == {"jsonrpc": "2.0", "id": "7", "method": "m"}


def test_notification_obj() -> None:
    """A notification has no id; params are omitted when None."""
    assert notification_obj("n") == {"jsonrpc": "2.0", "method": "n"}
    assert notification_obj("n", []) == {"jsonrpc": "2.0", "method": "n", "params": []}


def test_result_obj_keeps_null_result() -> None:
    """A None result is sent as null, never omitted."""
    assert result_obj(3, None) == {"jsonrpc": "2.0", "id": 3, "result": None}
    assert result_obj("a", {}) == {"jsonrpc": "2.0", "id": "a", "result": {}}


def test_error_obj() -> None:
    """An error response carries the error object, and id null when unknown."""
    assert error_obj(None, MethodNotFound("no such method", {"method": "x"})) == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": -32601, "message": "no such method", "data": {"method": "x"}},
    }


def test_builders_round_trip_through_classification() -> None:
    """What the builders make classifies back to the same values."""
    assert classify_message(request_obj(1, "m", {"p": 1})) == Request(1, "m", {"p": 1})
    assert classify_message(notification_obj("n", [2])) == Notification("n", [2])
    assert classify_message(result_obj("r", 5)) == Response("r", 5)
    err = classify_message(error_obj(2, InvalidParams("bad")))
    assert isinstance(err, ErrorResponse)
    assert isinstance(err.error, InvalidParams)
    assert err.error.message == "bad"
