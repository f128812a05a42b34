"""Errors of the virtual filesystem.

All derive from :class:`VfsError` (an :class:`~orchestrator.errors.OrchestratorError`). The fs
service (:mod:`orchestrator.agent.branchfs`) translates them into JSON-RPC errors at its boundary.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from .._names import display_name, display_names, one_line
from .._sizes import format_size
from ..errors import OrchestratorError

if TYPE_CHECKING:
    from .merge import Conflict

__all__ = [
    "ApplyError",
    "FileTooLarge",
    "MergeConflictError",
    "PathNotFound",
    "PathRefused",
    "SymlinkOutside",
    "VfsError",
    "WorkspaceChanged",
]


class VfsError(OrchestratorError):
    """Base class of the virtual filesystem's errors."""


class PathNotFound(VfsError, LookupError):
    """The path does not exist in the branch (or tree) it was looked up in."""

    def __init__(self, path: str):
        self.path = path
        super().__init__(f"no such file: {display_name(path)}")


def shown_path(path: str, limit: int = 200) -> str:
    """``path`` for a message: a long one is cut in its middle (the whole is kept elsewhere)."""
    path = display_name(path).replace("\0", "\\0")  # a NUL byte would end some readers' line
    if len(path) <= limit:
        return path
    return f"{path[: limit // 2]}...({len(path) - limit} characters)...{path[-limit // 2 :]}"


class PathRefused(VfsError):
    """A path that is not a usable branch path: absolute, ``..``, outside the root, a directory,
    one that can name no file. ``path`` is the path whole; the message cuts a long one."""

    def __init__(self, path: str, reason: str):
        self.path = path
        self.reason = reason
        super().__init__(f"{shown_path(path)}: {reason}")

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.path, self.reason))


class FileTooLarge(VfsError):
    """A changed file is larger than the limit on a changed file: it is not recorded.

    ``files`` holds ``(path, size)`` of each, ``limit`` the limit in bytes.
    """

    def __init__(self, files: Iterable[tuple[str, int]], limit: int):
        self.files = files = tuple(sorted(files))
        self.limit = limit
        shown = [
            f"{display_name(path)} ({format_size(size)}, {size} bytes)" for path, size in files
        ]
        over = f"over the limit of {format_size(limit)} ({limit} bytes) on a changed file"
        if len(shown) == 1:
            path, size = files[0]
            text = f"{display_name(path)} is {format_size(size)} ({size} bytes), {over}"
        else:
            text = f"{len(shown)} files are {over}: {', '.join(shown)}"
        super().__init__(f"{text}; not recorded")

    @property
    def paths(self) -> tuple[str, ...]:
        """The paths of the files."""
        return tuple(path for path, _ in self.files)

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.files, self.limit))


class WorkspaceChanged(VfsError):
    """Files of the workspace changed after the snapshot, so their snapshot content is gone.

    Raised when a snapshot's content is needed (a base for a merge, a diff, a materialized copy)
    and the file on disk no longer has the size, mtime, mode or hash recorded at snapshot time.
    Take a new snapshot to continue from the current state.
    """

    def __init__(self, paths: Iterable[str]):
        self.paths = tuple(sorted(paths))
        shown = ", ".join(display_names(self.paths[:10])) + (" ..." if len(self.paths) > 10 else "")
        super().__init__(f"changed in the workspace after the snapshot: {shown}")


class MergeConflictError(VfsError):
    """An operation needed a clean merge but the merge left conflicts."""

    def __init__(self, conflicts: Iterable[Conflict]):
        self.conflicts = tuple(conflicts)
        paths = display_names(sorted({c.path for c in self.conflicts})[:10])
        super().__init__(f"{len(self.conflicts)} unresolved conflict(s): {', '.join(paths)}")


class ApplyError(VfsError):
    """Applying changes to the workspace failed; the workspace was rolled back (or left intact)."""


class SymlinkOutside(VfsError):
    """Changes would make symlinks leading outside the workspace, round a loop of links, or
    into a version control directory (``.git``); nothing was written.

    ``links`` holds ``(path, target)`` of each, paths relative to the workspace; ``reasons``
    says where each leads ("outside the workspace", "a loop of links", "into .git").
    """

    def __init__(self, links: Iterable[tuple[str, str]], reasons: Iterable[str] = ()):
        self.links = tuple(links)
        self.reasons = tuple(reasons) or ("outside the workspace",) * len(self.links)
        super().__init__(f"symlinks the workspace cannot take: {self.described()}")

    def described(self) -> str:
        """Each link as ``PATH -> TARGET (where it leads)``, the first ten."""
        shown = ", ".join(
            f"{one_line(display_name(path))} -> {one_line(display_name(target))} ({why})"
            for (path, target), why in zip(self.links[:10], self.reasons, strict=False)
        )
        return shown + (" ..." if len(self.links) > 10 else "")
