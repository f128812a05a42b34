"""``orchestrator prune`` and the store's size in ``runs``, through the console script."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import trio
from run_helpers import (
    CLI,
    CLI_LIMIT,
    agent_command,
    as_json,
    one_line_error,
    prompts,
    run_cli,
    snapshot,
    write_agent,
)

from orchestrator.cli.output import output_schema
from orchestrator.testing import Say, Stall, Turn

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CLI.is_file(), reason=f"console script {CLI} not installed"),
]

SAMPLE = Path(__file__).resolve().parent.parent / "examples" / "sample-project"
EDIT = 'replace "colour" with "color" in **/*.md'


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A fresh copy of the sample project."""
    root = tmp_path / "sample-project"
    shutil.copytree(SAMPLE, root, ignore=shutil.ignore_patterns("__pycache__"))
    return root


async def cli(tmp_path: Path, state: Path, *args: str) -> Any:
    """Run a command with ``--json``; its object, checked against the schema (exit 0)."""
    done = await run_cli(*args, "--json", cwd=tmp_path, state=state)
    assert done.returncode == 0, done.stderr.decode()
    document = as_json(done)
    jsonschema.Draft202012Validator(output_schema()).validate(document)
    return document


async def demo_prompt(tmp_path: Path, project: Path, state: Path) -> str:
    """Run the demo agent's edit on ``project`` (not applied); the run's id."""
    result = await cli(tmp_path, state, "prompt", "--agent", "demo", "--policy", "edit",
                       "--cwd", str(project), EDIT)  # fmt: skip
    return str(result["runId"])


async def test_prune_keeps_what_the_remaining_run_shares(
    tmp_path: Path, project: Path, state_dir: Path
) -> None:
    """Pruning the older of two runs that wrote the same content: the newer still shows its
    diff and applies; runs shows the store smaller; a dry run first deleted nothing."""
    old = await demo_prompt(tmp_path, project, state_dir)
    new = await demo_prompt(tmp_path, project, state_dir)
    before = await cli(tmp_path, state_dir, "runs")
    assert before["store"]["bytes"] == (
        before["store"]["databaseBytes"] + before["store"]["fileBytes"]
    )
    listed = await run_cli("runs", cwd=tmp_path, state=state_dir)
    assert len(listed.stdout.decode().splitlines()) == 2  # a line per run, nothing else
    assert listed.stderr.decode().splitlines()[-1].startswith("store: ")
    diff = (await run_cli("diff", new, cwd=tmp_path, state=state_dir)).stdout
    assert b"+" in diff and b"color" in diff
    files = snapshot(state_dir)

    dry = await cli(tmp_path, state_dir, "prune", old[:6], "--dry-run")
    assert dry["dryRun"] and [r["runId"] for r in dry["deleted"]] == [old]
    assert snapshot(state_dir) == files  # not a byte changed
    text = await run_cli("prune", old, "--dry-run", cwd=tmp_path, state=state_dir)
    assert text.returncode == 0 and b"would delete 1 run, freeing" in text.stdout

    done = await cli(tmp_path, state_dir, "prune", old)
    assert [r["runId"] for r in done["deleted"]] == [old]
    assert (done["bytesFreed"], done["fileBytes"]) == (dry["bytesFreed"], dry["fileBytes"])
    assert [r["runId"] for r in (await cli(tmp_path, state_dir, "runs"))["runs"]] == [new]
    assert not (state_dir / "runs" / old).exists()
    shown = await run_cli("show", new, "--diff", cwd=tmp_path, state=state_dir)
    assert shown.returncode == 0 and diff in shown.stdout
    assert (await run_cli("diff", new, cwd=tmp_path, state=state_dir)).stdout == diff
    applied = await cli(tmp_path, state_dir, "apply", new)
    assert applied["applied"] is True
    assert "colour" not in (project / "README.md").read_text()


async def test_a_running_run_is_never_pruned(
    tmp_path: Path, project: Path, state_dir: Path
) -> None:
    """While a run runs, prune --keep 0 deletes the finished runs and keeps it, saying why."""
    finished = await demo_prompt(tmp_path, project, state_dir)
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
            listed = (await cli(tmp_path, state_dir, "runs"))["runs"]
            live = next(r["runId"] for r in listed if r["runId"] != finished)
            done = await cli(tmp_path, state_dir, "prune", "--keep", "0")
            assert [r["runId"] for r in done["deleted"]] == [finished]
            assert done["skipped"] == [
                {"runId": live, "reason": "it is running, resumed or applied"}
            ]
            by_id = await run_cli("prune", live, cwd=tmp_path, state=state_dir)
            assert by_id.returncode == 0
            assert f"kept {live}: it is running" in by_id.stdout.decode()
            assert running.poll() is None
        finally:
            running.send_signal(signal.SIGINT)
            await running.wait()
    [left] = (await cli(tmp_path, state_dir, "runs"))["runs"]
    assert (left["runId"], left["status"]) == (live, "interrupted")
    assert (await cli(tmp_path, state_dir, "prune", "--older-than", "0s"))["deleted"][0][
        "runId"
    ] == live
    assert os.listdir(state_dir / "runs") == []


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ((), "nothing chosen to prune"),
        (("--older-than", "2026-13-01"), "argument --older-than: not a date or an age"),
        (("--older-than", "7 days"), "argument --older-than: not a date or an age"),
        (("--keep", "-1"), "argument --keep: must not be below 0"),
        (("abcdef",), "no run 'abcdef'"),
        (("abc", "--keep", "2"), "not both"),
    ],
)
async def test_bad_selectors_are_one_line_usage_errors(
    tmp_path: Path, project: Path, state_dir: Path, args: tuple[str, ...], says: str
) -> None:
    """No selector, a bad date or age, a bad count, an unknown id: exit 2, one line."""
    kept = await demo_prompt(tmp_path, project, state_dir)
    done = await run_cli("prune", *args, cwd=tmp_path, state=state_dir)
    assert says in one_line_error(done)
    assert "Traceback" not in done.stderr.decode()
    assert [r["runId"] for r in (await cli(tmp_path, state_dir, "runs"))["runs"]] == [kept]


async def test_a_run_whose_apply_was_interrupted_is_kept_until_it_is_finished(
    tmp_path: Path, state_dir: Path
) -> None:
    """An apply killed midway keeps its run (its journal still needs it) until apply finishes."""
    from test_apply_workspace import kill_apply_midway

    files = tmp_path / "files"
    files.mkdir()
    for i in range(4):
        (files / f"f{i}.txt").write_text(f"old {i}\n")
    ran = await cli(tmp_path, state_dir, "prompt", "--agent", "demo", "--policy", "trusted",
                    "--cwd", str(files), "replace 'old' with 'new' in f*.txt")  # fmt: skip
    run_id = ran["runId"]
    kill_apply_midway(files, state_dir, run_id, tmp_path / "marker")
    done = await cli(tmp_path, state_dir, "prune", "--keep", "0")
    assert done["deleted"] == []
    [kept] = done["skipped"]
    assert kept["runId"] == run_id and "apply of it was interrupted" in kept["reason"]
    await cli(tmp_path, state_dir, "apply", run_id)  # finishes the interrupted apply
    assert [(files / f"f{i}.txt").read_text() for i in range(4)] == [f"new {i}\n" for i in range(4)]
    done = await cli(tmp_path, state_dir, "prune", "--keep", "0")
    assert [r["runId"] for r in done["deleted"]] == [run_id]
