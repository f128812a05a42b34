"""What a full scan of a branch directory found beyond its records, handed over with the watch
that has seen the directory since: a pooled directory is reset from it without a second scan.

A full harvest stats every entry of the directory (see :mod:`orchestrator.vfs.workdir`); what
it records is the branch, and what it sees besides (directories and their modes, entries it
does not record: ignored files, ``.git``, special files; files with a second name) is the
:class:`Survey`. The inotify watch on every directory listed stays open from before each
listing: any write, chmod, create, delete, rename or link in a watched directory, and the
close of a file written through a shared mapping (the mapping holds the file open), queues an
event. A :class:`Handover` is made only when nothing is queued once the harvest is done; the
pool resets from it only when nothing but its own renames of the directory is queued at the
take (:meth:`Handover.quiet`), and no process holds the directory then. Otherwise the reset
stats every entry, as it always did.
"""

from __future__ import annotations

from attrs import define, frozen

from ._inotify import IN_MOVE_SELF, Inotify

__all__ = ["Handover", "Survey"]

#: what a harvest compares: size, mtime, inode, st_mode, ctime
_Key = tuple[int, int, int, int, int]


@frozen
class Survey:
    """What one full scan of a directory saw besides the files it records."""

    #: every directory listed -> (st_mode, st_uid, st_gid, st_dev)
    dirs: dict[str, tuple[int, int, int, int]]
    #: directories seen but not entered (ignored, or a VCS's): what is in them is unknown
    skipped: tuple[str, ...]
    #: entries other than directories that may not be recorded: ignored ones, special files,
    #: the ones that changed (a path the records hold after the scan is recorded)
    strays: tuple[str, ...]
    #: recorded regular files found with a second name (a hard link could write them later)
    linked: tuple[str, ...]
    #: the directory's filesystem
    device: int


@define(eq=False)
class Handover:
    """A closed workdir's :class:`Survey`, its records as its last harvest left them, and the
    watch that has seen nothing change since that harvest's listings."""

    survey: Survey
    watcher: Inotify
    records: dict[str, _Key]

    def quiet(self) -> bool:
        """Whether nothing happened in the directory since the survey but its own renames
        (an event of the root itself, moved); reads the events."""
        events = self.watcher.read()
        if self.watcher.overflowed:
            return False
        return all(rel == "" and not name and mask & IN_MOVE_SELF for rel, mask, name in events)

    def close(self) -> None:
        """Release the watch."""
        self.watcher.close()
