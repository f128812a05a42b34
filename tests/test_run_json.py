"""A run's ``--json`` object read back from the run store is the one the run returned.

``get_run_json`` (and ``show``, ``show --json``) give the object each kind of run returned (a
prompt, a pipeline, a comparison, a resume), with only what a later apply changes read anew;
``show`` of a pipeline whose apply was refused names the files as a prompt's does. Agents are
the demo agent and scripted subprocesses; the autouse ``state_dir`` fixture points the run store
at a temporary directory.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import trio
from outcome_runs import SAMPLE, make_runs
from run_helpers import CLI, as_json, config, run_cli, spec_for, workspace

from orchestrator.cli.output import SCHEMA_VERSION, output_schema
from orchestrator.pipeline import Pipeline, step
from orchestrator.runs import FileChange, apply_run, compare, get_run_json, prompt, run_pipeline
from orchestrator.runs.recorded import LATER
from orchestrator.store import open_run_store
from orchestrator.testing import AgentScript, Say, Spawn, Turn, WriteDisk

LIMIT = 120.0  # seconds the runs of one test may take (each agent starts a Python)
DEMO_EDIT = 'replace "colour" with "color" in README.md'
#: what a prompt's kept object holds besides its ``--json`` object: the record's fields
PROMPT_RECORD = {
    "cwd",
    "created",
    "finished",
    "statusReason",
    "conflicts",
    "appliedSteps",
    "reused",
    "mcpServers",
    "branches",
}


def valid(document: dict[str, Any]) -> None:
    """``document``, versioned as the CLI prints it, is valid under the shipped schema."""
    jsonschema.Draft202012Validator(output_schema()).validate(
        {"schemaVersion": SCHEMA_VERSION, **document}
    )


async def test_every_kind_of_run_reads_back_as_it_returned(tmp_path: Path) -> None:
    """Prompt, pipeline, comparisons (one applied), conflicts, a failed run and its resume: the
    stored object is the run's result, its run-time fields too; a prompt's holds its object."""
    with trio.fail_after(LIMIT):
        made = await make_runs(tmp_path)
    for name, live, stored in made:
        valid(stored)
        if live is None:  # interrupted: no process ran it to its end
            assert "wallSeconds" not in stored and stored["status"] == "interrupted"
            continue
        if name == "prompt":
            assert {k: stored[k] for k in live} == live
            assert set(stored) - set(live) <= PROMPT_RECORD
            continue
        assert stored == live, name
        for key in ("wallSeconds", "reused", "workspaceChanged", "patchLeftOut", "didNothing"):
            assert key in stored, (name, key)
    resumed = {n: live for n, live, _ in made}["resumed"]
    assert resumed is not None and resumed["restored"] and resumed["reused"]


async def test_a_later_apply_is_the_only_change(tmp_path: Path) -> None:
    """Applied later (the whole run, a comparison's agent), the object reads the apply in
    ``applied`` (and the agent's), and is otherwise the one the run returned."""
    import shutil

    with trio.fail_after(LIMIT):
        project = tmp_path / "pipeline"
        shutil.copytree(SAMPLE, project)
        ran = await run_pipeline(
            Path(__file__).resolve().parent.parent / "examples" / "demo_pipeline.py",
            cwd=project,
            policy="trusted",
        )
        assert ran.status == "succeeded" and ran.result["applied"] is False
        await apply_run(ran.run_id)
        assert await get_run_json(ran.run_id) == {**ran.result, "applied": True}

        project = tmp_path / "compare"
        shutil.copytree(SAMPLE, project)
        side = await compare(["a=demo", "b=demo"], DEMO_EDIT, cwd=project, policy="edit")
        await apply_run(side.run_id, step="compare[b]")
        shown = await get_run_json(side.run_id)
    agents = [{**a, "applied": a["name"] == "b"} for a in side.result["agents"]]
    assert shown == {**side.result, "applied": "b", "agents": agents}
    assert set(LATER) == {"applied", "appliedSteps"}


LINES = "".join(f"line {i}\n" for i in range(20))


def human_edit(ws: Path) -> Spawn:
    """A program, run by the agent during its turn, that edits the workspace's a.txt (as a
    person at the keyboard would): deterministic, it ends before the agent goes on."""
    code = f"open({str(ws / 'a.txt')!r}, 'a').write('added by a human\\n')"
    return Spawn((sys.executable, "-c", code))


@pytest.mark.skipif(not CLI.is_file(), reason=f"console script {CLI} not installed")
async def test_a_refused_apply_is_shown_like_a_prompts(tmp_path: Path, state_dir: Path) -> None:
    """A pipeline asked to apply, refused because a.txt changed in the workspace during the
    run: ``get_run_json`` and ``show --json`` name a.txt, and ``show`` prints the same lines
    as for a prompt refused the same way."""
    ws = workspace(tmp_path, {"a.txt": LINES})
    script = AgentScript(
        turns=(Turn(steps=(human_edit(ws), WriteDisk("a.txt", "mine\n"), Say("edited"))),)
    )
    cfg = config(spec_for(script, tmp_path, "one"))

    @step(agent="one")
    def only(task: str) -> str:
        return task

    with trio.fail_after(LIMIT):
        ran = await run_pipeline(
            Pipeline.from_steps([only], name="one"), {"task": "t"}, cwd=ws, config=cfg, apply=True
        )
        (ws / "a.txt").write_text(LINES)
        asked = await prompt("one", "t", cwd=ws, config=cfg, apply=True)
    assert (ran.exit_code, ran.workspace_changed) == (3, ("a.txt",))
    assert (asked.exit_code, asked.workspace_changed) == (3, ("a.txt",))
    assert (await get_run_json(ran.run_id))["workspaceChanged"] == ["a.txt"]
    refused = "NOT applied: changed in the workspace during the run: a.txt"
    for run_id in (ran.run_id, asked.run_id):
        shown = await run_cli("show", run_id, cwd=tmp_path, state=state_dir)
        assert shown.returncode == 0, shown.stderr
        assert refused in shown.stdout.decode().splitlines(), shown.stdout.decode()
        document = as_json(await run_cli("show", run_id, "--json", cwd=tmp_path, state=state_dir))
        assert document["workspaceChanged"] == ["a.txt"]
        valid(document)


async def test_an_attempt_that_did_not_end_is_rebuilt(tmp_path: Path) -> None:
    """A run whose record changed since its object was kept (a resume that was interrupted)
    reads from its records, not as the earlier attempt's object."""
    ws = workspace(tmp_path, {"a.txt": LINES})
    cfg = config(spec_for(AgentScript(turns=(Turn(steps=(Say("hi"),)),)), tmp_path, "one"))

    @step(agent="one")
    def only(task: str) -> str:
        return task

    with trio.fail_after(LIMIT):
        ran = await run_pipeline(
            Pipeline.from_steps([only], name="one"), {"task": "t"}, cwd=ws, config=cfg
        )
    assert (await get_run_json(ran.run_id)) == ran.result
    async with open_run_store(Path(ran.run_dir).parent.parent) as store:
        await store.update_run(ran.run_id, status="interrupted", finished=time.time())
    shown = await get_run_json(ran.run_id)
    assert shown["status"] == "interrupted"
    assert "wallSeconds" not in shown and shown["didNothing"] is False


async def test_a_prompts_changes_are_file_changes_as_a_runs(tmp_path: Path) -> None:
    """``PromptRun.changes`` are ``FileChange`` values, as ``RunOutcome.changes`` are, and its
    object is unchanged; a comparison's ``changes`` are empty, each agent's in its entry."""
    import shutil

    project = tmp_path / "prompt"
    shutil.copytree(SAMPLE, project)
    with trio.fail_after(LIMIT):
        run = await prompt("demo", DEMO_EDIT, cwd=project, policy="edit")
        project = tmp_path / "compare"
        shutil.copytree(SAMPLE, project)
        side = await compare(["a=demo", "b=demo"], DEMO_EDIT, cwd=project, policy="edit")
    assert run.changes == (FileChange(path="README.md", change="modified"),)
    assert run.changes[0].name == "README.md"
    assert run.to_json()["changes"] == [{"path": "README.md", "change": "modified"}]
    assert run.to_json()["changes"] == (await get_run_json(run.run_id))["changes"]
    # a comparison's branches are alternatives, never merged: no changes of its own
    assert side.changes == ()
    assert [a.changes for a in side.agents] == [run.changes, run.changes]
