"""Runs in threads of their own: what the sync face (:mod:`orchestrator.sync`) and the asyncio
face (:mod:`orchestrator.aio`) are made of.

Each call runs ``trio.run`` of one library function in a dedicated (non-daemon) thread, under a
cancel scope that can be cancelled from any thread. A cancel stops the call the way Ctrl-C
stops the command line: the running turns get ``session/cancel`` and a grace to end, what they
did is recorded, the agents are stopped (the shutdown ladder), nothing is applied after it and
the run is recorded ``interrupted``. A second cancel ends the graces at once.

Every live call is in one process-wide registry: :func:`cancel_all` cancels them all, and the
SIGINT handler that :mod:`orchestrator.sync` installs calls it before raising
``KeyboardInterrupt`` as Python's default handler does.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import signal
import threading
from collections.abc import Awaitable, Callable
from types import FrameType
from typing import Any, Generic, TypeVar

import outcome
import trio

from .._util import end_grace_periods
from ..errors import RunCancelled
from ..pipeline._recording import call_listener
from ._face import check_asyncio_face, check_sync_face

__all__ = ["CancelToken", "ThreadedCall", "call_async", "call_sync", "cancel_all"]

T = TypeVar("T")

_LIVE: set[ThreadedCall[Any]] = set()
# re-entrant: the SIGINT handler (cancel_all) runs in the main thread between two bytecodes,
# maybe while that thread holds this lock or a call's
_LIVE_LOCK = threading.RLock()


def cancel_all() -> None:
    """Cancel every call of the sync and asyncio faces that is still running in this process
    (again: end their graces at once)."""
    with _LIVE_LOCK:
        calls = list(_LIVE)
    for call in calls:
        call.cancel()


class ThreadedCall(Generic[T]):
    """``trio.run(fn)`` in a thread of its own, cancellable from any thread.

    :meth:`cancel` may be called before the run started, while it runs or after it ended;
    :meth:`wait` blocks until it ended and gives its result.
    """

    def __init__(self, fn: Callable[[], Awaitable[T]], *, name: str) -> None:
        self._fn = fn
        self._lock = threading.RLock()  # re-entrant: see _LIVE_LOCK
        self._token: trio.lowlevel.TrioToken | None = None
        self._scope: trio.CancelScope | None = None
        self._level = 0  # cancels asked for: 1 cancels, 2 and more end the graces too
        self._done = threading.Event()
        self._when_done: list[Callable[[], None]] = []
        self._outcome: outcome.Outcome[T] | None = None
        #: the id of the run the call started, once its ``run_started`` event was seen
        self.run_id: str | None = None
        self._thread = threading.Thread(target=self._main, name=f"orchestrator {name}")

    # ------------------------------------------------------------------ any thread

    def start(self) -> None:
        """Register the call and start its thread."""
        with _LIVE_LOCK:
            _LIVE.add(self)
        try:
            self._thread.start()
        except BaseException:
            with _LIVE_LOCK:
                _LIVE.discard(self)
            raise

    def cancel(self) -> None:
        """Cancel the run (a second time: end its graces at once); a no-op once it ended."""
        self._request(None)

    def _request(self, level: int | None) -> None:
        """Raise the cancel level to ``level`` (``None``: one more than now)."""
        with self._lock:
            wanted = self._level + 1 if level is None else level
            if wanted <= self._level:
                return
            self._level = max(self._level, wanted)  # the handler may have raised it meanwhile
            token = self._token
        if token is not None:
            # it may end meanwhile: nothing left to cancel then
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(self._apply_level, wanted)

    def when_done(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (in the run's thread) once the call ended; at once if it has."""
        with self._lock:
            if not self._done.is_set():
                self._when_done.append(callback)
                return
        callback()

    @property
    def done(self) -> bool:
        """Whether the call ended."""
        return self._done.is_set()

    def wait(self) -> T:
        """Block until the call ended, then give its result.

        Interruptible: a ``KeyboardInterrupt`` in the waiting thread cancels the run (a second
        one ends its graces), waits for it to stop, then is raised again. A run that stopped
        because it was cancelled raises :class:`~orchestrator.errors.RunCancelled`.
        """
        interrupts = 0
        while True:
            try:
                self._done.wait()
                break
            except KeyboardInterrupt:
                # the SIGINT handler of orchestrator.sync has already asked as much: no-op then
                interrupts += 1
                self._request(interrupts)
        if interrupts:
            interrupt = KeyboardInterrupt()
            try:
                value = self.result()
            except BaseException:
                raise interrupt from None
            # the run was past its point of no return: it finished, and what it applied is
            # written. The program still stops (Ctrl-C), but does not pretend the run did
            status = getattr(value, "status", None)
            interrupt.add_note(
                f"run {getattr(value, 'run_id', None) or self.run_id} was past its point of no"
                f" return when interrupted: it finished"
                f" {status}, its changes applied if it was asked to apply (see its record)"
            )
            raise interrupt
        return self.result()

    def result(self) -> T:
        """The result of the ended call: its return value, its exception, or
        :class:`~orchestrator.errors.RunCancelled` when a cancel stopped it."""
        assert self._outcome is not None, "the call has not ended"
        return self._outcome.unwrap()

    def saw_event(self, event: Any) -> None:
        """Note the run's id from its ``run_started`` event."""
        if getattr(event, "type", None) == "run_started" and self.run_id is None:
            self.run_id = event.run_id

    # ------------------------------------------------------------------ the run's thread

    def _main(self) -> None:
        try:
            self._outcome = outcome.capture(trio.run, self._run)
        finally:
            with _LIVE_LOCK:
                _LIVE.discard(self)
            with self._lock:
                self._done.set()
                callbacks, self._when_done = self._when_done, []
            for callback in callbacks:
                callback()

    async def _run(self) -> T:
        scope = trio.CancelScope()
        with self._lock:
            self._token = trio.lowlevel.current_trio_token()
            self._scope = scope
            level = self._level
        if level:  # cancelled before it started
            self._apply_level(level)
        with scope:
            return await self._fn()
        # only reached when the scope caught the cancellation: the run stopped, recorded
        raise RunCancelled(self.run_id)

    def _apply_level(self, level: int) -> None:
        assert self._scope is not None
        self._scope.cancel()
        if level > 1:
            end_grace_periods()


# --------------------------------------------------------------------------- the faces


def _name(fn: Callable[..., Any]) -> str:
    inner = fn.func if isinstance(fn, functools.partial) else fn
    return str(getattr(inner, "__name__", "call"))


class CancelToken:
    """A way to cancel calls of the sync face from another thread.

    Pass it as ``cancel=`` to any ``*_sync`` function (one token may serve several calls).
    :meth:`cancel` stops them as Ctrl-C stops the command line: the running turns get
    ``session/cancel`` and a short grace, the agents are stopped, nothing is applied after
    it, and the run is recorded ``interrupted``; the call then raises
    :class:`~orchestrator.errors.RunCancelled` (its ``run_id`` names the run). A second
    :meth:`cancel` ends the graces at once. A call started with a cancelled token stops at
    once. Thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._level = 0
        self._calls: set[ThreadedCall[Any]] = set()

    def cancel(self) -> None:
        """Cancel the calls given this token, now and later (again: end their graces)."""
        with self._lock:
            self._level += 1
            level, calls = self._level, list(self._calls)
        for call in calls:
            call._request(level)

    @property
    def cancelled(self) -> bool:
        """Whether :meth:`cancel` was called."""
        return self._level > 0

    def _attach(self, call: ThreadedCall[Any]) -> None:
        with self._lock:
            self._calls.add(call)
            level = self._level
        if level:
            call._request(level)

    def _detach(self, call: ThreadedCall[Any]) -> None:
        with self._lock:
            self._calls.discard(call)


def _watching(
    fn: Callable[[], Awaitable[T]], call: ThreadedCall[Any]
) -> Callable[[], Awaitable[T]]:
    """``fn`` (a partial) with its ``on_event`` (if given one) seen by ``call`` first."""
    if not isinstance(fn, functools.partial) or "on_event" not in fn.keywords:
        return fn
    listener = fn.keywords["on_event"]

    def on_event(event: Any) -> None:
        call.saw_event(event)
        if listener is not None:
            listener(event)

    return functools.partial(fn, on_event=on_event)


def call_sync(fn: Callable[[], Awaitable[T]], cancel: CancelToken | None) -> T:
    """Run ``fn`` in a thread of its own and wait for it (see :class:`ThreadedCall.wait`).

    The callbacks ``fn`` was given (``on_event``, ``on_update``, ``escalate``) run in that
    thread, in its trio run.
    """
    check_sync_face(_name(fn))  # before anything starts
    holder: list[ThreadedCall[T]] = []
    call: ThreadedCall[T] = ThreadedCall(lambda: _watching(fn, holder[0])(), name=_name(fn))
    holder.append(call)
    if cancel is not None:
        cancel._attach(call)
    try:
        call.start()
        return call.wait()
    finally:
        if cancel is not None:
            cancel._detach(call)


def _on_loop(
    fn: Callable[[], Awaitable[T]], loop: asyncio.AbstractEventLoop
) -> Callable[[], Awaitable[T]]:
    """``fn`` with the callbacks it was given handed to the asyncio ``loop``: ``on_event`` and
    ``on_update`` are called there (in order, without waiting), ``escalate`` is awaited there."""
    if not isinstance(fn, functools.partial):
        return fn
    changed: dict[str, Any] = {}

    for name in ("on_event", "on_update"):
        listener = fn.keywords.get(name)
        if listener is not None:
            # one that fails is logged as in the trio face, not left to the loop's exception
            # handler; the run goes on
            logged = functools.partial(call_listener, listener, callback=name)
            changed[name] = functools.partial(loop.call_soon_threadsafe, logged)
    escalate = fn.keywords.get("escalate")
    if escalate is not None:
        changed["escalate"] = functools.partial(_escalate_on, loop, escalate)
    return functools.partial(fn, **changed) if changed else fn


async def _escalate_on(
    loop: asyncio.AbstractEventLoop, escalate: Callable[..., Awaitable[Any]], *args: Any
) -> Any:
    """Await ``escalate(*args)`` on ``loop``, from the run's trio thread."""

    async def ask() -> Any:
        return await escalate(*args)

    future = asyncio.run_coroutine_threadsafe(ask(), loop)
    token = trio.lowlevel.current_trio_token()
    answered = trio.Event()

    def wake(_: object) -> None:
        with contextlib.suppress(trio.RunFinishedError):
            token.run_sync_soon(answered.set)

    future.add_done_callback(wake)
    try:
        await answered.wait()
    except trio.Cancelled:
        future.cancel()
        raise
    return future.result()


async def call_async(fn: Callable[[], Awaitable[T]]) -> T:
    """Run ``fn`` in a thread of its own and await its end on the running asyncio loop.

    Cancelling the awaiting task cancels the run; the coroutine still waits until the run
    stopped (agents gone, recorded ``interrupted``), then raises ``CancelledError``.
    """
    check_asyncio_face(_name(fn))  # before anything starts
    loop = asyncio.get_running_loop()
    holder: list[ThreadedCall[T]] = []
    call: ThreadedCall[T] = ThreadedCall(
        lambda: _watching(_on_loop(fn, loop), holder[0])(),
        name=_name(fn),
    )
    holder.append(call)
    ended = loop.create_future()

    def end() -> None:
        if not ended.done():
            ended.set_result(None)

    # through the loop, after the callbacks the run handed to it: they all ran before the end
    def wake() -> None:
        # a closed loop: nobody awaits the call any more
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(end)

    call.when_done(wake)
    call.start()
    cancelled = 0
    while not ended.done():
        try:
            await asyncio.shield(ended)
        except asyncio.CancelledError:
            cancelled += 1
            call._request(cancelled)
    if cancelled:
        try:
            value = call.result()
        except RunCancelled:
            raise asyncio.CancelledError from None
        # the run was past its point of no return (its outcome recorded final, the apply asked
        # for under way): it finished, and saying it stopped would hide what it wrote. The
        # coroutine returns its outcome and, as asyncio asks of a task that declines a
        # cancel, takes back the cancels it was sent
        task = asyncio.current_task()
        if task is not None:
            for _ in range(cancelled):
                task.uncancel()
        return value
    return call.result()


# --------------------------------------------------------------------------- Ctrl-C


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    """Cancel every run this process started, then do what Python's default handler does."""
    cancel_all()
    signal.default_int_handler(signum, frame)


def install_interrupt_handler() -> bool:
    """Make Ctrl-C stop every run of the sync and asyncio faces, then raise
    ``KeyboardInterrupt`` as before; only from the main thread, and only while SIGINT still
    has Python's default handler (a program's own handler is never replaced). Whether the
    handler is in place."""
    if threading.current_thread() is not threading.main_thread():
        return signal.getsignal(signal.SIGINT) is _on_sigint
    current = signal.getsignal(signal.SIGINT)
    if current is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_sigint)
        return True
    return current is _on_sigint
