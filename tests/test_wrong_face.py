"""A call from the wrong kind of code (the trio function from asyncio, the asyncio one from
trio, a sync one inside a running event loop) is a UsageError naming the right face, raised
before anything is recorded or started."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from pathlib import Path

import pytest

import orchestrator
import orchestrator.aio
from orchestrator import list_runs_sync, prompt_sync
from orchestrator.errors import UsageError

EDIT = 'append "x" to README.md'


def _nothing_recorded(state_dir: Path) -> None:
    assert list_runs_sync(state_dir=state_dir) == []


async def test_the_asyncio_face_inside_trio_names_the_trio_function(
    project: Path, state_dir: Path
) -> None:
    """await orchestrator.aio.prompt inside trio: UsageError naming orchestrator.prompt."""
    with pytest.raises(UsageError, match=r"orchestrator\.aio\.prompt is for asyncio; from trio "
                       r"await orchestrator\.prompt$"):  # fmt: skip
        await orchestrator.aio.prompt("demo", EDIT, cwd=project)
    with pytest.raises(UsageError, match=r"from trio await orchestrator\.list_runs$"):
        await orchestrator.aio.list_runs()
    assert await orchestrator.list_runs(state_dir=state_dir) == []


def test_the_trio_function_inside_asyncio_names_the_asyncio_face(
    project: Path, state_dir: Path
) -> None:
    """await orchestrator.prompt (or another trio function) inside asyncio: UsageError naming
    orchestrator.aio's."""
    with pytest.raises(UsageError, match=r"^orchestrator\.prompt is for trio; from asyncio await "
                       r"orchestrator\.aio\.prompt$"):  # fmt: skip
        asyncio.run(orchestrator.prompt("demo", EDIT, cwd=project))

    async def awaiting(call: Awaitable[object]) -> object:
        return await call

    calls: list[Awaitable[object]] = [
        orchestrator.run_pipeline("pipeline.py", cwd=project),
        orchestrator.list_runs(),
        orchestrator.get_run_json("abc"),
        orchestrator.diff_run("abc"),
        orchestrator.apply_run("abc"),
        orchestrator.resume_run("abc"),
        orchestrator.compare(["demo"], EDIT, cwd=project),
    ]
    for call in calls:
        with pytest.raises(UsageError, match=r"is for trio; from asyncio await orchestrator\.aio"):
            asyncio.run(awaiting(call))
    _nothing_recorded(state_dir)


def test_a_sync_call_inside_a_running_asyncio_loop_is_refused(
    project: Path, state_dir: Path
) -> None:
    """prompt_sync inside asyncio would block the loop: UsageError naming orchestrator.aio."""

    async def inside() -> None:
        prompt_sync("demo", EDIT, cwd=project)

    with pytest.raises(UsageError, match=r"prompt_sync would block the running asyncio loop .*"
                       r"await orchestrator\.aio\.prompt there$"):  # fmt: skip
        asyncio.run(inside())
    _nothing_recorded(state_dir)


async def test_a_sync_call_inside_trio_is_refused(project: Path, state_dir: Path) -> None:
    """prompt_sync inside a trio run would block it: UsageError naming orchestrator.prompt."""
    with pytest.raises(UsageError, match=r"prompt_sync would block the trio run .*"
                       r"await orchestrator\.prompt there$"):  # fmt: skip
        prompt_sync("demo", EDIT, cwd=project)
    with pytest.raises(UsageError, match=r"list_runs_sync would block the trio run"):
        list_runs_sync(state_dir=state_dir)


def test_the_trio_function_outside_any_loop_names_every_face() -> None:
    """A trio function's coroutine driven by neither trio nor asyncio names the three faces."""
    coroutine = orchestrator.list_runs()
    with pytest.raises(UsageError, match=r"orchestrator\.list_runs_sync"):
        coroutine.send(None)
