"""Where symlinks lead: keeping a branch directory self-contained, and links out of an apply.

A symlink is recorded as its target text, the same in the workspace, the branch and the run
store. Two places must look at where that text leads:

- A branch directory lives elsewhere than the workspace, so a link that names a workspace path
  (absolute, or relative and climbing out with ``..`` and back in) would lead from the branch
  directory into the user's real files: a write through it would write the workspace during a
  run. :class:`LinkMap` gives such a link, in the branch directory, the target that names the
  branch's own copy of that path, and gives the recorded target back when the link is read
  there, so the rewrite is never a change. A link leading outside the workspace keeps leading to
  the same place (a relative one that climbs out is made absolute: from the branch directory it
  would name a path under the state directory instead).
- An apply must not plant a link leading outside the workspace, round a loop, or into a
  version control directory (``.git``): :func:`refused_links` says which links a change set
  would make that do, following the links on the way as the kernel will once the changes are
  written.

Everything here looks at one link at a time and only at links: nothing is added per file.
"""

from __future__ import annotations

import os
import posixpath
import stat
from collections.abc import Mapping

from attrs import frozen

from .._names import name_of
from .changes import Change, Write
from .ignore import is_vcs_name

__all__ = ["LinkMap", "escaping_links", "inside", "refused_links"]

# as Linux's MAXSYMLINKS: more links than this on one path is a loop
_MAX_HOPS = 40


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


def _link_at(root: str, path: str, made: Mapping[str, str | None]) -> str | None:
    """The target of the symlink at absolute ``path`` once the changes are written (``made``:
    what they leave at the workspace paths they touch; None for no link), else on disk now."""
    if path != root and inside(root, path):
        rel = path[len(root.rstrip("/")) + 1 :]
        if rel in made:
            return made[rel]
    try:
        return os.readlink(path)
    except OSError:  # not a link, or absent
        return None


def _destination(root: str, path: str, target: str, made: Mapping[str, str | None]) -> str | None:
    """Where the link at workspace path ``path`` with ``target`` leads, every symlink on the
    way followed (its own target's last part too); None for a loop."""
    head = path.rpartition("/")[0]
    current = posixpath.join(root, head) if head else root
    pending = target.split("/")[::-1]
    if target.startswith("/"):
        current = "/"
    hops = 0
    while pending:
        part = pending.pop()
        if part in ("", "."):
            continue
        if part == "..":
            current = posixpath.dirname(current)
            continue
        candidate = posixpath.join(current, part)
        link = _link_at(root, candidate, made)
        if link is None:
            current = candidate
            continue
        hops += 1
        if hops > _MAX_HOPS:
            return None
        if link.startswith("/"):
            current = "/"
        pending.extend(link.split("/")[::-1])
    return current


def escaping_links(root: str, changes: Mapping[str, Change]) -> list[tuple[str, str]]:
    """``(path, target)`` of every symlink ``changes`` would make in the workspace ``root``
    (absolute, symlink-free) that :func:`refused_links` refuses."""
    return [(path, target) for path, target, _ in refused_links(root, changes)]


def refused_links(root: str, changes: Mapping[str, Change]) -> list[tuple[str, str, str]]:
    """``(path, target, why)`` of every symlink ``changes`` would make in the workspace
    ``root`` (absolute, symlink-free) that leads outside it (``why``: "outside the
    workspace"), round a loop of links ("a loop of links"), or into a version control
    directory such as ``.git`` ("into .git"), which is no part of the workspace's tree: the
    next write through such a link would change the repository's hooks or config.

    Where a link leads is judged as the kernel will once every change is written: from the
    link's directory, following the links on the way (those the changes make, else those on
    disk), so a link through another link that leads out is caught too.
    """
    links = {
        path: name_of(change.data)
        for path, change in changes.items()
        if isinstance(change, Write) and stat.S_ISLNK(change.mode)
    }
    if not links:
        return []
    made: dict[str, str | None] = dict.fromkeys(changes)
    made.update(links)
    out: list[tuple[str, str, str]] = []
    for path in sorted(links):
        end = _destination(root, path, links[path], made)
        if end is None:
            out.append((path, links[path], "a loop of links"))
        elif not inside(root, end):
            out.append((path, links[path], "outside the workspace"))
        elif vcs := next((p for p in end[len(root) :].split("/") if is_vcs_name(p)), None):
            out.append((path, links[path], f"into {vcs}"))
    return out
