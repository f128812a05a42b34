"""Small helpers shared by the trio-facing modules."""

from __future__ import annotations

import functools
import os
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

import trio
from attrs import define, field

__all__ = [
    "end_grace_periods",
    "grace_period",
    "grace_periods_ended",
    "plain_cancelled",
    "single_error",
    "without_cancelled",
]

P = ParamSpec("P")
T = TypeVar("T")


def _only(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    if group.split(trio.Cancelled)[1] is None:
        # every task ended with Cancelled (a scope around the nursery was cancelled): that is
        # one cancellation, which ``except trio.Cancelled`` above must see as such
        return _first_leaf(group)
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        if len(exc.exceptions) != 1:
            return None
        exc = exc.exceptions[0]
    return exc


def _first_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException:
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


@contextmanager
def single_error() -> Iterator[None]:
    """Let a nursery's lone exception out as itself rather than inside an exception group.

    Users of a context manager should see ``AgentExited``, not ``ExceptionGroup[AgentExited]``;
    a group of nothing but ``trio.Cancelled`` comes out as one ``Cancelled``; other groups of
    several exceptions are left as they are.
    """
    try:
        yield
    except BaseExceptionGroup as group:
        only = _only(group)
        if only is None:
            raise
        raise only from only.__cause__


def without_cancelled(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """What a trio caller should see of ``group`` coming out of a library call: a group of
    nothing but ``trio.Cancelled`` (however nested) is one ``Cancelled``; another group keeps
    its other exceptions (the cancellation's own ``Cancelled`` is the caller's scope's to
    catch, as trio's own scopes drop theirs), as itself when only one is left."""
    cancelled, rest = group.split(trio.Cancelled)
    if rest is None:
        return _first_leaf(group)
    if cancelled is None:
        return group
    leaves = list(_leaves(rest))
    return leaves[0] if len(leaves) == 1 else rest


def _leaves(exc: BaseException) -> Iterator[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaves(inner)
    else:
        yield exc


def plain_cancelled(fn: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
    """``fn`` (an async library function) raising what trio code expects: a cancellation as a
    plain ``trio.Cancelled`` (``except trio.Cancelled`` sees it, ``move_on_after`` catches
    it), not inside the exception groups of the nurseries it ran (see
    :func:`without_cancelled`)."""

    @functools.wraps(fn)
    async def call(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await fn(*args, **kwargs)
        except BaseExceptionGroup as group:
            plain = without_cancelled(group)
            if plain is group:
                raise
            raise plain from plain.__cause__

    return call


@define(eq=False)
class _Graces:
    """The grace periods open in one trio run."""

    scopes: set[trio.CancelScope] = field(factory=set)
    ended: bool = False


_GRACES: trio.lowlevel.RunVar[_Graces] = trio.lowlevel.RunVar("orchestrator_graces")


def _graces() -> _Graces:
    try:
        return _GRACES.get()
    except LookupError:
        graces = _Graces()
        _GRACES.set(graces)
        return graces


@contextmanager
def grace_period(seconds: float) -> Iterator[trio.CancelScope]:
    """A shielded scope for the clean-up after a cancellation, ending after ``seconds``.

    What runs inside (ending a turn the ACP way, closing a session) goes on although its
    caller was cancelled (Ctrl-C), for at most ``seconds``; :func:`end_grace_periods` (a second
    Ctrl-C) ends every grace period of the trio run at once, and those opened after it too.
    """
    graces = _graces()
    scope = trio.CancelScope(shield=True, deadline=trio.current_time() + seconds)
    if graces.ended:
        scope.cancel()
    graces.scopes.add(scope)
    try:
        with scope:
            yield scope
    finally:
        graces.scopes.discard(scope)


def end_grace_periods() -> None:
    """End every grace period of the current trio run now, and any opened later."""
    graces = _graces()
    graces.ended = True
    for scope in list(graces.scopes):
        scope.cancel()


def grace_periods_ended() -> bool:
    """Whether :func:`end_grace_periods` was called in the current trio run."""
    return _graces().ended


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity where the system says), at least one."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
