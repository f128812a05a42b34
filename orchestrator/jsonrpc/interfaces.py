"""What a :class:`~orchestrator.jsonrpc.JsonRpcConnection` is given and gives back.

The handler signatures it calls, the stream capability it uses when present, and its
statistics; kept apart from the connection itself, which imports them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Literal, Protocol, TypeAlias, runtime_checkable

from attrs import frozen

from orchestrator.errors import ConnectionClosed

__all__ = [
    "CANCEL_REQUEST_METHOD",
    "CloseErrorFactory",
    "ConnectionStatistics",
    "FallbackNotificationHandler",
    "FallbackRequestHandler",
    "FrameObserver",
    "NotificationHandler",
    "NowaitRequestHandler",
    "RequestHandler",
    "SupportsSendNowait",
]

CANCEL_REQUEST_METHOD = "$/cancel_request"
"""The notification either side sends to cancel one of its requests: ``{"requestId": id}``."""

RequestHandler: TypeAlias = Callable[[Any], Awaitable[Any]]
"""Serves one request method: params -> awaitable JSON-able result (raise a JsonRpcError to
refuse). Called in the read loop as the request arrives; the awaitable runs in a task."""
NowaitRequestHandler: TypeAlias = Callable[[Any], Any]
"""Serves a request at once, in the read loop: params -> JSON-able result. It raises
:class:`trio.WouldBlock` (before doing anything) when the request needs waiting for; the
method's :data:`RequestHandler` then serves it in a task of its own."""
NotificationHandler: TypeAlias = Callable[[Any], Awaitable[None] | None]
"""Handles one notification method; plain functions are the fast path."""
FallbackRequestHandler: TypeAlias = Callable[[str, Any], Awaitable[Any]]
"""Serves requests for methods without a handler: (method, params) -> result."""
FallbackNotificationHandler: TypeAlias = Callable[[str, Any], Awaitable[None] | None]
"""Handles notifications for methods without a handler: (method, params)."""
FrameObserver: TypeAlias = Callable[[Literal["send", "recv"], bytes, bool], None]
"""Sees every frame (without its newline) in both directions, e.g. for a wire transcript:
(direction, frame, whether the frame is valid JSON, as the connection found parsing it)."""
CloseErrorFactory: TypeAlias = Callable[[str], Awaitable[ConnectionClosed]]
"""Builds the error given to waiters when the stream ends, from a short reason."""


@runtime_checkable
class SupportsSendNowait(Protocol):
    """A stream that can write without waiting (such as :class:`~orchestrator.jsonrpc.PipeStream`).

    ``send_nowait`` writes what fits at once and returns the number of bytes written; the
    connection then sends the rest with ``send_all``.
    """

    def send_nowait(self, data: bytes) -> int: ...


@frozen
class ConnectionStatistics:
    """Counters of a :class:`JsonRpcConnection`, from :meth:`JsonRpcConnection.statistics`."""

    requests_sent: int
    """Requests we sent."""
    notifications_sent: int
    """Notifications we sent (including ``$/cancel_request``)."""
    responses_received: int
    """Responses (results and errors) that arrived, matched or not."""
    requests_received: int
    """Requests the peer sent us."""
    notifications_received: int
    """Notifications the peer sent us (including ``$/cancel_request``)."""
    pending_outbound: int
    """Our requests still waiting for their response."""
    running_inbound: int
    """The peer's requests whose handlers are running now."""
    oversized_dropped: int
    """Lines dropped because they passed ``max_message_size``."""
    parse_errors: int
    """Lines that were not JSON (each answered with -32700)."""
    invalid_messages: int
    """JSON values that were not valid JSON-RPC messages (each answered with -32600)."""
    queued_answers: int = 0
    """Answers waiting in the queue for the peer to read what was sent before them."""
    unsent_bytes: int = 0
    """Bytes of answers not written out yet: the queued ones, and the rest of the one being
    written."""
