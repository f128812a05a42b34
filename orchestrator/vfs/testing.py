"""Helpers for testing code that uses the VFS: build directory trees, capture them byte for byte,
and make throwaway git repositories."""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Mapping
from pathlib import Path

from .._names import name_bytes

__all__ = ["Captured", "capture", "git", "git_repo", "make_tree"]

#: what :func:`capture` records per path: content (a symlink's: its target) and st_mode
Captured = dict[str, tuple[bytes, int]]


def make_tree(root: Path, files: Mapping[str, bytes | str], *, mode: int | None = None) -> Path:
    """Create ``root`` with ``files`` (relative path -> content); returns ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
        if mode is not None:
            path.chmod(mode)
    return root


def capture(root: Path) -> Captured:
    """Every file, symlink and directory below ``root`` (``.git`` too), with content and mode."""
    out: Captured = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root)
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = (name_bytes(os.readlink(full)), st.st_mode)
            elif stat.S_ISDIR(st.st_mode):
                out[rel + "/"] = (b"", st.st_mode)
            else:
                out[rel] = (Path(full).read_bytes(), st.st_mode)
    return out


def git(cwd: Path, *args: str) -> str:
    """Run git with a fixed identity; its stdout."""
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "Test",
        "GIT_AUTHOR_EMAIL": "test@example.com",
        "GIT_COMMITTER_NAME": "Test",
        "GIT_COMMITTER_EMAIL": "test@example.com",
        "GIT_CONFIG_NOSYSTEM": "1",
    }
    done = subprocess.run(
        ["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=True
    )
    return done.stdout


def git_repo(root: Path, files: Mapping[str, bytes | str]) -> Path:
    """A git repository at ``root`` with ``files`` committed on ``main``."""
    make_tree(root, files)
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "initial")
    return root
