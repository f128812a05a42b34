"""An agent step instance that ends in an error after its turns ran is recorded with what they
did: text, tool calls, the permission audit, the rounds so far, and the branch's changes.

The agents are scripted agents run as subprocesses; the run is read back from the run store.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
from run_helpers import config, spec_for, workspace

from orchestrator.config import Config
from orchestrator.pipeline import CheckResult, Pipeline, step
from orchestrator.pipeline.results import StepResult
from orchestrator.runs import diff_run, get_run_json, run_pipeline
from orchestrator.testing import (
    AgentScript,
    AskPermission,
    PermissionToolCall,
    Say,
    Stall,
    ToolCall,
    ToolUpdate,
    Turn,
    WriteFile,
)

LIMIT = 60.0  # seconds any one run here may take


def working_turn(n: int) -> Turn:
    """Turn ``n``: says so, writes ``round-N.txt`` through the client under a tool call, and
    asks for a permission (the audit records it whatever the verdict)."""
    return Turn(
        steps=(
            Say(text=f"turn {n}"),
            ToolCall(id=f"edit-{n}", title=f"Edit round-{n}.txt", kind="edit", status="pending"),
            WriteFile(path=f"round-{n}.txt", content=f"round {n}\n"),
            ToolUpdate(id=f"edit-{n}", status="completed"),
            AskPermission(
                tool_call=PermissionToolCall(
                    id=f"run-{n}", title=f"run {n}", kind="execute", raw_input={"command": "ls"}
                ),
                on_reject="continue",
            ),
        )
    )


def worker(tmp_path: Path, *turns: Turn) -> Config:
    """A config whose agent ``worker`` plays ``turns`` (by default two working turns)."""
    script = AgentScript(name="worker", turns=turns or (working_turn(1), working_turn(2)))
    return config(spec_for(script, tmp_path, "worker"))


async def stored_instance(
    pipe: Pipeline, ws: Path, cfg: Config, state_dir: Path, **kw: Any
) -> tuple[str, dict[str, Any]]:
    """Run ``pipe`` (one agent step ``work``) to its end: the run id and the stored instance."""
    with trio.fail_after(LIMIT):
        outcome = await run_pipeline(pipe, {}, cwd=ws, config=cfg, policy="edit", **kw)
    stored = await get_run_json(outcome.run_id, state_dir=state_dir)
    assert stored["status"] == "failed"
    return outcome.run_id, stored["steps"]["work"]["instances"]["work"]


def assert_turns_kept(one: dict[str, Any], turns: int) -> None:
    """``one`` holds what its ``turns`` turns did: the last one's text, every tool call, every
    permission request, and every file they wrote."""
    assert one["text"] == f"turn {turns}"
    assert [c["toolCallId"] for c in one["toolCalls"]] == [f"edit-{n}" for n in range(1, turns + 1)]
    assert [p["title"] for p in one["permissions"]] == [f"run {n}" for n in range(1, turns + 1)]
    assert one["changes"] == [
        {"path": f"round-{n}.txt", "change": "added"} for n in range(1, turns + 1)
    ]
    assert "+round 1\n" in one["diff"]


async def test_a_python_check_that_raises_keeps_the_rounds_work(
    tmp_path: Path, state_dir: Path
) -> None:
    """A Python check raising in round 2: the instance fails as an exception, recorded with
    both turns, round 1's check and round 2's work; the run's diff leaves it out, its own
    diff has it."""
    ws = workspace(tmp_path, {"a.txt": "start\n"})
    checks: list[int] = []

    def check(workdir: Path, result: StepResult) -> bool:
        checks.append(1)
        if len(checks) == 2:
            raise ValueError("the check broke")
        return False

    @step(agent="worker", check=check, rounds=3)
    def work() -> str:
        return "work"

    run_id, one = await stored_instance(
        Pipeline.from_steps([work], name="p"), ws, worker(tmp_path), state_dir
    )
    assert (one["status"], one["errorKind"]) == ("failed", "exception")
    assert one["error"] == "ValueError: the check broke"
    assert "raise ValueError" in one["traceback"]
    assert_turns_kept(one, 2)
    assert [(r["turn"], r["check"] is not None) for r in one["rounds"]] == [(1, True), (2, False)]
    assert "+round 2\n" in one["rounds"][1]["diff"]
    # a failed instance is no part of the run's diff; asked for by name, its diff is there
    assert await diff_run(run_id, state_dir=state_dir) == ""
    assert "+round 2\n" in await diff_run(run_id, step="work", state_dir=state_dir)


async def test_a_feedback_function_that_raises_keeps_the_rounds_work(
    tmp_path: Path, state_dir: Path
) -> None:
    """A feedback function raising after round 1's check: the instance fails recorded with
    round 1 (its check included) and what its turn did."""
    ws = workspace(tmp_path, {"a.txt": "start\n"})

    def feedback(result: CheckResult, round: int) -> str:
        raise RuntimeError("no feedback")

    @step(agent="worker", check="exit 1", rounds=3, feedback=feedback)
    def work() -> str:
        return "work"

    _, one = await stored_instance(
        Pipeline.from_steps([work], name="p"), ws, worker(tmp_path), state_dir
    )
    assert (one["status"], one["errorKind"]) == ("failed", "exception")
    assert one["error"] == "RuntimeError: no feedback"
    assert_turns_kept(one, 1)
    assert [(r["turn"], r["check"]["exitCode"]) for r in one["rounds"]] == [(1, 1)]


async def test_a_step_timeout_during_a_check_keeps_the_rounds_work(
    tmp_path: Path, state_dir: Path
) -> None:
    """The step's time running out in round 1's check: the instance fails as a timeout,
    recorded with round 1 and what its turn did."""
    ws = workspace(tmp_path, {"a.txt": "start\n"})

    @step(agent="worker", check="sleep 60", rounds=3, timeout=3)
    def work() -> str:
        return "work"

    _, one = await stored_instance(
        Pipeline.from_steps([work], name="p"), ws, worker(tmp_path), state_dir
    )
    assert (one["status"], one["errorKind"]) == ("failed", "timeout")
    assert_turns_kept(one, 1)
    assert [(r["turn"], r["check"]["timedOut"]) for r in one["rounds"]] == [(1, True)]


async def test_a_turn_timeout_without_a_check_keeps_the_turns_work(
    tmp_path: Path, state_dir: Path
) -> None:
    """A turn that outlasts the step's timeout (no check): the instance fails as a timeout,
    recorded with what the turn did until then."""
    ws = workspace(tmp_path, {"a.txt": "start\n"})
    first = working_turn(1)
    cfg = worker(tmp_path, Turn(steps=(*first.steps, Stall())))

    @step(agent="worker", timeout=2)
    def work() -> str:
        return "work"

    _, one = await stored_instance(Pipeline.from_steps([work], name="p"), ws, cfg, state_dir)
    assert (one["status"], one["errorKind"]) == ("failed", "timeout")
    assert_turns_kept(one, 1)
    assert one["rounds"] == []


async def test_a_failed_instances_changes_are_never_merged(tmp_path: Path, state_dir: Path) -> None:
    """Of a fan-out whose one instance fails after its turn (its check raises), the run's
    changes hold the other instance's work alone; the failed one keeps its own."""
    ws = workspace(tmp_path, {"a.txt": "start\n"})

    def check(workdir: Path, result: StepResult) -> bool:
        if result.item == "bad":
            raise ValueError("bad item")
        return True

    @step
    def items() -> list[str]:
        return ["good", "bad"]

    @step(agent="demo", over="items", check=check)
    def work(item: str) -> str:
        return f'append "{item}" to a.txt'

    with trio.fail_after(LIMIT):
        outcome = await run_pipeline(
            Pipeline.from_steps([items, work], name="p"), {}, cwd=ws, policy="edit"
        )
    stored = await get_run_json(outcome.run_id, state_dir=state_dir)
    bad = stored["steps"]["work"]["instances"]["bad"]
    assert (bad["status"], bad["errorKind"]) == ("failed", "exception")
    assert "+bad\n" in bad["diff"]
    assert stored["steps"]["work"]["instances"]["good"]["status"] == "succeeded"
    assert "+good\n" in outcome.diff and "bad" not in outcome.diff
