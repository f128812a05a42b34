"""Which processes hold a directory: their working directory, root, open files or mapped files
are in it (see :mod:`orchestrator.vfs.pool`, which never resets a directory a process holds).

Looked for in ``/proc``, by path, and by device and inode where the caller knows what the
directory holds: a process that reached the directory through a bind mount unmounted since is
shown a path elsewhere for all it holds there.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Collection, Container

__all__ = ["find_holders"]


def find_holders(
    directory: str, inodes: Collection[int] = (), device: int | None = None
) -> list[int]:
    """The processes whose working directory, root, open files or mapped files are
    ``directory`` or below it by their path, or are on ``device`` with one of ``inodes``
    (what the directory holds) whatever path ``/proc`` gives them: a process that reached the
    directory through a bind mount since unmounted is shown a path elsewhere. Raises
    :class:`OSError` when ``/proc`` cannot be read, or a process of this user cannot be
    looked at (nothing proves it holds nothing)."""
    top = directory.rstrip("/")
    inside = top + "/"
    needle = os.fsencode(top)
    me = os.geteuid()
    # a mapped file's device as the maps show it (hex major:minor), and its inode
    mapped = (
        re.compile(rb"^\S+ \S+ \S+ %02x:%02x (\d+) " % (os.major(device), os.minor(device)), re.M)
        if inodes and device is not None
        else None
    )

    def held(path: str) -> bool:
        return path == top or path.startswith(inside)

    def held_file(path: str) -> bool:
        if not inodes:
            return False
        st = os.stat(path)  # through the link /proc gives: the very file it holds
        return st.st_dev == device and st.st_ino in inodes

    found: list[int] = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        proc = f"/proc/{name}"
        try:
            if _holds(proc, held, needle) or _holds_ids(proc, held_file, inodes, mapped):
                found.append(int(name))
        except (FileNotFoundError, ProcessLookupError):
            continue  # exited meanwhile
        except PermissionError:
            # one that cannot be looked at: of another user, or older than this process (it
            # descends from none of the processes the run started, as the reaper reasons)
            try:
                owner = os.stat(proc).st_uid
                older = _start_time(name) < _start_time("self")
            except (FileNotFoundError, ProcessLookupError):
                continue
            if owner == me and not older:
                raise
    return found


def _start_time(pid: str) -> int:
    """When the process started, in clock ticks since boot (``/proc/PID/stat``, field 22)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        text = f.read()
    # the command name (field 2) may hold spaces and parentheses: fields follow its last ")"
    return int(text[text.rindex(b")") + 2 :].split()[19])


def _holds(proc: str, held: Callable[[str], bool], needle: bytes) -> bool:
    """Whether the process at ``proc`` (its ``/proc`` directory) holds a path ``held`` names
    (each of which holds ``needle``)."""
    if held(os.readlink(f"{proc}/cwd")) or held(os.readlink(f"{proc}/root")):
        return True
    for fd in os.listdir(f"{proc}/fd"):
        try:
            if held(os.readlink(f"{proc}/fd/{fd}")):
                return True
        except FileNotFoundError:
            continue  # closed meanwhile
    with open(f"{proc}/maps", "rb") as maps:
        text = maps.read()
    if needle not in text:  # no mapped file's path holds the directory's: none to parse
        return False
    for line in text.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and held(os.fsdecode(fields[5])):
            return True
    return False


def _holds_ids(
    proc: str,
    held_file: Callable[[str], bool],
    inodes: Container[int],
    mapped: re.Pattern[bytes] | None,
) -> bool:
    """Whether the process at ``proc`` holds one of the files or directories ``held_file``
    tells by device and inode, or maps one (``mapped`` finds the inodes of the device)."""
    if mapped is None:
        return False
    if held_file(f"{proc}/cwd") or held_file(f"{proc}/root"):
        return True
    for fd in os.listdir(f"{proc}/fd"):
        try:
            if held_file(f"{proc}/fd/{fd}"):
                return True
        except FileNotFoundError:
            continue  # closed meanwhile
    with open(f"{proc}/maps", "rb") as maps:
        text = maps.read()
    return any(int(found) in inodes for found in mapped.findall(text))
