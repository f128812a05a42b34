"""Where the orchestrator keeps its state: run directories, branch working directories, journals.

Never inside the user's workspace. The location is, in order: the ``state_dir`` argument (the
CLI's ``--state-dir``), ``$ORCHESTRATOR_STATE_DIR``, ``$XDG_STATE_HOME/acp-orchestrator``, or
``~/.local/state/acp-orchestrator``.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["state_directory"]


def state_directory(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The state directory (created if missing)."""
    if explicit is not None:
        path = Path(explicit)
    elif os.environ.get("ORCHESTRATOR_STATE_DIR"):
        path = Path(os.environ["ORCHESTRATOR_STATE_DIR"])
    elif os.environ.get("XDG_STATE_HOME"):
        path = Path(os.environ["XDG_STATE_HOME"]) / "acp-orchestrator"
    else:
        path = Path.home() / ".local" / "state" / "acp-orchestrator"
    path = path.expanduser().absolute()
    path.mkdir(parents=True, exist_ok=True)
    return path
