"""PipeStream: a trio stream over two pipes that waits only when a call would block."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from orchestrator.jsonrpc import PipeStream, SupportsSendNowait


def _pipe() -> tuple[trio.lowlevel.FdStream, trio.lowlevel.FdStream]:
    """A pipe as (read end, write end) FdStreams."""
    r, w = os.pipe()
    return trio.lowlevel.FdStream(r), trio.lowlevel.FdStream(w)


def _pair() -> tuple[PipeStream, PipeStream]:
    """Two PipeStreams wired to each other, like a client and a child process."""
    a_read, b_write = _pipe()
    b_read, a_write = _pipe()
    return PipeStream(a_write, a_read), PipeStream(b_write, b_read)


def _clogged_pair() -> tuple[PipeStream, PipeStream]:
    """A pair whose first stream's outgoing pipe is already full."""
    left, right = _pair()
    while left.send_nowait(b"x" * 65536):
        pass
    return left, right


@asynccontextmanager
async def _open_pair() -> AsyncIterator[tuple[PipeStream, PipeStream]]:
    left, right = _pair()
    try:
        yield left, right
    finally:
        await left.aclose()
        await right.aclose()


async def test_round_trip_both_ways() -> None:
    """Bytes sent on one side arrive on the other, in both directions."""
    async with _open_pair() as (left, right):
        with trio.fail_after(5):
            await left.send_all(b"ping\n")
            assert await right.receive_some(100) == b"ping\n"
            await right.send_all(b"pong\n")
            assert await left.receive_some(100) == b"pong\n"


async def test_receive_waits_until_data_arrives() -> None:
    """A receive on an empty pipe waits, and wakes when the peer writes."""
    async with _open_pair() as (left, right):
        got: list[bytes] = []

        async def reader() -> None:
            got.append(await right.receive_some(100))

        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(reader)
                await trio.testing.wait_all_tasks_blocked()
                assert got == []
                await left.send_all(b"late")
        assert got == [b"late"]


async def test_send_all_larger_than_the_pipe_completes() -> None:
    """A message bigger than the pipe buffer goes out whole while the peer reads."""
    payload = bytes(range(256)) * 8192  # 2 MiB
    async with _open_pair() as (left, right):
        received = bytearray()

        async def reader() -> None:
            while len(received) < len(payload):
                received.extend(await right.receive_some(65536))

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(reader)
                await left.send_all(payload)
        assert bytes(received) == payload


async def test_send_nowait_writes_what_fits() -> None:
    """send_nowait writes at once what the pipe takes and reports 0 when it is full."""
    left, right = _clogged_pair()
    try:
        assert isinstance(left, SupportsSendNowait)
        assert left.send_nowait(b"more") == 0
        await right.receive_some(65536)  # room again
        assert left.send_nowait(b"more") == 4
    finally:
        await left.aclose()
        await right.aclose()


async def test_end_of_stream_reads_empty() -> None:
    """When the peer closes its side, receive_some returns b'' after the pending data."""
    left, right = _pair()
    try:
        await left.send_all(b"last")
        await left.aclose()
        with trio.fail_after(5):
            assert await right.receive_some(100) == b"last"
            assert await right.receive_some(100) == b""
    finally:
        await right.aclose()


async def test_send_to_a_closed_peer_is_broken() -> None:
    """Writing after the peer closed raises BrokenResourceError, from both send paths."""
    left, right = _pair()
    await right.aclose()
    try:
        with pytest.raises(trio.BrokenResourceError):
            await left.send_all(b"anyone?")
        with pytest.raises(trio.BrokenResourceError):
            left.send_nowait(b"anyone?")
    finally:
        await left.aclose()


async def test_use_after_close_is_closed_resource_error() -> None:
    """Every call on a closed PipeStream raises ClosedResourceError."""
    left, right = _pair()
    await left.aclose()
    try:
        with pytest.raises(trio.ClosedResourceError):
            await left.send_all(b"x")
        with pytest.raises(trio.ClosedResourceError):
            left.send_nowait(b"x")
        with pytest.raises(trio.ClosedResourceError):
            await left.receive_some(10)
    finally:
        await right.aclose()


async def test_close_wakes_a_waiting_receiver() -> None:
    """Closing the stream while a task waits to receive raises ClosedResourceError there."""
    left, right = _pair()
    errors: list[BaseException] = []

    async def reader() -> None:
        try:
            await right.receive_some(10)
        except trio.ClosedResourceError as exc:
            errors.append(exc)

    try:
        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(reader)
                await trio.testing.wait_all_tasks_blocked()
                await right.aclose()
        assert len(errors) == 1
    finally:
        await left.aclose()


async def test_cancelled_caller_receives_nothing_even_with_data_ready() -> None:
    """A cancelled receive raises Cancelled and leaves ready data for the next call."""
    async with _open_pair() as (left, right):
        await left.send_all(b"kept")
        with trio.CancelScope() as scope:
            scope.cancel()
            await right.receive_some(10)
            pytest.fail("receive_some should have raised Cancelled")
        assert scope.cancelled_caught
        assert await right.receive_some(10) == b"kept"


async def test_cancelled_caller_sends_nothing() -> None:
    """A cancelled send_all raises Cancelled before writing a byte."""
    async with _open_pair() as (left, right):
        with trio.CancelScope() as scope:
            scope.cancel()
            await left.send_all(b"never")
        assert scope.cancelled_caught
        await left.send_all(b"sent")
        assert await right.receive_some(10) == b"sent"


async def test_busy_reader_lets_other_tasks_run() -> None:
    """A reader that always finds data ready still yields to other tasks now and then."""
    async with _open_pair() as (left, right):
        await left.send_all(b"y" * 4096)
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await trio.lowlevel.checkpoint()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ticker)  # runs only when this task yields
            for _ in range(64):
                assert await right.receive_some(1) == b"y"
            assert ticks > 0
            nursery.cancel_scope.cancel()


async def test_ready_reads_skip_the_scheduler_pass() -> None:
    """Reads and writes that need no waiting do not yield on every call."""
    async with _open_pair() as (left, right):
        await left.send_all(b"z" * 100)
        passes = 0

        async def counter() -> None:
            nonlocal passes
            while True:
                passes += 1
                await trio.lowlevel.checkpoint()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(counter)  # counts the passes this task yields for
            for _ in range(40):
                await right.receive_some(1)
            yielded = passes
            nursery.cancel_scope.cancel()
        assert 0 < yielded < 40


@pytest.mark.parametrize("call", ["send", "receive"])
async def test_concurrent_use_is_busy(call: str) -> None:
    """Two tasks in send_all (or receive_some) at once get BusyResourceError."""
    left, right = _clogged_pair() if call == "send" else _pair()
    stream = left if call == "send" else right
    op: Callable[[], object] = (
        (lambda: stream.send_all(b"more")) if call == "send" else (lambda: stream.receive_some(1))
    )
    try:
        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(op)  # type: ignore[arg-type]
                await trio.testing.wait_all_tasks_blocked()
                with pytest.raises(trio.BusyResourceError):
                    await op()  # type: ignore[misc]
                nursery.cancel_scope.cancel()
    finally:
        await left.aclose()
        await right.aclose()
