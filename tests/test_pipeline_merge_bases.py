"""Pipelines whose branches share bases at different depths merge each against its nearest.

The demo agent (a real subprocess) makes the edits; a file a step created and a later step
changed is no conflict with the steps beside that one, whatever else is merged with them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from orchestrator.pipeline.branches import FINAL
from orchestrator.runs import RunOutcome, run_pipeline
from orchestrator.store import open_run_store

pytestmark = pytest.mark.slow

#: seconds a run with a few demo agent turns may take
LIMIT = 60.0

HEADER = """\
from orchestrator.pipeline import step


@step(agent="demo")
def edit(task: str) -> str:
    return 'create notes.txt with "first\\\\n"\\ncreate list.txt with "x\\\\n"'
"""

#: three sinks: ``keep`` and ``extend`` after ``edit`` (``extend`` appends to its file), and
#: ``beside``, which shares nothing with them but the workspace
THREE_SINKS = (
    HEADER
    + """

@step(agent="demo")
def keep(edit: object) -> str:
    return 'create keep.txt with "keep\\\\n"'


@step(agent="demo")
def extend(edit: object) -> str:
    return 'append "extend" to notes.txt'


@step(agent="demo")
def beside(task: str) -> str:
    return 'create beside.txt with "beside\\\\n"'
"""
)

#: ``keep`` and ``extend`` change the line after the one ``edit`` wrote differently: a real
#: conflict, against ``edit``'s version
REAL_CONFLICT = THREE_SINKS.replace(
    r"""'create keep.txt with "keep\\n"'""", """'append "keep" to notes.txt'"""
)

#: two steps after the same two parents (each merges them itself), one changing what a parent
#: created; and a step after both ``edit`` and ``after``, a step after ``edit`` that changed
#: a file ``edit`` created
SHARED_PARENTS = (
    HEADER
    + """

@step(agent="demo")
def other(task: str) -> str:
    return 'create other.txt with "other\\\\n"'


@step(agent="demo")
def left(edit: object, other: object) -> str:
    return 'append "left" to notes.txt'


@step(agent="demo")
def right(edit: object, other: object) -> str:
    return 'create right.txt with "right\\\\n"'


@step(agent="demo")
def after(edit: object) -> str:
    return 'append "after" to list.txt'


@step(agent="demo")
def both(edit: object, after: object) -> str:
    return 'create both.txt with "both\\\\n"'
"""
)


async def run(tmp_path: Path, source: str) -> RunOutcome:
    """``source`` run straight through over an empty workspace."""
    pipeline = tmp_path / "pipeline.py"
    pipeline.write_text(source)
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    with trio.fail_after(LIMIT):
        return await run_pipeline(pipeline, {"task": "t"}, cwd=workspace, policy="edit")


async def final_files(run_id: str, state_dir: Path) -> dict[str, bytes | None]:
    """The run's final changes from the run store: path -> content (None: deleted)."""
    async with open_run_store(state_dir) as store:
        return {c.path: c.data for c in await store.changes(run_id, FINAL)}


async def test_three_sinks_two_after_one_step_merge_cleanly(
    tmp_path: Path, state_dir: Path
) -> None:
    """Two sinks after a step that created a file, and a third beside them, merge cleanly."""
    outcome = await run(tmp_path, THREE_SINKS)
    assert outcome.result["conflicts"] == []
    assert outcome.status == "succeeded"
    assert await final_files(outcome.run_id, state_dir) == {
        "notes.txt": b"first\nextend\n",
        "list.txt": b"x\n",
        "keep.txt": b"keep\n",
        "beside.txt": b"beside\n",
    }


async def test_steps_after_the_same_parents_and_after_a_step_and_its_child_merge_cleanly(
    tmp_path: Path, state_dir: Path
) -> None:
    """Siblings after one pair of parents, and a step after a step and its child, merge cleanly."""
    outcome = await run(tmp_path, SHARED_PARENTS)
    assert outcome.result["conflicts"] == []
    assert outcome.status == "succeeded"
    assert {name: s.status for name, s in outcome.steps.items()} == dict.fromkeys(
        ["edit", "other", "left", "right", "after", "both"], "succeeded"
    )
    assert await final_files(outcome.run_id, state_dir) == {
        "notes.txt": b"first\nleft\n",
        "list.txt": b"x\nafter\n",
        "other.txt": b"other\n",
        "right.txt": b"right\n",
        "both.txt": b"both\n",
    }


async def test_a_real_conflict_of_two_sinks_is_against_their_shared_step(tmp_path: Path) -> None:
    """Two sinks after one step changing its file differently conflict over its version."""
    outcome = await run(tmp_path, REAL_CONFLICT)
    assert outcome.status == "conflicts"
    (conflict,) = outcome.result["conflicts"]
    assert conflict["step"] == FINAL
    assert conflict["path"] == "notes.txt"
    assert conflict["kind"] == "content"
    assert (conflict["base"], conflict["ours"], conflict["theirs"]) == (
        "first\n",
        "first\nkeep\n",
        "first\nextend\n",
    )
    assert (conflict["oursLabel"], conflict["theirsLabel"]) == ("keep", "extend")
    assert conflict["alsoChanged"] == []
