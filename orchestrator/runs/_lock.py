"""One process at a time per run: the lock a run (or an apply of it) holds on its directory.

A run holds an exclusive ``flock`` on ``runs/RUN/lock`` in the state directory while it runs,
and so does an apply of it; the lock goes with the process (a crash or a SIGKILL releases it),
so a run whose record still says ``running`` but whose lock is free is one whose process died.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import RunBusy

__all__ = ["hold_run_lock"]

LOCK_NAME = "lock"


@contextmanager
def hold_run_lock(run_dir: Path, run_id: str, *, doing: str) -> Iterator[None]:
    """Hold run ``run_id``'s lock for the block; :class:`RunBusy` if another process has it.

    ``doing`` says what the refused caller wanted, for the message (``resume``, ``apply``).
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunBusy(
                f"run {run_id} is running in another process: cannot {doing} it now", run_id
            ) from None
        yield
    finally:
        os.close(fd)  # closing the file releases the lock
