"""What an apply leaves in the workspace: modes, and type changes in ``changes.patch``.

Through the console script, with the demo agent editing files and running shell commands: a
mode the user set after the run stays unless the run set one; a file become a symlink (and the
reverse) makes a ``changes.patch`` that ``git apply`` takes and that gives the tree ``apply``
gives.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from run_helpers import CLI, as_json, run_cli

from orchestrator.vfs.testing import capture, git

EXIT_OK, EXIT_FAILED = 0, 1

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CLI.is_file(), reason=f"console script {CLI} not installed"),
]

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project holding a few text files, a script and a symlink."""
    root = (tmp_path / "P").resolve()
    root.mkdir()
    for i in range(4):
        (root / f"f{i}.txt").write_text(f"old {i}\n")
    (root / "secret.txt").write_text("token\n")
    (root / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (root / "file").write_text("a file\n")
    (root / "link").symlink_to("f0.txt")
    return root


async def prompt(project: Path, state: Path, *instructions: str) -> str:
    """``orchestrator prompt --json`` of the demo agent given ``instructions``; the run id."""
    done = await run_cli(
        "prompt", "--agent", "demo", "--policy", "trusted", "--json", "--cwd", str(project),
        "\n".join(instructions), cwd=project.parent, state=state,
    )  # fmt: skip
    assert done.returncode == EXIT_OK, done.stderr.decode()
    result = as_json(done)
    assert not result["applied"]
    return str(result["runId"])


async def cli(project: Path, state: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    """The console script, beside the project."""
    return await run_cli(*args, cwd=project.parent, state=state)


def mode_of(path: Path) -> int:
    """The permission bits of ``path``."""
    return stat.S_IMODE(path.lstat().st_mode)


# --------------------------------------------------------------------------- modes


async def test_a_content_change_keeps_the_mode_the_user_set_after_the_run(
    project: Path, state_dir: Path
) -> None:
    """chmod 600 after the run, then apply a change of the file's content: it stays 600."""
    run_id = await prompt(project, state_dir, 'append "second" to secret.txt')
    (project / "secret.txt").chmod(0o600)
    done = await cli(project, state_dir, "apply", run_id)
    assert done.returncode == EXIT_OK, done.stderr.decode()
    assert (project / "secret.txt").read_text() == "token\nsecond\n"
    assert mode_of(project / "secret.txt") == 0o600


async def test_a_mode_the_run_set_is_applied(project: Path, state_dir: Path) -> None:
    """A mode the run set (alone, or with new content) is applied over the user's later one."""
    run_id = await prompt(
        project, state_dir, "run chmod 755 run.sh", "run chmod 700 f1.txt",
        'append "more" to f1.txt',
    )  # fmt: skip
    (project / "run.sh").chmod(0o600)
    (project / "f1.txt").chmod(0o640)
    done = await cli(project, state_dir, "apply", run_id)
    assert done.returncode == EXIT_OK, done.stderr.decode()
    assert mode_of(project / "run.sh") == 0o755
    assert (project / "f1.txt").read_text() == "old 1\nmore\n"
    assert mode_of(project / "f1.txt") == 0o700


# --------------------------------------------------------------------------- type changes


async def test_changes_patch_of_type_changes_applies_with_git_as_apply_does(
    project: Path, state_dir: Path, tmp_path: Path
) -> None:
    """A symlink become a file and a file become a symlink: changes.patch passes git apply
    --check, and git apply gives the tree that orchestrator apply gives."""
    git(project, "init", "-q", "-b", "main")
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "initial")
    run_id = await prompt(
        project, state_dir, "run rm link", "create link with 'now a file'",
        "run rm file && ln -s f2.txt file",
    )  # fmt: skip
    patch = state_dir / "runs" / run_id / "changes.patch"
    by_git = tmp_path / "by-git"
    shutil.copytree(project, by_git, symlinks=True)
    git(by_git, "apply", "--check", str(patch))
    git(by_git, "apply", str(patch))
    done = await cli(project, state_dir, "apply", run_id)
    assert done.returncode == EXIT_OK, done.stderr.decode()
    assert (project / "link").read_text() == "now a file"
    assert os.readlink(project / "file") == "f2.txt"

    def tree(root: Path) -> dict[str, tuple[bytes, int]]:
        return {k: v for k, v in capture(root).items() if not k.startswith(".git")}

    assert tree(by_git) == tree(project)
