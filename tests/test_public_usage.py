"""Every public function, called as a typed user program calls it (mypy --strict checks it).

The calls run on the built-in demo agent served in this process (the testing plugin's
connector) or, for the lowest layer, as a real subprocess; the point is the types and the
contracts each face keeps, so each call's result is used through its typed attributes.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import sys
from pathlib import Path

import pytest
import trio
import trio.testing

import orchestrator
from orchestrator import (
    AgentSpec,
    ApplyOutcome,
    BatchOutcome,
    CancelToken,
    Limits,
    Pipeline,
    PromptRun,
    RunOutcome,
    StepContext,
    StepOutcome,
    agent_input,
    agents_input,
    aio,
    apply_run,
    apply_run_sync,
    batch,
    batch_sync,
    compare,
    compare_sync,
    diff_run,
    diff_run_sync,
    get_run_json,
    get_run_json_sync,
    list_runs,
    list_runs_sync,
    load_pipeline,
    open_agent,
    open_agent_on_stream,
    open_run_store,
    open_supervisor,
    prompt,
    prompt_sync,
    prune,
    prune_sync,
    render_report,
    replay_run,
    replay_run_sync,
    resolve_agent,
    resume_batch,
    resume_batch_sync,
    resume_run,
    resume_run_sync,
    run_pipeline,
    run_pipeline_sync,
    step,
)
from orchestrator.demo.agent import serve_demo_agent
from orchestrator.errors import OrchestratorError, RunCancelled, UsageError
from orchestrator.testing import InProcessAgents, TempProjects

EDIT = 'replace "colour" with "color" in README.md'


@step(agent=agent_input("writer", default="demo"))
def fix(task: str) -> str:
    """The agent step: the task is the demo agent's instruction."""
    return task


@step(agent=agents_input("reviewers", default=["alice=demo", "bob=demo"]))
def review(fix: object, ctx: StepContext) -> str:
    """Each reviewer appends a line of its own (no conflict between them: other files)."""
    return f'append "reviewed by {ctx.agent}" to {ctx.agent}.txt'


PIPE = Pipeline.from_steps([fix, review], name="usage")


def _project(orchestrator_project: TempProjects) -> Path:
    return orchestrator_project({"README.md": "The colour.\n"})


def test_every_public_function_is_called_here() -> None:
    """A public function, of the package or of its asyncio face, that no test here calls fails."""
    tree = ast.parse(Path(__file__).read_text(encoding="utf-8"))
    called: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            fn = node.func
            if isinstance(fn, ast.Name):
                called.add(fn.id)
            elif isinstance(fn, ast.Attribute) and isinstance(fn.value, ast.Name):
                called.add(f"{fn.value.id}.{fn.attr}")
    public = {
        name for name in orchestrator.__all__ if inspect.isfunction(getattr(orchestrator, name))
    }
    public |= {f"aio.{name}" for name in aio.__all__}
    # the decorator is applied, not called, above
    assert public - called - {"step"} == set()


def test_the_sync_face(
    orchestrator_project: TempProjects, orchestrator_agents: InProcessAgents
) -> None:
    """prompt, run, compare, resume, replay, apply, list, get, diff: the *_sync twins."""
    project = _project(orchestrator_project)
    run: PromptRun = prompt_sync(
        "demo", EDIT, cwd=project, policy="edit", connector=orchestrator_agents
    )
    assert run.status == "succeeded" and "+The color." in run.diff
    assert run.turn is not None and run.turn.stop_reason == "end_turn"

    piped: RunOutcome = run_pipeline_sync(
        PIPE, {"task": EDIT}, cwd=project, policy="edit", connector=orchestrator_agents
    )
    review_step: StepOutcome = piped.steps["review"]
    assert review_step.status == "succeeded" and set(review_step.instances) == {
        "alice",
        "bob",
    }
    assert piped.steps["fix"].value is not None

    side = compare_sync(
        ["alice=demo", "bob=demo"], EDIT, cwd=project, policy="edit", connector=orchestrator_agents
    )
    assert [a.name for a in side.agents] == ["alice", "bob"] and side.winner in ("alice", "bob")

    again = resume_run_sync(run.run_id)  # the prompt's agent step is done: reused
    assert again.status == "succeeded" and again.result["reused"]

    assert diff_run_sync(piped.run_id) == piped.diff
    # its agents played back; the pipeline built in code is given again
    replayed = replay_run_sync(piped.run_id, PIPE, in_process=True)
    assert replayed.result["replay"]["divergences"] == [] and replayed.diff == piped.diff
    assert get_run_json_sync(piped.run_id)["status"] == "succeeded"
    assert piped.run_id in [r.run_id for r in list_runs_sync()]
    applied: ApplyOutcome = apply_run_sync(piped.run_id)
    assert applied.applied and (project / "README.md").read_text() == "The color.\n"
    would = prune_sync([side.run_id], dry_run=True)
    assert would.dry_run and [r.run_id for r in would.deleted] == [side.run_id]

    repos = [str(orchestrator_project({"README.md": "The colour.\n"}, git=True)) for _ in "ab"]
    many: BatchOutcome = batch_sync(
        PIPE,
        repos,
        {"task": EDIT},
        policy="edit",
        connector=orchestrator_agents,
        git_branch="agent/usage",
    )
    assert many.exit_code == 0 and [r.branch for r in many.repos] == ["agent/usage"] * 2
    kept = resume_batch_sync(many.run_id, pipeline=PIPE, connector=orchestrator_agents)
    assert [r.run_id for r in kept.repos] == [r.run_id for r in many.repos]

    token = CancelToken()
    token.cancel()
    with pytest.raises(RunCancelled) as cancelled:
        prompt_sync("demo", EDIT, cwd=project, connector=orchestrator_agents, cancel=token)
    assert cancelled.value.run_id is None  # cancelled before the run started: nothing recorded


def test_the_asyncio_face(
    orchestrator_project: TempProjects, orchestrator_agents: InProcessAgents
) -> None:
    """The same calls awaited from asyncio, two of them gathered."""
    project = _project(orchestrator_project)

    async def main() -> tuple[PromptRun, RunOutcome]:
        one, two = await asyncio.gather(
            aio.prompt("demo", EDIT, cwd=project, policy="edit", connector=orchestrator_agents),
            aio.run_pipeline(
                PIPE, {"task": EDIT}, cwd=project, policy="edit", connector=orchestrator_agents
            ),
        )
        side = await aio.compare(
            ["alice=demo", "bob=demo"], EDIT, cwd=project, connector=orchestrator_agents
        )
        assert side.verdict is not None
        again = await aio.resume_run(one.run_id)
        assert again.status == "succeeded"
        assert await aio.diff_run(two.run_id) == two.diff
        assert (await aio.get_run_json(two.run_id))["runId"] == two.run_id
        assert len(await aio.list_runs(limit=2)) == 2
        replayed = await aio.replay_run(two.run_id, PIPE, in_process=True)
        assert replayed.result["replay"]["divergences"] == []
        assert (await aio.apply_run(one.run_id)).applied
        assert (await aio.prune([side.run_id])).deleted[0].run_id == side.run_id
        repo = str(orchestrator_project({"README.md": "The colour.\n"}, git=True))
        many = await aio.batch(
            PIPE, [repo], {"task": EDIT}, policy="edit", connector=orchestrator_agents
        )
        assert many.status == "succeeded" and many.repos[0].files and not many.repos[0].branch
        kept = await aio.resume_batch(many.run_id, pipeline=PIPE, connector=orchestrator_agents)
        assert kept.status == "succeeded"
        return one, two

    one, two = asyncio.run(main())
    assert one.status == two.status == "succeeded"
    assert (project / "README.md").read_text() == "The color.\n"


async def test_the_trio_face(
    orchestrator_project: TempProjects, orchestrator_agents: InProcessAgents, tmp_path: Path
) -> None:
    """The trio functions, a pipeline file, the store, the report."""
    project = _project(orchestrator_project)
    run = await prompt("demo", EDIT, cwd=project, policy="edit", connector=orchestrator_agents)
    file = tmp_path / "usage.py"
    file.write_text(
        "from orchestrator import step\n\n\n"
        "@step(agent='demo')\n"
        "def fix() -> str:\n"
        f"    return {EDIT!r}\n",
        encoding="utf-8",
    )
    loaded: Pipeline = load_pipeline(file)
    piped = await run_pipeline(loaded, cwd=project, policy="edit", connector=orchestrator_agents)
    side = await compare(["demo"], EDIT, cwd=project, connector=orchestrator_agents)
    assert [a.status for a in side.agents] == ["succeeded"]
    again = await resume_run(piped.run_id)
    assert again.steps["fix"].status == "succeeded"
    assert "+The color." in await diff_run(run.run_id)
    result = await get_run_json(piped.run_id)
    paths = render_report(result, tmp_path / "report")
    assert paths.html.is_file() and paths.markdown.is_file()
    async with open_run_store(orchestrator.state.state_directory(None)) as store:
        assert (await store.get_run(piped.run_id)).status == "succeeded"
    assert {r.run_id for r in await list_runs()} >= {run.run_id, piped.run_id}
    replayed = await replay_run(piped.run_id, in_process=True)
    assert replayed.diff == piped.diff and replayed.result["replay"]["divergences"] == []
    assert (await apply_run(piped.run_id)).written == ("README.md",)
    pruned = await prune([side.run_id])
    assert [r.run_id for r in pruned.deleted] == [side.run_id] and pruned.bytes_freed >= 0
    repo = orchestrator_project({"README.md": "The colour.\n"}, git=True)
    many = await batch(loaded, [repo.as_posix()], policy="edit", connector=orchestrator_agents)
    assert many.status == "succeeded" and many.repos[0].files == 1
    with pytest.raises(UsageError, match="not a batch"):
        await resume_batch(piped.run_id)

    with trio.CancelScope() as scope:
        scope.cancel()
        await prompt("demo", EDIT, cwd=project, connector=orchestrator_agents)
    assert scope.cancelled_caught


def test_the_batch_faces(
    orchestrator_project: TempProjects, orchestrator_agents: InProcessAgents
) -> None:
    """batch and resume_batch on each face: trio, sync, asyncio."""
    repos = [str(_project(orchestrator_project)) for _ in range(2)]
    file = Path(repos[0]).parent / "batch_usage.py"
    file.write_text(
        f"from orchestrator import step\n\n\n@step(agent='demo')\ndef fix() -> str:\n"
        f"    return {EDIT!r}\n",
        encoding="utf-8",
    )
    done: BatchOutcome = batch_sync(file, repos, policy="edit", connector=orchestrator_agents)
    assert done.status == "succeeded" and [r.files for r in done.repos] == [1, 1]
    again = resume_batch_sync(done.run_id, connector=orchestrator_agents)
    assert [r.run_id for r in again.repos] == [r.run_id for r in done.repos]

    async def on_trio() -> BatchOutcome:
        one = await batch(file, repos[:1], policy="edit", connector=orchestrator_agents)
        return await resume_batch(one.run_id, connector=orchestrator_agents)

    assert trio.run(on_trio).exit_code == 0

    async def on_asyncio() -> BatchOutcome:
        one = await aio.batch(file, repos[1:], policy="edit", connector=orchestrator_agents)
        return await aio.resume_batch(one.run_id, connector=orchestrator_agents)

    assert asyncio.run(on_asyncio()).repos[0].status == "succeeded"


async def test_the_supervisor_and_the_connections(tmp_path: Path) -> None:
    """A lease from the supervisor, an agent process, an agent on a stream."""
    spec: AgentSpec = resolve_agent("demo")
    async with open_supervisor(Limits(max_sessions=2)) as supervisor:
        async with supervisor.lease(spec, cwd=str(tmp_path)) as lease:
            turn = await lease.prompt("say hello", idle_timeout=30)
        assert turn.stop_reason == "end_turn"
        assert supervisor.statistics()["agents"]["demo"]["turnsTotal"] == 1

    async with open_agent([sys.executable, "-m", "orchestrator.demo"], name="demo") as conn:
        session = await conn.new_session(str(tmp_path))
        assert (await session.prompt("say hello")).stop_reason == "end_turn"

    ours, theirs = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_demo_agent, theirs)
        async with open_agent_on_stream(ours, name="demo") as conn:
            session = await conn.new_session(str(tmp_path))
            assert (await session.prompt("say hello")).stop_reason == "end_turn"
        nursery.cancel_scope.cancel()


def test_bad_usage_raises_a_usage_error(orchestrator_state_dir: Path, tmp_path: Path) -> None:
    """Bad usage is the one thing raised, and every error is an OrchestratorError."""
    with pytest.raises(UsageError, match="not a directory") as bad:
        run_pipeline_sync(PIPE, {"task": EDIT}, cwd=tmp_path / "missing")
    assert isinstance(bad.value, OrchestratorError)
