"""A caller's ``on_event`` or ``on_update`` that raises is logged and the run goes on, in the
trio, sync and asyncio faces alike (``event listener failed`` under the ``orchestrator``
logger); a failing ``on_update`` costs the ``on_event`` listener nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from log_capture import capture_logs

from orchestrator import PromptRun, aio, prompt, prompt_sync
from orchestrator.pipeline.results import RunEvent
from orchestrator.testing import InProcessAgents, TempProjects

EDIT = 'replace "colour" with "color" in README.md'


def _project(orchestrator_project: TempProjects) -> Path:
    return orchestrator_project({"README.md": "The colour.\n"})


def _failures(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == "event listener failed"]


def _raising(counter: list[object]) -> Callable[[Any], None]:
    def callback(value: Any) -> None:
        counter.append(value)
        raise RuntimeError("the caller's callback failed")

    return callback


def _check(run: PromptRun, project: Path, called: list[object], logs: list[dict[str, Any]]) -> None:
    assert run.status == "succeeded"
    assert (project / "README.md").read_text() == "The colour.\n"  # not applied: only the diff
    assert "+The color." in run.diff
    assert called, "the callback was never called"
    failures = _failures(logs)
    assert len(failures) == len(called)
    assert all(e["log_level"] == "error" and "RuntimeError" in e["exception"] for e in failures)


async def test_trio_on_update_that_raises_is_logged_and_on_event_still_sees_updates(
    orchestrator_project: TempProjects, orchestrator_agents: InProcessAgents
) -> None:
    """trio: each failing ``on_update`` call is logged; the run succeeds, and ``on_event``
    receives the update events all the same."""
    project = _project(orchestrator_project)
    called: list[object] = []
    events: list[RunEvent] = []
    with capture_logs() as logs:
        run = await prompt(
            "demo",
            EDIT,
            cwd=project,
            policy="edit",
            connector=orchestrator_agents,
            on_update=_raising(called),
            on_event=events.append,
        )
    _check(run, project, called, logs)
    assert len([e for e in events if e.type == "update"]) == len(called)


def test_sync_on_event_and_on_update_that_raise_are_logged(
    orchestrator_project: TempProjects, orchestrator_agents: InProcessAgents
) -> None:
    """sync: each failing call of either callback is logged; the run succeeds."""
    for name in ("on_event", "on_update"):
        project = _project(orchestrator_project)
        called: list[object] = []
        callback: dict[str, Any] = {name: _raising(called)}
        with capture_logs() as logs:
            run = prompt_sync(
                "demo", EDIT, cwd=project, policy="edit", connector=orchestrator_agents, **callback
            )
        _check(run, project, called, logs)


@pytest.mark.parametrize("name", ["on_event", "on_update"])
def test_asyncio_callbacks_that_raise_are_logged_not_left_to_the_loop(
    name: str, orchestrator_project: TempProjects, orchestrator_agents: InProcessAgents
) -> None:
    """asyncio: the callback runs on the event loop; its failures are logged through the
    ``orchestrator`` logger, none reaches the loop's exception handler, the run succeeds."""
    project = _project(orchestrator_project)
    called: list[object] = []
    loop_errors: list[dict[str, Any]] = []

    async def main() -> PromptRun:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _, context: loop_errors.append(context))
        callback: dict[str, Any] = {name: _raising(called)}
        return await aio.prompt(
            "demo", EDIT, cwd=project, policy="edit", connector=orchestrator_agents, **callback
        )

    with capture_logs() as logs:
        run = asyncio.run(main())
    _check(run, project, called, logs)
    assert loop_errors == []
    assert {e["callback"] for e in _failures(logs)} == {name}
