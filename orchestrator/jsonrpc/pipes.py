"""A :class:`trio.abc.Stream` over a pair of pipe file descriptors, tuned for request latency.

Trio's :class:`trio.lowlevel.FdStream` yields to the scheduler at the start of every
``send_all`` and ``receive_some``, even when the write or read would complete at once. On a
JSON-RPC connection serving an agent's requests one at a time, those yields are most of the
cost of a round trip: each is a pass of trio's run loop with an ``epoll_wait`` of its own.
:class:`PipeStream` tries the system call first and waits only when it would block. It still
honours cancellation at every call, and a reader that keeps finding data ready yields every
few calls, so one busy connection cannot starve the other tasks.

The descriptors stay owned by the two :class:`~trio.lowlevel.FdStream` objects it wraps (they
set non-blocking mode and close the descriptors); :meth:`PipeStream.aclose` closes both.
"""

from __future__ import annotations

import errno
import os

import trio

__all__ = ["PipeStream"]

# A reader that found data ready this many calls in a row yields once anyway.
_YIELD_EVERY = 4


class PipeStream(trio.abc.Stream):
    """Send to one pipe and receive from another, waiting only when a call would block."""

    def __init__(self, send: trio.lowlevel.FdStream, receive: trio.lowlevel.FdStream) -> None:
        self._send = send
        self._receive = receive
        self._sending = False
        self._receiving = False
        self._ready_streak = 0

    @property
    def send_stream(self) -> trio.lowlevel.FdStream:
        """The sending side (for example an agent's stdin)."""
        return self._send

    @property
    def receive_stream(self) -> trio.lowlevel.FdStream:
        """The receiving side (for example an agent's stdout)."""
        return self._receive

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """Write all of ``data``; waits for room only when the pipe is full."""
        if self._sending:
            raise trio.BusyResourceError("another task is sending on this stream")
        self._sending = True
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
            with memoryview(data) as view:
                sent, length = 0, len(view)
                while sent < length:
                    fd = self._send.fileno()  # raises once closed
                    try:
                        sent += os.write(fd, view[sent:])
                    except BlockingIOError:
                        await trio.lowlevel.wait_writable(fd)
                    except OSError as exc:
                        if exc.errno == errno.EBADF:
                            raise trio.ClosedResourceError("stream was closed") from None
                        raise trio.BrokenResourceError from exc
        finally:
            self._sending = False

    def send_nowait(self, data: bytes | bytearray | memoryview) -> int:
        """Write as much of ``data`` as fits without waiting; return how many bytes went out.

        Never yields, so a caller can send a whole message without a shielded cancel scope
        when it fits, and fall back to :meth:`send_all` for the rest. Raises
        :class:`trio.ClosedResourceError` or :class:`trio.BrokenResourceError` like
        :meth:`send_all`, and :class:`trio.BusyResourceError` during another task's send.
        """
        if self._sending:
            raise trio.BusyResourceError("another task is sending on this stream")
        try:
            return os.write(self._send.fileno(), data)
        except BlockingIOError:
            return 0
        except OSError as exc:
            if exc.errno == errno.EBADF:
                raise trio.ClosedResourceError("stream was closed") from None
            raise trio.BrokenResourceError from exc

    async def wait_send_all_might_not_block(self) -> None:
        """Wait until the pipe has room."""
        await self._send.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        """Read what is available (up to ``max_bytes``), waiting only if nothing is."""
        if self._receiving:
            raise trio.BusyResourceError("another task is receiving on this stream")
        self._receiving = True
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
            if self._ready_streak >= _YIELD_EVERY:
                self._ready_streak = 0
                await trio.lowlevel.cancel_shielded_checkpoint()
            size = 65536 if max_bytes is None else max_bytes
            if size < 1:
                raise ValueError("max_bytes must be integer >= 1")
            waited = False
            while True:
                fd = self._receive.fileno()
                try:
                    data = os.read(fd, size)
                except BlockingIOError:
                    waited = True
                    await trio.lowlevel.wait_readable(fd)
                    continue
                except OSError as exc:
                    if exc.errno == errno.EBADF:
                        raise trio.ClosedResourceError("stream was closed") from None
                    raise trio.BrokenResourceError from exc
                self._ready_streak = 0 if waited else self._ready_streak + 1
                return data
        finally:
            self._receiving = False

    async def aclose(self) -> None:
        """Close both pipes."""
        try:
            await self._send.aclose()
        finally:
            await self._receive.aclose()
