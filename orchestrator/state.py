"""Where the orchestrator keeps its state: run directories, branch working directories, journals.

Never inside the user's workspace. The location is, in order: the ``state_dir`` argument (the
CLI's ``--state-dir``), ``$ORCHESTRATOR_STATE_DIR``, ``$XDG_STATE_HOME/acp-orchestrator``, or
``~/.local/state/acp-orchestrator``. It must be a directory this process can write (it is
created if missing); a run refuses one inside its workspace before creating anything. Its path
must be UTF-8 (runs record it as text), and the directories the orchestrator keeps in it
(:data:`SUBDIRECTORIES`) must be directories where they exist; its run store's files
(:data:`STORE_FILES`) must not be symbolic links (opening one would create or write whatever it
leads to, anywhere).
"""

from __future__ import annotations

import os
from pathlib import Path

from ._names import display_name, is_utf8
from .errors import StateDirectoryError
from .vfs._fileio import make_dirs

__all__ = ["STORE_FILES", "SUBDIRECTORIES", "state_directory", "state_path"]

#: the directories the orchestrator keeps in the state directory: runs (one per run) and applies
#: (the journals of applies under way)
SUBDIRECTORIES = ("runs", "applies")
#: the files of the run store (SQLite's database and the journals it keeps next to it)
STORE_FILES = ("runs.sqlite3", "runs.sqlite3-wal", "runs.sqlite3-shm")


def state_path(explicit: str | os.PathLike[str] | None = None) -> Path:
    """Where the state directory is, as :func:`state_directory` chooses it; nothing is made."""
    if explicit is not None:
        if not os.fspath(explicit):
            raise StateDirectoryError("the state directory is an empty path")
        path = Path(explicit)
    elif os.environ.get("ORCHESTRATOR_STATE_DIR"):
        path = Path(os.environ["ORCHESTRATOR_STATE_DIR"])
    elif os.environ.get("XDG_STATE_HOME"):
        path = Path(os.environ["XDG_STATE_HOME"]) / "acp-orchestrator"
    else:
        path = Path.home() / ".local" / "state" / "acp-orchestrator"
    path = path.expanduser().absolute()
    if not is_utf8(str(path)):
        # runs record where they live as text (JSON, SQLite): a name that is not text cannot be
        raise StateDirectoryError(
            f"the state directory {display_name(str(path))} is not a UTF-8 path; "
            "choose one whose name is UTF-8"
        )
    return path


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def resolves_inside(path: str | os.PathLike[str], root: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is ``root`` or inside it, symlinks of both resolved (a path that does
    not exist yet by where it would be)."""
    return _inside(os.path.realpath(path), os.path.realpath(root))


def state_directory(
    explicit: str | os.PathLike[str] | None = None,
    *,
    workspace: str | os.PathLike[str] | None = None,
) -> Path:
    """The state directory, created if missing and checked usable.

    Raises :class:`~orchestrator.errors.StateDirectoryError` (a usage error) when it is not a
    directory, cannot be created or written, its path is not UTF-8, one of its
    :data:`SUBDIRECTORIES` is there but is not a directory, one of its :data:`STORE_FILES` is a
    symbolic link, or it is ``workspace`` or inside it
    (symlinks resolved); in that last case nothing is created.
    """
    path = state_path(explicit)
    if workspace is not None:
        root = os.path.realpath(workspace)
        if resolves_inside(path, root):
            raise StateDirectoryError(
                f"the state directory {path} is inside the workspace {root}: runs and branches "
                "would be part of what they copy; choose a state directory outside it"
            )
    try:
        make_dirs(str(path))
    except FileExistsError as e:  # a file (or a link to none) where a directory should be
        where = "" if e.filename == str(path) else f": {e.filename} is not a directory"
        raise StateDirectoryError(f"the state directory {path} is not a directory{where}") from e
    except OSError as e:
        raise StateDirectoryError(
            f"cannot create the state directory {path}: {e.strerror or e}"
        ) from e
    if not path.is_dir():
        raise StateDirectoryError(f"the state directory {path} is not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise StateDirectoryError(f"the state directory {path} is not writable")
    for name in SUBDIRECTORIES:
        inner = path / name
        # else each command fails in its own way inside it (FileExistsError, NotADirectoryError)
        if os.path.lexists(inner) and not inner.is_dir():
            raise StateDirectoryError(
                f"the state directory {path} is damaged: {inner} is not a directory"
            )
    for name in STORE_FILES:
        inner = path / name
        if inner.is_symlink():
            raise StateDirectoryError(
                f"the state directory {path} is damaged: {inner} is a symbolic link, not the "
                "run store's file; remove the link"
            )
    return path
