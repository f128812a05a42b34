"""Early warning: two live branches touching the same path, reported before any merge.

A :class:`ConflictWatch` is shared by the branches of a run. Each time a branch records a change
to a path that another live branch has also changed, the watch emits an :class:`EarlyWarning`
(once per path and pair of branches): a structlog ``warning`` line, a call to every registered
callback, and an item on every subscribed trio memory channel. A branch stops counting once it is
closed (its work is finished and it waits to be merged).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

import trio
from attrs import define, field, frozen

from .._log import get_logger

__all__ = ["ConflictWatch", "EarlyWarning", "WarningCallback"]

log = get_logger(__name__)


@frozen
class EarlyWarning:
    """Two live branches changed the same path; merging them may conflict there."""

    #: the branch path both changed
    path: str
    #: the branch that changed it first, then the one that changed it now
    branches: tuple[str, str]
    #: wall-clock time of the second change (seconds since the epoch)
    time: float


WarningCallback = Callable[[EarlyWarning], None]


def _in_trio_thread(token: trio.lowlevel.TrioToken) -> bool:
    try:
        return trio.lowlevel.current_trio_token() is token
    except RuntimeError:
        return False


@define
class _Subscription:
    send: trio.MemorySendChannel[EarlyWarning]
    token: trio.lowlevel.TrioToken


@define
class ConflictWatch:
    """Tracks which live branch changed which path, and warns about overlaps.

    Thread-safe: branches may record changes from worker threads. Callbacks run in the thread
    that recorded the change; channel items are always sent from the trio thread of the run that
    subscribed (scheduled from other threads, never blocking them).
    """

    _touched: dict[str, dict[str, None]] = field(factory=dict, alias="_touched")
    _live: set[str] = field(factory=set, alias="_live")
    _reported: set[tuple[str, str, str]] = field(factory=set, alias="_reported")
    _callbacks: list[WarningCallback] = field(factory=list, alias="_callbacks")
    _subscriptions: list[_Subscription] = field(factory=list, alias="_subscriptions")
    _lock: threading.Lock = field(factory=threading.Lock, alias="_lock")
    #: every warning emitted so far, oldest first
    history: list[EarlyWarning] = field(factory=list)

    def register(self, branch: str) -> None:
        """Start tracking the live branch named ``branch`` (names are unique among live ones)."""
        with self._lock:
            if branch in self._live:
                raise ValueError(f"a live branch named {branch!r} is already registered")
            self._live.add(branch)

    def unregister(self, branch: str) -> None:
        """Stop tracking ``branch`` (closed or discarded); its paths no longer count."""
        with self._lock:
            self._live.discard(branch)
            for path in [p for p, names in self._touched.items() if branch in names]:
                names = self._touched[path]
                del names[branch]
                if not names:
                    del self._touched[path]

    def touch(self, branch: str, path: str) -> list[EarlyWarning]:
        """Record that ``branch`` changed ``path``; emit and return the new warnings."""
        new: list[EarlyWarning] = []
        with self._lock:
            if branch not in self._live:
                return new
            names = self._touched.setdefault(path, {})
            if branch in names:
                return new
            now = time.time()
            for other in names:
                key = (path, *sorted((other, branch)))
                if other in self._live and key not in self._reported:
                    self._reported.add(key)  # type: ignore[arg-type]
                    new.append(EarlyWarning(path, (other, branch), now))
            names[branch] = None
            self.history.extend(new)
            callbacks = list(self._callbacks)
            subscriptions = list(self._subscriptions)
        for warning in new:
            self._emit(warning, callbacks, subscriptions)
        return new

    def overlaps(self) -> dict[str, tuple[str, ...]]:
        """Paths changed by two or more live branches, with those branches."""
        with self._lock:
            return {p: tuple(names) for p, names in self._touched.items() if len(names) > 1}

    def add_callback(self, callback: WarningCallback) -> None:
        """Call ``callback(warning)`` for every future warning."""
        with self._lock:
            self._callbacks.append(callback)

    def remove_callback(self, callback: WarningCallback) -> None:
        """Stop calling ``callback``."""
        with self._lock:
            self._callbacks.remove(callback)

    def subscribe(
        self, max_buffer_size: float = math.inf
    ) -> trio.MemoryReceiveChannel[EarlyWarning]:
        """A channel that receives every future warning; call from inside ``trio.run``.

        Closing the receive end unsubscribes. When a bounded buffer is full the warning is dropped
        for that channel (and logged), never blocking the branch that recorded the change.
        """
        send, receive = trio.open_memory_channel[EarlyWarning](max_buffer_size)
        token = trio.lowlevel.current_trio_token()
        with self._lock:
            self._subscriptions.append(_Subscription(send, token))
        return receive

    def _emit(
        self,
        warning: EarlyWarning,
        callbacks: list[WarningCallback],
        subscriptions: list[_Subscription],
    ) -> None:
        log.warning(
            "branches touch the same path",
            path=warning.path,
            first=warning.branches[0],
            second=warning.branches[1],
        )
        for callback in callbacks:
            try:
                callback(warning)
            except Exception:
                # A faulty observer must not undo or block the branch's recorded change.
                log.exception("early-warning callback failed", callback=repr(callback))
        for sub in subscriptions:
            self._deliver(sub, warning)

    def _deliver(self, sub: _Subscription, warning: EarlyWarning) -> None:
        if _in_trio_thread(sub.token):
            self._send(sub, warning)
            return
        try:
            # Never block the recording thread: it may hold locks the trio thread waits for.
            sub.token.run_sync_soon(self._send, sub, warning)
        except trio.RunFinishedError:
            self._unsubscribe(sub)

    def _send(self, sub: _Subscription, warning: EarlyWarning) -> None:
        try:
            sub.send.send_nowait(warning)
        except trio.WouldBlock:
            log.warning("early-warning channel full, warning dropped", path=warning.path)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._unsubscribe(sub)

    def _unsubscribe(self, sub: _Subscription) -> None:
        with self._lock:
            if sub in self._subscriptions:
                self._subscriptions.remove(sub)
