"""A JSON-RPC 2.0 connection over any :class:`trio.abc.Stream`.

Our requests are numbered 0, 1, 2, ... and responses are matched only against what we sent; the
peer's requests each run in their own task (it may call us while our request is pending), their
handlers called as they arrive; notifications run inline in arrival order, so a response is
delivered only after every notification that preceded it. The read loop is the hot path (agents
stream thousands of ``session/update`` per turn): big reads, orjson, and a few dict lookups per
notification.

Our answers never make the read loop wait for the peer to read: one that does not fit in the
stream at once waits as bytes in a queue that one task writes out. A peer that leaves too much
unanswered (too many of its requests in flight, or too many bytes of answers unread) ends the
connection with :class:`~orchestrator.errors.BacklogExceeded`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from typing import Any, Literal, NoReturn, cast

import orjson
import trio
from attrs import define, field

from orchestrator.errors import (
    BacklogExceeded,
    ConnectionClosed,
    InternalError,
    InvalidRequest,
    JsonRpcError,
    MethodNotFound,
    ParseError,
    RequestCancelled,
    error_from_code,
)
from orchestrator.jsonrpc.framing import (
    DEFAULT_MAX_MESSAGE_SIZE,
    LineSplitter,
    OversizedLine,
    decode_message,
    encode_message,
    excerpt,
)
from orchestrator.jsonrpc.interfaces import (
    CANCEL_REQUEST_METHOD,
    CloseErrorFactory,
    ConnectionStatistics,
    FallbackNotificationHandler,
    FallbackRequestHandler,
    FrameObserver,
    NotificationHandler,
    NowaitRequestHandler,
    RequestHandler,
    SupportsSendNowait,
)
from orchestrator.jsonrpc.messages import (
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

from .._log import get_logger

__all__ = [
    "CANCEL_REQUEST_METHOD",
    "DEFAULT_MAX_REQUESTS_IN_FLIGHT",
    "DEFAULT_MAX_UNSENT_BYTES",
    "CloseErrorFactory",
    "ConnectionStatistics",
    "FallbackNotificationHandler",
    "FallbackRequestHandler",
    "FrameObserver",
    "JsonRpcConnection",
    "NotificationHandler",
    "NowaitRequestHandler",
    "RequestHandler",
    "SupportsSendNowait",
    "open_connection",
]

log = get_logger(__name__)

#: a received line not parsed yet (or not JSON)
_UNPARSED: Any = object()

_RECEIVE_SIZE = 256 * 1024
# How long a cancelled request may wait for the send lock to tell the peer about it.
_CANCEL_NOTICE_TIMEOUT = 5.0
# Ids of our cancelled requests whose late answers are expected; bounded in case the peer
# never answers them.
_MAX_REMEMBERED_CANCELLED = 10_000

DEFAULT_MAX_REQUESTS_IN_FLIGHT = 10_000
"""The default bound on the peer's requests not answered yet (handlers running, answers not
written out). Real agents keep a handful in flight, a few dozen at most, however many they send
in a turn."""
DEFAULT_MAX_UNSENT_BYTES = 256 * 2**20
"""The default bound on the bytes of answers waiting for the peer to read them (256 MiB: room
for a few reads of large files at once); one answer of any size may always wait."""


@define
class _Waiter:
    """One of our requests waiting for its response."""

    event: trio.Event = field(factory=trio.Event)
    result: Any = None
    error: BaseException | None = None
    #: called in the read loop the moment the response arrives, before any later message
    on_response: Callable[[], None] | None = None


@define(eq=False)
class JsonRpcConnection:
    """JSON-RPC 2.0 over a byte stream carrying one JSON message per line.

    Register handlers with :meth:`on_request` / :meth:`on_notification`, run :meth:`serve`
    (or use :func:`open_connection`), then call :meth:`request` and :meth:`notify`.

    ``frame_observer`` sees every frame line both ways, malformed ones included (an oversized
    line appears as ``{"oversized": <size>}``). ``close_error`` builds the exception delivered to
    waiters when the stream ends; by default a :class:`ConnectionClosed` naming ``name``.

    A peer that passes ``max_requests_in_flight`` or ``max_unsent_bytes`` is cut off: the
    connection ends at once (nothing more is read or written, its handlers are cancelled) and
    waiters get a :class:`~orchestrator.errors.BacklogExceeded` naming the limit.

    Notification handlers run inline in the read loop: keep them quick, and never wait in one
    for a response from the same peer (nothing is read until the handler returns).
    """

    _stream: trio.abc.Stream
    name: str = field(default="peer", kw_only=True)
    """The peer's name, used in logs and in the default close error."""
    max_message_size: int = field(default=DEFAULT_MAX_MESSAGE_SIZE, kw_only=True)
    """The longest line accepted, in bytes; longer lines are dropped and counted."""
    max_requests_in_flight: int | None = field(default=DEFAULT_MAX_REQUESTS_IN_FLIGHT, kw_only=True)
    """The most requests of the peer not answered yet: handlers running and answers not written
    out. None: no bound."""
    max_unsent_bytes: int | None = field(default=DEFAULT_MAX_UNSENT_BYTES, kw_only=True)
    """The most bytes of answers waiting for the peer to read them (one answer may always
    wait, whatever its size). None: no bound."""
    _frame_observer: FrameObserver | None = field(default=None, kw_only=True)
    _close_error: CloseErrorFactory | None = field(default=None, kw_only=True)

    _request_handlers: dict[str, RequestHandler] = field(init=False, factory=dict)
    _nowait_handlers: dict[str, NowaitRequestHandler] = field(init=False, factory=dict)
    _notification_handlers: dict[str, NotificationHandler] = field(init=False, factory=dict)
    _fallback_request: FallbackRequestHandler | None = field(init=False, default=None)
    _fallback_notification: FallbackNotificationHandler | None = field(init=False, default=None)
    # a semaphore, not a Lock: a frame started in the read loop may be finished by a task
    _send_lock: trio.Semaphore = field(init=False, factory=lambda: trio.Semaphore(1))
    _next_id: int = field(init=False, default=0)
    _pending: dict[RequestId, _Waiter] = field(init=False, factory=dict)
    _cancelled_outbound: set[RequestId] = field(init=False, factory=set)
    _inbound: dict[RequestId, trio.CancelScope] = field(init=False, factory=dict)
    _nursery: trio.Nursery | None = field(init=False, default=None)
    _serving: bool = field(init=False, default=False)
    _closed: bool = field(init=False, default=False)
    _close_exc: ConnectionClosed | None = field(init=False, default=None)
    _close_exc_computing: bool = field(init=False, default=False)
    _close_exc_ready: trio.Event = field(init=False, factory=trio.Event)
    _ignored_methods: set[str] = field(init=False, factory=set)
    _log: Any = field(init=False, default=None)
    _send_nowait: Callable[[bytes], int] | None = field(init=False, default=None)
    # answers waiting for the stream, in order: bytes only, written by one task at a time
    _outbox: deque[bytes] = field(init=False, factory=deque)
    # bytes of the queued answers and of the rest of the one being written
    _unsent: int = field(init=False, default=0)
    _writing: bool = field(init=False, default=False)
    # the writer's shielded write; cancelled when the peer is cut off
    _write_scope: trio.CancelScope | None = field(init=False, default=None)

    _requests_sent: int = field(init=False, default=0)
    _notifications_sent: int = field(init=False, default=0)
    _responses_received: int = field(init=False, default=0)
    _requests_received: int = field(init=False, default=0)
    _notifications_received: int = field(init=False, default=0)
    _running_inbound: int = field(init=False, default=0)
    _oversized_dropped: int = field(init=False, default=0)
    _parse_errors: int = field(init=False, default=0)
    # the start of the first line that was not JSON: what the peer sent instead, for the close
    # error (an agent that prints to stdout before dying is otherwise a mystery)
    _malformed: str | None = field(init=False, default=None)
    _invalid_messages: int = field(init=False, default=0)

    def __attrs_post_init__(self) -> None:
        self._log = log.bind(peer=self.name)
        if isinstance(self._stream, SupportsSendNowait):
            self._send_nowait = self._stream.send_nowait
        self._notification_handlers[CANCEL_REQUEST_METHOD] = self._on_cancel_request

    def on_request(
        self, method: str, handler: RequestHandler, *, nowait: NowaitRequestHandler | None = None
    ) -> None:
        """Serve requests for ``method`` with ``handler`` (replacing any earlier one).

        The handler gets the params and returns an awaitable of a JSON-able result. Raising a
        :class:`~orchestrator.errors.JsonRpcError` answers that error; any other exception
        answers -32603 and is logged with its traceback. The handler is called in the read
        loop as the request arrives, in wire order with the messages around it, and what it
        returns is awaited in a task of its own: an ``async def`` handler runs wholly in that
        task, while a plain function returning an awaitable can first note, without waiting,
        what the request arrived into.

        ``nowait`` is tried first, in the read loop itself, and answers at once: no task, no
        scheduler pass. It must not block; it raises :class:`trio.WouldBlock` to leave the
        request to ``handler``. Errors are answered as ``handler``'s are.
        """
        self._request_handlers[method] = handler
        if nowait is None:
            self._nowait_handlers.pop(method, None)
        else:
            self._nowait_handlers[method] = nowait

    def on_notification(self, method: str, handler: NotificationHandler) -> None:
        """Handle notifications for ``method``; a plain function or one returning an awaitable.

        Handlers run inline, in arrival order; an exception from one is logged and ignored.
        """
        if method == CANCEL_REQUEST_METHOD:
            raise ValueError(f"{CANCEL_REQUEST_METHOD} is handled by the connection itself")
        self._notification_handlers[method] = handler

    def set_fallback_request_handler(self, handler: FallbackRequestHandler) -> None:
        """Serve requests for methods without a handler (default: answer -32601)."""
        self._fallback_request = handler

    def set_fallback_notification_handler(self, handler: FallbackNotificationHandler) -> None:
        """Handle notifications for methods without a handler (default: ignore them)."""
        self._fallback_notification = handler

    @property
    def closed(self) -> bool:
        """Whether the connection ended (EOF, a broken stream, :meth:`aclose`, serve stopped)."""
        return self._closed

    async def wait_closed(self) -> ConnectionClosed:
        """Wait until the connection has ended (EOF, a broken stream or ``aclose``); return why."""
        await self._close_exc_ready.wait()
        assert self._close_exc is not None
        return self._close_exc

    def statistics(self) -> ConnectionStatistics:
        """A snapshot of the connection's counters."""
        return ConnectionStatistics(
            requests_sent=self._requests_sent,
            notifications_sent=self._notifications_sent,
            responses_received=self._responses_received,
            requests_received=self._requests_received,
            notifications_received=self._notifications_received,
            pending_outbound=len(self._pending),
            running_inbound=self._running_inbound,
            oversized_dropped=self._oversized_dropped,
            parse_errors=self._parse_errors,
            invalid_messages=self._invalid_messages,
            queued_answers=len(self._outbox),
            unsent_bytes=self._unsent,
        )

    async def request(
        self,
        method: str,
        params: Any = None,
        *,
        on_response: Callable[[], None] | None = None,
        notify_cancel: bool = True,
    ) -> Any:
        """Send a request and wait for its result.

        An error response raises the matching :class:`~orchestrator.errors.JsonRpcError`
        subclass; a closed connection raises its close error (a ``ConnectionClosed``). If the
        caller is cancelled while waiting, the peer is told with ``$/cancel_request``, unless
        ``notify_cancel`` is false (a protocol that ends the request its own way); the late
        answer is dropped either way. ``on_response`` runs in the read loop as the response
        arrives, before any message behind it is handled (the caller itself resumes later).
        """
        if self._closed:
            raise await self._get_close_error("connection closed")
        request_id = self._next_id
        self._next_id += 1
        data = encode_message(request_obj(request_id, method, params))
        waiter = _Waiter(on_response=on_response)
        self._pending[request_id] = waiter
        sent = False
        try:
            # Cancellation can only strike before the bytes go out: the write is shielded
            # and nothing after it checkpoints.
            await self._send(data)
            sent = True
            self._requests_sent += 1
            await waiter.event.wait()
        except trio.Cancelled:
            if sent and not waiter.event.is_set():
                await self._cancel_outbound(request_id, notify=notify_cancel)
            raise
        finally:
            self._pending.pop(request_id, None)
        if waiter.error is not None:
            raise waiter.error
        return waiter.result

    async def notify(self, method: str, params: Any = None) -> None:
        """Send a notification; raises the close error if the connection is closed."""
        await self._send(encode_message(notification_obj(method, params)))
        self._notifications_sent += 1

    async def _cancel_outbound(self, request_id: RequestId, *, notify: bool) -> None:
        """Our caller gave up on ``request_id``: forget it and tell the peer (best effort)."""
        self._pending.pop(request_id, None)
        if len(self._cancelled_outbound) >= _MAX_REMEMBERED_CANCELLED:
            self._cancelled_outbound.clear()
        self._cancelled_outbound.add(request_id)
        if self._closed or not notify:
            return
        with trio.move_on_after(_CANCEL_NOTICE_TIMEOUT, shield=True):
            with suppress(ConnectionClosed):
                await self.notify(CANCEL_REQUEST_METHOD, {"requestId": request_id})

    async def _send(self, data: bytes) -> None:
        """Write one encoded frame; a broken stream raises the close error."""
        if self._closed:
            raise await self._get_close_error("connection closed")
        # A free lock is taken without a scheduler pass (Lock.acquire always yields once);
        # a caller already cancelled must still send nothing, hence the explicit check.
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            self._send_lock.acquire_nowait()
        except trio.WouldBlock:
            await self._send_lock.acquire()
        try:
            if self._closed:  # while we waited for the lock
                reason = "connection closed"
            else:
                try:
                    rest = self._start_frame(data)
                    if rest:
                        await self._write_rest(rest)
                    return
                except trio.BrokenResourceError as exc:
                    reason = f"stream broken: {exc}" if str(exc) else "stream broken"
                except trio.ClosedResourceError:
                    reason = "stream closed"
        finally:
            self._send_lock.release()
        raise await self._get_close_error(reason)

    def _start_frame(self, data: bytes) -> bytes:
        """With the send lock held: observe the frame, write what fits at once, return the rest.

        A frame that fits in the stream goes out without a cancel scope or a scheduler pass.
        """
        if self._frame_observer is not None:
            self._observe("send", data[:-1], True)
        if self._send_nowait is None:
            return data
        sent = self._send_nowait(data)
        return data[sent:] if sent else data

    async def _write_rest(self, rest: bytes) -> None:
        """With the send lock held: write the rest of a started frame.

        Shielded, so a cancelled sender never leaves half a frame on the wire; only cutting
        the peer off (:meth:`_cut_off`) stops it, and that ends the connection anyway.
        """
        with trio.CancelScope(shield=True) as scope:
            self._write_scope = scope
            try:
                await self._stream.send_all(rest)
            finally:
                self._write_scope = None
        if scope.cancelled_caught:
            raise trio.ClosedResourceError("the write was abandoned")

    def _observe(self, direction: Literal["send", "recv"], line: bytes, valid: bool) -> None:
        assert self._frame_observer is not None
        try:
            self._frame_observer(direction, line, valid)
        except Exception:
            self._log.exception("frame observer failed")

    def _observe_received(self, lines: list[bytes | OversizedLine]) -> list[Any]:
        """Show the frame observer a batch of received lines; their parsed values.

        An oversized line is shown as ``{"oversized": <size>}``; a line that is not JSON is
        shown as not valid and comes back as ``_UNPARSED``. An observer with a
        ``recv_batch(frames, valid)`` method gets the batch in one call.
        """
        observer = self._frame_observer
        assert observer is not None
        loads = orjson.loads
        try:  # the common case, a batch of JSON lines: one comprehension, no check per line
            parsed: list[Any] = [loads(line) for line in lines]  # type: ignore[arg-type]
        except (orjson.JSONDecodeError, TypeError):  # a line that is not JSON, or oversized
            pass
        else:
            self._show_received(observer, cast("list[bytes]", lines), [True] * len(lines))
            return parsed
        parsed = []
        frames: list[bytes] = []
        for line in lines:
            if isinstance(line, OversizedLine):
                parsed.append(_UNPARSED)
                frames.append(b'{"oversized": %d}' % line.size)
                continue
            frames.append(line)
            try:
                parsed.append(loads(line))
            except orjson.JSONDecodeError:
                parsed.append(_UNPARSED)
        valid = [
            obj is not _UNPARSED or isinstance(line, OversizedLine)
            for obj, line in zip(parsed, lines, strict=True)
        ]
        self._show_received(observer, frames, valid)
        return parsed

    def _show_received(
        self, observer: FrameObserver, frames: list[bytes], valid: list[bool]
    ) -> None:
        try:
            batch = getattr(observer, "recv_batch", None)
            if batch is not None:
                batch(frames, valid)
            else:
                for frame, ok in zip(frames, valid, strict=True):
                    observer("recv", frame, ok)
        except Exception:
            self._log.exception("frame observer failed")

    async def _get_close_error(self, reason: str) -> ConnectionClosed:
        """The one close error of this connection, built on first use."""
        if self._close_exc is not None:
            return self._close_exc
        if self._close_exc_computing:
            await self._close_exc_ready.wait()
            assert self._close_exc is not None
            return self._close_exc
        self._close_exc_computing = True
        exc: ConnectionClosed | None = None
        try:
            if self._close_error is not None:
                exc = await self._close_error(reason)
        except Exception:
            self._log.exception("close_error factory failed")
        finally:
            # Also on cancellation, so that others waiting here are released.
            self._set_close_error(exc or ConnectionClosed(reason, peer=self.name))
        assert self._close_exc is not None
        return self._close_exc

    def _set_close_error(self, exc: ConnectionClosed) -> None:
        if self._close_exc is None:
            if exc.malformed is None:
                exc.malformed = self._malformed
            self._close_exc = exc
        self._close_exc_ready.set()

    def _fail_pending(self, exc: ConnectionClosed) -> None:
        pending = list(self._pending.values())
        self._pending.clear()
        for waiter in pending:
            waiter.error = exc
            waiter.event.set()

    async def aclose(self) -> None:
        """Close the connection and its stream; pending requests fail with ConnectionClosed."""
        if not self._closed:
            self._closed = True
            self._set_close_error(ConnectionClosed("connection closed locally", peer=self.name))
        if self._close_exc is not None:
            self._fail_pending(self._close_exc)
        await self._stream.aclose()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Read and dispatch messages until the stream ends; run it once, in a nursery.

        On EOF or a broken stream the connection is closed, every pending request of ours fails
        with the close error, handlers of the peer's requests are cancelled, and ``serve``
        returns normally.
        """
        if self._serving:
            raise RuntimeError("serve() can only run once per connection")
        self._serving = True
        reason = "connection no longer served"
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                try:
                    reason = await self._read_loop()
                except trio.Cancelled:
                    # no longer served: a frame still waiting for the peer to read it would
                    # hold the nursery open for ever (its write is shielded)
                    self._closed = True
                    if self._write_scope is not None:
                        self._write_scope.cancel()
                    raise
                self._closed = True
                nursery.cancel_scope.cancel()
            self._nursery = None
            self._log.debug("connection ended", reason=reason)
            self._fail_pending(await self._get_close_error(reason))
        finally:
            # Cancelled or crashed: nobody may keep waiting for a response.
            self._nursery = None
            self._closed = True
            self._set_close_error(ConnectionClosed(reason, peer=self.name))
            assert self._close_exc is not None
            self._fail_pending(self._close_exc)

    async def _read_loop(self) -> str:
        """Read until the stream ends; return why it ended."""
        splitter = LineSplitter(self.max_message_size)
        receive_some = self._stream.receive_some
        while True:
            try:
                data = await receive_some(_RECEIVE_SIZE)
            except trio.BrokenResourceError as exc:
                return f"stream broken: {exc}" if str(exc) else "stream broken"
            except trio.ClosedResourceError:
                return "stream closed"
            if not data:
                tail = splitter.eof()
                if tail is not None:
                    await self._handle_lines([tail])
                return "end of stream"
            lines = splitter.feed(data)
            if lines:
                await self._handle_lines(lines)

    async def _handle_lines(self, lines: list[bytes | OversizedLine]) -> None:
        handlers = self._notification_handlers
        loads = orjson.loads
        # an observer sees the batch before any of it is handled, so a transcript keeps the
        # wire's order (what we answer comes after what it answers); the lines it parsed for
        # that are not parsed again
        parsed = self._observe_received(lines) if self._frame_observer is not None else None
        for i, line in enumerate(lines):
            if isinstance(line, OversizedLine):
                self._dropped_oversized(line.size)
                continue
            obj = parsed[i] if parsed is not None else _UNPARSED
            if obj is _UNPARSED:
                try:
                    obj = loads(line)
                except orjson.JSONDecodeError:
                    try:
                        obj = decode_message(line)
                    except ParseError as exc:
                        self._answer_parse_error(exc, line)
                        continue
            # Fast path for the flood: a well-formed notification is dispatched with a few
            # lookups, without building a message object.
            if obj.__class__ is dict:
                method = obj.get("method")
                if method.__class__ is str and "id" not in obj and obj.get("jsonrpc") == "2.0":
                    self._notifications_received += 1
                    handler = handlers.get(method)
                    if handler is None:
                        await self._deliver_notification(method, obj.get("params"))
                        continue
                    try:
                        result = handler(obj.get("params"))
                        if result is not None:
                            await result
                    except Exception:
                        self._log.exception("notification handler failed", method=method)
                    continue
            await self._dispatch(classify_message(obj))

    async def _dispatch(self, msg: Message) -> None:
        """The general path for anything but a plain notification."""
        if self._closed:  # the peer was cut off in the middle of this batch
            return
        if isinstance(msg, Request):
            self._requests_received += 1
            nowait = self._nowait_handlers.get(msg.method)
            if nowait is not None and self._serve_nowait(msg.id, msg.method, msg.params, nowait):
                return
            self._start_inbound(msg.id, msg.method, msg.params)
        elif isinstance(msg, Response | ErrorResponse):
            self._responses_received += 1
            self._deliver_response(msg)
        elif isinstance(msg, Notification):
            self._notifications_received += 1
            await self._deliver_notification(msg.method, msg.params)
        else:
            assert isinstance(msg, InvalidMessage)
            self._invalid_messages += 1
            self._log.warning("invalid message", reason=msg.reason, id=msg.id)
            error = InvalidRequest(f"Invalid request: {msg.reason}")
            self._answer(encode_message(error_obj(msg.id, error)))

    def _deliver_response(self, msg: Response | ErrorResponse) -> None:
        waiter = self._pending.pop(msg.id, None) if msg.id is not None else None
        if waiter is None:
            if msg.id in self._cancelled_outbound:
                self._cancelled_outbound.discard(msg.id)
            elif isinstance(msg, ErrorResponse) and msg.id is None:
                self._log.warning("peer reported an error", error=str(msg.error))
            else:
                self._log.warning("response for an unknown request id dropped", id=msg.id)
            return
        if isinstance(msg, ErrorResponse):
            waiter.error = msg.error
        else:
            waiter.result = msg.result
        if waiter.on_response is not None:
            try:
                waiter.on_response()
            except Exception:
                self._log.exception("on_response callback failed")
        waiter.event.set()

    async def _deliver_notification(self, method: str, params: Any) -> None:
        """Run the handler for ``method`` (the same as the fast path in ``_handle_lines``)."""
        handler = self._notification_handlers.get(method)
        try:
            if handler is None:
                result = self._unhandled_notification(method, params)
            else:
                result = handler(params)
            if result is not None:
                await result
        except Exception:
            self._log.exception("notification handler failed", method=method)

    def _unhandled_notification(self, method: str, params: Any) -> Awaitable[None] | None:
        if self._fallback_notification is not None:
            return self._fallback_notification(method, params)
        # Logged once per method: an unknown notification may come by the thousand.
        if method not in self._ignored_methods:
            self._ignored_methods.add(method)
            self._log.debug("ignoring notifications without a handler", method=method)
        return None

    def _on_cancel_request(self, params: Any) -> None:
        request_id = params.get("requestId") if isinstance(params, dict) else None
        if not is_request_id(request_id):
            return
        scope = self._inbound.get(request_id)
        if scope is not None:
            scope.cancel()

    def _start_inbound(self, request_id: RequestId, method: str, params: Any) -> None:
        """Take one request of the peer as it is read: call its handler, await it in a task.

        The handler is called (and its cancel scope registered) here in the read loop, so it
        sees the connection as the wire had it when the request arrived, and a
        ``$/cancel_request`` read right behind the request finds it.
        """
        assert self._nursery is not None
        if self._over_bounds(0):
            return
        scope = trio.CancelScope()
        if request_id in self._inbound:
            # A duplicate id from the peer: served, but $/cancel_request reaches the first.
            self._log.warning("duplicate request id from peer", id=request_id, method=method)
        else:
            self._inbound[request_id] = scope
        self._running_inbound += 1
        try:
            handler = self._request_handlers.get(method)
            if handler is not None:
                pending = handler(params)
            else:
                pending = (self._fallback_request or _method_not_found)(method, params)
        except Exception as exc:
            self._inbound_done(request_id, scope)
            self._answer(self._failure_answer(request_id, method, exc))
            return
        self._nursery.start_soon(self._run_inbound, request_id, method, scope, pending)

    async def _run_inbound(
        self, request_id: RequestId, method: str, scope: trio.CancelScope, pending: Awaitable[Any]
    ) -> None:
        """Await one request's handler and send its answer."""
        try:
            with scope:
                result = await pending
            if scope.cancelled_caught:
                answer = _encode_error(request_id, RequestCancelled())
            else:
                answer = encode_message(result_obj(request_id, result))
        except Exception as exc:
            answer = self._failure_answer(request_id, method, exc)
        finally:
            self._inbound_done(request_id, scope)
        self._answer(answer)

    def _inbound_done(self, request_id: RequestId, scope: trio.CancelScope) -> None:
        self._running_inbound -= 1
        if self._inbound.get(request_id) is scope:
            del self._inbound[request_id]

    def _serve_nowait(
        self, request_id: RequestId, method: str, params: Any, nowait: NowaitRequestHandler
    ) -> bool:
        """Answer a request at once with ``nowait``; False if it left the request to a task."""
        try:
            answer = encode_message(result_obj(request_id, nowait(params)))
        except trio.WouldBlock:
            return False
        except Exception as exc:
            answer = self._failure_answer(request_id, method, exc)
        self._answer(answer)
        return True

    def _failure_answer(self, request_id: RequestId, method: str, exc: Exception) -> bytes:
        """The answer to a request whose handler raised ``exc`` (call it in the except block).

        A :class:`JsonRpcError` is answered as itself; anything else as -32603, logged with
        its traceback.
        """
        if isinstance(exc, JsonRpcError):
            return _encode_error(request_id, exc)
        self._log.exception("request handler failed", method=method, id=request_id)
        return _encode_error(
            request_id, InternalError(data={"details": f"{type(exc).__name__}: {exc}"})
        )

    def _answer(self, data: bytes) -> None:
        """Send an answer without waiting for the peer to read it (the read loop never may).

        It goes out at once when the stream takes it and nothing is queued before it; else
        it waits in the queue, as bytes, for the one task that writes the queue out. An answer
        that passes a bound cuts the peer off instead.
        """
        if self._closed:
            return
        if not self._writing and self._send_nowait is not None:
            try:
                self._send_lock.acquire_nowait()
            except trio.WouldBlock:
                pass
            else:
                try:
                    rest = self._start_frame(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    self._send_lock.release()
                    self._log.debug("answer dropped: connection closed")
                    return
                if not rest:
                    self._send_lock.release()
                    return
                # the writer finishes this frame first, holding the lock until it is whole
                self._queue(rest, started=True)
                return
        if self._over_bounds(len(data)):
            return
        self._queue(data, started=False)

    def _queue(self, data: bytes, *, started: bool) -> None:
        """Queue an answer (``started``: the rest of a frame begun under the held lock)."""
        assert self._nursery is not None
        # a copy of its own size: orjson hands out at least 4 KiB for any frame, so a queue of
        # small answers would otherwise cost 4 KiB each
        data = memoryview(data).tobytes()
        self._outbox.append(data)
        self._unsent += len(data)
        if started:
            self._writing = True
            self._nursery.start_soon(self._write_out, True)
        elif not self._writing:
            self._writing = True
            self._nursery.start_soon(self._write_out, False)

    async def _write_out(self, locked: bool) -> None:
        """Write queued answers out in order until none is left (``locked``: the lock is held
        and the first one is the rest of a started frame)."""
        outbox = self._outbox
        try:
            while outbox and not self._closed:
                if not locked:
                    try:
                        self._send_lock.acquire_nowait()
                    except trio.WouldBlock:
                        await self._send_lock.acquire()
                    locked = True
                    if not outbox or self._closed:
                        break
                    data = outbox.popleft()
                    rest = self._start_frame(data)
                    self._unsent -= len(data) - len(rest)
                else:
                    rest = outbox.popleft()
                if rest:
                    await self._write_rest(rest)
                    self._unsent -= len(rest)
                self._send_lock.release()
                locked = False
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._log.debug("answers dropped: connection closed", count=len(outbox) + 1)
            outbox.clear()
            self._unsent = 0
        finally:
            if locked:
                self._send_lock.release()
            self._writing = False

    def _over_bounds(self, size: int) -> bool:
        """Whether one more request in flight (an answer of ``size`` bytes to queue, or a
        handler to start with ``size`` 0) passes a bound; if so the peer is cut off."""
        limit = self.max_requests_in_flight
        in_flight = self._running_inbound + len(self._outbox) + 1
        if limit is not None and in_flight > limit:
            self._cut_off(
                BacklogExceeded(
                    f"{in_flight:,} of its requests were in flight at once (being handled, or "
                    "answered and the answers not read)",
                    "max_requests_in_flight",
                    limit,
                    peer=self.name,
                )
            )
            return True
        limit = self.max_unsent_bytes
        if limit is not None and self._unsent and self._unsent + size > limit:
            self._cut_off(
                BacklogExceeded(
                    f"{self._unsent + size:,} bytes of answers were waiting for it to read them",
                    "max_unsent_bytes",
                    limit,
                    peer=self.name,
                )
            )
            return True
        return False

    def _cut_off(self, error: BacklogExceeded) -> None:
        """End the connection now: nothing more is read or written, handlers are cancelled,
        and waiters get ``error``."""
        if self._closed:
            return
        self._log.error("peer cut off", limit=error.limit, value=error.value, reason=error.reason)
        self._closed = True
        self._set_close_error(error)
        self._outbox.clear()
        self._unsent = 0
        if self._write_scope is not None:
            self._write_scope.cancel()
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()
        self._fail_pending(error)

    def _answer_parse_error(self, exc: ParseError, line: bytes) -> None:
        self._parse_errors += 1
        shown = excerpt(line)
        if self._malformed is None:
            self._malformed = shown
        self._log.warning("malformed JSON from peer", error=exc.message, line=shown)
        self._answer(_encode_error(None, ParseError(exc.message)))

    def _dropped_oversized(self, size: int) -> None:
        self._oversized_dropped += 1
        self._log.error("oversized message dropped", size=size, limit=self.max_message_size)


async def _method_not_found(method: str, params: Any) -> NoReturn:
    raise MethodNotFound(f"Method not found: {method}")


def _encode_error(request_id: RequestId | None, error: JsonRpcError) -> bytes:
    try:
        return encode_message(error_obj(request_id, error))
    except TypeError:
        # Its data was not JSON-able: send the code and message alone.
        return encode_message(error_obj(request_id, error_from_code(error.code, error.message)))


# ---------------------------------------------------------------------- open_connection


@asynccontextmanager
async def open_connection(
    stream: trio.abc.Stream,
    *,
    name: str = "peer",
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
    max_requests_in_flight: int | None = DEFAULT_MAX_REQUESTS_IN_FLIGHT,
    max_unsent_bytes: int | None = DEFAULT_MAX_UNSENT_BYTES,
    frame_observer: FrameObserver | None = None,
    close_error: CloseErrorFactory | None = None,
) -> AsyncIterator[JsonRpcConnection]:
    """A served :class:`JsonRpcConnection` for the duration of the block.

    On exit the read loop is cancelled and the stream closed. An exception from the block
    propagates unchanged (not wrapped in an exception group).
    """
    conn = JsonRpcConnection(
        stream,
        name=name,
        max_message_size=max_message_size,
        max_requests_in_flight=max_requests_in_flight,
        max_unsent_bytes=max_unsent_bytes,
        frame_observer=frame_observer,
        close_error=close_error,
    )
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(conn.serve)
            try:
                yield conn
            finally:
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1:
            _raise_keeping_context(group.exceptions[0])
        raise
    finally:
        # Close without waiting (a graceful close could block on a stuck peer).
        with trio.CancelScope() as scope:
            scope.cancel()
            await conn.aclose()


def _raise_keeping_context(exc: BaseException) -> NoReturn:
    """Raise ``exc`` out of an ``except`` block without making the group its context."""
    context = exc.__context__
    try:
        raise exc
    finally:
        exc.__context__ = context
        del exc, context
