"""Start-up cost control, run when the package is imported (keep this module tiny).

structlog's ``dev`` module imports rich, when it is installed, to render tracebacks: about
0.1 s at the start of every process (the CLI and each demo or scripted agent), for a feature
we do not use. rich is installed for the live progress view, so it is kept out of structlog's
import only: while ``structlog.dev`` is being imported, ``import rich`` fails there and
structlog falls back to plain tracebacks. Any other import of rich works as usual.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # importlib.abc alone costs ~10 ms of start-up (it imports importlib.resources)
    import importlib.machinery
    from collections.abc import Sequence
    from types import ModuleType


class _NoRichForStructlog:
    """A meta path finder (duck-typed, see :class:`importlib.abc.MetaPathFinder`)."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == "rich" or fullname.startswith("rich."):
            dev = sys.modules.get("structlog.dev")
            spec = getattr(dev, "__spec__", None)
            if spec is not None and getattr(spec, "_initializing", False):
                raise ImportError("rich is not used for structlog's tracebacks here")
        return None


def install() -> None:
    """Keep rich out of structlog's import, unless structlog is already imported."""
    if "structlog" in sys.modules or any(isinstance(f, _NoRichForStructlog) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _NoRichForStructlog())
