"""``prompt`` keeps the library's one contract: a run that started returns its recorded outcome,
however it failed; bad usage raises before anything is recorded or started."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
from run_helpers import CLI, as_json, config, configure, run_cli, spec_for, write_agent

from orchestrator import list_runs_sync, prompt_sync
from orchestrator.errors import AgentExited, AgentStartError, UsageError
from orchestrator.runs import run_pipeline
from orchestrator.testing import AgentScript, Crash, ErrorReply, ExitAtStart, Turn

pytestmark = pytest.mark.skipif(not CLI.exists(), reason="the console script is not installed")

#: seconds one run may take (its agent is a Python subprocess)
LIMIT = 60.0

#: agents whose turn never ends well, with the error kind a pipeline step records for each
FAILING: dict[str, tuple[AgentScript, str]] = {
    "exit-at-start": (AgentScript(exit_at_start=ExitAtStart(exit_code=3)), "agent-start"),
    "crash-mid-turn": (
        AgentScript(turns=(Turn(steps=(Crash(exit_code=2, stderr="boom"),)),)),
        "agent-exited",
    ),
    "error-reply": (
        AgentScript(turns=(Turn(error=ErrorReply(code=-32603, message="it broke")),)),
        "agent-error",
    ),
    "auth-required": (AgentScript(require_auth=True), "agent-start"),
}


@pytest.mark.parametrize("case", sorted(FAILING))
def test_a_failing_agent_returns_a_failed_prompt_run(tmp_path: Path, case: str) -> None:
    """prompt_sync returns the run failed, its error and error kind those of a pipeline step."""
    script, kind = FAILING[case]
    spec = spec_for(script, tmp_path, case)
    project = tmp_path / "project"
    project.mkdir()
    state = tmp_path / "state"
    run = prompt_sync(spec, "go", cwd=project, config=config(spec), state_dir=state, timeout=LIMIT)
    assert (run.status, run.exit_code, run.error_kind) == ("failed", 1, kind)
    assert run.exception is not None and run.error == str(run.exception)
    assert run.to_json()["errorKind"] == kind and run.to_json()["error"] == run.error
    assert run.turn.stop_reason is None and run.changes == ()
    [listed] = list_runs_sync(state_dir=state)
    assert (listed.run_id, listed.status) == (run.run_id, "failed")


async def test_the_same_agents_in_a_pipeline_fail_with_the_same_kinds(tmp_path: Path) -> None:
    """A pipeline step of each failing agent records the error kind the prompt returns."""
    from orchestrator.runs.prompt import prompt_pipeline

    for case, (script, kind) in sorted(FAILING.items()):
        spec = spec_for(script, tmp_path, case)
        project = tmp_path / case
        project.mkdir()
        with trio.fail_after(LIMIT):
            outcome = await run_pipeline(
                prompt_pipeline(spec.name, LIMIT, None),
                {"text": "go"},
                cwd=project,
                config=config(spec),
                state_dir=tmp_path / "state",
            )
        assert (outcome.status, outcome.steps["prompt"].error_kind) == ("failed", kind), case


async def test_the_cli_says_a_failed_turn_as_an_error_exit_1(
    tmp_path: Path, project: Path, state_dir: Path
) -> None:
    """orchestrator prompt with an agent that exits at start or crashes: exit 1, one error line."""
    starter = tmp_path / "starter.json"
    starter.write_bytes(orjson.dumps(AgentScript(exit_at_start=ExitAtStart(exit_code=3)).to_json()))
    crasher = write_agent(tmp_path / "crasher.json", Turn(steps=(Crash(exit_code=2),)))
    configure(project, starter=starter, crasher=crasher)
    for name, error in (("starter", AgentStartError), ("crasher", AgentExited)):
        argv = ("prompt", "--agent", name, "--cwd", str(project), "--no-progress", "go")
        text = await run_cli(*argv, cwd=tmp_path, state=state_dir)
        assert text.returncode == 1, text.stderr.decode()
        lines = [line for line in text.stderr.decode().splitlines() if "error:" in line]
        assert len(lines) == 1 and lines[0].startswith("orchestrator: error: "), lines
        assert text.stdout == b""
        done = await run_cli(*argv, "--json", cwd=tmp_path, state=state_dir)
        assert done.returncode == 1, done.stderr.decode()
        body = as_json(done)
        assert (body["exitCode"], body["error"]["type"]) == (1, error.__name__)
        assert body["runId"]


@pytest.mark.parametrize(
    ("text", "got"), [(42, "got int"), (None, "got None"), (["go", 7], "holding int")]
)
def test_a_prompt_that_is_no_prompt_is_refused_before_anything_is_recorded(
    project: Path, state_dir: Path, text: Any, got: str
) -> None:
    """A prompt that is neither text nor content blocks: UsageError saying what a prompt is,
    no run recorded."""
    with pytest.raises(UsageError, match=rf"a prompt is text \(str\), a content block.*{got}"):
        prompt_sync("demo", text, cwd=project, state_dir=state_dir)
    assert list_runs_sync(state_dir=state_dir) == []


def test_a_prompt_of_content_blocks_runs(project: Path, state_dir: Path) -> None:
    """Text, a content block and a list mixing them are prompts the demo agent follows."""
    from orchestrator.agent.content import text as block

    edit = 'replace "colour" with "color" in *.txt'
    for prompt in (edit, block(edit), ["", block(edit)]):
        (project / "a.txt").write_text("colour\n")
        run = prompt_sync("demo", prompt, cwd=project, policy="edit")  # type: ignore[arg-type]
        assert (run.status, [(c.path, c.change) for c in run.changes]) == (
            "succeeded",
            [("a.txt", "modified")],
        )


@pytest.mark.parametrize("sandbox", ["yes", 1, "true", 0.0])
async def test_a_sandbox_that_is_no_choice_is_refused_by_every_run(
    tmp_path: Path, project: Path, state_dir: Path, sandbox: Any
) -> None:
    """sandbox= other than None, True, False or a Sandbox: UsageError naming those, nothing
    recorded, for prompt, compare, run_pipeline, resume_run and @step."""
    from orchestrator import compare, list_runs, prompt, resume_run, step
    from orchestrator.pipeline import Pipeline

    accepted = r"sandbox must be None, True, False or a Sandbox \(orchestrator\.sandbox\.Sandbox\)"

    @step(agent="demo")
    def edit(task: str) -> str:
        return task

    pipe = Pipeline.from_steps([edit])
    with trio.fail_after(LIMIT):
        with pytest.raises(UsageError, match=accepted):
            await prompt("demo", "hi", cwd=project, sandbox=sandbox)
        with pytest.raises(UsageError, match=accepted):
            await compare(["demo", "demo:demo-slow"], "hi", cwd=project, sandbox=sandbox)
        with pytest.raises(UsageError, match=accepted):
            await run_pipeline(pipe, {"task": "hi"}, cwd=project, sandbox=sandbox)
        assert await list_runs() == []
        done = await prompt("demo", "hi", cwd=project)
        with pytest.raises(UsageError, match=accepted):
            await resume_run(done.run_id, sandbox=sandbox)
        assert [r.status for r in await list_runs()] == ["succeeded"]
    with pytest.raises(UsageError, match=accepted):
        step(agent="demo", sandbox=sandbox)(edit.fn)


async def test_a_negative_list_limit_is_a_usage_error(state_dir: Path) -> None:
    """list_runs(limit=-1) is bad usage: UsageError, not a plain ValueError."""
    from orchestrator import list_runs

    with pytest.raises(UsageError, match="limit must be None or a number not below 0, not -1"):
        await list_runs(limit=-1)
