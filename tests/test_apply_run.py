"""Applying recorded runs: ``orchestrator apply`` for every kind of run, refusals, exit codes.

The console script runs as a subprocess against scripted agents (subprocesses too) named in the
workspace's ``.orchestrator.toml``. Exit codes: 3 when files changed in the workspace since the
run, 4 for merge conflicts between branches. (The library side is in ``test_runs.py``.)
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from run_helpers import (
    CLI,
    agent_command,
    as_json,
    immutable,
    project_config,
    run_cli,
    run_console,
    snapshot,
    write_script,
)

from orchestrator.store import open_run_store
from orchestrator.testing import DeleteDisk, Say, Terminal, Turn, WriteDisk, WriteFile

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
EXIT_WORKSPACE_CHANGED, EXIT_MERGE_CONFLICTS = 3, 4

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CLI.is_file(), reason=f"console script {CLI} not installed"),
]

FAN_OUT = """\
from orchestrator import step


@step(agent=["a", "b"])
def edit(task: str) -> str:
    return task
"""

TWO_SINKS = """\
from orchestrator import step


@step(agent="a")
def left(task: str) -> str:
    return task


@step(agent="b")
def right(task: str) -> str:
    return task
"""

ONE = """\
from orchestrator import step


@step(agent="a")
def edit(task: str) -> str:
    return task
"""


class Project:
    """A workspace, pipeline files beside it and the scripts of agents ``a`` and ``b``."""

    def __init__(self, root: Path, files: dict[str, str]) -> None:
        self.root = root
        self.path = root / "project"
        self.path.mkdir()
        for name, text in files.items():
            (self.path / name).write_text(text)
        (root / "agents").mkdir()

    def agents(self, **turns: Turn) -> None:
        """Agent NAME plays ``turns[NAME]`` (written to the workspace's .orchestrator.toml)."""
        lines = []
        for name, turn in turns.items():
            script = write_script(self.root / "agents" / f"{name}.json", turn)
            lines += [f"[agents.{name}]", f"command = {json.dumps(agent_command(script))}", ""]
        project_config(self.path, "\n".join(lines))

    def pipeline(self, text: str) -> str:
        """A pipeline file beside the workspace."""
        path = self.root / "pipeline.py"
        path.write_text(text)
        return str(path)

    async def cli(self, *args: str, state: Path) -> subprocess.CompletedProcess[bytes]:
        """The console script, in the directory above the workspace."""
        return await run_cli(*args, cwd=self.root, state=state)

    async def run(self, text: str, state: Path, *extra: str) -> subprocess.CompletedProcess[bytes]:
        """``orchestrator run`` of the pipeline ``text`` with ``--json``."""
        return await self.cli(
            "run", self.pipeline(text), "--cwd", str(self.path), "--set", "task=go",
            "--policy", "trusted", "--json", "--no-progress", *extra, state=state,
        )  # fmt: skip


def writes(*files: tuple[str, str]) -> Turn:
    """A turn writing ``files`` through fs/write_text_file."""
    return Turn(steps=(*(WriteFile(path=p, content=c) for p, c in files), Say(text="done")))


def run_id_of(done: subprocess.CompletedProcess[bytes]) -> str:
    """The run id of a ``--json`` run or comparison."""
    return str(as_json(done)["runId"])


def err(done: subprocess.CompletedProcess[bytes]) -> str:
    """The command's standard error, decoded."""
    return done.stderr.decode()


@pytest.fixture
def project(tmp_path: Path) -> Project:
    """A workspace holding README.md and keep.txt."""
    return Project(tmp_path, {"README.md": "hello\n", "keep.txt": "kept\n"})


# --------------------------------------------------------------------------- steps and instances


async def test_apply_a_fanned_out_step_applies_its_instances_merged(
    project: Project, state_dir: Path
) -> None:
    """apply --step STEP writes every instance's files, merged; the JSON names the full run id."""
    project.agents(a=writes(("a.txt", "from a\n")), b=writes(("b.txt", "from b\n")))
    run_id = run_id_of(await project.run(FAN_OUT, state_dir))
    done = await project.cli("apply", run_id[:6], "--step", "edit", "--json", state=state_dir)
    assert done.returncode == EXIT_OK, err(done)
    result = as_json(done)
    assert result["runId"] == run_id
    assert (result["applied"], sorted(result["written"])) == (True, ["a.txt", "b.txt"])
    assert sorted(result["keys"]) == ["edit[a]", "edit[b]"]
    assert (project.path / "a.txt").read_text() == "from a\n"
    assert (project.path / "b.txt").read_text() == "from b\n"


async def test_apply_a_step_whose_instances_conflict_exits_4_naming_the_file(
    project: Project, state_dir: Path
) -> None:
    """apply --step STEP whose instances changed one file differently: exit 4, nothing written."""
    project.agents(a=writes(("README.md", "by a\n")), b=writes(("README.md", "by b\n")))
    run_id = run_id_of(await project.run(FAN_OUT, state_dir))
    before = snapshot(project.path)
    done = await project.cli("apply", run_id, "--step", "edit", "--json", state=state_dir)
    assert done.returncode == EXIT_MERGE_CONFLICTS, err(done)
    result = as_json(done)
    assert (result["runId"], result["applied"]) == (run_id, False)
    assert result["error"]["type"] == "UnsettledConflicts"
    assert "README.md" in result["error"]["message"]
    assert "edit[a]" in result["error"]["message"]
    assert snapshot(project.path) == before
    one = await project.cli("apply", run_id, "--step", "edit[b]", state=state_dir)
    assert one.returncode == EXIT_OK, err(one)
    assert (project.path / "README.md").read_text() == "by b\n"


async def test_apply_compare_without_an_agent_is_a_usage_error_naming_the_agents(
    project: Project, state_dir: Path
) -> None:
    """apply --step compare (no agent) exits 2 and names compare[a] and compare[b]."""
    project.agents(a=writes(("a.txt", "from a\n")), b=writes(("b.txt", "from b\n")))
    done = await project.cli(
        "compare", "--agent", "a", "--agent", "b", "--cwd", str(project.path),
        "--policy", "trusted", "--json", "--no-progress", "go", state=state_dir,
    )  # fmt: skip
    assert done.returncode == EXIT_OK, err(done)
    run_id = run_id_of(done)
    before = snapshot(project.path)
    for step in (["--step", "compare"], []):
        refused = await project.cli("apply", run_id, *step, state=state_dir)
        assert refused.returncode == EXIT_USAGE, err(refused)
        assert "compare[a]" in err(refused) and "compare[b]" in err(refused)
    assert snapshot(project.path) == before


async def test_another_agent_of_a_comparison_applies_after_the_first_checked_like_any(
    project: Project, state_dir: Path
) -> None:
    """compare --apply a, then compare[b] applies; compare[a] again is refused: already applied."""
    project.agents(
        a=writes(("a.txt", "from a\n")), b=writes(("b.txt", "from b\n"), ("a.txt", "b's a\n"))
    )
    done = await project.cli(
        "compare", "--agent", "a", "--agent", "b", "--cwd", str(project.path),
        "--policy", "trusted", "--json", "--no-progress", "--apply", "a", "go", state=state_dir,
    )  # fmt: skip
    assert done.returncode == EXIT_OK, err(done)
    run_id = run_id_of(done)
    assert as_json(done)["applied"] == "a"

    # b also wrote a.txt, which a's apply created since the run: refused, nothing written
    refused = await project.cli("apply", run_id, "--step", "compare[b]", "--json", state=state_dir)
    assert refused.returncode == EXIT_WORKSPACE_CHANGED, err(refused)
    assert as_json(refused)["workspaceChanged"] == ["a.txt"]
    assert not (project.path / "b.txt").exists()

    again = await project.cli("apply", run_id, "--step", "compare[a]", state=state_dir)
    assert again.returncode == EXIT_FAILED, err(again)
    assert f"compare[a] of run {run_id} was already applied at" in err(again)

    (project.path / "a.txt").unlink()  # the user takes a's file back: b applies
    applied = await project.cli("apply", run_id, "--step", "compare[b]", state=state_dir)
    assert applied.returncode == EXIT_OK, err(applied)
    assert (project.path / "b.txt").read_text() == "from b\n"
    async with open_run_store(state_dir) as store:
        keys = [a.keys for a in await store.applies(run_id)]
    assert keys == [("compare[a]",), ("compare[b]",)]


# --------------------------------------------------------------------------- refusals


async def test_run_with_merge_conflicts_exits_4_and_apply_refuses_with_4(
    project: Project, state_dir: Path
) -> None:
    """Two sinks change one file differently: run exits 4 (conflicts); apply exits 4 saying why."""
    project.agents(a=writes(("README.md", "by a\n")), b=writes(("README.md", "by b\n")))
    before = snapshot(project.path)
    done = await project.run(TWO_SINKS, state_dir, "--apply")
    assert done.returncode == EXIT_MERGE_CONFLICTS, err(done)
    assert as_json(done)["status"] == "conflicts"
    run_id = run_id_of(done)
    refused = await project.cli("apply", run_id, state=state_dir)
    assert refused.returncode == EXIT_MERGE_CONFLICTS, err(refused)
    assert "merge conflicts to settle" in err(refused) and "README.md" in err(refused)
    assert snapshot(project.path) == before


async def test_apply_twice_is_refused_saying_when(project: Project, state_dir: Path) -> None:
    """A second apply of the same run exits 1: already applied at TIME; nothing is written."""
    project.agents(a=writes(("README.md", "by a\n")))
    run_id = run_id_of(await project.run(ONE, state_dir))
    first = await project.cli("apply", run_id, "--json", state=state_dir)
    assert first.returncode == EXIT_OK, err(first)
    at = as_json(first)["at"]
    (project.path / "README.md").write_text("hello\n")  # even with the base back
    second = await project.cli("apply", run_id, "--json", state=state_dir)
    assert second.returncode == EXIT_FAILED, err(second)
    result = as_json(second)
    assert (result["runId"], result["applied"]) == (run_id, False)
    assert result["error"]["type"] == "AlreadyApplied"
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))
    assert f"run {run_id} was already applied at {when}" in result["error"]["message"]
    assert (project.path / "README.md").read_text() == "hello\n"


async def test_apply_of_a_run_that_changed_nothing_says_nothing_to_apply(
    project: Project, state_dir: Path
) -> None:
    """A run with no changes: 'nothing to apply', exit 0, applied false; nothing recorded."""
    project.agents(a=Turn(steps=(Say(text="nothing to do"),)))
    run_id = run_id_of(await project.run(ONE, state_dir))
    done = await project.cli("apply", run_id, "--json", state=state_dir)
    assert done.returncode == EXIT_OK, err(done)
    result = as_json(done)
    assert (result["applied"], result["written"], result["workspaceChanged"]) == (False, [], [])
    human = await project.cli("apply", run_id, state=state_dir)
    assert human.returncode == EXIT_OK
    assert f"nothing to apply: run {run_id} changed no files" in err(human)
    async with open_run_store(state_dir) as store:
        assert await store.applies(run_id) == []
        assert (await store.get_run(run_id)).applied is None


# --------------------------------------------------------------------------- workspace changed


async def test_run_apply_with_the_workspace_changed_underneath_exits_3_and_applies_later(
    project: Project, state_dir: Path
) -> None:
    """run --apply: a file changed underneath leaves the run succeeded, unapplied, exit 3;
    its change is kept (diff shows it) and apply writes it once the file is back."""
    readme = project.path / "README.md"
    project.agents(
        a=Turn(
            steps=(
                WriteFile(path="README.md", content="by the agent\n"),
                WriteFile(path="new.txt", content="new\n"),
                WriteDisk(path=str(readme), content="someone else\n"),  # the user, meanwhile
                Say(text="done"),
            )
        )
    )
    done = await project.run(ONE, state_dir, "--apply")
    assert done.returncode == EXIT_WORKSPACE_CHANGED, err(done)
    result = as_json(done)
    assert (result["status"], result["applied"]) == ("succeeded", False)
    assert result["workspaceChanged"] == ["README.md"]
    assert {c["path"] for c in result["changes"]} == {"README.md", "new.txt"}
    assert readme.read_text() == "someone else\n"
    assert not (project.path / "new.txt").exists()
    run_id = run_id_of(done)

    diff = await project.cli("diff", run_id, state=state_dir)
    assert "+by the agent" in diff.stdout.decode()
    refused = await project.cli("apply", run_id, state=state_dir)
    assert refused.returncode == EXIT_WORKSPACE_CHANGED
    assert "README.md" in err(refused)

    readme.write_text("hello\n")  # the run's base again
    applied = await project.cli("apply", run_id, state=state_dir)
    assert applied.returncode == EXIT_OK, err(applied)
    assert readme.read_text() == "by the agent\n"
    assert (project.path / "new.txt").read_text() == "new\n"


# --------------------------------------------------------------------------- a new git branch


def git(repo: Path, *args: str) -> str:
    """Run git in ``repo``; its output."""
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com"}
    env |= {"GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}
    done = subprocess.run(
        ["git", *args], cwd=repo, env=env, capture_output=True, text=True, check=True
    )
    return done.stdout


def git_state(repo: Path) -> tuple[Any, ...]:
    """HEAD, the current branch, the index file and the working tree (.git aside)."""
    tree = {p: data for p, data in snapshot(repo).items() if not p.startswith(".git/")}
    return (
        git(repo, "rev-parse", "HEAD"),
        git(repo, "symbolic-ref", "HEAD"),
        (repo / ".git" / "index").read_bytes(),
        tree,
    )


@pytest.fixture
def repo(project: Project) -> Project:
    """The workspace as a git repository with one commit (README.md, keep.txt, gone.txt)."""
    (project.path / "gone.txt").write_text("to delete\n")
    (project.path / ".gitignore").write_text(".orchestrator.toml\n")
    git(project.path, "init", "-q", "-b", "main")
    git(project.path, "add", "-A")
    git(project.path, "commit", "-q", "-m", "start")
    return project


async def test_apply_to_a_git_branch_leaves_the_checkout_alone(
    repo: Project, state_dir: Path
) -> None:
    """--git-branch: a new branch at HEAD plus the changes, one commit; tree, index, HEAD as
    they were; the same branch again, or a workspace outside git, is refused with exit 2."""
    repo.agents(
        a=Turn(
            steps=(
                WriteFile(path="README.md", content="by the agent\n"),
                WriteFile(path="docs/new.md", content="# New\n"),
                DeleteDisk(path="gone.txt"),
                Say(text="done"),
            )
        )
    )
    done = await repo.run(ONE, state_dir)
    assert done.returncode == EXIT_OK, err(done)
    run_id = run_id_of(done)
    head = git(repo.path, "rev-parse", "HEAD").strip()
    # a working-tree edit after the run does not matter: the branch is checked against HEAD
    (repo.path / "keep.txt").write_text("edited, not committed\n")
    before = git_state(repo.path)

    made = await repo.cli(
        "apply", run_id, "--git-branch", "agent/result", "--json", state=state_dir
    )
    assert made.returncode == EXIT_OK, err(made)
    result = as_json(made)
    assert (result["runId"], result["applied"], result["gitBranch"]) == (
        run_id,
        True,
        "agent/result",
    )
    assert git_state(repo.path) == before
    commit = result["gitCommit"]
    assert git(repo.path, "rev-parse", "agent/result").strip() == commit
    assert git(repo.path, "rev-parse", f"{commit}^").strip() == head
    files = git(repo.path, "ls-tree", "-r", "--name-only", "agent/result").split()
    assert sorted(files) == [".gitignore", "README.md", "docs/new.md", "keep.txt"]
    assert git(repo.path, "show", "agent/result:README.md") == "by the agent\n"
    assert git(repo.path, "show", "agent/result:keep.txt") == "kept\n"
    message = git(repo.path, "log", "-1", "--format=%B", "agent/result")
    assert run_id in message and "pipeline" in message and "go" in message.splitlines()[0]

    again = await repo.cli("apply", run_id, "--git-branch", "agent/result", state=state_dir)
    assert again.returncode == EXIT_USAGE
    assert "already exists" in err(again)
    # the working tree was never written: a working-tree apply is still to come
    applied = await repo.cli("apply", run_id, state=state_dir)
    assert applied.returncode == EXIT_OK, err(applied)
    assert (repo.path / "README.md").read_text() == "by the agent\n"
    assert not (repo.path / "gone.txt").exists()


async def test_apply_to_a_git_branch_checks_the_base_against_head(
    repo: Project, state_dir: Path
) -> None:
    """A file the run changed whose base is not HEAD's (uncommitted edit): exit 3, no branch."""
    (repo.path / "README.md").write_text("uncommitted\n")
    repo.agents(a=writes(("README.md", "by the agent\n")))
    run_id = run_id_of(await repo.run(ONE, state_dir))
    refused = await repo.cli("apply", run_id, "--git-branch", "x", "--json", state=state_dir)
    assert refused.returncode == EXIT_WORKSPACE_CHANGED, err(refused)
    assert as_json(refused)["workspaceChanged"] == ["README.md"]
    assert git(repo.path, "branch", "--list", "x") == ""


async def test_apply_to_a_git_branch_outside_git_exits_2(project: Project, state_dir: Path) -> None:
    """--git-branch in a workspace that is not a git repository: a usage error, exit 2."""
    project.agents(a=writes(("README.md", "by a\n")))
    run_id = run_id_of(await project.run(ONE, state_dir))
    done = await project.cli("apply", run_id, "--git-branch", "x", state=state_dir)
    assert done.returncode == EXIT_USAGE
    assert "not in a git repository" in err(done)


async def test_a_file_made_over_a_directory_of_ignored_files_names_them(
    project: Project, state_dir: Path
) -> None:
    """The agent replaces directory d (one file, d/a.txt) with a file d, while the workspace's
    d also holds an ignored file the run never copied: run --apply and apply refuse (exit 3)
    naming that file as in the way, not as changed during the run, and the file is kept."""
    (project.path / ".gitignore").write_text("*.log\n")
    (project.path / "d").mkdir()
    (project.path / "d" / "a.txt").write_text("a\n")
    (project.path / "d" / "x.log").write_text("mine\n")
    project.agents(
        a=Turn(steps=(Terminal("sh", args=("-c", "rm -rf d && echo file > d")), Say("done")))
    )
    done = await project.cli(
        "run", project.pipeline(ONE), "--cwd", str(project.path), "--set", "task=go",
        "--policy", "trusted", "--no-progress", "--apply", state=state_dir,
    )  # fmt: skip
    assert done.returncode == EXIT_WORKSPACE_CHANGED, err(done)
    said = done.stdout.decode()
    blocked = (
        "NOT applied: the run made d a file, and the workspace's directory there holds what "
        "the run did not copy: d/x.log"
    )
    assert blocked in said.splitlines(), said
    assert "changed in the workspace during the run" not in said
    assert (project.path / "d" / "x.log").read_text() == "mine\n"
    run_id = next(
        line.split()[1].rstrip(":") for line in said.splitlines() if line.startswith("run ")
    )

    refused = await project.cli("apply", run_id, state=state_dir)
    assert refused.returncode == EXIT_WORKSPACE_CHANGED
    assert blocked in err(refused), err(refused)
    assert "changed in the workspace since" not in err(refused)

    assert "once what is in the way is moved away" in said
    assert "as they were when the run started" not in said
    assert (
        "changed"
        not in as_json(await project.cli("apply", run_id, "--json", state=state_dir))["error"][
            "message"
        ]
    )

    (project.path / "d" / "x.log").unlink()  # out of the way: the apply goes through
    applied = await project.cli("apply", run_id, state=state_dir)
    assert applied.returncode == EXIT_OK, err(applied)
    assert (project.path / "d").read_text() == "file\n"


async def test_what_is_in_the_way_is_named_whatever_its_name_and_kind(
    project: Project, state_dir: Path
) -> None:
    """Where the agent made a file of directory d, names with a line break or a non-UTF-8
    byte, an empty directory and more entries than are shown stand in the way: apply names
    them on one line (escaped, in UTF-8 output too), says there are more, never claims d
    changed, and keeps them all."""
    d = project.path / "d"
    (project.path / ".gitignore").write_text("*.log\n")
    (d / "empty").mkdir(parents=True)
    (d / "a.txt").write_text("a\n")
    odd = [b"new\nNOT applied: fake.log", b"caf\xe9.log"]
    for name in odd:
        (d / os.fsdecode(name)).write_text("mine\n")
    for i in range(6):
        (d / f"x{i}.log").write_text("mine\n")
    project.agents(
        a=Turn(steps=(Terminal("sh", args=("-c", "rm -rf d && echo file > d")), Say("done")))
    )
    before = snapshot(d)
    done = await project.run(ONE, state_dir)
    assert done.returncode == EXIT_OK, err(done)
    refused = await run_console(
        "apply", run_id_of(done), cwd=project.root,
        env={"ORCHESTRATOR_STATE_DIR": str(state_dir), "PYTHONIOENCODING": "utf-8"},
    )  # fmt: skip
    assert refused.returncode == EXIT_WORKSPACE_CHANGED, err(refused)
    said = err(refused).splitlines()
    (line,) = [s for s in said if "NOT applied" in s]
    assert line.endswith(
        "NOT applied: the run made d a file, and the workspace's directory there holds what the "
        "run did not copy: d/caf\\xe9.log, d/new\\nNOT applied: fake.log, d/x0.log, d/x1.log, "
        "d/x2.log and more; none of its changes were written"
    ), line
    assert not any("changed" in s for s in said), said
    assert snapshot(d) == before


async def test_a_refused_compare_apply_names_the_agent_asked_for(
    project: Project, state_dir: Path
) -> None:
    """compare --apply b, refused because the user changed README.md during the run: the
    way to apply later names compare[b], not the winner's step."""
    readme = project.path / "README.md"
    project.agents(
        a=writes(("a.txt", "from a\n")),
        b=Turn(
            steps=(
                WriteFile(path="README.md", content="by b\n"),
                WriteDisk(path=str(readme), content="someone else\n"),
                Say(text="done"),
            )
        ),
    )
    done = await project.cli(
        "compare", "--agent", "a", "--agent", "b", "--cwd", str(project.path),
        "--policy", "trusted", "--no-progress", "--apply", "b", "go", state=state_dir,
    )  # fmt: skip
    assert done.returncode == EXIT_WORKSPACE_CHANGED, err(done)
    said = done.stdout.decode()
    assert "NOT applied: changed in the workspace during the run: README.md" in said, said
    assert "--step 'compare[b]'" in said, said
    assert "compare[a]" not in said, said


async def test_a_write_that_fails_midway_leaves_the_run_succeeded_and_applicable_later(
    project: Project, state_dir: Path
) -> None:
    """run --apply whose write fails (keep.txt immutable, the run deletes it): one line, no
    traceback, exit 1, nothing written; the run stays succeeded and apply works once the
    file can go."""
    keep = project.path / "keep.txt"
    if not immutable(keep, True):
        pytest.skip("chattr +i is refused here (it needs root and a file system with the flag)")
    try:
        project.agents(a=Turn(steps=(DeleteDisk("keep.txt"), *writes(("new.txt", "n\n")).steps)))
        before = snapshot(project.path)
        done = await project.cli(
            "run", project.pipeline(ONE), "--cwd", str(project.path), "--set", "task=go",
            "--policy", "trusted", "--no-progress", "--apply", state=state_dir,
        )  # fmt: skip
        assert done.returncode == EXIT_FAILED, err(done)
        assert "Traceback" not in err(done), err(done)
        (last,) = [line for line in err(done).splitlines() if "error:" in line]
        assert "changes were not applied: apply failed and was rolled back" in last, last
        assert snapshot(project.path) == before
    finally:
        immutable(keep, False)
    listed = as_json(await project.cli("runs", "--json", state=state_dir))
    runs = listed["runs"] if isinstance(listed, dict) else listed
    assert runs[0]["status"] == "succeeded"
    applied = await project.cli("apply", runs[0]["runId"], state=state_dir)
    assert applied.returncode == EXIT_OK, err(applied)
    assert not keep.exists()
    assert (project.path / "new.txt").read_text() == "n\n"


async def test_apply_names_changed_files_and_what_is_in_the_way_at_once(
    project: Project, state_dir: Path
) -> None:
    """README.md changed in the workspace since the run, and an ignored file stands where the
    run made file d: apply names both in one refusal, not one and then the other."""
    (project.path / ".gitignore").write_text("*.log\n")
    (project.path / "d").mkdir()
    (project.path / "d" / "a.txt").write_text("a\n")
    (project.path / "d" / "x.log").write_text("mine\n")
    project.agents(
        a=Turn(
            steps=(
                WriteFile(path="README.md", content="by the agent\n"),
                Terminal("sh", args=("-c", "rm -rf d && echo file > d")),
                Say("done"),
            )
        )
    )
    done = await project.run(ONE, state_dir)
    assert done.returncode == EXIT_OK, err(done)
    (project.path / "README.md").write_text("the user's\n")
    refused = await project.cli("apply", run_id_of(done), state=state_dir)
    assert refused.returncode == EXIT_WORKSPACE_CHANGED, err(refused)
    said = err(refused)
    assert "NOT applied: files changed in the workspace since the run: README.md" in said, said
    assert "holds what the run did not copy: d/x.log" in said, said
    assert (project.path / "d" / "x.log").read_text() == "mine\n"


def test_a_refusal_check_reads_each_file_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checking an apply reads a file the run changed once (through the workspace's
    snapshot); only a file the run made is looked for on disk again, for what is in its way."""
    from orchestrator.pipeline import branches as pipeline_branches
    from orchestrator.runs import apply as runs_apply
    from orchestrator.store.records import StoredChange
    from orchestrator.vfs._fileio import digest

    ws = tmp_path / "ws"
    (ws / "gone").mkdir(parents=True)
    (ws / "gone" / "kept.txt").write_text("kept\n")  # not deleted by the run: in the way
    for name in ("a.txt", "b.txt"):
        (ws / name).write_text(f"{name}\n")
    changes = [
        StoredChange("a.txt", "write", b"new a\n", base_digest=digest(b"a.txt\n")),
        StoredChange("b.txt", "write", b"new b\n", base_digest=digest(b"b.txt\n")),
        StoredChange("c.txt", "write", b"made\n"),
        StoredChange("gone", "write", b"a file where a directory is\n"),
    ]
    looked: list[str] = []
    real = pipeline_branches.disk_digest  # type: ignore[attr-defined]

    def counted(root: str, path: str) -> str | None:
        looked.append(path)
        return real(root, path)

    monkeypatch.setattr(pipeline_branches, "disk_digest", counted)
    moved = runs_apply._moved(runs_apply._workspace(str(ws)), {"edit": changes}, str(ws))
    assert moved == ("gone",)
    assert sorted(looked) == ["c.txt", "gone"]
