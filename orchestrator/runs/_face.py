"""Which face of the library a call belongs to: a call from the wrong kind of code (a trio
function awaited from asyncio, an asyncio one from trio, a sync one inside a running event
loop) is a :class:`~orchestrator.errors.UsageError` naming the right one, before anything
starts."""

from __future__ import annotations

import asyncio

import trio

from ..errors import UsageError

__all__ = ["check_asyncio_face", "check_sync_face", "check_trio_face"]


def _in_trio() -> bool:
    try:
        trio.lowlevel.current_task()
    except RuntimeError:
        return False
    return True


def _in_asyncio() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def check_trio_face(name: str) -> None:
    """Refuse ``orchestrator.NAME`` (the trio function) outside a trio run."""
    if _in_trio():
        return
    if _in_asyncio():
        raise UsageError(
            f"orchestrator.{name} is for trio; from asyncio await orchestrator.aio.{name}"
        )
    raise UsageError(
        f"orchestrator.{name} is for trio (await it inside trio.run); from asyncio await "
        f"orchestrator.aio.{name}, from plain code call orchestrator.{name}_sync"
    )


def check_asyncio_face(name: str) -> None:
    """Refuse ``orchestrator.aio.NAME`` outside a running asyncio loop."""
    if _in_asyncio():
        return
    if _in_trio():
        raise UsageError(
            f"orchestrator.aio.{name} is for asyncio; from trio await orchestrator.{name}"
        )
    raise UsageError(
        f"orchestrator.aio.{name} is for asyncio (await it in a running loop); from plain code "
        f"call orchestrator.{name}_sync"
    )


def check_sync_face(name: str) -> None:
    """Refuse ``orchestrator.NAME_sync`` in a thread running trio or an asyncio loop: it would
    block that loop for the whole run (as ``asyncio.run`` refuses inside a running loop)."""
    if _in_trio():
        raise UsageError(
            f"orchestrator.{name}_sync would block the trio run it is called in; "
            f"await orchestrator.{name} there"
        )
    if _in_asyncio():
        raise UsageError(
            f"orchestrator.{name}_sync would block the running asyncio loop it is called in; "
            f"await orchestrator.aio.{name} there"
        )
