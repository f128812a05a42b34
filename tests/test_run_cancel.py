"""Cancelling a fan-out run at each moment of its life, its agents stalling and deaf to
``session/cancel``: the run ends within the escalation ladder, is recorded ``interrupted`` and
leaves no process.

The agents are scripted agents run as subprocesses; each records what it receives beside its
script, which (with the run's own events) is how a test picks the moment it cancels.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from conftest import is_process_watchdog, is_test_cluster, pid_gone
from run_helpers import config, spec_for, timeline, workspace

from orchestrator import RunEvent
from orchestrator.agent.client import ClientOptions
from orchestrator.pipeline import Pipeline, step
from orchestrator.runs import list_runs, run_pipeline
from orchestrator.testing import AgentScript, Say, Stall, Turn, WriteDisk

NAMES = ("a", "b", "c")
#: real seconds a cancelled run may take: the interrupt grace, the shutdown ladder of three
#: Python processes on a shared machine; past it the run counts as hung
ENDS_WITHIN = 20.0
#: seconds between two looks at the agents' records
POLL = 0.02
#: short graces: a deaf agent costs the run these, then the shutdown ladder
OPTIONS = ClientOptions(interrupt_grace=0.5, cancel_grace=1.0)


def deaf(record: Path, *, initialize_delay: float = 0.0) -> AgentScript:
    """An agent whose turn edits its branch, then stalls and ignores ``session/cancel``."""
    turn = Turn(steps=(Say("working"), WriteDisk(path="partial.txt", content="half\n"), Stall()))
    return AgentScript(
        turns=(Turn(steps=turn.steps, ignore_cancel=True),),
        initialize_delay=initialize_delay,
        record_path=str(record),
    )


def quick(record: Path) -> AgentScript:
    """An agent whose turn ends at once."""
    return AgentScript(turns=(Turn(steps=(Say("done"),)),), record_path=str(record))


def descendants() -> set[int]:
    """The live processes below this one, but the orchestrator's process watchdogs."""
    found: set[int] = set()
    todo = [os.getpid()]
    while todo:
        parent = todo.pop()
        for listing in Path(f"/proc/{parent}/task").glob("*/children"):
            try:
                kids = [int(k) for k in listing.read_text().split()]
            except OSError:
                continue  # the thread or process ended meanwhile
            for kid in kids:
                if kid not in found and not is_test_cluster(kid):  # the session's, not a run's
                    found.add(kid)
                    todo.append(kid)
    return {p for p in found if not pid_gone(p) and not is_process_watchdog(p)}


def fan_out(fan_agents: tuple[str, ...], after_agent: str | None = None) -> Pipeline:
    """A step fanning out over ``fan_agents``, then (with ``after_agent``) a fan-in step."""

    @step(agent=list(fan_agents))
    def fan(task: str) -> str:
        return f"work on {task}"

    if after_agent is None:
        return Pipeline.from_steps([fan], name="fan")

    @step(agent=after_agent)
    def after(fan: Any) -> str:
        return "review"

    return Pipeline.from_steps([fan, after], name="fan-in")


async def cancelled_run(
    pipe: Pipeline,
    tmp_path: Path,
    scripts: dict[str, AgentScript],
    *,
    when: Callable[[RunEvent | None], bool],
    max_sessions: int | None = None,
) -> None:
    """Run ``pipe`` and cancel it once ``when`` holds: checked on each run event (from the
    run's own task, so the cancel lands right there) and between looks at the records (given
    None). Fails if the run does not end within :data:`ENDS_WITHIN` once cancelled (its agents
    are then killed, the only way to end a hang), is not recorded interrupted, or leaves a
    process."""
    ws = workspace(tmp_path, {"a.txt": "a\n"})
    cfg = config(*(spec_for(script, tmp_path, name) for name, script in scripts.items()))
    scope = trio.CancelScope()
    ended = trio.Event()

    def on_event(event: RunEvent) -> None:
        if when(event):
            scope.cancel()

    async def run() -> None:
        with scope:
            await run_pipeline(
                pipe,
                {"task": "t"},
                cwd=ws,
                config=cfg,
                max_sessions=max_sessions,
                options=OPTIONS,
                on_event=on_event,
            )
        ended.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        with trio.fail_after(ENDS_WITHIN * 3):  # the agents' start: Python processes
            while not scope.cancel_called:
                if when(None):
                    scope.cancel()
                    break
                await trio.sleep(POLL)
        with trio.move_on_after(ENDS_WITHIN):
            await ended.wait()
        if not ended.is_set():
            for pid in descendants():  # the hung run's shields end with their agents
                os.kill(pid, signal.SIGKILL)
            nursery.cancel_scope.cancel()
    assert ended.is_set(), f"the run did not end within {ENDS_WITHIN:g}s of its cancel"
    assert scope.cancelled_caught
    assert [r.status for r in await list_runs()] == ["interrupted"]
    assert not descendants()


def records(tmp_path: Path) -> dict[str, Path]:
    """Where each agent records what it receives."""
    return {name: tmp_path / f"{name}.jsonl" for name in NAMES}


def received(record: Path, method: str) -> bool:
    """Whether the agent recording to ``record`` received ``method``."""
    return f"recv {method}" in timeline(record)


async def test_cancelled_when_the_run_started_before_any_session(tmp_path: Path) -> None:
    """Cancelled as the run starts, before any agent process or session exists."""
    paths = records(tmp_path)
    await cancelled_run(
        fan_out(NAMES),
        tmp_path,
        {name: deaf(paths[name]) for name in NAMES},
        when=lambda e: e is not None and e.type == "run_started",
    )


async def test_cancelled_as_the_first_instance_starts(tmp_path: Path) -> None:
    """Cancelled as the first instance of the fan-out starts, its agent not yet started."""
    paths = records(tmp_path)
    await cancelled_run(
        fan_out(NAMES),
        tmp_path,
        {name: deaf(paths[name]) for name in NAMES},
        when=lambda e: e is not None and e.type == "step_started",
    )


async def test_cancelled_while_initialize_is_in_flight(tmp_path: Path) -> None:
    """Cancelled while every agent holds its answer to initialize."""
    paths = records(tmp_path)
    await cancelled_run(
        fan_out(NAMES),
        tmp_path,
        {name: deaf(paths[name], initialize_delay=600) for name in NAMES},
        when=lambda e: e is None and all(received(p, "initialize") for p in paths.values()),
    )


async def test_cancelled_while_instances_wait_for_a_session_slot(tmp_path: Path) -> None:
    """Cancelled mid-turn of the one instance the session limit lets run, the others queued."""
    paths = records(tmp_path)
    prompted: list[str] = []

    def one_prompted(event: RunEvent | None) -> bool:
        if event is not None:
            return False
        prompted[:] = [n for n, p in paths.items() if received(p, "session/prompt")]
        return bool(prompted)

    await cancelled_run(
        fan_out(NAMES),
        tmp_path,
        {name: deaf(paths[name]) for name in NAMES},
        when=one_prompted,
        max_sessions=1,
    )
    assert len(prompted) == 1  # the others were queued on the limit
    assert all(not received(paths[n], "session/new") for n in NAMES if n not in prompted)


async def test_cancelled_mid_turn(tmp_path: Path) -> None:
    """Cancelled once every agent of the fan-out is mid-turn."""
    paths = records(tmp_path)
    await cancelled_run(
        fan_out(NAMES),
        tmp_path,
        {name: deaf(paths[name]) for name in NAMES},
        when=lambda e: e is None and all(received(p, "session/prompt") for p in paths.values()),
    )
    for path in paths.values():
        seen = timeline(path)
        assert "turn_end" not in seen  # deaf to the cancel: the ladder stopped it
        assert seen.index("recv session/cancel") < seen.index("eof")


@pytest.mark.parametrize("moment", ["fan_finished", "fan_in_started"])
async def test_cancelled_at_the_merge(tmp_path: Path, moment: str) -> None:
    """Cancelled as the fan-out finished (its branches about to be merged) or as the fan-in
    step starts from the merge, whose agent would stall deaf to the cancel."""
    paths = records(tmp_path)
    scripts = {name: quick(paths[name]) for name in NAMES[:2]}
    scripts["c"] = deaf(paths["c"])

    def at(event: RunEvent | None) -> bool:
        if event is None:
            return False
        if moment == "fan_finished":
            return event.type == "step_finished" and event.step == "fan"
        return event.type == "step_started" and event.step == "after"

    await cancelled_run(fan_out(NAMES[:2], "c"), tmp_path, scripts, when=at)
