"""The ``git apply`` command line that applies a run's ``changes.patch`` to its workspace.

The patch names files relative to the workspace. Inside a git work tree, ``git apply`` reads
a patch's paths from the top of the work tree, and silently skips the ones outside the
directory it runs in, so a plain ``git apply PATCH`` run in a workspace below the top changes
nothing and exits 0. The command therefore runs at the top and adds the workspace's place in it
with ``--directory``.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

__all__ = ["git_apply_command", "git_work_tree_top"]


def git_work_tree_top(directory: str | os.PathLike[str]) -> Path | None:
    """The top of the git work tree that holds ``directory`` (resolved), or None outside one.

    Found as git finds it by default: the nearest directory, from ``directory`` up, holding a
    ``.git`` entry (a directory, or a file as in linked worktrees and submodules).
    """
    here = Path(directory).resolve()
    for candidate in (here, *here.parents):
        if (candidate / ".git").exists():
            return candidate
    return None


def git_apply_command(workspace: str | os.PathLike[str], patch: str | os.PathLike[str]) -> str:
    """A shell command line, to run from any directory, that applies ``patch`` to ``workspace``.

    ``git -C TOP apply --directory=SUB PATCH`` when ``workspace`` is the directory SUB below
    the top TOP of a git work tree, else ``git -C WORKSPACE apply PATCH``. Paths are absolute
    and quoted for a POSIX shell where they need it.
    """
    root = Path(workspace).resolve()
    patch_path = str(Path(patch).absolute())
    top = git_work_tree_top(root)
    if top is None or top == root:
        return shlex.join(["git", "-C", str(root), "apply", patch_path])
    below = root.relative_to(top).as_posix()
    return shlex.join(["git", "-C", str(top), "apply", f"--directory={below}", patch_path])
