"""Symlinks through the console script, with the demo agent running shell commands.

A link of the project leading into it must not let a run write the project; a link an agent
makes is shown as one, and applied only when it leads inside the project.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from run_helpers import CLI, as_json, run_cli

from orchestrator.vfs.testing import capture

EXIT_OK, EXIT_USAGE = 0, 2

pytestmark = pytest.mark.skipif(not CLI.is_file(), reason=f"console script {CLI} not installed")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project holding target.txt."""
    root = (tmp_path / "P").resolve()
    root.mkdir()
    (root / "target.txt").write_text("target\n")
    return root


async def prompt(project: Path, state: Path, command: str, *extra: str) -> dict[str, object]:
    """``orchestrator prompt --json`` of the demo agent running ``command``, in ``project``."""
    done = await run_cli(
        "prompt", "--agent", "demo", "--policy", "trusted", "--json", *extra,
        f"run sh -c {command!r}", cwd=project, state=state,
    )  # fmt: skip
    assert done.returncode == EXIT_OK, done.stderr.decode()
    result = as_json(done)
    assert isinstance(result, dict)
    return result


@pytest.mark.parametrize(
    ("link", "target", "write"),
    [
        ("abs.txt", "{project}/target.txt", "abs.txt"),
        ("up.txt", "../P/target.txt", "up.txt"),
        ("here", "{project}", "here/target.txt"),
    ],
    ids=["absolute", "relative-out-and-in", "directory"],
)
async def test_a_write_through_a_project_link_stays_in_the_branch(
    project: Path, state_dir: Path, link: str, target: str, write: str
) -> None:
    """Writing through a link of the project that leads into it changes the branch's copy of
    the target: the project is untouched until apply, which then writes the target."""
    (project / link).symlink_to(target.format(project=project))
    before = capture(project)
    result = await prompt(project, state_dir, f"echo via-link >> {write}")
    assert capture(project) == before
    assert result["changes"] == [{"path": "target.txt", "change": "modified"}]
    assert "+via-link\n" in str(result["diff"])
    done = await run_cli("apply", str(result["runId"]), "--json", cwd=project, state=state_dir)
    assert done.returncode == EXIT_OK, done.stderr.decode()
    assert as_json(done)["written"] == ["target.txt"]
    assert (project / "target.txt").read_text() == "target\nvia-link\n"
    assert os.readlink(project / link) == target.format(project=project)


async def test_a_symlink_out_of_the_project_is_shown_and_never_applied(
    project: Path, state_dir: Path
) -> None:
    """A link the agent makes to /etc/passwd is marked as a symlink in the changes and every
    diff, and apply (or prompt --apply) refuses it with exit 2, writing nothing."""
    # from a script of the project: the policy rejects /etc/passwd as an argument of a command
    (project / "mk.sh").write_text("echo new > new.txt; ln -s /etc/passwd evil.md\n")
    (project / "up.sh").write_text("ln -s ../../../../etc/passwd evil.md\n")
    before = capture(project)
    result = await prompt(project, state_dir, "sh mk.sh")
    assert result["changes"] == [
        {"path": "evil.md", "change": "added", "symlink": "/etc/passwd"},
        {"path": "new.txt", "change": "added"},
    ]
    assert "diff --git a/evil.md b/evil.md\nnew file mode 120000\n" in str(result["diff"])
    run_id = str(result["runId"])
    diff = await run_cli("diff", run_id, cwd=project, state=state_dir)
    assert "diff --git a/evil.md b/evil.md\nnew file mode 120000\n" in diff.stdout.decode()
    show = await run_cli("show", run_id, cwd=project, state=state_dir)
    shown = show.stdout.decode()
    assert " evil.md -> /etc/passwd (symlink) | " in shown
    # no apply is offered that would be refused
    assert "no apply will write it: it makes symlinks the workspace cannot take: " in shown
    assert "evil.md -> /etc/passwd (outside the workspace)" in shown
    assert "to apply:" not in shown
    done = await run_cli("apply", run_id, "--json", cwd=project, state=state_dir)
    assert done.returncode == EXIT_USAGE, done.stderr.decode()
    error = as_json(done)["error"]
    assert error["type"] == "SymlinkRefused"
    assert "evil.md -> /etc/passwd" in error["message"]
    assert capture(project) == before
    again = await run_cli(
        "prompt", "--agent", "demo", "--policy", "trusted", "--apply",
        "run sh up.sh", cwd=project, state=state_dir,
    )  # fmt: skip
    assert again.returncode == EXIT_USAGE, again.stderr.decode()
    assert "evil.md -> ../../../../etc/passwd" in again.stderr.decode()
    assert capture(project) == before


async def test_a_symlink_within_the_project_is_applied_as_one(
    project: Path, state_dir: Path
) -> None:
    """A link the agent makes to a file of the project is applied as a symlink."""
    result = await prompt(project, state_dir, "ln -s target.txt good.md")
    assert result["changes"] == [{"path": "good.md", "change": "added", "symlink": "target.txt"}]
    show = await run_cli("show", str(result["runId"]), cwd=project, state=state_dir)
    assert f"not applied; to apply: orchestrator apply {result['runId']}" in show.stdout.decode()
    done = await run_cli("apply", str(result["runId"]), cwd=project, state=state_dir)
    assert done.returncode == EXIT_OK, done.stderr.decode()
    assert os.readlink(project / "good.md") == "target.txt"


async def test_a_symlink_into_git_is_refused_like_one_out_of_the_project(
    project: Path, state_dir: Path
) -> None:
    """A link the agent makes into the project's .git (directly, or through another link it
    makes) is refused by prompt --apply with exit 2, saying where it leads; nothing is
    written, so no later write through it can plant a hook."""
    (project / ".git" / "hooks").mkdir(parents=True)
    before = capture(project)
    done = await run_cli(
        "prompt", "--agent", "demo", "--policy", "trusted", "--apply",
        "run sh -c 'echo new > new.txt; ln -s .git d; ln -s d/hooks h'",
        cwd=project, state=state_dir,
    )  # fmt: skip
    assert done.returncode == EXIT_USAGE, done.stderr.decode()
    said = done.stderr.decode()
    assert "d -> .git (into .git), h -> d/hooks (into .git); nothing applied" in said, said
    assert capture(project) == before


def test_the_links_no_apply_writes_are_told_from_a_result(project: Path) -> None:
    """From a run's result, the links leading out, round a loop or into .git are named as the
    apply names them; a link within the project, or one through a link the run makes into it,
    is not."""
    from orchestrator.cli.render import unappliable_links

    changes = [
        {"path": "out", "change": "added", "symlink": "/etc/passwd"},
        {"path": "in", "change": "added", "symlink": "target.txt"},
        {"path": "loop", "change": "added", "symlink": "loop"},
        {"path": "d", "change": "added", "symlink": "sub"},
        {"path": "sub/x.txt", "change": "added"},
        {"path": "via", "change": "added", "symlink": "d/x.txt"},
        {"path": "g", "change": "added", "symlink": ".git/hooks"},
    ]
    found = unappliable_links({"cwd": str(project), "changes": changes})
    assert found == [
        "g -> .git/hooks (into .git)",
        "loop -> loop (a loop of links)",
        "out -> /etc/passwd (outside the workspace)",
    ]
    assert unappliable_links({"cwd": str(project), "changes": changes[1:2]}) == []
