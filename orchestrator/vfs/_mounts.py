"""Mount points below a directory, which no ``stat`` tells.

A bind mount of a directory of the same filesystem (``mount --bind /elsewhere dir/sub``, by
a process running as root) has the device of the directory it is mounted in: a walk that
compares ``st_dev`` enters it, and what it deletes or writes there is the mounted directory's,
outside the tree. Linux lists every mount point of the process's mount namespace in
``/proc/self/mountinfo`` (read once per operation: tens of microseconds), and gives the mount
an open file is on in ``/proc/self/fdinfo/FD`` (``mnt_id``). Without ``/proc`` (not Linux)
nothing is known here: callers keep their ``st_dev`` checks alone.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

__all__ = ["MOUNTINFO", "mount_id", "mount_points", "mounts_under", "points_under"]

#: the mount table of the calling process's mount namespace
MOUNTINFO = "/proc/self/mountinfo"

# the kernel writes a space, tab, newline or backslash of a path as a backslash and 3 octal digits
_ESCAPE = re.compile(rb"\\([0-7]{3})")


def _unescape(match: re.Match[bytes]) -> bytes:
    return bytes([int(match.group(1), 8) & 0xFF])


def mount_points(table: bytes) -> list[str]:
    """The mount points a ``mountinfo`` table lists (the 5th field of each line), their
    escapes decoded (``\\040`` a space, ``\\012`` a newline, ``\\134`` a backslash)."""
    out: list[str] = []
    for line in table.splitlines():
        fields = line.split(b" ", 5)
        if len(fields) >= 5:
            out.append(os.fsdecode(_ESCAPE.sub(_unescape, fields[4])))
    return out


def points_under(points: Iterable[str], directory: str) -> list[str]:
    """Those of ``points`` that are ``directory`` (absolute, normalized) or below it: a path
    of it followed by ``/`` (``/a/bc`` is not below ``/a/b``)."""
    inside = directory if directory.endswith("/") else f"{directory}/"
    return [p for p in points if p == directory or p.startswith(inside)]


def mounts_under(directory: str) -> list[str] | None:
    """The mount points at or below ``directory`` (by its real path, as the table gives
    them), sorted (each before those below it); None when the mount table cannot be read
    (no ``/proc``)."""
    # Read afresh each time: a table kept until the kernel says it changed (the priority event
    # of an open ``mountinfo``) would be stale after a rename of a directory holding a mount,
    # which moves the mount point's path and raises no event.
    try:
        with open(MOUNTINFO, "rb") as f:
            table = f.read()
    except OSError:
        return None
    return sorted(points_under(mount_points(table), os.path.realpath(directory)))


def mount_id(fd: int) -> int | None:
    """The id of the mount the open file ``fd`` is on (``mnt_id`` in ``/proc/self/fdinfo``,
    the ids ``mountinfo`` lists first); None when it is not told."""
    try:
        with open(f"/proc/self/fdinfo/{fd}", "rb") as f:
            info = f.read()
    except OSError:
        return None
    for line in info.splitlines():
        if line.startswith(b"mnt_id:"):
            return int(line[7:])
    return None
