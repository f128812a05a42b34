"""Tests of orchestrator.jsonrpc.connection over in-memory streams."""

from __future__ import annotations

import functools
import gc
import os
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, Literal

import pytest
import trio
import trio.lowlevel
import trio.testing
from log_capture import capture_logs

from orchestrator.errors import (
    AgentExited,
    AuthRequired,
    BacklogExceeded,
    ConnectionClosed,
    InternalError,
    InvalidParams,
    InvalidRequest,
    JsonRpcError,
    MethodNotFound,
    ParseError,
    RequestCancelled,
    ResourceNotFound,
)
from orchestrator.jsonrpc import (
    ConnectionStatistics,
    JsonRpcConnection,
    LineSplitter,
    PipeStream,
    SupportsSendNowait,
    decode_message,
    encode_message,
    open_connection,
)


class RawPeer:
    """The other end of the stream, speaking raw JSON lines."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.splitter = LineSplitter()
        self.lines: list[bytes] = []

    async def send(self, obj: Any) -> None:
        await self.stream.send_all(encode_message(obj))

    async def send_raw(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def receive(self) -> Any:
        while not self.lines:
            data = await self.stream.receive_some()
            if not data:
                raise EOFError
            for line in self.splitter.feed(data):
                assert isinstance(line, bytes)
                self.lines.append(line)
        return decode_message(self.lines.pop(0))

    async def receive_nothing(self) -> None:
        """Assert that nothing arrives for a while (virtual time)."""
        with trio.move_on_after(10):
            msg = await self.receive()
            raise AssertionError(f"unexpected message {msg!r}")


@asynccontextmanager
async def connected(**kwargs: Any) -> AsyncIterator[tuple[JsonRpcConnection, RawPeer]]:
    ours, theirs = trio.testing.memory_stream_pair()
    with trio.fail_after(60):
        async with open_connection(ours, name="agent", **kwargs) as conn:
            yield conn, RawPeer(theirs)


def req(id: Any, method: Any, params: Any = None) -> dict[str, Any]:
    obj = {"jsonrpc": "2.0", "id": id, "method": method}
    if params is not None:
        obj["params"] = params
    return obj


def note(method: str, params: Any = None) -> dict[str, Any]:
    obj = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        obj["params"] = params
    return obj


def ok(id: Any, result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id, "result": result}


def err(id: Any, code: int, message: str = "x", data: Any = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": id, "error": error}


# ---------------------------------------------------------------------- outbound requests


async def test_request_returns_the_result(autojump_clock: trio.testing.MockClock) -> None:
    """request() sends id 0 with params and returns the matching result."""
    async with connected() as (conn, peer), trio.open_nursery() as nursery:
        results: list[Any] = []

        async def call() -> None:
            results.append(await conn.request("session/new", {"cwd": "/"}))

        nursery.start_soon(call)
        assert await peer.receive() == req(0, "session/new", {"cwd": "/"})
        await peer.send(ok(0, {"sessionId": "s"}))
    assert results == [{"sessionId": "s"}]


async def test_ids_count_from_zero_and_params_are_omitted(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Our ids are 0, 1, 2...; a request without params has no params member."""
    async with connected() as (conn, peer), trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(conn.request, "ping")
        seen = [await peer.receive() for _ in range(3)]
        assert sorted(m["id"] for m in seen) == [0, 1, 2]
        assert all("params" not in m for m in seen)
        for m in seen:
            await peer.send(ok(m["id"], None))


async def test_responses_match_only_our_ids(autojump_clock: trio.testing.MockClock) -> None:
    """A response with id "0" or an unknown id does not answer our request 0."""
    async with connected() as (conn, peer), trio.open_nursery() as nursery:
        results: list[Any] = []

        async def call() -> None:
            results.append(await conn.request("m"))

        nursery.start_soon(call)
        await peer.receive()
        with capture_logs() as logs:
            await peer.send(ok("0", "wrong type"))
            await peer.send(ok(99, "unknown"))
            await trio.sleep(1)
        assert results == []
        assert [e["event"] for e in logs].count("response for an unknown request id dropped") == 2
        await peer.send(ok(0, "right"))
    assert results == ["right"]
    assert conn.statistics().responses_received == 3


@pytest.mark.parametrize(
    ("code", "cls"),
    [
        (-32700, ParseError),
        (-32600, InvalidRequest),
        (-32601, MethodNotFound),
        (-32602, InvalidParams),
        (-32603, InternalError),
        (-32800, RequestCancelled),
        (-32000, AuthRequired),
        (-32002, ResourceNotFound),
        (-31999, JsonRpcError),
    ],
)
async def test_error_response_raises_matching_class(
    code: int, cls: type[JsonRpcError], autojump_clock: trio.testing.MockClock
) -> None:
    """An error response raises the JsonRpcError subclass for its code, message and data kept."""
    async with connected() as (conn, peer), trio.open_nursery() as nursery:
        caught: list[JsonRpcError] = []

        async def call() -> None:
            with pytest.raises(JsonRpcError) as info:
                await conn.request("m")
            caught.append(info.value)

        nursery.start_soon(call)
        await peer.receive()
        await peer.send(err(0, code, "boom", {"why": 1}))
    assert type(caught[0]) is cls
    assert caught[0].code == code
    assert caught[0].message == "boom"
    assert caught[0].data == {"why": 1}


async def test_cancelled_request_sends_cancel_request(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Cancelling a caller sends $/cancel_request; the late answer is dropped quietly."""
    async with connected() as (conn, peer):
        with trio.move_on_after(5) as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(conn.request, "session/prompt", {"p": 1})
                assert (await peer.receive())["id"] == 0
        assert scope.cancelled_caught
        assert await peer.receive() == note("$/cancel_request", {"requestId": 0})
        assert conn.statistics().pending_outbound == 0
        with capture_logs() as logs:
            await peer.send(err(0, -32800, "cancelled"))
            await trio.sleep(1)
        assert not [e for e in logs if e["log_level"] != "debug"]
        assert conn.statistics().notifications_sent == 1


async def test_cancelled_request_without_notice_sends_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """notify_cancel=False: a cancelled caller sends no $/cancel_request; the answer is dropped."""
    async with connected() as (conn, peer):
        with trio.move_on_after(5) as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    functools.partial(conn.request, "session/prompt", {"p": 1}, notify_cancel=False)
                )
                assert (await peer.receive())["id"] == 0
        assert scope.cancelled_caught
        await peer.receive_nothing()
        assert conn.statistics().pending_outbound == 0
        with capture_logs() as logs:
            await peer.send(ok(0, {"stopReason": "cancelled"}))
            await trio.sleep(1)
        assert not [e for e in logs if e["log_level"] != "debug"]
        assert conn.statistics().notifications_sent == 0


async def test_request_cancelled_before_sending_sends_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A caller cancelled before its request went out does not send $/cancel_request."""
    async with connected() as (conn, peer):
        with trio.CancelScope() as scope:
            scope.cancel()
            await conn.request("m")
        await peer.receive_nothing()
        assert conn.statistics().requests_sent == 0


# ---------------------------------------------------------------------- inbound requests


async def test_inbound_requests_run_concurrently_while_ours_is_pending(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The peer's requests are served while our request waits, and concurrently."""
    b_done = trio.Event()

    async def handler_a(params: Any) -> Any:
        await b_done.wait()  # would deadlock if requests were served one at a time
        return {"a": params}

    async def handler_b(params: Any) -> Any:
        b_done.set()
        return {"b": params}

    async with connected() as (conn, peer), trio.open_nursery() as nursery:
        conn.on_request("fs/a", handler_a)
        conn.on_request("fs/b", handler_b)
        results: list[Any] = []

        async def call() -> None:
            results.append(await conn.request("session/prompt"))

        nursery.start_soon(call)
        assert (await peer.receive())["method"] == "session/prompt"
        await peer.send(req(0, "fs/a", 1))
        await peer.send(req(1, "fs/b", 2))
        answers = [await peer.receive(), await peer.receive()]
        assert answers == [ok(1, {"b": 2}), ok(0, {"a": 1})]
        await peer.send(ok(0, {"stopReason": "end_turn"}))
    assert results == [{"stopReason": "end_turn"}]


async def test_inbound_ids_are_echoed_exactly(autojump_clock: trio.testing.MockClock) -> None:
    """String and integer ids come back exactly as received ("0" is not 0)."""

    async def echo(params: Any) -> Any:
        return params

    async with connected() as (conn, peer):
        conn.on_request("echo", echo)
        for request_id in ["0", 0, "uuid-1f3a", -5, 2**40]:
            await peer.send(req(request_id, "echo", [request_id]))
            answer = await peer.receive()
            assert answer == ok(request_id, [request_id])
            assert type(answer["id"]) is type(request_id)


async def test_unknown_request_gets_method_not_found(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A request for a method without a handler is answered -32601."""
    async with connected() as (conn, peer):
        await peer.send(req("r1", "craft/drainMidTurnQueue"))
        answer = await peer.receive()
        assert answer["id"] == "r1"
        assert answer["error"]["code"] == -32601
        assert conn.statistics().requests_received == 1


async def test_extension_methods_go_to_fallbacks(autojump_clock: trio.testing.MockClock) -> None:
    """Unregistered "_x" requests and notifications reach the fallback handlers."""
    seen: list[tuple[str, Any]] = []

    async def fallback_request(method: str, params: Any) -> Any:
        seen.append((method, params))
        if method.startswith("_"):
            return {"handled": method}
        raise MethodNotFound()

    def fallback_notification(method: str, params: Any) -> None:
        seen.append((method, params))

    async with connected() as (conn, peer):
        conn.set_fallback_request_handler(fallback_request)
        conn.set_fallback_notification_handler(fallback_notification)
        await peer.send(note("_auth/status_update", {"s": 1}))
        await peer.send(req(4, "_x/do", {"k": 2}))
        assert await peer.receive() == ok(4, {"handled": "_x/do"})
        await peer.send(req(5, "other"))
        assert (await peer.receive())["error"]["code"] == -32601
    assert seen == [("_auth/status_update", {"s": 1}), ("_x/do", {"k": 2}), ("other", None)]


async def test_handler_errors_become_error_responses(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A JsonRpcError answers its own code; any other exception answers -32603 and is logged."""

    async def refuse(params: Any) -> Any:
        raise InvalidParams("bad path", {"path": params})

    async def crash(params: Any) -> Any:
        raise RuntimeError("kaput")

    async def unserializable(params: Any) -> Any:
        return object()

    async with connected() as (conn, peer):
        conn.on_request("refuse", refuse)
        conn.on_request("crash", crash)
        conn.on_request("odd", unserializable)
        await peer.send(req(1, "refuse", "x"))
        assert await peer.receive() == err(1, -32602, "bad path", {"path": "x"})
        with capture_logs() as logs:
            await peer.send(req(2, "crash"))
            answer = await peer.receive()
        assert answer["id"] == 2
        assert answer["error"]["code"] == -32603
        assert "kaput" in answer["error"]["data"]["details"]
        assert any(e["event"] == "request handler failed" and e.get("exc_info") for e in logs)
        await peer.send(req(3, "odd"))
        assert (await peer.receive())["error"]["code"] == -32603


async def test_inbound_cancel_request_cancels_the_handler(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """$/cancel_request cancels the running handler, which is answered -32800."""
    started = trio.Event()
    cancelled = trio.Event()

    async def slow(params: Any) -> Any:
        started.set()
        try:
            await trio.sleep_forever()
        finally:
            cancelled.set()

    async with connected() as (conn, peer):
        conn.on_request("slow", slow)
        await peer.send(req("a", "slow"))
        await started.wait()
        assert conn.statistics().running_inbound == 1
        await peer.send(note("$/cancel_request", {"requestId": "other"}))
        await peer.send(note("$/cancel_request", {"requestId": "a"}))
        answer = await peer.receive()
        assert cancelled.is_set()
        assert answer["id"] == "a"
        assert answer["error"]["code"] == -32800
        assert conn.statistics().running_inbound == 0


async def test_cancel_request_read_with_its_request_cancels_the_handler(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A $/cancel_request read in the same chunk as its request still cancels its handler."""

    async def slow(params: Any) -> Any:
        await trio.sleep_forever()

    async with connected() as (conn, peer):
        conn.on_request("slow", slow)
        cancel = note("$/cancel_request", {"requestId": "a"})
        await peer.send_raw(encode_message(req("a", "slow")) + encode_message(cancel))
        answer = await peer.receive()
        assert (answer["id"], answer["error"]["code"]) == ("a", -32800)
        assert conn.statistics().running_inbound == 0


async def test_request_handler_is_called_in_wire_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A handler is called as its request is read: it sees what came before, not after."""
    notes: list[Any] = []

    def handler(params: Any) -> Awaitable[Any]:
        seen = list(notes)  # called in the read loop; the answer is awaited in a task

        async def answer() -> Any:
            await trio.lowlevel.checkpoint()
            return seen

        return answer()

    async with connected() as (conn, peer):
        conn.on_notification("note", notes.append)
        conn.on_request("snapshot", handler)
        frames = [note("note", "before"), req(1, "snapshot"), note("note", "after")]
        await peer.send_raw(b"".join(encode_message(f) for f in frames))
        assert await peer.receive() == ok(1, ["before"])
    assert notes == ["before", "after"]


async def test_handler_failing_as_it_is_called_is_answered_with_its_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A handler raising before it returns an awaitable is answered as if it failed later."""

    def refuse(params: Any) -> Awaitable[Any]:
        raise InvalidParams("no such session")

    def crash(params: Any) -> Awaitable[Any]:
        raise RuntimeError("boom")

    async with connected() as (conn, peer):
        conn.on_request("refuse", refuse)
        conn.on_request("crash", crash)
        with capture_logs() as logs:
            await peer.send(req(1, "refuse"))
            assert await peer.receive() == err(1, -32602, "no such session")
            await peer.send(req(2, "crash"))
            answer = await peer.receive()
        assert (answer["id"], answer["error"]["code"]) == (2, -32603)
        assert any(e["event"] == "request handler failed" for e in logs)
        assert conn.statistics().running_inbound == 0


async def test_cancel_request_for_unknown_id_is_ignored(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """$/cancel_request naming no running request changes nothing."""
    async with connected() as (conn, peer):
        await peer.send(note("$/cancel_request", {"requestId": 12}))
        await peer.send(note("$/cancel_request", {"requestId": True}))
        await peer.send(note("$/cancel_request", "junk"))
        await peer.receive_nothing()
        assert not conn.closed


def test_cancel_request_handler_cannot_be_replaced() -> None:
    """Registering a handler for $/cancel_request is refused."""
    conn = JsonRpcConnection(trio.testing.memory_stream_pair()[0])
    with pytest.raises(ValueError, match="cancel_request"):
        conn.on_notification("$/cancel_request", lambda params: None)


# ---------------------------------------------------------------------- notifications


async def test_notifications_reach_sync_and_async_handlers(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Plain and async notification handlers both get the params, in order."""
    seen: list[Any] = []

    async def async_handler(params: Any) -> None:
        await trio.lowlevel.checkpoint()
        seen.append(("async", params))

    async with connected() as (conn, peer):
        conn.on_notification("a", async_handler)
        conn.on_notification("s", lambda params: seen.append(("sync", params)))
        await peer.send(note("s", 1))
        await peer.send(note("a", 2))
        await peer.send({"method": "s", "params": 3})  # no jsonrpc member: tolerated
        await trio.sleep(1)
    assert seen == [("sync", 1), ("async", 2), ("sync", 3)]


async def test_unknown_notifications_are_ignored(autojump_clock: trio.testing.MockClock) -> None:
    """A notification without a handler is dropped and the connection goes on."""

    async def echo(params: Any) -> Any:
        return params

    async with connected() as (conn, peer):
        conn.on_request("echo", echo)
        for _ in range(3):
            await peer.send(note("qwen/notify/session/prompt-suggestion", {"x": 1}))
        await peer.send(req(1, "echo", "still here"))
        assert await peer.receive() == ok(1, "still here")
        assert conn.statistics().notifications_received == 3


async def test_failing_notification_handler_is_logged_and_survived(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """An exception from a notification handler is logged; later messages still arrive."""
    seen: list[Any] = []

    def handler(params: Any) -> None:
        if params == "bad":
            raise KeyError(params)
        seen.append(params)

    async with connected() as (conn, peer):
        conn.on_notification("n", handler)
        with capture_logs() as logs:
            await peer.send(note("n", "bad"))
            await peer.send(note("n", "good"))
            await trio.sleep(1)
    assert seen == ["good"]
    assert any(e["event"] == "notification handler failed" for e in logs)


async def test_notifications_are_delivered_before_a_following_response(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Every notification sent before the response has been handled when request() returns."""
    seen: list[int] = []

    async with connected() as (conn, peer), trio.open_nursery() as nursery:
        conn.on_notification("session/update", lambda params: seen.append(params["n"]))
        counts: list[int] = []

        async def call() -> None:
            await conn.request("session/prompt")
            counts.append(len(seen))

        nursery.start_soon(call)
        await peer.receive()
        data = b"".join(encode_message(note("session/update", {"n": i})) for i in range(500))
        await peer.send_raw(data + encode_message(ok(0, {"stopReason": "end_turn"})))
    assert counts == [500]
    assert seen == list(range(500))


# ---------------------------------------------------------------------- bad input


async def test_malformed_json_is_answered_and_survived(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A line that is not JSON is answered -32700 with id null; the connection goes on."""
    async with connected() as (conn, peer):
        conn.on_notification("n", lambda params: None)
        await peer.send_raw(b'{"jsonrpc": "2.0", "method": \n')
        answer = await peer.receive()
        assert answer["id"] is None
        assert answer["error"]["code"] == -32700
        await peer.send_raw(b"\xff\xfe\n")
        assert (await peer.receive())["error"]["code"] == -32700
        await peer.send(req(1, "nothing"))
        assert (await peer.receive())["id"] == 1
        assert conn.statistics().parse_errors == 2


async def test_invalid_messages_are_answered_with_invalid_request(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A JSON value that is not a message gets -32600, naming its id when it had one."""
    async with connected() as (conn, peer):
        await peer.send(req(7, 123))
        answer = await peer.receive()
        assert answer["id"] == 7
        assert answer["error"]["code"] == -32600
        for junk in ([note("n")], "hello", {"jsonrpc": "2.0", "id": 1.5, "method": "m"}):
            await peer.send(junk)
            answer = await peer.receive()
            assert answer["id"] is None
            assert answer["error"]["code"] == -32600
        assert conn.statistics().invalid_messages == 4


async def test_oversized_message_is_dropped_and_survived(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A line over max_message_size is dropped with an error log; later lines still work."""
    frames: list[tuple[str, bytes]] = []

    async def echo(params: Any) -> Any:
        return params

    def observe(direction: Literal["send", "recv"], line: bytes, valid: bool) -> None:
        frames.append((direction, line))

    async with connected(max_message_size=200, frame_observer=observe) as (conn, peer):
        conn.on_request("echo", echo)
        with capture_logs() as logs:
            big = encode_message(req(1, "echo", "x" * 1000))
            for i in range(0, len(big), 64):
                await peer.send_raw(big[i : i + 64])
            await peer.send(req(2, "echo", "small"))
            assert await peer.receive() == ok(2, "small")
        assert conn.statistics().oversized_dropped == 1
        error = next(e for e in logs if e["event"] == "oversized message dropped")
        assert error["log_level"] == "error"
        assert error["size"] == len(big) - 1
        assert ("recv", b'{"oversized": %d}' % (len(big) - 1)) in frames


async def test_unterminated_last_line_is_handled_at_eof(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A final line without a newline is still processed when the stream ends."""
    seen: list[Any] = []
    ours, theirs = trio.testing.memory_stream_pair()
    conn = JsonRpcConnection(ours)
    conn.on_notification("n", seen.append)
    await theirs.send_all(b'{"jsonrpc":"2.0","method":"n","params":1}')
    await theirs.aclose()
    with trio.fail_after(5):
        await conn.serve()
    assert seen == [1]


async def test_lone_surrogate_is_tolerated(autojump_clock: trio.testing.MockClock) -> None:
    """A message with a lone UTF-16 surrogate escape is delivered, not refused."""
    seen: list[Any] = []
    async with connected() as (conn, peer):
        conn.on_notification("n", seen.append)
        await peer.send_raw(b'{"jsonrpc":"2.0","method":"n","params":"cut \\ud83d"}\n')
        await trio.sleep(1)
    assert seen == ["cut \ufffd"]


# ---------------------------------------------------------------------- end of stream


async def test_eof_fails_pending_requests_with_close_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """At EOF every waiter gets the close_error exception and serve returns normally."""
    the_error = AgentExited("agent exited", peer="agent", exit_status=3, stderr_tail="oops")
    reasons: list[str] = []

    async def close_error(reason: str) -> ConnectionClosed:
        reasons.append(reason)
        await trio.sleep(1)  # e.g. waiting for the exit status
        return the_error

    ours, theirs = trio.testing.memory_stream_pair()
    conn = JsonRpcConnection(ours, close_error=close_error)
    peer = RawPeer(theirs)
    caught: list[BaseException] = []

    async def call(n: int) -> None:
        try:
            await conn.request("m", n)
        except ConnectionClosed as exc:
            caught.append(exc)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(conn.serve)
            for n in range(3):
                nursery.start_soon(call, n)
            for _ in range(3):
                await peer.receive()
            await theirs.aclose()
    assert caught == [the_error] * 3
    assert all(exc is the_error for exc in caught)
    assert reasons == ["end of stream"]
    assert conn.closed
    with pytest.raises(AgentExited) as info:
        await conn.request("later")
    assert info.value is the_error
    with pytest.raises(AgentExited):
        await conn.notify("later")
    assert conn.statistics().pending_outbound == 0


async def test_default_close_error_names_the_peer(autojump_clock: trio.testing.MockClock) -> None:
    """Without close_error, waiters get a ConnectionClosed naming the peer."""
    ours, theirs = trio.testing.memory_stream_pair()
    conn = JsonRpcConnection(ours, name="qwen")
    caught: list[ConnectionClosed] = []

    async def call() -> None:
        with pytest.raises(ConnectionClosed) as info:
            await conn.request("m")
        caught.append(info.value)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(conn.serve)
            nursery.start_soon(call)
            await RawPeer(theirs).receive()
            await theirs.aclose()
    assert caught[0].peer == "qwen"
    assert "end of stream" in str(caught[0])


async def test_eof_cancels_running_inbound_handlers(autojump_clock: trio.testing.MockClock) -> None:
    """Handlers of the peer's requests still running at EOF are cancelled."""
    started = trio.Event()
    cancelled: list[bool] = []

    async def slow(params: Any) -> Any:
        started.set()
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            cancelled.append(True)
            raise

    ours, theirs = trio.testing.memory_stream_pair()
    conn = JsonRpcConnection(ours)
    conn.on_request("slow", slow)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(conn.serve)
            await theirs.send_all(encode_message(req(1, "slow")))
            await started.wait()
            await theirs.aclose()
    assert cancelled == [True]
    assert conn.statistics().running_inbound == 0


async def test_send_on_broken_stream_raises_connection_closed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Writing to a stream whose reader is gone raises ConnectionClosed."""
    ours, theirs = trio.testing.memory_stream_pair()
    conn = JsonRpcConnection(ours, name="gone")
    await theirs.aclose()
    with pytest.raises(ConnectionClosed) as info:
        await conn.notify("n")
    assert info.value.peer == "gone"
    assert "broken" in info.value.reason


async def test_broken_stream_while_reading_fails_pending_requests(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A stream that breaks under the read loop ends serve; waiters get ConnectionClosed."""
    breaking = trio.Event()

    async def hook() -> None:
        await breaking.wait()
        raise trio.BrokenResourceError("pipe gone")

    sent = trio.testing.MemorySendStream()
    stream = trio.StapledStream(sent, trio.testing.MemoryReceiveStream(hook))
    conn = JsonRpcConnection(stream, name="flaky")
    caught: list[ConnectionClosed] = []

    async def call() -> None:
        with pytest.raises(ConnectionClosed) as info:
            await conn.request("m")
        caught.append(info.value)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(conn.serve)
            nursery.start_soon(call)
            await trio.sleep(1)
            assert conn.statistics().pending_outbound == 1
            breaking.set()
    assert caught[0].reason == "stream broken: pipe gone"
    assert conn.closed


async def test_cancelled_serve_fails_pending_requests(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """When serve is cancelled, nobody is left waiting for a response."""
    ours, theirs = trio.testing.memory_stream_pair()
    conn = JsonRpcConnection(ours)
    caught: list[ConnectionClosed] = []

    async def call() -> None:
        with pytest.raises(ConnectionClosed) as info:
            await conn.request("m")
        caught.append(info.value)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            serve_scope = trio.CancelScope()

            async def run_serve() -> None:
                with serve_scope:
                    await conn.serve()

            nursery.start_soon(run_serve)
            nursery.start_soon(call)
            await RawPeer(theirs).receive()
            serve_scope.cancel()
    assert "no longer served" in str(caught[0])
    assert conn.closed


async def test_aclose_fails_pending_requests(autojump_clock: trio.testing.MockClock) -> None:
    """aclose() closes the stream and fails our pending requests."""
    async with connected() as (conn, peer), trio.open_nursery() as nursery:
        caught: list[ConnectionClosed] = []

        async def call() -> None:
            with pytest.raises(ConnectionClosed) as info:
                await conn.request("m")
            caught.append(info.value)

        nursery.start_soon(call)
        await peer.receive()
        await conn.aclose()
    assert conn.closed
    assert "closed locally" in str(caught[0])


async def test_serve_runs_only_once(autojump_clock: trio.testing.MockClock) -> None:
    """A second serve() is refused."""
    async with connected() as (conn, _peer):
        with pytest.raises(RuntimeError):
            await conn.serve()


async def test_open_connection_propagates_exceptions_unwrapped(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """An exception raised in the block comes out as itself, not in an exception group."""
    ours, _theirs = trio.testing.memory_stream_pair()
    with pytest.raises(KeyError, match="inside") as info:
        async with open_connection(ours):
            raise KeyError("inside")
    assert info.value.__context__ is None


async def test_open_connection_closes_the_stream(autojump_clock: trio.testing.MockClock) -> None:
    """Leaving open_connection closes the stream: the peer sees EOF."""
    ours, theirs = trio.testing.memory_stream_pair()
    async with open_connection(ours) as conn:
        pass
    assert conn.closed
    assert await theirs.receive_some() == b""


# ---------------------------------------------------------------------- observation


async def test_frame_observer_sees_both_directions(autojump_clock: trio.testing.MockClock) -> None:
    """The frame observer gets every line sent and received, malformed ones marked invalid."""
    frames: list[tuple[str, bytes]] = []
    validity: list[bool] = []

    def observe(direction: Literal["send", "recv"], line: bytes, valid: bool) -> None:
        frames.append((direction, line))
        validity.append(valid)

    async def echo(params: Any) -> Any:
        return params

    async with connected(frame_observer=observe) as (conn, peer):
        conn.on_request("echo", echo)
        await conn.notify("hello", {"a": 1})
        await peer.receive()
        await peer.send_raw(b'{"jsonrpc":"2.0","id":"e","method":"echo","params":5}\r\n')
        await peer.receive()
        await peer.send_raw(b"garbage\n")
        await peer.receive()
    assert frames == [
        ("send", b'{"jsonrpc":"2.0","method":"hello","params":{"a":1}}'),
        ("recv", b'{"jsonrpc":"2.0","id":"e","method":"echo","params":5}'),
        ("send", b'{"jsonrpc":"2.0","id":"e","result":5}'),
        ("recv", b"garbage"),
        ("send", frames[-1][1]),
    ]
    assert b'"code":-32700' in frames[-1][1]
    assert validity == [True, True, True, False, True]


async def test_failing_frame_observer_does_not_break_the_connection(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """An exception from the frame observer is logged; traffic goes on."""

    def observe(direction: Literal["send", "recv"], line: bytes, valid: bool) -> None:
        raise RuntimeError("disk full")

    async def echo(params: Any) -> Any:
        return params

    async with connected(frame_observer=observe) as (conn, peer):
        conn.on_request("echo", echo)
        with capture_logs() as logs:
            await peer.send(req(1, "echo", 1))
            assert await peer.receive() == ok(1, 1)
        assert [e["event"] for e in logs].count("frame observer failed") == 2


async def test_statistics_count_traffic(autojump_clock: trio.testing.MockClock) -> None:
    """statistics() counts messages in both directions."""

    async def echo(params: Any) -> Any:
        return params

    async with connected() as (conn, peer), trio.open_nursery() as nursery:
        conn.on_request("echo", echo)
        conn.on_notification("n", lambda params: None)
        nursery.start_soon(conn.request, "ours")
        await peer.receive()
        await conn.notify("tell")
        await peer.receive()
        await peer.send(note("n"))
        await peer.send(note("n"))
        await peer.send(req(1, "echo"))
        await peer.receive()
        await peer.send_raw(b"}\n")
        await peer.receive()
        await peer.send(42)
        await peer.receive()
        assert conn.statistics() == ConnectionStatistics(
            requests_sent=1,
            notifications_sent=1,
            responses_received=0,
            requests_received=1,
            notifications_received=2,
            pending_outbound=1,
            running_inbound=0,
            oversized_dropped=0,
            parse_errors=1,
            invalid_messages=1,
        )
        await peer.send(ok(0, None))
    assert conn.statistics().responses_received == 1
    assert conn.statistics().pending_outbound == 0


# ---------------------------------------------------------------------- streams that send at once


def _pipe_pair() -> tuple[PipeStream, PipeStream]:
    """Two PipeStreams over real pipes, wired to each other."""
    a_read, b_write = (trio.lowlevel.FdStream(fd) for fd in os.pipe())
    b_read, a_write = (trio.lowlevel.FdStream(fd) for fd in os.pipe())
    return PipeStream(a_write, a_read), PipeStream(b_write, b_read)


@pytest.mark.parametrize("clogged", [False, True])
async def test_frames_go_out_whole_through_send_nowait(clogged: bool) -> None:
    """Over a PipeStream frames go out whole, finished by send_all when the pipe fills."""
    ours, theirs = _pipe_pair()
    filler = 0
    if clogged:
        while sent := ours.send_nowait(b" " * 65536):
            filler += sent
    peer = RawPeer(theirs)
    big = {"blob": "x" * 200_000}  # more than a pipe holds: finished by send_all either way
    with trio.fail_after(10):
        async with open_connection(ours, name="agent") as conn, trio.open_nursery() as nursery:
            nursery.start_soon(conn.notify, "note/one", {"n": 1})
            nursery.start_soon(conn.notify, "note/big", big)
            skipped = 0
            while skipped < filler:  # the filler is whitespace before the first frame
                skipped += len(await theirs.receive_some(min(65536, filler - skipped)))
            got = {(await peer.receive())["method"] for _ in range(2)}
            assert got == {"note/one", "note/big"}
        await theirs.aclose()


# ---------------------------------------------------------------------- requests answered at once


class SpawnCounter(trio.abc.Instrument):
    """Records the name of every task spawned while it is installed."""

    def __init__(self) -> None:
        self.spawned: list[str] = []

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        self.spawned.append(task.name)


@contextmanager
def counting_spawns() -> Iterator[SpawnCounter]:
    """A SpawnCounter installed for the duration of the block."""
    counter = SpawnCounter()
    trio.lowlevel.add_instrument(counter)
    try:
        yield counter
    finally:
        trio.lowlevel.remove_instrument(counter)


class PipePeer(RawPeer):
    """A RawPeer on a pipe that was filled with ``filler`` bytes of whitespace before the first
    frame: nothing the connection sends reaches it until :meth:`skip_filler`."""

    def __init__(self, stream: trio.abc.Stream, filler: int) -> None:
        super().__init__(stream)
        self.filler = filler

    async def skip_filler(self) -> None:
        """Start draining the pipe: read and drop the whitespace filler."""
        while self.filler:
            data = await self.stream.receive_some(min(65536, self.filler))
            assert data and not data.strip()
            self.filler -= len(data)


@asynccontextmanager
async def piped(
    *, clogged: bool = False, **kwargs: Any
) -> AsyncIterator[tuple[JsonRpcConnection, PipePeer]]:
    """A connection over a PipeStream (so it sends with send_nowait) and its raw peer.

    With ``clogged`` our pipe is full before the connection starts: every frame waits for the
    peer to drain it. ``kwargs`` go to :func:`open_connection`.
    """
    ours, theirs = _pipe_pair()
    filler = 0
    if clogged:
        while sent := ours.send_nowait(b" " * 65536):
            filler += sent

    async def hang_up_late() -> None:
        # A frame waiting for room is written under a shield, which fail_after cannot cancel;
        # closing the peer's end breaks it, so that a failing test ends instead of hanging.
        await trio.sleep(12)
        await theirs.aclose()

    async with trio.open_nursery() as watchdog:
        watchdog.start_soon(hang_up_late)
        try:
            with trio.fail_after(10):
                async with open_connection(ours, name="agent", **kwargs) as conn:
                    yield conn, PipePeer(theirs, filler)
        finally:
            watchdog.cancel_scope.cancel()
    await theirs.aclose()


async def never_called(params: Any) -> Any:
    """An async handler for requests that must be answered by the nowait handler."""
    raise AssertionError(f"the async handler was called with {params!r}")


async def test_nowait_handler_answers_without_a_task() -> None:
    """A nowait handler's answer is written by the read loop itself: no task is spawned."""
    async with piped() as (conn, peer):
        conn.on_request("m", never_called, nowait=lambda params: {"fast": params})
        with counting_spawns() as counter:
            for i in range(3):
                await peer.send(req(i, "m", [i]))
                assert await peer.receive() == ok(i, {"fast": [i]})
        assert counter.spawned == []
        stats = conn.statistics()
        assert (stats.requests_received, stats.running_inbound) == (3, 0)


async def test_nowait_would_block_leaves_the_request_to_the_async_handler(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A nowait handler raising WouldBlock hands the request, same params, to the async handler."""
    tried: list[Any] = []
    served: list[Any] = []

    def fast(params: Any) -> Any:
        tried.append(params)
        if params["size"] > 10:
            raise trio.WouldBlock
        return "fast"

    async def slow(params: Any) -> Any:
        served.append(params)
        await trio.sleep(1)
        return "slow"

    async with connected() as (conn, peer):
        conn.on_request("read", slow, nowait=fast)
        await peer.send(req(1, "read", {"size": 99}))
        await peer.send(req(2, "read", {"size": 1}))
        assert await peer.receive() == ok(2, "fast")
        assert conn.statistics().running_inbound == 1
        assert await peer.receive() == ok(1, "slow")
    assert tried == [{"size": 99}, {"size": 1}]
    assert served == [{"size": 99}]


async def test_nowait_errors_become_error_responses(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """From a nowait handler a JsonRpcError answers its code; anything else -32603, logged."""

    def refuse(params: Any) -> Any:
        raise InvalidParams("bad path", {"path": params})

    def crash(params: Any) -> Any:
        raise RuntimeError("kaput")

    async with connected() as (conn, peer):
        conn.on_request("refuse", never_called, nowait=refuse)
        conn.on_request("crash", never_called, nowait=crash)
        conn.on_request("odd", never_called, nowait=lambda params: object())
        conn.on_request("fine", never_called, nowait=lambda params: "fine")
        await peer.send(req(1, "refuse", "x"))
        assert await peer.receive() == err(1, -32602, "bad path", {"path": "x"})
        with capture_logs() as logs:
            await peer.send(req(2, "crash"))
            answer = await peer.receive()
        assert answer["id"] == 2
        assert answer["error"]["code"] == -32603
        assert "kaput" in answer["error"]["data"]["details"]
        assert any(e["event"] == "request handler failed" and e.get("exc_info") for e in logs)
        await peer.send(req(3, "odd"))
        assert (await peer.receive())["error"]["code"] == -32603
        await peer.send(req(4, "fine"))
        assert await peer.receive() == ok(4, "fine")
        assert not conn.closed


@pytest.mark.parametrize("clogged", [False, True])
async def test_nowait_answer_the_pipe_cannot_take_goes_out_whole_while_reading_goes_on(
    clogged: bool,
) -> None:
    """An answer the pipe cannot take goes out whole from a task while the read loop reads on."""
    big = {"content": "x" * 200_000}  # more than a pipe holds
    noted = trio.Event()
    async with piped(clogged=clogged) as (conn, peer), trio.open_nursery() as nursery:
        conn.on_request("read", never_called, nowait=lambda params: big)
        conn.on_notification("n", lambda params: noted.set())
        await peer.send(req(1, "read"))
        await peer.send(note("n"))
        with trio.fail_after(5):
            await noted.wait()  # handled before the peer has read a byte of the answer
        nursery.start_soon(conn.notify, "after", {"k": 1})
        await trio.testing.wait_all_tasks_blocked()
        await peer.skip_filler()
        assert await peer.receive() == ok(1, big)
        assert await peer.receive() == note("after", {"k": 1})


@pytest.mark.parametrize("clogged", [False, True])
async def test_nowait_answer_waits_for_a_frame_in_progress(clogged: bool) -> None:
    """An answer made while another task's frame is half sent goes out after it, not inside it."""
    big = {"blob": "x" * 200_000}  # more than a pipe holds: its sender waits for the peer
    noted = trio.Event()
    async with piped(clogged=clogged) as (conn, peer), trio.open_nursery() as nursery:
        conn.on_request("m", never_called, nowait=lambda params: {"echo": params})
        conn.on_notification("n", lambda params: noted.set())
        nursery.start_soon(conn.notify, "note/big", big)
        await trio.testing.wait_all_tasks_blocked()
        await peer.send(req(1, "m", 5))
        await peer.send(note("n"))
        with trio.fail_after(5):
            await noted.wait()
        await peer.skip_filler()
        assert await peer.receive() == note("note/big", big)
        assert await peer.receive() == ok(1, {"echo": 5})


async def test_nowait_answers_echo_ids_exactly() -> None:
    """Answers made at once carry string and integer ids exactly as received."""

    def echo(params: Any) -> Any:
        if params == "refuse":
            raise ResourceNotFound("gone")
        return params

    async with piped() as (conn, peer):
        conn.on_request("echo", never_called, nowait=echo)
        for request_id in ["0", 0, "uuid-1f3a", -5, 2**40]:
            await peer.send(req(request_id, "echo", [request_id]))
            answer = await peer.receive()
            assert answer == ok(request_id, [request_id])
            assert type(answer["id"]) is type(request_id)
            await peer.send(req(request_id, "echo", "refuse"))
            answer = await peer.receive()
            assert answer == err(request_id, -32002, "gone")
            assert type(answer["id"]) is type(request_id)


async def test_on_request_without_nowait_drops_the_earlier_nowait(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Registering a method again without nowait leaves its requests to the async handler."""
    tried: list[Any] = []

    def fast(params: Any) -> Any:
        tried.append(params)
        return "fast"

    async def slow(params: Any) -> Any:
        return "slow"

    async with connected() as (conn, peer):
        conn.on_request("m", slow, nowait=fast)
        await peer.send(req(1, "m", 1))
        assert await peer.receive() == ok(1, "fast")
        conn.on_request("m", slow)
        await peer.send(req(2, "m", 2))
        assert await peer.receive() == ok(2, "slow")
    assert tried == [1]


async def test_nowait_over_a_stream_without_send_nowait(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Without send_nowait the answer is still made at once, and only its sending is a task."""
    ours, theirs = trio.testing.memory_stream_pair()
    assert not isinstance(ours, SupportsSendNowait)
    peer = RawPeer(theirs)
    with trio.fail_after(60):
        async with open_connection(ours, name="agent") as conn:
            conn.on_request("m", never_called, nowait=lambda params: {"fast": params})
            with counting_spawns() as counter:
                await peer.send(req("a", "m", 1))
                assert await peer.receive() == ok("a", {"fast": 1})
            assert len(counter.spawned) == 1
            assert "_run_inbound" not in counter.spawned[0]
            assert conn.statistics().running_inbound == 0


# ---------------------------------------------------------------------- answers left unread

UNREAD = 2000
FILE = {"content": "x" * 64}


def _requests(count: int, method: str = "read") -> bytes:
    """``count`` requests with ids of one width, so that their answers have one size."""
    return b"".join(encode_message(req(f"r{i:06d}", method)) for i in range(count))


async def _read_file(params: Any) -> Any:
    return FILE


@pytest.mark.parametrize("served", ["nowait", "task"])
async def test_an_answer_the_peer_leaves_unread_is_held_as_its_bytes(served: str) -> None:
    """Answers a peer does not read wait in one queue as their own bytes: no task each, and
    about their size in memory each (orjson's 4 KiB buffers are not kept)."""
    one = len(encode_message(ok("r000000", FILE)))
    bounds = {"max_requests_in_flight": None, "max_unsent_bytes": None}
    async with piped(clogged=True, **bounds) as (conn, peer):
        if served == "nowait":
            conn.on_request("read", never_called, nowait=lambda params: FILE)
        else:
            conn.on_request("read", _read_file)
        with counting_spawns() as counter:
            await peer.stream.send_all(_requests(UNREAD))
            await trio.testing.wait_all_tasks_blocked()
        # one task writes every waiting answer out (besides the handlers' own, which ended)
        assert [name for name in counter.spawned if "_run_inbound" not in name] == [
            "orchestrator.jsonrpc.connection.JsonRpcConnection._write_out"
        ]
        stats = conn.statistics()
        assert (stats.requests_received, stats.running_inbound) == (UNREAD, 0)
        assert stats.unsent_bytes == UNREAD * one  # all of them, the one being written too
        assert stats.queued_answers == UNREAD - 1
        # as many again, measured (trio's own tables have grown to their size already)
        flood = _requests(UNREAD)
        gc.collect()
        tracemalloc.start()
        try:
            await peer.stream.send_all(flood)
            await trio.testing.wait_all_tasks_blocked()
            gc.collect()
            held, _peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert conn.statistics().queued_answers == 2 * UNREAD - 1
        # its bytes, a bytes object's header and a slot in the queue (4 KiB and more before)
        assert held < UNREAD * (one + 150)


async def test_a_peer_with_too_many_requests_in_flight_is_cut_off() -> None:
    """Past max_requests_in_flight the connection ends at once with BacklogExceeded naming the
    limit; our own request waiting to be written fails with it, and nothing more is read."""
    failed: list[BaseException] = []
    async with piped(clogged=True, max_requests_in_flight=50) as (conn, peer):
        conn.on_request("read", never_called, nowait=lambda params: FILE)
        async with trio.open_nursery() as nursery:

            async def ours() -> None:
                with pytest.raises(BacklogExceeded) as caught:
                    await conn.request("ours")
                failed.append(caught.value)

            nursery.start_soon(ours)
            await trio.testing.wait_all_tasks_blocked()  # its frame waits for the peer
            await peer.stream.send_all(_requests(200))
            closed = await conn.wait_closed()
        stats = conn.statistics()
    assert isinstance(closed, BacklogExceeded)
    assert (closed.limit, closed.value) == ("max_requests_in_flight", 50)
    assert str(closed) == (
        "agent: stopped: 51 of its requests were in flight at once (being handled, or answered "
        "and the answers not read), over the limit max_requests_in_flight = 50"
    )
    assert failed == [closed]
    assert (stats.requests_received, stats.queued_answers, stats.unsent_bytes) == (51, 0, 0)


async def test_a_peer_leaving_too_many_bytes_unread_is_cut_off() -> None:
    """Past max_unsent_bytes of answers waiting for the peer, the connection ends with
    BacklogExceeded naming that limit."""
    big = {"content": "x" * 1000}
    one = len(encode_message(ok("r000000", big)))
    async with piped(clogged=True, max_unsent_bytes=5 * one) as (conn, peer):
        conn.on_request("read", never_called, nowait=lambda params: big)
        await peer.stream.send_all(_requests(50))
        closed = await conn.wait_closed()
        stats = conn.statistics()
    assert isinstance(closed, BacklogExceeded)
    assert (closed.limit, closed.value) == ("max_unsent_bytes", 5 * one)
    assert f"{6 * one:,} bytes of answers were waiting for it to read them" in str(closed)
    assert stats.requests_received == 6


@pytest.mark.parametrize("served", ["nowait", "task"])
async def test_a_peer_that_reads_its_answers_is_never_cut_off(served: str) -> None:
    """Requests answered and read one after another never count against the bound, however
    many of them a peer sends."""
    async with piped(max_requests_in_flight=2) as (conn, peer):
        if served == "nowait":
            conn.on_request("read", never_called, nowait=lambda params: FILE)
        else:
            conn.on_request("read", _read_file)
        for i in range(30):
            await peer.send(req(i, "read"))
            assert await peer.receive() == ok(i, FILE)
        assert not conn.closed


async def test_leaving_a_connection_whose_peer_reads_nothing_does_not_wait_for_it() -> None:
    """A frame still waiting for a peer that reads nothing is abandoned when the connection is
    left, instead of holding it open for ever (past piped's deadline, the test fails)."""
    big = {"blob": "x" * 200_000}  # more than a pipe holds: its frame waits for the peer
    async with piped(clogged=True) as (conn, peer):
        conn.on_request("read", never_called, nowait=lambda params: big)
        await peer.send(req(1, "read"))
        await trio.testing.wait_all_tasks_blocked()
    assert conn.closed
