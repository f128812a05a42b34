"""Bad options are refused before a run starts; a running run is not resumed or applied twice.

The console script runs as a subprocess against scripted agents (subprocesses too). Each test
checks the refusal (one line, its exit code, the JSON error object) and that nothing ran or
was written.
"""

from __future__ import annotations

import os
import shlex
import signal
from pathlib import Path

import jsonschema
import pytest
import trio
from run_helpers import (
    CLI,
    CLI_LIMIT,
    agent_command,
    as_json,
    configure,
    prompts,
    run_cli,
    snapshot,
    write_agent,
)

from orchestrator.cli.output import output_schema
from orchestrator.report import render_report
from orchestrator.testing import Crash, Say, Stall, Turn, WriteFile

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_WORKSPACE_CHANGED = 0, 1, 2, 3

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CLI.is_file(), reason=f"console script {CLI} not installed"),
]


def valid(document: object) -> None:
    """``document`` matches the shipped output schema."""
    jsonschema.Draft202012Validator(output_schema()).validate(document)


async def test_a_transcript_that_cannot_be_written_is_refused_before_the_run(
    tmp_path: Path, project: Path, state_dir: Path
) -> None:
    """--transcript in a missing directory: exit 2, one line, no agent started, nothing written."""
    script = write_agent(tmp_path / "w.json", Turn(steps=(WriteFile("README.md", "x\n"),)))
    agent = f"w={shlex.join(agent_command(script))}"
    before = snapshot(project)
    done = await run_cli(
        "prompt", "--apply", "--json", "--policy", "edit", "--agent", agent,
        "--transcript", str(tmp_path / "missing" / "t.ndjson"), "--cwd", str(project), "go",
        cwd=tmp_path, state=state_dir,
    )  # fmt: skip
    assert done.returncode == EXIT_USAGE, done.stderr.decode()
    assert "Traceback" not in done.stderr.decode()
    assert "does not exist" in as_json(done)["error"]["message"]
    valid(as_json(done))
    assert prompts(script) == 0
    assert snapshot(project) == before


async def test_a_report_directory_that_cannot_be_made_is_refused_before_the_run(
    tmp_path: Path, project: Path, state_dir: Path
) -> None:
    """--report under a file: exit 2 before any agent starts; no run recorded."""
    script = write_agent(tmp_path / "w.json", Turn(steps=(Say("hi"),)))
    agent = f"w={shlex.join(agent_command(script))}"
    (tmp_path / "file").write_text("")
    done = await run_cli(
        "compare", "--agent", agent, "--report", str(tmp_path / "file" / "out"),
        "--cwd", str(project), "go", cwd=tmp_path, state=state_dir,
    )  # fmt: skip
    assert done.returncode == EXIT_USAGE, done.stderr.decode()
    assert prompts(script) == 0
    listed = await run_cli("runs", "--json", cwd=tmp_path, state=state_dir)
    assert as_json(listed)["runs"] == []


@pytest.mark.parametrize(
    "argv",
    [
        ["runs", "--limit", "-1"],
        ["runs", "--limit", "0"],
        ["run", "p.py", "--max-sessions", "0"],
        ["compare", "--agent", "demo", "--max-sessions", "-3", "x"],
        ["resume", "abc", "--max-sessions", "0"],
    ],
)
async def test_counts_below_one_are_usage_errors(
    tmp_path: Path, state_dir: Path, argv: list[str]
) -> None:
    """--limit and --max-sessions below 1: exit 2 with one line, no traceback; JSON if asked."""
    done = await run_cli(*argv, cwd=tmp_path, state=state_dir)
    assert done.returncode == EXIT_USAGE
    assert "must be at least 1" in done.stderr.decode()
    assert "Traceback" not in done.stderr.decode()
    scripted = await run_cli(*argv, "--json", cwd=tmp_path, state=state_dir)
    assert scripted.returncode == EXIT_USAGE
    error = as_json(scripted)
    valid(error)
    assert (error["error"]["type"], error["exitCode"]) == ("UsageError", EXIT_USAGE)


TWO_STEPS = """\
from orchestrator import step


@step(agent="writer")
def write(task: str) -> str:
    return task


@step(agent="crasher")
def check(write: object) -> str:
    return "check"
"""


async def test_a_refused_resume_reads_like_every_error_object(
    tmp_path: Path, project: Path, state_dir: Path
) -> None:
    """resume after the workspace changed under a finished step's file: exit 3, runId, paths."""
    writer = write_agent(tmp_path / "writer.json", Turn(steps=(WriteFile("README.md", "w\n"),)))
    crasher = write_agent(tmp_path / "crasher.json", Turn(steps=(Crash(exit_code=3),)))
    configure(project, writer=writer, crasher=crasher)
    pipeline = tmp_path / "two.py"
    pipeline.write_text(TWO_STEPS)
    first = await run_cli(
        "run", str(pipeline), "--set", "task=go", "--policy", "edit", "--json",
        "--cwd", str(project), cwd=tmp_path, state=state_dir,
    )  # fmt: skip
    assert first.returncode == EXIT_FAILED, first.stderr.decode()
    run_id = as_json(first)["runId"]
    # a failed run offers no whole-run apply, only a look
    text = await run_cli(
        "run", str(pipeline), "--set", "task=go", "--policy", "edit",
        "--cwd", str(project), "--no-progress", cwd=tmp_path, state=state_dir,
    )  # fmt: skip
    assert "to apply" not in text.stderr.decode()
    (project / "README.md").write_text("# edited meanwhile\n")
    resumed = await run_cli("resume", run_id[:6], "--json", cwd=tmp_path, state=state_dir)
    assert resumed.returncode == EXIT_WORKSPACE_CHANGED, resumed.stderr.decode()
    error = as_json(resumed)
    valid(error)
    assert (error["exitCode"], error["runId"], error["paths"]) == (3, run_id, ["README.md"])
    assert error["error"]["type"] == "ResumeConflict"


async def test_a_running_run_is_neither_resumed_nor_applied_elsewhere(
    tmp_path: Path, project: Path, state_dir: Path
) -> None:
    """While a run runs, resume and apply of it from another process exit 1 and change nothing."""
    staller = write_agent(tmp_path / "staller.json", Turn(steps=(Say("working"), Stall())))
    agent = f"staller={shlex.join(agent_command(staller))}"
    env = {**os.environ, "ORCHESTRATOR_STATE_DIR": str(state_dir)}
    argv = [str(CLI), "compare", "--agent", agent, "--cwd", str(project), "--no-progress", "go"]
    with trio.fail_after(CLI_LIMIT):
        running = await trio.lowlevel.open_process(argv, cwd=tmp_path, env=env)
        try:
            while not prompts(staller):
                assert running.poll() is None
                await trio.sleep(0.05)
            [run] = as_json(await run_cli("runs", "--json", cwd=tmp_path, state=state_dir))["runs"]
            resumed = await run_cli("resume", run["runId"], "--json", cwd=tmp_path, state=state_dir)
            assert resumed.returncode == EXIT_FAILED, resumed.stderr.decode()
            assert "running in another process" in as_json(resumed)["error"]["message"]
            applied = await run_cli(
                "apply", run["runId"][:5], "--step", "compare[staller]", "--json",
                cwd=tmp_path, state=state_dir,
            )  # fmt: skip
            assert applied.returncode == EXIT_FAILED, applied.stderr.decode()
            refusal = as_json(applied)
            valid(refusal)
            assert (refusal["runId"], refusal["applied"]) == (run["runId"], False)
            assert refusal["error"]["type"] == "RunBusy"
            assert prompts(staller) == 1  # the resume started no agent
        finally:
            running.send_signal(signal.SIGINT)
            await running.wait()
    listed = await run_cli("runs", "--json", cwd=tmp_path, state=state_dir)
    assert [r["status"] for r in as_json(listed)["runs"]] == ["interrupted"]


async def test_runs_lists_one_line_per_run_whatever_the_task(
    tmp_path: Path, project: Path, state_dir: Path
) -> None:
    """A task holding newlines is listed on one line."""
    script = write_agent(tmp_path / "s.json", Turn(steps=(Say("hi"),)))
    agent = f"s={shlex.join(agent_command(script))}"
    done = await run_cli(
        "compare", "--agent", agent, "--cwd", str(project), "first\nsecond",
        cwd=tmp_path, state=state_dir,
    )  # fmt: skip
    assert done.returncode == EXIT_OK, done.stderr.decode()
    listed = (await run_cli("runs", cwd=tmp_path, state=state_dir)).stdout.decode()
    assert listed.count("\n") == 1 and "first second" in listed


def test_report_paths_are_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """render_report into a relative directory returns absolute paths (file:// URIs work)."""
    monkeypatch.chdir(tmp_path)
    result = {"kind": "compare", "runId": "0123456789ab", "status": "succeeded", "agents": []}
    paths = render_report(result, "out")
    assert paths.html.is_absolute()
    assert paths.html.as_uri().startswith("file://")
