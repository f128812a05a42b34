"""``orchestrator compare`` picks: who succeeded, who won, and the exit code that follows.

The console script runs as a subprocess against scripted agents (also subprocesses), each
given as ``NAME=COMMAND``. An agent succeeds only when its turn ends ``end_turn`` and its
``--verify`` command passes; a comparison succeeds when at least one agent did.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
from run_helpers import (
    CLI,
    agent_command,
    as_json,
    project_config,
    run_cli,
    snapshot,
    write_script,
)

from orchestrator.testing import Say, Turn, WriteDisk
from orchestrator.testing.script import StopReason

EXIT_OK, EXIT_FAILED = 0, 1

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CLI.is_file(), reason=f"console script {CLI} not installed"),
]

#: the verify command: an agent passes when it wrote ok.txt
VERIFY = "test -f ok.txt"

PIPELINE = """\
from orchestrator import step


@step(agent="writer")
def write(task: str) -> str:
    return f"write {task}"


@step()
def after(write: object) -> str:
    return "done"


@step()
def unrelated() -> int:
    return 1
"""


class Project:
    """A workspace and a folder for the agents' scripts."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.workspace = root / "project"
        self.workspace.mkdir()
        (self.workspace / "README.md").write_text("hello\n")
        self.scripts = root / "agents"
        self.scripts.mkdir()

    def agent(self, name: str, turn: Turn) -> str:
        """``NAME=COMMAND`` for an agent that plays ``turn``."""
        script = write_script(self.scripts / f"{name}.json", turn)
        return f"{name}={shlex.join(agent_command(script))}"

    async def compare(
        self,
        state: Path,
        *agents: str,
        verify: str | None = VERIFY,
        as_json: bool = True,
        extra: tuple[str, ...] = (),
    ) -> subprocess.CompletedProcess[bytes]:
        """Run ``compare`` over ``agents`` (``NAME=COMMAND``); the finished process."""
        argv = ["compare", "--cwd", str(self.workspace), "--no-progress", *extra]
        if as_json:
            argv.append("--json")
        for agent in agents:
            argv += ["--agent", agent]
        if verify is not None:
            argv += ["--verify", verify]
        return await run_cli(*argv, "do the task", cwd=self.root, state=state)


@pytest.fixture
def project(tmp_path: Path) -> Project:
    """See :class:`Project`."""
    return Project(tmp_path)


def writes(*files: tuple[str, str]) -> Turn:
    """A turn that writes ``files`` (path, content) to disk and ends ``end_turn``."""
    return Turn(steps=(*(WriteDisk(path=p, content=c) for p, c in files), Say(text="done")))


def by_name(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The agents of a compare result, by name."""
    return {a["name"]: a for a in result["agents"]}


# --------------------------------------------------------------------------- verify


async def test_every_agent_failing_verify_exits_1_without_a_winner(
    project: Project, state_dir: Path
) -> None:
    """No agent passes verify: exit 1, status failed, succeeded [], winner null, each failed."""
    done = await project.compare(
        state_dir,
        project.agent("alice", writes(("a.txt", "a\n"))),
        project.agent("bob", writes(("b.txt", "b\n"))),
    )
    assert done.returncode == EXIT_FAILED, done.stderr.decode()
    result = as_json(done)
    assert result["status"] == "failed"
    assert result["succeeded"] == []
    assert result["winner"] is None
    for agent in result["agents"]:
        assert agent["status"] == "failed"
        assert agent["error"] == "verify failed: exit 1"
        assert agent["verify"]["exitCode"] == 1
    shown = as_json(
        await run_cli("show", result["runId"], "--json", cwd=project.root, state=state_dir)
    )
    assert (shown["status"], shown["succeeded"], shown["winner"]) == ("failed", [], None)


async def test_the_agent_that_passes_verify_wins_and_the_others_stay_in_the_store(
    project: Project, state_dir: Path
) -> None:
    """One agent passes: exit 0 and it wins; the failed one's branch is kept in the store."""
    before = snapshot(project.workspace)
    done = await project.compare(
        state_dir,
        project.agent("alice", writes(("b.txt", "bad\n"))),
        project.agent("bob", writes(("ok.txt", "ok\n"), ("more.txt", "1\n2\n3\n"))),
    )
    assert done.returncode == EXIT_OK, done.stderr.decode()
    result = as_json(done)
    run_id = result["runId"]
    assert result["status"] == "succeeded"
    assert result["succeeded"] == ["bob"]
    assert result["winner"] == "bob"
    agents = by_name(result)
    assert (agents["alice"]["status"], agents["alice"]["error"]) == (
        "failed",
        "verify failed: exit 1",
    )
    assert (agents["bob"]["status"], agents["bob"]["error"]) == ("succeeded", None)
    assert snapshot(project.workspace) == before

    # the recorded run gives the same verdict, as JSON and as text
    shown = await run_cli("show", run_id, "--json", cwd=project.root, state=state_dir)
    assert (as_json(shown)["succeeded"], as_json(shown)["winner"]) == (["bob"], "bob")
    text = (await run_cli("show", run_id, cwd=project.root, state=state_dir)).stdout.decode()
    assert "winner: bob (verify passed, 4 lines changed, " in text, text

    # the failed agent's branch is kept: its diff, and a deliberate apply of it
    diff = await run_cli(
        "diff", run_id, "--step", "compare[alice]", cwd=project.root, state=state_dir
    )
    assert "+bad" in diff.stdout.decode(), diff.stderr.decode()
    applied = await run_cli(
        "apply", run_id, "--step", "compare[alice]", cwd=project.root, state=state_dir
    )
    assert applied.returncode == EXIT_OK, applied.stderr.decode()
    assert (project.workspace / "b.txt").read_text() == "bad\n"
    assert not (project.workspace / "ok.txt").exists()


async def test_apply_of_an_agent_that_failed_writes_nothing_and_exits_1(
    project: Project, state_dir: Path
) -> None:
    """--apply NAME of an agent that failed verify writes nothing, even if another agent won."""
    before = snapshot(project.workspace)
    done = await project.compare(
        state_dir,
        project.agent("alice", writes(("b.txt", "bad\n"))),
        project.agent("bob", writes(("ok.txt", "ok\n"))),
        extra=("--apply", "alice"),
    )
    assert done.returncode == EXIT_FAILED, done.stderr.decode()
    result = as_json(done)
    assert (result["winner"], result["applied"]) == ("bob", None)
    assert snapshot(project.workspace) == before


# --------------------------------------------------------------------------- stop reasons


async def test_a_turn_that_did_not_end_end_turn_fails_its_agent(
    project: Project, state_dir: Path
) -> None:
    """cancelled, max_tokens, refusal, max_turn_requests: each such agent failed, with why."""
    reasons: tuple[StopReason, ...] = ("cancelled", "max_tokens", "refusal", "max_turn_requests")
    agents = [project.agent("fine", writes(("ok.txt", "ok\n")))]
    for reason in reasons:
        turn = Turn(steps=(WriteDisk(path="ok.txt", content=f"{reason}\n"),), stop_reason=reason)
        agents.append(project.agent(reason, turn))
    done = await project.compare(state_dir, *agents)
    assert done.returncode == EXIT_OK, done.stderr.decode()
    result = as_json(done)
    assert (result["succeeded"], result["winner"]) == (["fine"], "fine")
    found = by_name(result)
    for reason in reasons:
        assert found[reason]["stopReason"] == reason
        assert found[reason]["verify"]["exitCode"] == 0  # verify passed, the turn did not
        assert (found[reason]["status"], found[reason]["error"]) == (
            "failed",
            f"turn ended {reason}",
        )


async def test_without_verify_a_comparison_of_stopped_turns_fails(
    project: Project, state_dir: Path
) -> None:
    """No --verify, every turn ended max_tokens: exit 1 and no winner."""
    turn = Turn(steps=(Say(text="ran out"),), stop_reason="max_tokens")
    done = await project.compare(
        state_dir, project.agent("alice", turn), project.agent("bob", turn), verify=None
    )
    assert done.returncode == EXIT_FAILED, done.stderr.decode()
    result = as_json(done)
    assert (result["status"], result["succeeded"], result["winner"]) == ("failed", [], None)
    assert {a["error"] for a in result["agents"]} == {"turn ended max_tokens"}


# --------------------------------------------------------------------------- the winner


async def test_fewest_changed_lines_wins_among_those_that_passed(
    project: Project, state_dir: Path
) -> None:
    """Two agents pass verify: the one with fewer added+removed lines wins, in both outputs."""
    done = await project.compare(
        state_dir,
        project.agent("wordy", writes(("ok.txt", "1\n2\n3\n"), ("extra.txt", "x\n"))),
        project.agent("terse", writes(("ok.txt", "ok\n"))),
        project.agent("broken", writes(("nothing.txt", "-\n"))),
    )
    assert done.returncode == EXIT_OK, done.stderr.decode()
    result = as_json(done)
    assert result["succeeded"] == ["wordy", "terse"]  # in the order given
    assert result["winner"] == "terse"

    text = await project.compare(
        state_dir,
        project.agent("wordy2", writes(("ok.txt", "1\n2\n"))),
        project.agent("terse2", writes(("ok.txt", "ok\n"))),
        as_json=False,
    )
    assert text.returncode == EXIT_OK, text.stderr.decode()
    out = text.stdout.decode()
    assert "winner: terse2 (verify passed, 1 line changed, " in out, out
    [marked] = [line for line in out.splitlines() if line.lstrip().startswith("*")]
    assert "terse2" in marked


# --------------------------------------------------------------------------- pipelines


async def test_a_pipeline_agent_step_ending_refusal_fails_and_skips_descendants(
    project: Project, state_dir: Path
) -> None:
    """An agent step whose turn ends refusal fails the run; its descendant is skipped."""
    script = write_script(
        project.scripts / "writer.json",
        Turn(steps=(WriteDisk(path="x.txt", content="x\n"),), stop_reason="refusal"),
    )
    command = json.dumps(agent_command(script))
    project_config(project.workspace, f"[agents.writer]\ncommand = {command}\n")
    pipeline = project.root / "refuse.py"
    pipeline.write_text(PIPELINE)
    done = await run_cli(
        "run", str(pipeline), "--cwd", str(project.workspace), "--set", "task=x", "--json",
        "--no-progress", cwd=project.root, state=state_dir,
    )  # fmt: skip
    assert done.returncode == EXIT_FAILED, done.stderr.decode()
    result = as_json(done)
    assert result["status"] == "failed"
    steps = result["steps"]
    assert steps["write"]["status"] == "failed"
    assert steps["write"]["error"] == "turn ended refusal"
    assert steps["write"]["instances"]["write"]["error"] == "turn ended refusal"
    assert steps["after"]["status"] == "skipped"
    assert steps["after"]["cause"] == "skipped because write failed"
    assert steps["unrelated"]["status"] == "succeeded"


async def test_a_comparison_of_one_agent_names_its_instance_after_the_agent(
    project: Project, state_dir: Path
) -> None:
    """compare with one --agent: its instance is compare[NAME], applied by that name."""
    alice = project.agent("alice", Turn(steps=(WriteDisk("ok.txt", "ok\n"), Say("done"))))
    done = await project.compare(state_dir, alice)
    assert done.returncode == EXIT_OK, done.stderr.decode()
    result = as_json(done)
    assert [a["name"] for a in result["agents"]] == ["alice"]
    assert (result["succeeded"], result["winner"]) == (["alice"], "alice")
    applied = await run_cli(
        "apply", result["runId"], "--step", "compare[alice]", "--json",
        cwd=project.root, state=state_dir,
    )  # fmt: skip
    assert applied.returncode == EXIT_OK, applied.stderr.decode()
    assert as_json(applied)["written"] == ["ok.txt"]
    assert (project.workspace / "ok.txt").read_text() == "ok\n"
