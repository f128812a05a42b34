"""A resumed run merges reused branches against the same bases a run straight through would.

Each pipeline's ``build`` step fails until its marker file exists: the first run fails there,
the marker is written, and ``resume_run`` reuses the instances that succeeded. The demo agent
(a real subprocess) makes the edits; the run's result is compared with that of the same
pipeline run straight through (marker present from the start).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from orchestrator.pipeline.branches import FINAL
from orchestrator.runs import RunOutcome, resume_run, run_pipeline
from orchestrator.store import open_run_store

pytestmark = pytest.mark.slow

#: seconds a run with a few demo agent turns may take
LIMIT = 60.0

EDIT = """\
from pathlib import Path

from orchestrator.pipeline import step


@step(agent="demo")
def edit(task: str) -> str:
    return 'create notes.txt with "first\\\\n"\\ncreate list.txt with "x\\\\n"'
"""


def build_after(parent: str) -> str:
    """A step ``build`` after ``parent`` that fails until its marker file exists."""
    return f"""

@step
def build({parent}: object, marker: str) -> str:
    if not Path(marker).exists():
        raise RuntimeError("the marker is missing")
    return "built"
"""


HEADER = EDIT + build_after("edit")

#: ``edit`` is the common ancestor of the re-run ``after`` and the reused ``side``
ANCESTOR = (
    HEADER
    + """

@step(agent="demo")
def after(build: str) -> str:
    return 'append "after" to notes.txt'


@step
def side(edit: object) -> int:
    return 7
"""
)

#: two reused siblings and a reused fan-out change and keep what their ancestor created
SIBLINGS = (
    HEADER
    + """

@step(agent="demo")
def left(edit: object) -> str:
    return 'append "left" to notes.txt'


@step(agent="demo")
def right(edit: object) -> str:
    return 'create right.txt with "right\\\\n"'


@step(agent="demo", over="items")
def fan(edit: object, item: str) -> str:
    if item == "a":
        return 'append "a" to list.txt'
    return 'create b.txt with "b\\\\n"'
"""
)

#: a fan-out after a merge of reused siblings changes what one of them created; the step
#: after it merges its instances again
FAN_AFTER_MERGE = (
    EDIT
    + build_after("fan")
    + """

@step(agent="demo")
def left(edit: object) -> str:
    return 'create left.txt with "left\\\\n"'


@step(agent="demo")
def right(edit: object) -> str:
    return 'create right.txt with "right\\\\n"'


@step(agent="demo", over="items")
def fan(left: object, right: object, item: str) -> str:
    if item == "a":
        return 'append "a" to right.txt'
    return 'create b.txt with "b\\\\n"'
"""
)

#: a reused step and a re-run one change the same line differently: a real conflict
REAL_CONFLICT = (
    HEADER
    + """

@step(agent="demo")
def left(edit: object) -> str:
    return 'replace "first" with "left" in notes.txt'


@step(agent="demo")
def after(build: str) -> str:
    return 'replace "first" with "after" in notes.txt'
"""
)


def project(tmp_path: Path, name: str) -> Path:
    """An empty workspace directory."""
    root = tmp_path / name
    root.mkdir()
    return root


async def final_files(run_id: str, state_dir: Path) -> dict[str, bytes | None]:
    """The run's final changes from the run store: path -> content (None: deleted)."""
    async with open_run_store(state_dir) as store:
        return {c.path: c.data for c in await store.changes(run_id, FINAL)}


async def resumed_and_straight(
    tmp_path: Path, source: str, inputs: dict[str, Any]
) -> tuple[RunOutcome, RunOutcome]:
    """The resume of a first run of ``source`` that failed in ``build``, and a run straight
    through."""
    pipeline = tmp_path / "pipeline.py"
    pipeline.write_text(source)
    marker = tmp_path / "marker"
    values = {"task": "t", "marker": str(marker), **inputs}
    with trio.fail_after(LIMIT):
        first = await run_pipeline(pipeline, values, cwd=project(tmp_path, "a"), policy="edit")
    assert first.status == "failed"
    assert first.steps["build"].status == "failed"
    marker.write_text("")
    with trio.fail_after(LIMIT):
        resumed = await resume_run(first.run_id)
    with trio.fail_after(LIMIT):
        straight = await run_pipeline(pipeline, values, cwd=project(tmp_path, "b"), policy="edit")
    return resumed, straight


async def test_resume_merges_a_rerun_sink_and_a_reused_one_over_their_reused_ancestor(
    tmp_path: Path, state_dir: Path
) -> None:
    """A re-run step and a reused sibling of its reused ancestor merge cleanly, as straight."""
    resumed, straight = await resumed_and_straight(tmp_path, ANCESTOR, {})
    assert resumed.result["reused"] == ["edit", "side"]
    assert resumed.result["conflicts"] == []
    assert resumed.status == "succeeded"
    files = await final_files(resumed.run_id, state_dir)
    assert files == {"notes.txt": b"first\nafter\n", "list.txt": b"x\n"}
    assert files == await final_files(straight.run_id, state_dir)


async def test_resume_merges_reused_siblings_and_fanned_out_instances_over_their_ancestor(
    tmp_path: Path, state_dir: Path
) -> None:
    """Reused siblings and a reused fan-out merge cleanly with the re-run step, as straight."""
    resumed, straight = await resumed_and_straight(tmp_path, SIBLINGS, {"items": ["a", "b"]})
    assert resumed.result["reused"] == ["edit", "fan[a]", "fan[b]", "left", "right"]
    assert resumed.result["conflicts"] == []
    assert resumed.status == "succeeded"
    files = await final_files(resumed.run_id, state_dir)
    assert files == {
        "notes.txt": b"first\nleft\n",
        "list.txt": b"x\na\n",
        "right.txt": b"right\n",
        "b.txt": b"b\n",
    }
    assert files == await final_files(straight.run_id, state_dir)


async def test_fanned_out_instances_after_a_merge_merge_over_the_merged_tree(
    tmp_path: Path, state_dir: Path
) -> None:
    """A fan-out after a merge merges cleanly, straight through and reused by a resume."""
    resumed, straight = await resumed_and_straight(tmp_path, FAN_AFTER_MERGE, {"items": ["a", "b"]})
    assert straight.result["conflicts"] == []
    assert straight.status == "succeeded"
    assert resumed.result["reused"] == ["edit", "fan[a]", "fan[b]", "left", "right"]
    assert resumed.steps["build"].status == "succeeded"
    assert resumed.result["conflicts"] == []
    assert resumed.status == "succeeded"
    files = await final_files(resumed.run_id, state_dir)
    assert files == {
        "notes.txt": b"first\n",
        "list.txt": b"x\n",
        "left.txt": b"left\n",
        "right.txt": b"right\na\n",
        "b.txt": b"b\n",
    }
    assert files == await final_files(straight.run_id, state_dir)


async def test_resume_still_reports_a_real_conflict_against_the_shared_base(
    tmp_path: Path,
) -> None:
    """Both sides changing one line still conflict after a resume, against their base."""
    resumed, straight = await resumed_and_straight(tmp_path, REAL_CONFLICT, {})
    assert resumed.result["reused"] == ["edit", "left"]
    assert resumed.status == "conflicts"
    [conflict] = resumed.result["conflicts"]
    assert {k: conflict[k] for k in ("step", "path", "kind", "base", "ours", "theirs")} == {
        "step": FINAL,
        "path": "notes.txt",
        "kind": "content",
        "base": "first\n",
        "ours": "left\n",
        "theirs": "after\n",
    }
    assert straight.status == "conflicts"
    assert resumed.result["conflicts"] == straight.result["conflicts"]
