"""Temporary projects for tests: a directory holding the files a test gives, a git repository
on request (the ``orchestrator_project`` fixture of :mod:`orchestrator.testing.pytest_plugin`)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from attrs import define, field

from orchestrator.errors import UsageError

__all__ = ["TempProjects"]

# a commit that neither the user's git config nor the clock can change
_GIT_ENV = {
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "test",
    "GIT_AUTHOR_EMAIL": "test@example.invalid",
    "GIT_COMMITTER_NAME": "test",
    "GIT_COMMITTER_EMAIL": "test@example.invalid",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z",
}


@define
class TempProjects:
    """Makes projects under ``root``: call it with the files each holds.

    ``make(files)`` (or calling the object) writes ``files`` (relative POSIX path: text or
    bytes) into a new directory and returns its path; with ``git=True`` the directory is also a
    git repository with the files committed (the user's git config is not read).
    """

    root: Path
    _made: int = field(default=0, init=False)

    def __call__(
        self, files: Mapping[str, str | bytes] | None = None, *, git: bool = False
    ) -> Path:
        """A new project holding ``files``; a committed git repository if ``git``."""
        return self.make(files, git=git)

    def make(self, files: Mapping[str, str | bytes] | None = None, *, git: bool = False) -> Path:
        """A new project holding ``files``; a committed git repository if ``git``."""
        self._made += 1
        project = self.root / ("project" if self._made == 1 else f"project-{self._made}")
        project.mkdir(parents=True)
        for name, content in (files or {}).items():
            path = project / _relative(name)
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                path.write_bytes(content)
            else:
                path.write_text(content, encoding="utf-8")
        if git:
            env = {**os.environ, **_GIT_ENV}
            for argv in (
                ["git", "init", "-q", "-b", "main"],
                ["git", "add", "-A"],
                ["git", "commit", "-q", "--allow-empty", "-m", "the project"],
            ):
                subprocess.run(argv, cwd=project, env=env, check=True, capture_output=True)
        return project


def _relative(name: str) -> PurePosixPath:
    path = PurePosixPath(name)
    if not name or path.is_absolute() or ".." in path.parts or path == PurePosixPath("."):
        raise UsageError(f"a project file must be a relative path inside it, not {name!r}")
    return path
