"""Where symlinks lead: keeping a branch directory self-contained.

A symlink is recorded as its target text, the same in the workspace, the branch and the run
store. A branch directory lives elsewhere than the workspace, so a link that names a workspace
path (absolute, or relative and climbing out with ``..`` and back in) would lead from the branch
directory into the user's real files: a write through it would write the workspace during a
run. :class:`LinkMap` gives such a link, in the branch directory, the target that names the
branch's own copy of that path, and gives the recorded target back when the link is read there,
so the rewrite is never a change. A link leading outside the workspace keeps leading to the same
place (a relative one that climbs out is made absolute: from the branch directory it would name
a path under the state directory instead).

Everything here looks at one link at a time and only at links: nothing is added per file.
"""

from __future__ import annotations

import os
import posixpath

from attrs import frozen

__all__ = ["LinkMap", "inside"]


def inside(root: str, path: str) -> bool:
    """Whether the absolute, normalized ``path`` is ``root`` or below it."""
    return path == root or path.startswith(root.rstrip("/") + "/")


def _location(link_dir: str, target: str) -> str:
    """The absolute path ``target`` names from the directory ``link_dir``, ``..`` taken
    lexically."""
    where = posixpath.normpath(posixpath.join(link_dir, target))
    # POSIX keeps a leading "//"; Linux does not tell it from "/"
    return "/" + where.lstrip("/")


def _real_parent(path: str) -> str:
    """``path`` with its directory resolved (symlinks followed), its last part kept as is."""
    head, name = posixpath.split(path)
    return posixpath.join(os.path.realpath(head), name)


@frozen
class LinkMap:
    """How the symlinks of the workspace ``workspace`` read in the branch directory ``branch``.

    Both are absolute, symlink-free paths (as :class:`~orchestrator.vfs.snapshot.Workspace` and
    :func:`~orchestrator.vfs.checkout.materialize` make them).
    """

    workspace: str
    branch: str

    def to_branch(self, path: str, target: str) -> str | None:
        """The target the link at branch path ``path`` gets in the branch directory, for its
        recorded ``target``; None when ``target`` itself leads to the same place from there.

        A target leading into the workspace is made to lead to the same path in the branch
        directory (absolute stays absolute, relative stays relative); a relative target leading
        out of the workspace is made absolute; an absolute target outside is kept.
        """
        head = path.rpartition("/")[0]
        relative = not target.startswith("/")
        if relative:
            within = posixpath.normpath(posixpath.join(head, target))
            if within != ".." and not within.startswith("../"):
                return None  # never leaves the tree: the same path in either directory
        where = _location(posixpath.join(self.workspace, head), target)
        if not inside(self.workspace, where):
            # a path through a symlink to the workspace (or the workspace's own parents)
            real = _real_parent(where)
            if inside(self.workspace, real):
                where = real
        if not inside(self.workspace, where):
            return where if relative else None
        mirrored = self.branch + where[len(self.workspace) :]
        if relative:
            return posixpath.relpath(mirrored, posixpath.join(self.branch, head))
        return mirrored

    def to_recorded(self, target: str) -> str:
        """The target to record for a link the branch directory holds with ``target``, when it
        is not one :meth:`to_branch` wrote: an absolute path into the branch directory names
        the same path of the workspace."""
        if target.startswith("/"):
            where = _location("/", target)
            if inside(self.branch, where):
                return self.workspace + where[len(self.branch) :]
        return target
