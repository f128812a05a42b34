"""Small helpers shared by the trio-facing modules."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["single_error"]


def _only(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        if len(exc.exceptions) != 1:
            return None
        exc = exc.exceptions[0]
    return exc


@contextmanager
def single_error() -> Iterator[None]:
    """Let a nursery's lone exception out as itself rather than inside an exception group.

    Users of a context manager should see ``AgentExited``, not ``ExceptionGroup[AgentExited]``;
    groups of several exceptions are left as they are.
    """
    try:
        yield
    except BaseExceptionGroup as group:
        only = _only(group)
        if only is None:
            raise
        raise only from only.__cause__
