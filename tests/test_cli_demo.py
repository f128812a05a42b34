"""The demo agent and the demo script as a user meets them: through the console script, and
``examples/demo.py`` as a subprocess; and the ``git apply`` line that ``prompt`` prints.

The ``git apply`` line must work where the workspace is: at the top of a git work tree, below
it (git reads a patch's paths from the top and silently skips the others), or outside git.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest
import trio

from orchestrator.runs.git_apply import git_apply_command
from orchestrator.testing import AgentScript, ReadFile, Say, Turn
from orchestrator.testing.scripted_agent import scripted_agent_command
from orchestrator.vfs.testing import git

ROOT = Path(__file__).resolve().parent.parent
CLI = Path(sys.executable).parent / "orchestrator"
SAMPLE = ROOT / "examples" / "sample-project"
DEMO = ROOT / "examples" / "demo.py"
LIMIT = 60.0
HINT = re.compile(r"^not applied; to apply: orchestrator apply \w+ \(or (git -C .+)\)$", re.M)

pytestmark = pytest.mark.skipif(not CLI.is_file(), reason=f"console script {CLI} not installed")


async def run(
    argv: list[str], cwd: Path, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` to its end, its output captured as text."""
    with trio.fail_after(LIMIT):
        done = await trio.run_process(
            argv,
            cwd=cwd,
            env={**os.environ, **(env or {})},
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    return subprocess.CompletedProcess(
        done.args, done.returncode, done.stdout.decode(), done.stderr.decode()
    )


async def prompt_demo(workspace: Path, text: str, *flags: str) -> subprocess.CompletedProcess[str]:
    """``orchestrator prompt --agent demo --policy edit --cwd WORKSPACE TEXT``."""
    argv = [str(CLI), "prompt", "--agent", "demo", "--policy", "edit", *flags]
    return await run([*argv, "--cwd", str(workspace), text], cwd=workspace.parent)


def sample_copy(at: Path) -> Path:
    """A copy of the sample project at ``at``."""
    shutil.copytree(SAMPLE, at, ignore=shutil.ignore_patterns("__pycache__"))
    return at


@pytest.mark.parametrize("where", ["below the top", "at the top", "outside git"])
async def test_the_printed_git_apply_line_applies_the_changes(tmp_path: Path, where: str) -> None:
    """Run as printed, from another directory, the git apply line changes the workspace's
    files, wherever the workspace is in a git work tree (or outside one)."""
    if where == "outside git":
        workspace = sample_copy(tmp_path / "project")
    else:
        repo = tmp_path / "repo"
        workspace = sample_copy(
            repo / "examples" / "sample-project" if where == "below the top" else repo
        )
        git(repo, "init", "-q", "-b", "main")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", "initial")
    done = await prompt_demo(
        workspace, 'append "- one" to CHANGES.md\ncreate docs/new.md with "new\\n"'
    )
    assert done.returncode == 0, done.stderr
    hint = HINT.search(done.stdout)  # the result's ending
    assert hint is not None, done.stdout
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    applied = await run(["sh", "-c", hint.group(1)], cwd=elsewhere)
    assert (applied.returncode, applied.stderr) == (0, "")
    assert (workspace / "CHANGES.md").read_text() == "# Changes\n- one\n"
    assert (workspace / "docs" / "new.md").read_text() == "new\n"


def test_git_apply_command_names_the_workspace_below_the_top(tmp_path: Path) -> None:
    """Below the top of a work tree: git -C TOP apply --directory=SUB; else git -C WORKSPACE."""
    top = tmp_path / "my repo"
    (top / ".git").mkdir(parents=True)
    (top / "a b" / "c").mkdir(parents=True)
    patch = tmp_path / "changes.patch"
    assert git_apply_command(top / "a b" / "c", patch) == (
        f"git -C '{top}' apply '--directory=a b/c' {patch}"
    )
    assert git_apply_command(top, patch) == f"git -C '{top}' apply {patch}"
    assert git_apply_command(tmp_path, patch) == f"git -C {tmp_path} apply {patch}"


async def test_a_missing_file_is_answered_and_the_run_succeeds(tmp_path: Path) -> None:
    """``delete nope.txt``: the demo agent says the file does not exist, the other instructions'
    changes are kept, and the run succeeds (exit 0)."""
    workspace = sample_copy(tmp_path / "project")
    done = await prompt_demo(
        workspace,
        'append "- one" to CHANGES.md\ndelete nope.txt\nappend "- two" to CHANGES.md',
        "--json",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert (result["status"], result["stopReason"]) == ("succeeded", "end_turn")
    assert result["text"] == (
        "Done.\n"
        "- Append a line to CHANGES.md: CHANGES.md\n"
        "- Delete nope.txt: nope.txt does not exist\n"
        "- Append a line to CHANGES.md: CHANGES.md\n"
    )
    assert result["diff"].endswith("+- one\n+- two\n")


async def test_an_error_answer_to_an_agent_request_does_not_fail_the_run(tmp_path: Path) -> None:
    """An agent that reads a missing file gets an error answer and goes on: the run succeeds."""
    workspace = tmp_path / "project"
    workspace.mkdir()
    script = AgentScript(turns=(Turn(steps=(ReadFile(path="nope.txt"), Say(text="went on"))),))
    agent = " ".join(scripted_agent_command(script, tmp_path))
    done = await run(
        [str(CLI), "prompt", "--json", "--agent", agent, "--cwd", str(workspace), "hi"],
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert (result["status"], result["text"]) == ("succeeded", "went on")


async def test_the_demo_script_refuses_a_missing_project_in_one_line(tmp_path: Path) -> None:
    """``examples/demo.py --project MISSING``: one line on stderr, no traceback, exit 2."""
    missing = tmp_path / "nonexistent"
    done = await run([sys.executable, str(DEMO), "--project", str(missing)], cwd=ROOT)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == f"demo.py: error: {missing} is not a directory\n"


async def test_the_demo_script_ends_with_both_ways_to_apply(tmp_path: Path) -> None:
    """The demo's last lines name ``orchestrator apply RUN`` and ``examples/demo.py --project
    COPY --apply``, as the README says; applied, CHANGES.md gains one line, no blank one."""
    project = sample_copy(tmp_path / "copy")
    done = await run([sys.executable, str(DEMO), "--project", str(project)], cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    untouched = next(i for i, line in enumerate(lines) if line.startswith("the project is "))
    applied = re.fullmatch(
        r"the project is untouched; apply the changes with: \S*orchestrator apply (\w+)",
        lines[untouched],
    )
    assert applied is not None, lines[untouched:]
    assert re.fullmatch(
        r"or run the demo on a copy of the project and write its changes there: "
        r"\S+ examples/demo\.py --project COPY --apply",
        lines[untouched + 1],
    ), lines[untouched:]
    written = await run([str(CLI), "apply", applied.group(1)], cwd=tmp_path)
    assert written.returncode == 0, written.stderr
    assert (project / "CHANGES.md").read_text() == (
        "# Changes\n- Renamed calc_total to compute_total.\n"
    )


@pytest.mark.parametrize("where", ["at the top", "below the top"])
async def test_an_edit_of_a_tracked_file_the_patterns_ignore_is_kept_and_applied(
    tmp_path: Path, where: str
) -> None:
    """Files added with ``git add -f`` are part of the branch: the demo agent reads and edits
    one through ``fs/*`` and writes another on disk; both changes are in the run's diff and
    ``apply`` writes them. A file it creates beside them stays ignored, as git would."""
    repo = tmp_path / "repo"
    workspace = repo / "sub" if where == "below the top" else repo
    workspace.mkdir(parents=True)
    (workspace / ".gitignore").write_text("dist/\n")
    (workspace / "dist").mkdir()
    (workspace / "dist" / "app.js").write_text("let v = 'old';\n")
    (workspace / "dist" / "lib.js").write_text("lib\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "add", "-f", str(workspace / "dist"))
    git(repo, "commit", "-q", "-m", "initial")
    done = await prompt_demo(
        workspace,
        'replace "old" with "new" in dist/app.js\n'
        'create dist/lib.js with "rewritten"\n'
        'create dist/scratch.js with "untracked"',
        "--json",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == "succeeded"
    assert "+let v = 'new';" in result["diff"] and "+rewritten" in result["diff"]
    assert "scratch.js" not in result["diff"]
    applied = await run([str(CLI), "apply", result["runId"]], cwd=workspace)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert (workspace / "dist" / "app.js").read_text() == "let v = 'new';\n"
    assert (workspace / "dist" / "lib.js").read_text() == "rewritten"
    assert not (workspace / "dist" / "scratch.js").exists()


async def test_an_agent_cannot_plant_a_git_hook_through_another_case(tmp_path: Path) -> None:
    """``.GIT/hooks/pre-commit`` would be the repository's hook on a case-insensitive file
    system: written by the agent, it is no change of the run, whatever its case."""
    workspace = sample_copy(tmp_path / "project")
    done = await prompt_demo(
        workspace,
        'create .GIT/hooks/pre-commit with "evil"\n'
        'create sub/.Git/config with "evil"\n'
        'append "- one" to CHANGES.md',
        "--json",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert [c["path"] for c in result["changes"]] == ["CHANGES.md"], result["changes"]
