"""Where the orchestrator keeps its state: run directories, branch working directories, journals.

Never inside the user's workspace. The location is, in order: the ``state_dir`` argument (the
CLI's ``--state-dir``), ``$ORCHESTRATOR_STATE_DIR``, ``$XDG_STATE_HOME/acp-orchestrator``, or
``~/.local/state/acp-orchestrator``. It must be a directory this process can write (it is
created if missing); a run refuses one inside its workspace before creating anything.
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import StateDirectoryError
from .vfs._fileio import make_dirs

__all__ = ["state_directory", "state_path"]


def state_path(explicit: str | os.PathLike[str] | None = None) -> Path:
    """Where the state directory is, as :func:`state_directory` chooses it; nothing is made."""
    return _chosen(explicit)


def _chosen(explicit: str | os.PathLike[str] | None) -> Path:
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
    return path.expanduser().absolute()


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def state_directory(
    explicit: str | os.PathLike[str] | None = None,
    *,
    workspace: str | os.PathLike[str] | None = None,
) -> Path:
    """The state directory, created if missing and checked usable.

    Raises :class:`~orchestrator.errors.StateDirectoryError` (a usage error) when it is not a
    directory, cannot be created or written, or is ``workspace`` or inside it (symlinks
    resolved); in that last case nothing is created.
    """
    path = _chosen(explicit)
    if workspace is not None:
        root = os.path.realpath(workspace)
        if _inside(os.path.realpath(path), root):
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
    return path
