"""JSON-RPC 2.0 over newline-delimited JSON streams; knows nothing about ACP.

- :mod:`.framing`: sans-I/O line splitting and JSON encoding of single frames.
- :mod:`.messages`: classifying received values and building the ones to send.
- :mod:`.connection`: :class:`JsonRpcConnection` over any :class:`trio.abc.Stream`.
- :mod:`.interfaces`: the handler signatures, stream capability and statistics it uses.
- :mod:`.pipes`: :class:`PipeStream`, a low-latency stream over a pair of pipes.
"""

from __future__ import annotations

from orchestrator.jsonrpc.connection import (
    CANCEL_REQUEST_METHOD,
    DEFAULT_MAX_REQUESTS_IN_FLIGHT,
    DEFAULT_MAX_UNSENT_BYTES,
    CloseErrorFactory,
    ConnectionStatistics,
    FallbackNotificationHandler,
    FallbackRequestHandler,
    FrameObserver,
    JsonRpcConnection,
    NotificationHandler,
    NowaitRequestHandler,
    RequestHandler,
    SupportsSendNowait,
    open_connection,
)
from orchestrator.jsonrpc.framing import (
    DEFAULT_MAX_MESSAGE_SIZE,
    LineSplitter,
    OversizedLine,
    decode_message,
    encode_message,
    scrubbed_keys,
)
from orchestrator.jsonrpc.messages import (
    JSONRPC_VERSION,
    ErrorResponse,
    InvalidMessage,
    Message,
    Notification,
    Request,
    RequestId,
    Response,
    classify_message,
    error_obj,
    is_request_id,
    notification_obj,
    request_obj,
    result_obj,
)
from orchestrator.jsonrpc.pipes import PipeStream

__all__ = [
    "CANCEL_REQUEST_METHOD",
    "DEFAULT_MAX_MESSAGE_SIZE",
    "DEFAULT_MAX_REQUESTS_IN_FLIGHT",
    "DEFAULT_MAX_UNSENT_BYTES",
    "JSONRPC_VERSION",
    "CloseErrorFactory",
    "ConnectionStatistics",
    "ErrorResponse",
    "FallbackNotificationHandler",
    "FallbackRequestHandler",
    "FrameObserver",
    "InvalidMessage",
    "JsonRpcConnection",
    "LineSplitter",
    "Message",
    "Notification",
    "NotificationHandler",
    "NowaitRequestHandler",
    "OversizedLine",
    "PipeStream",
    "Request",
    "RequestHandler",
    "RequestId",
    "Response",
    "SupportsSendNowait",
    "classify_message",
    "decode_message",
    "encode_message",
    "error_obj",
    "is_request_id",
    "notification_obj",
    "open_connection",
    "request_obj",
    "result_obj",
    "scrubbed_keys",
]
