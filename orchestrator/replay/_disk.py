"""The replay agent's writes to disk: a recorded change made in the session's directory, and
what refuses one (a path that leaves it, climbs a symlink, or names what is not a directory).
Blocking: called in worker threads."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..vfs._fileio import digest_fd
from .record import RecordedChange

__all__ = ["NEW_FILE_MODE", "apply_change", "confined", "found_digests"]

#: the mode of a file the record creates without one (the vfs's default)
NEW_FILE_MODE = 0o644


def confined(cwd: Path, rel: str) -> str | None:
    """Why ``rel`` may not be changed under ``cwd`` (None: it may)."""
    if os.path.isabs(rel) or rel.startswith("~"):
        return f"refused to change {rel}: an absolute path"
    parts = Path(rel).parts
    if not parts or any(part in ("..", "") for part in parts) or "\0" in rel:
        return f"refused to change {rel}: it leaves the session's directory"
    here = cwd
    for part in parts[:-1]:
        here = here / part
        try:
            st = here.lstat()
        except FileNotFoundError:
            break
        except OSError as e:
            return f"refused to change {rel}: {e.strerror or e}"
        if stat.S_ISLNK(st.st_mode):
            return f"refused to change {rel}: {here.relative_to(cwd)} is a symlink"
        if not stat.S_ISDIR(st.st_mode):
            return f"refused to change {rel}: {here.relative_to(cwd)} is not a directory"
    return None


def apply_change(cwd: Path, change: RecordedChange) -> None:
    """Make one recorded change under ``cwd`` (a worker thread; ``confined`` said yes)."""
    target = cwd / change.path
    if change.kind == "delete":
        if target.is_symlink() or target.is_file():
            target.unlink()
        elif target.exists():
            raise IsADirectoryError(21, "a directory, not a file")
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_symlink():
        target.unlink()  # the record has a file there: replace the link, never follow it
    temporary = target.with_name(f".{target.name}.replay{os.getpid()}")
    if change.mode is not None:
        mode = stat.S_IMODE(change.mode) & 0o777  # never a set-id or sticky bit from a record
    elif target.is_file():
        mode = stat.S_IMODE(target.stat().st_mode)  # as the vfs does: a write keeps the mode
    else:
        mode = NEW_FILE_MODE
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(change.data or b"")
        os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


#: what :func:`found_digests` says of a path that is no regular file (a link, a directory)
NOT_A_FILE = "not a regular file"


def found_digests(cwd: Path, paths: list[str]) -> dict[str, str | None]:
    """What each of ``paths`` holds under ``cwd`` now: the file's digest (the vfs's, as a
    recorded change's base is), None if there is nothing, :data:`NOT_A_FILE` otherwise. A
    path :func:`confined` refuses is left out."""
    found: dict[str, str | None] = {}
    for rel in paths:
        if confined(cwd, rel) is not None:
            continue
        target = cwd / rel
        try:
            st = target.lstat()
        except FileNotFoundError:
            found[rel] = None
            continue
        except OSError:
            found[rel] = NOT_A_FILE
            continue
        if not stat.S_ISREG(st.st_mode):
            found[rel] = NOT_A_FILE
            continue
        try:
            fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            found[rel] = NOT_A_FILE
            continue
        try:
            # the vfs's own digest: what a recorded change's base digest was taken with
            found[rel] = digest_fd(fd)
        finally:
            os.close(fd)
    return found
