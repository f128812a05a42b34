"""Paths as the permission policy sees them (a pure leaf: standard library only).

:func:`raw_paths` finds the paths a tool call names in its raw input, :func:`resolve` places a
path against the session root (lexically), and :func:`compile_glob` turns a path glob into a
regex. The path rules are documented in :mod:`orchestrator.policy`, which re-exports
:func:`compile_glob`.
"""

from __future__ import annotations

import posixpath
import re
from typing import Any

__all__ = ["compile_glob", "raw_paths", "resolve"]

# fmt: off
_PATH_KEYS = frozenset((
    "path", "file_path", "filePath", "filepath", "paths", "file_paths", "filePaths", "abs_path",
    "absPath", "absolute_path", "absolutePath", "notebook_path", "target_file", "targetFile",
    "file", "filename", "source", "destination", "old_path", "new_path", "oldPath", "newPath",
    "move_path", "movePath", "dir_path", "dirPath", "directory", "cwd", "workdir",
))
# fmt: on
_PATH_CONTAINERS = frozenset(("changes", "edits", "files", "operations"))


def compile_glob(pattern: str) -> re.Pattern[str]:
    """A path glob as a regex to ``fullmatch`` against a ``/``-separated path.

    The syntax is that of a rule's ``paths`` (see :mod:`orchestrator.policy`). ``ValueError``
    for a glob that makes no regex (a character class such as ``[z-a]``).
    """
    given = pattern
    if pattern.endswith("/"):
        pattern += "**"
    if "/" not in pattern.lstrip("/"):
        pattern = "**/" + pattern
    parts = pattern.lstrip("/").split("/") if pattern.startswith("/") else pattern.split("/")
    out = ["/"] if pattern.startswith("/") else []
    for index, part in enumerate(parts):
        last = index == len(parts) - 1
        if part == "**":
            out.append(".*" if last else "(?:.*/)?")
        else:
            out.append(_glob_segment(part) + ("" if last else "/"))
    try:
        return re.compile("".join(out), re.DOTALL)
    except re.error as e:
        raise ValueError(f"bad path glob {given!r}: {e.msg}") from e


def _glob_segment(part: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(part):
        char = part[i]
        close = part.find("]", i + 2) if char == "[" else -1
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif close > 0:
            body = part[i + 1 : close].replace("\\", "\\\\")
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
            i = close
        else:
            out.append(re.escape(char))
        i += 1
    return "".join(out)


def raw_paths(raw: Any, depth: int = 0) -> list[str]:
    """The path-like values of a tool call's raw input (by key name, a few levels deep)."""
    if depth > 3:
        return []
    if isinstance(raw, list):
        return [p for item in raw for p in raw_paths(item, depth + 1)]
    if not isinstance(raw, dict):
        return []
    found: list[str] = []
    for key, value in raw.items():
        if key in _PATH_KEYS:
            if isinstance(value, str):
                found.append(value)
            elif isinstance(value, list):
                found += [v for v in value if isinstance(v, str)]
        elif key in _PATH_CONTAINERS:
            if isinstance(value, dict):  # Codex: {"changes": {"/abs/path": {...}}}
                found += [k for k in value if isinstance(k, str)]
            found += raw_paths(value if isinstance(value, list) else [value], depth + 1)
    return found


def resolve(path: str, root: str) -> tuple[str, str | None]:
    """``path`` made absolute against ``root``, and relative to it (None: outside the root)."""
    if path.startswith("file://"):
        path = path[len("file://") :]
    root = posixpath.normpath(root)
    if path.startswith("~") or "$" in path:  # the shell would expand these elsewhere
        return path, None
    absolute = posixpath.normpath(posixpath.join(root, path))
    if absolute == root:
        return absolute, "."
    prefix = root.rstrip("/") + "/"
    return absolute, absolute[len(prefix) :] if absolute.startswith(prefix) else None
