"""The library's result and error contract: a run returns its outcome, raises only for bad usage,
with one error hierarchy (``orchestrator.errors``), typed error kinds, and plain ``trio.Cancelled``.

Agents are scripted subprocesses (tests/run_helpers.py); the autouse ``state_dir`` fixture points
the run store at a temporary directory.
"""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, get_args

import pytest
import trio
import trio.testing
from run_helpers import config, spec_for, workspace

import orchestrator
import orchestrator.errors
from orchestrator._util import without_cancelled
from orchestrator.errors import (
    ERROR_KINDS,
    AgentNotFound,
    ErrorKind,
    UnknownAgent,
    UsageError,
)
from orchestrator.pipeline import Pipeline, step
from orchestrator.runs import (
    apply_run,
    compare,
    get_run_json,
    list_runs,
    prompt,
    resume_run,
    run_pipeline,
)
from orchestrator.store import SCHEMA_VERSION, open_run_store
from orchestrator.testing import (
    AgentScript,
    AskPermission,
    Crash,
    PermissionToolCall,
    Say,
    Spawn,
    Stall,
    Turn,
    WriteDisk,
)

LIMIT = 60.0  # seconds any one run here may take (subprocess agents start a Python each)
SCHEMA = Path(orchestrator.__file__).parent / "schemas" / "output.schema.json"
LINES = "".join(f"line {i}\n" for i in range(20))


def edited(line: int) -> str:
    """The twenty lines of ``LINES`` with ``line`` changed."""
    lines = LINES.splitlines(keepends=True)
    lines[line] = "edited by the agent\n"
    return "".join(lines)


def human_edit(ws: Path) -> Spawn:
    """A program, run by the agent during its turn, that edits the workspace's a.txt (as a
    person at the keyboard would): deterministic, it ends before the agent goes on."""
    code = f"open({str(ws / 'a.txt')!r}, 'a').write('added by a human\\n')"
    return Spawn((sys.executable, "-c", code))


def editor(ws: Path, line: int) -> AgentScript:
    """An agent whose turn first sees a.txt change in the workspace, then rewrites its own copy
    of a.txt on disk (behind the client's back, so the run never kept a.txt's first content)."""
    return AgentScript(
        turns=(Turn(steps=(human_edit(ws), WriteDisk("a.txt", edited(line)), Say("edited"))),)
    )


# --------------------------------------------------------------------------- one result contract


async def test_sinks_changing_a_file_the_workspace_changed_return_the_outcome(
    tmp_path: Path,
) -> None:
    """Two sinks changed a.txt while the workspace did: the run returns (not raises) its
    recorded outcome naming a.txt, with or without apply, and writes nothing."""
    ws = workspace(tmp_path, {"a.txt": LINES})
    cfg = config(
        spec_for(editor(ws, 1), tmp_path, "one"), spec_for(editor(ws, 15), tmp_path, "two")
    )

    @step(agent="one")
    def left(task: str) -> str:
        return task

    @step(agent="two")
    def right(task: str) -> str:
        return task

    for apply in (False, True):
        (ws / "a.txt").write_text(LINES)
        with trio.fail_after(LIMIT):
            outcome = await run_pipeline(
                Pipeline.from_steps([left, right], name="two-sinks"),
                {"task": "edit"},
                cwd=ws,
                config=cfg,
                apply=apply,
            )
        assert outcome.workspace_changed == ("a.txt",)
        assert outcome.result["workspaceChanged"] == ["a.txt"]
        # no common version to merge against: the two versions conflict, reported whole
        assert outcome.status == "conflicts"
        assert [(c["path"], c["kind"]) for c in outcome.result["conflicts"]] == [
            ("a.txt", "add/add")
        ]
        # each agent edited it once, nothing else wrote it
        assert (ws / "a.txt").read_text() == LINES + "added by a human\n" * 2
        recorded = await get_run_json(outcome.run_id)
        assert recorded["status"] == "conflicts"


async def test_fan_in_over_a_file_the_workspace_changed_returns_the_outcome(
    tmp_path: Path,
) -> None:
    """A fan-in merging branches whose base of a.txt is gone settles it by its strategy, runs,
    and the run returns naming a.txt (its changes cannot be applied as they are)."""
    ws = workspace(tmp_path, {"a.txt": LINES})
    cfg = config(
        spec_for(editor(ws, 1), tmp_path, "one"), spec_for(editor(ws, 15), tmp_path, "two")
    )

    @step(agent=["one", "two"])
    def edit(task: str) -> str:
        return task

    @step(merge="theirs")
    def review(edit: Any) -> str:
        return "reviewed"

    with trio.fail_after(LIMIT):
        outcome = await run_pipeline(
            Pipeline.from_steps([edit, review], name="fan-in"), {"task": "edit"}, cwd=ws, config=cfg
        )
    assert outcome.status == "succeeded"
    assert outcome.workspace_changed == ("a.txt",)
    assert outcome.result["steps"]["review"]["status"] == "succeeded"
    assert outcome.exit_code == 0  # not asked to apply: nothing was left unapplied


async def test_prompt_and_one_step_run_name_the_file_the_same_way(tmp_path: Path) -> None:
    """A prompt and the same one-step pipeline both return the file both sides changed."""
    ws = workspace(tmp_path, {"a.txt": LINES})
    cfg = config(spec_for(editor(ws, 1), tmp_path, "one"))

    @step(agent="one")
    def only(task: str) -> str:
        return task

    with trio.fail_after(LIMIT):
        run = await prompt("one", "edit", cwd=ws, config=cfg)
    (ws / "a.txt").write_text(LINES)
    with trio.fail_after(LIMIT):
        outcome = await run_pipeline(
            Pipeline.from_steps([only], name="one"), {"task": "edit"}, cwd=ws, config=cfg
        )
    assert run.workspace_changed == outcome.workspace_changed == ("a.txt",)
    assert run.to_json()["workspaceChanged"] == outcome.result["workspaceChanged"] == ["a.txt"]
    # asked to apply later, the same files are named, nothing written
    applied = await apply_run(outcome.run_id)
    assert (applied.applied, applied.workspace_changed) == (False, ("a.txt",))


# --------------------------------------------------------------------------- did nothing

REFUSED = AgentScript(
    turns=(
        Turn(
            steps=(
                AskPermission(PermissionToolCall("t1", "Edit a.txt", "edit"), on_reject="continue"),
                AskPermission(
                    PermissionToolCall("t2", "Run make", "execute"), on_reject="continue"
                ),
                Say("I could not do anything"),
            )
        ),
    )
)


async def test_a_run_whose_permissions_were_all_refused_did_nothing(tmp_path: Path) -> None:
    """Every permission refused and nothing changed: succeeded, flagged and warned, in the
    outcome, its --json object, and a prompt's result alike."""
    ws = workspace(tmp_path, {"a.txt": LINES})
    cfg = config(spec_for(REFUSED, tmp_path, "shy"))

    @step(agent="shy")
    def only(task: str) -> str:
        return task

    with trio.fail_after(LIMIT):
        outcome = await run_pipeline(
            Pipeline.from_steps([only], name="shy"), {"task": "t"}, cwd=ws, config=cfg
        )
        run = await prompt("shy", "t", cwd=ws, config=cfg)
        side = await compare(["shy"], "t", cwd=ws, config=cfg)
    assert outcome.status == "succeeded"
    assert outcome.did_nothing and run.did_nothing and side.did_nothing
    assert outcome.result["didNothing"] is True and run.to_json()["didNothing"] is True
    expected = ("every one of the run's 2 permission requests was refused and it changed nothing",)
    assert outcome.warnings == run.warnings == expected
    assert outcome.result["warnings"] == run.to_json()["warnings"] == list(expected)


async def test_a_run_that_did_its_work_is_not_flagged(tmp_path: Path) -> None:
    """A run that changed a file without asking anything is not flagged."""
    ws = workspace(tmp_path, {"a.txt": LINES})
    writer = AgentScript(turns=(Turn(steps=(WriteDisk("a.txt", edited(3)), Say("done"))),))
    with trio.fail_after(LIMIT):
        run = await prompt("w", "t", cwd=ws, config=config(spec_for(writer, tmp_path, "w")))
    assert (run.did_nothing, run.warnings, run.to_json()["didNothing"]) == (False, (), False)


# --------------------------------------------------------------------------- errors


def _defined_exceptions() -> set[type[BaseException]]:
    """Every exception class defined in the package (every module imported)."""
    found: set[type[BaseException]] = set()
    for info in pkgutil.walk_packages(orchestrator.__path__, "orchestrator."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__ == module.__name__
            ):
                found.add(value)
    return found


#: exceptions that never leave the code that raises them (a test agent's process, a parser's
#: own control flow): not part of the library's error contract
INTERNAL = {
    "orchestrator._fetch._Refused",
    "orchestrator.demo.instructions._Refused",
    "orchestrator.pipeline._budget.NotStarted",
    "orchestrator.replay.agent._Stop",
    "orchestrator.runs._clones._GitFailed",
    "orchestrator.runs._repos._Bad",
    "orchestrator.runs.outcomes._Unreadable",
    "orchestrator.store.runstore._RolledBack",
    "orchestrator.vfs._poolscan.NotTold",
    "orchestrator.vfs._poolscan.Unclean",
    "orchestrator.vfs.apply._EntryFailed",
    "orchestrator.vfs._statwalk.ListingFailed",
    "orchestrator.testing._steps.ScriptedCrash",
    "orchestrator.testing._wire.PeerGone",
}


def test_every_error_class_is_importable_from_orchestrator_errors() -> None:
    """Every exception class defined in the package is an attribute of orchestrator.errors
    (and listed in its __all__), but for the few internal ones."""
    found = {f"{c.__module__}.{c.__qualname__}": c for c in _defined_exceptions()}
    assert set(found) >= INTERNAL  # the exceptions still exist (else the list is stale)
    for name, cls in sorted(found.items()):
        if name in INTERNAL:
            continue
        assert getattr(orchestrator.errors, cls.__name__, None) is cls, name
        assert cls.__name__ in orchestrator.errors.__all__, name
    assert len(found) - len(INTERNAL) == len(
        [n for n in orchestrator.errors.__all__ if inspect.isclass(getattr(orchestrator.errors, n))]
    )


def test_error_kinds_are_one_list() -> None:
    """ERROR_KINDS holds exactly the ErrorKind literals, and the JSON schema lists them."""
    assert get_args(ErrorKind) == ERROR_KINDS
    schema = json.loads(SCHEMA.read_text())
    assert schema["$defs"]["errorKind"]["enum"] == [*ERROR_KINDS, None]


async def test_failed_instances_carry_their_error_kind(tmp_path: Path, state_dir: Path) -> None:
    """A timeout, an exited agent, a stop reason, a Python exception and a conflict each fail
    their instance with their kind: in the outcome, the stored run and the store's records."""
    ws = workspace(tmp_path, {"a.txt": LINES})
    stall = spec_for(AgentScript(turns=(Turn(steps=(Stall(),)),)), tmp_path, "stall")
    gone = spec_for(AgentScript(turns=(Turn(steps=(Say("bye"), Crash())),)), tmp_path, "gone")
    refuses = spec_for(
        AgentScript(turns=(Turn(steps=(Say("no"),), stop_reason="refusal"),)), tmp_path, "no"
    )
    one = spec_for(AgentScript(turns=(Turn(steps=(WriteDisk("a.txt", "one\n"),)),)), tmp_path, "a")
    two = spec_for(AgentScript(turns=(Turn(steps=(WriteDisk("a.txt", "two\n"),)),)), tmp_path, "b")

    @step(agent="stall", timeout=1.0)
    def slow(task: str) -> str:
        return task

    @step(agent="gone")
    def crash(task: str) -> str:
        return task

    @step(agent="no")
    def refusal(task: str) -> str:
        return task

    @step()
    def boom(task: str) -> str:
        raise ValueError("bad value")

    @step(agent=["a", "b"])
    def both(task: str) -> str:
        return task

    @step()
    def joined(both: Any) -> str:
        return "joined"

    pipe = Pipeline.from_steps([slow, crash, refusal, boom, both, joined], name="failing")
    with trio.fail_after(LIMIT):
        outcome = await run_pipeline(
            pipe, {"task": "t"}, cwd=ws, config=config(stall, gone, refuses, one, two)
        )
    assert outcome.status == "failed"
    steps = outcome.result["steps"]
    kinds = {name: steps[name]["errorKind"] for name in steps}
    assert kinds == {
        "slow": "timeout",
        "crash": "agent-exited",
        "refusal": "stopped",
        "boom": "exception",
        "both": None,
        "joined": "conflict",
    }
    assert steps["slow"]["instances"]["slow"]["errorKind"] == "timeout"
    assert steps["boom"]["instances"]["boom"]["errorKind"] == "exception"
    assert steps["both"]["instances"]["a"]["errorKind"] is None
    async with open_run_store(state_dir) as store:
        records = {r.key: r.error_kind for r in await store.steps(outcome.run_id)}
    assert records["crash"] == "agent-exited" and records["joined"] == "conflict"
    # the cause stays: the exception this process saw
    assert isinstance(outcome.outcomes["boom"][None], ValueError)


def test_the_store_keeps_error_kinds_from_schema_version_5() -> None:
    """The error kind came with a migration (v5) of the run store's schema; a run's batch (v6)
    came after it, and what a replay needs (v7) after that."""
    assert SCHEMA_VERSION == 8


@pytest.mark.parametrize(
    ("name", "error"),
    [
        ("claudee", UnknownAgent("claudee", "claude")),
        ("no-such-agent-program", AgentNotFound("no-such-agent-program", "no-such-agent-program")),
    ],
)
async def test_an_unknown_agent_is_the_same_error_everywhere(
    tmp_path: Path, name: str, error: UsageError
) -> None:
    """prompt, compare and run_pipeline refuse an unknown agent with one class and message."""
    ws = workspace(tmp_path)

    @step(agent=name)
    def only(task: str) -> str:
        return task

    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: prompt(name, "t", cwd=ws),
        lambda: compare([name, "demo"], "t", cwd=ws),
        lambda: run_pipeline(Pipeline.from_steps([only], name="p"), {"task": "t"}, cwd=ws),
    ]
    for call in calls:
        with pytest.raises(UsageError) as caught:
            await call()
        assert (type(caught.value), str(caught.value)) == (type(error), str(error))
    assert await list_runs() == []


# --------------------------------------------------------------------------- plain Cancelled


def test_groups_of_cancelled_become_one_cancelled() -> None:
    """A group of nothing but Cancelled, however nested, is one Cancelled; a group with other
    errors keeps those (alone: the error itself)."""

    async def main() -> None:
        cancelled: list[BaseException] = []

        async def grab() -> None:
            try:
                await trio.sleep_forever()
            except trio.Cancelled as e:
                cancelled.append(e)
                raise

        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(grab)
                nursery.start_soon(grab)
                await trio.testing.wait_all_tasks_blocked()
                scope.cancel()
        a, b = cancelled
        nested = BaseExceptionGroup("outer", [a, BaseExceptionGroup("inner", [b])])
        assert without_cancelled(nested) is a
        error = ValueError("x")
        assert without_cancelled(BaseExceptionGroup("g", [a, ExceptionGroup("i", [error])])) is (
            error
        )
        other = KeyError("y")
        rest = without_cancelled(BaseExceptionGroup("g", [a, error, other]))
        assert isinstance(rest, BaseExceptionGroup) and list(rest.exceptions) == [error, other]

    trio.run(main)


STALL = AgentScript(turns=(Turn(steps=(Say("working"), Stall())),))


async def test_cancelling_a_run_raises_plain_cancelled(tmp_path: Path) -> None:
    """run_pipeline, prompt, compare and resume_run cancelled from trio raise trio.Cancelled
    (seen by ``except trio.Cancelled``) and are recorded interrupted; move_on_after works."""
    ws = workspace(tmp_path, {"a.txt": LINES})
    cfg = config(spec_for(STALL, tmp_path, "one"), spec_for(STALL, tmp_path, "two"))

    @step(agent=["one", "two"])
    def fan(task: str) -> str:
        return task

    @step(agent="one")
    def after(fan: Any) -> str:
        return "next"

    pipe = Pipeline.from_steps([fan, after], name="stalls")
    calls = {
        "pipeline": lambda hook: run_pipeline(
            pipe, {"task": "t"}, cwd=ws, config=cfg, on_update=hook
        ),
        "prompt": lambda hook: prompt("one", "t", cwd=ws, config=cfg, on_update=hook),
        "compare": lambda hook: compare(["one", "two"], "t", cwd=ws, config=cfg, on_update=hook),
    }
    for name, call in calls.items():
        seen: list[str] = []
        working = trio.Event()

        async def run(
            call: Any = call, working: trio.Event = working, seen: list[str] = seen
        ) -> None:
            try:
                await call(lambda update: working.set())
            except trio.Cancelled:
                seen.append("Cancelled")
                raise

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run)
            await working.wait()  # an agent is mid-turn: it said "working"
            nursery.cancel_scope.cancel()
        assert seen == ["Cancelled"], name
    runs = await list_runs()
    assert [r.status for r in runs] == ["interrupted"] * 3
    # a resume, cut short by move_on_after: the scope catches it, the run is interrupted again
    first = next(r for r in runs if r.kind == "prompt")
    with trio.move_on_after(2) as scope:  # its agents stall: only the deadline ends it
        await resume_run(first.run_id, config=cfg)
    assert scope.cancelled_caught
    assert (await get_run_json(first.run_id))["status"] == "interrupted"
