"""JSON-RPC 2.0 message values: classifying what arrived, building what to send.

Pure functions over decoded JSON values; no I/O. :func:`classify_message` runs once per
received message, so it sticks to a few dict lookups and exact class checks.
"""

from __future__ import annotations

from typing import Any, TypeAlias, TypeGuard

from attrs import frozen

from orchestrator.errors import JsonRpcError

__all__ = [
    "JSONRPC_VERSION",
    "ErrorResponse",
    "InvalidMessage",
    "Message",
    "Notification",
    "Request",
    "RequestId",
    "Response",
    "classify_message",
    "error_obj",
    "is_request_id",
    "notification_obj",
    "request_obj",
    "result_obj",
]

JSONRPC_VERSION = "2.0"

RequestId: TypeAlias = int | str
"""A request id: a JSON integer or string. ``0`` and ``"0"`` are different ids."""


@frozen
class Request:
    """A call that expects an answer."""

    id: RequestId
    method: str
    params: Any = None


@frozen
class Notification:
    """A call without an answer."""

    method: str
    params: Any = None


@frozen
class Response:
    """The successful answer to the request ``id``."""

    id: RequestId
    result: Any


@frozen
class ErrorResponse:
    """The error answer to the request ``id`` (``None`` when the peer could not read our id)."""

    id: RequestId | None
    error: JsonRpcError


@frozen
class InvalidMessage:
    """JSON that is not a usable JSON-RPC 2.0 message.

    ``id`` is set only for something shaped like a request whose id could be read, so that the
    -32600 answer can name it. A broken *response* never carries an id here: answering it with
    that id would look like an answer to one of the peer's own requests.
    """

    id: RequestId | None
    reason: str


Message: TypeAlias = Request | Notification | Response | ErrorResponse | InvalidMessage
"""Everything :func:`classify_message` can return."""

_MISSING: Any = object()


def is_request_id(value: object) -> TypeGuard[RequestId]:
    """Whether ``value`` can be a request id: an ``int`` (not a ``bool``) or a ``str``."""
    # Exact class checks: bool is an int subclass, and JSON never yields other subclasses.
    cls = value.__class__
    return cls is int or cls is str


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else type(value).__name__


def classify_message(obj: Any) -> Message:
    """Classify a decoded JSON value; anything unusable becomes an :class:`InvalidMessage`.

    Tolerances: a missing ``"jsonrpc"`` member is accepted (a wrong value is not); a request
    with ``"id": null`` is taken as a notification (the JSON-RPC 1.0 form); a response with
    neither ``result`` nor ``error`` is a ``null`` result (JavaScript drops ``undefined``
    members), and one with both counts as an error.
    """
    if obj.__class__ is not dict:
        if isinstance(obj, list):
            return InvalidMessage(None, "batches are not supported")
        if not isinstance(obj, dict):
            return InvalidMessage(None, f"expected a JSON object, got {_json_type(obj)}")
    version = obj.get("jsonrpc", JSONRPC_VERSION)
    msg_id = obj.get("id")
    method = obj.get("method", _MISSING)

    if method is not _MISSING:
        if version != JSONRPC_VERSION:
            return InvalidMessage(
                msg_id if is_request_id(msg_id) else None,
                f"unsupported jsonrpc version {version!r}",
            )
        if method.__class__ is not str:
            return InvalidMessage(
                msg_id if is_request_id(msg_id) else None,
                f"method must be a string, got {_json_type(method)}",
            )
        if msg_id is None:
            return Notification(method, obj.get("params"))
        if not is_request_id(msg_id):
            return InvalidMessage(
                None, f"request id must be an integer or a string, got {_json_type(msg_id)}"
            )
        return Request(msg_id, method, obj.get("params"))

    if version != JSONRPC_VERSION:
        return InvalidMessage(None, f"unsupported jsonrpc version {version!r}")
    if "error" in obj:
        if msg_id is not None and not is_request_id(msg_id):
            return InvalidMessage(
                None, f"response id must be an integer or a string, got {_json_type(msg_id)}"
            )
        return ErrorResponse(msg_id, JsonRpcError.from_error_object(obj["error"]))
    if "id" not in obj:
        return InvalidMessage(None, "neither a request, a notification nor a response")
    if not is_request_id(msg_id):
        return InvalidMessage(
            None, f"response id must be an integer or a string, got {_json_type(msg_id)}"
        )
    return Response(msg_id, obj.get("result"))


def request_obj(id: RequestId, method: str, params: Any = None) -> dict[str, Any]:
    """The wire form of a request (``params`` omitted when ``None``)."""
    obj: dict[str, Any] = {"jsonrpc": JSONRPC_VERSION, "id": id, "method": method}
    if params is not None:
        obj["params"] = params
    return obj


def notification_obj(method: str, params: Any = None) -> dict[str, Any]:
    """The wire form of a notification (``params`` omitted when ``None``)."""
    obj: dict[str, Any] = {"jsonrpc": JSONRPC_VERSION, "method": method}
    if params is not None:
        obj["params"] = params
    return obj


def result_obj(id: RequestId, result: Any) -> dict[str, Any]:
    """The wire form of a successful response (a ``None`` result is sent as ``null``)."""
    return {"jsonrpc": JSONRPC_VERSION, "id": id, "result": result}


def error_obj(id: RequestId | None, error: JsonRpcError) -> dict[str, Any]:
    """The wire form of an error response (``id`` is ``null`` when the request was unreadable)."""
    return {"jsonrpc": JSONRPC_VERSION, "id": id, "error": error.to_error_object()}
