"""Apply: the only write to the user's disk, all-or-nothing, with a journal.

:func:`apply_changes` first refuses changes that would make a symlink leading outside the
workspace (absolute, or relative climbing out with ``..``, or through other links that do, as
they will be once written): :class:`~orchestrator.vfs.errors.SymlinkOutside` names them and
NOTHING is written. Links within the workspace are written as links.

Then it checks every file it is about to touch: each must still be what the
snapshot saw (by hash when known, else by stat), and each new file must still be absent. If any
differs it is reported as an :class:`OutsideChange` (a conflict with the outside world) and
NOTHING is written.

Then it journals, in ``STATE_DIR/applies/<id>/``: every new content (``new/N``) and a backup of
every original it will replace or delete (``old/N``), each fsynced, and last ``journal.json``
(written through a temporary name, fsynced, renamed, directory fsynced). Only then does it touch
the workspace: deletions, mode changes, then writes through a temporary file in the same
directory and ``os.replace`` (modes preserved or set). The journal is removed when done; an error
midway rolls the workspace back from the backups before raising :class:`ApplyError`.

Recovery (:func:`recover_applies`, to run on the next start) decides per journal:

- no ``journal.json``: the crash came before anything was written -> the partial journal is
  discarded;
- ``journal.json`` present and every new content verifies (all new contents are journaled) ->
  the apply is **completed** (roll forward, idempotently);
- otherwise (a new content is missing or corrupt) -> it is **rolled back** from the backups;
- a ``journal.json`` that cannot be read or is no journal (damaged state) -> nothing is done and
  :class:`~orchestrator.errors.StateDirectoryError` names it: its workspace may be half written,
  so someone must look before it is moved aside (so does :func:`interrupted_applies`).

A file that is neither its old nor its new version (edited by someone after the crash) is never
overwritten. Such an apply cannot be completed, so it is **rolled back** around them, whatever the
journal holds: every other file is brought back to what it held before the apply, the edited ones
stay as they are (the apply's changes to them are not made) and are reported in ``problems``.
The journal then moves aside, out of the way of recovery (``applies/.kept-<name>``: it holds
what the edited files held before the apply, which nothing else may hold any more).

The journal also keeps what the caller says the changes are (``origin``: the run they come from,
say), and :func:`interrupted_applies` lists the journals a crash left behind, without touching
anything, so that a half-applied workspace can be named before it is recovered.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import shutil
import stat
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Set
from typing import Any, Literal

import attrs
import trio
from attrs import frozen

from .._log import get_logger
from .._names import display_name, name_bytes
from ..errors import StateDirectoryError
from ._fileio import (
    copy_fd_hashed,
    digest,
    digest_fd,
    fsync_dir,
    is_temp_name,
    make_dirs,
    normalize_mode,
    temp_name,
    write_entry_atomic,
)
from ._links import refused_links
from .changes import Change, ChangeSet, Delete, ModeChange, Write
from .errors import ApplyError, MergeConflictError, SymlinkOutside, WorkspaceChanged
from .snapshot import Snapshot
from .tree import ChangeSource

__all__ = [
    "ApplyResult",
    "InterruptedApply",
    "OutsideChange",
    "RecoveryReport",
    "apply_changes",
    "apply_changes_async",
    "check_symlinks",
    "dir_in_the_way",
    "disk_digest",
    "in_the_way",
    "interrupted_applies",
    "recover_applies",
]

log = get_logger(__name__)

_JOURNAL = "journal.json"
#: how many paths a log line names before it says how many more there are
LOGGED_PATHS = 10


def logged_paths(paths: Iterable[str]) -> list[str]:
    """``paths`` for a log line: the first :data:`LOGGED_PATHS`, then ``and N more`` (an apply
    can touch thousands; the reports keep them all)."""
    paths = list(paths)
    if len(paths) <= LOGGED_PATHS:
        return paths
    return [*paths[:LOGGED_PATHS], f"and {len(paths) - LOGGED_PATHS} more"]


@frozen
class OutsideChange:
    """A path the apply would touch that is not as the snapshot held it: changed in the
    workspace after it, or a directory holding files in the way of a file the apply makes."""

    path: str
    reason: str


@frozen
class ApplyResult:
    """What an apply did (``applied``) or why it did nothing (``conflicts``)."""

    #: True when every change was written
    applied: bool
    written: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()
    mode_changed: tuple[str, ...] = ()
    #: files changed outside since the snapshot; non-empty means nothing was written
    conflicts: tuple[OutsideChange, ...] = ()

    @property
    def ok(self) -> bool:
        """Whether the apply happened (or there was nothing to do)."""
        return self.applied


@frozen
class InterruptedApply:
    """An apply a crash interrupted, as its journal holds it: the workspace may be half written."""

    #: the journal directory
    journal: str
    #: the workspace it writes
    workspace: str
    #: what the caller said the changes are (``apply_changes(origin=...)``), if it did
    origin: Mapping[str, Any] | None = None
    #: when the apply started (seconds since the epoch)
    started: float | None = None
    written: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()
    mode_changed: tuple[str, ...] = ()
    #: files that are neither their version before the apply nor after it (edited since the
    #: crash): recovery leaves them alone and keeps the journal until they are settled
    edited: tuple[str, ...] = ()

    @property
    def paths(self) -> tuple[str, ...]:
        """Every path the apply touches, sorted."""
        return tuple(sorted((*self.written, *self.deleted, *self.mode_changed)))


@frozen
class RecoveryReport:
    """What :func:`recover_applies` did with one interrupted apply."""

    #: the journal directory
    journal: str
    action: Literal["completed", "rolled back", "discarded"]
    #: workspace paths that hold the version the action gives them (the edited ones excepted)
    paths: tuple[str, ...] = ()
    #: files left as they were because they were neither version (edited since the crash): the
    #: apply is then rolled back around them and its journal kept aside (``journal`` names it)
    problems: tuple[str, ...] = ()
    #: the apply as journaled; None when the journal was discarded (nothing had been written)
    apply: InterruptedApply | None = None
    #: the paths the action wrote, deleted or changed the mode of (the others already held the
    #: version it gives them)
    changed: tuple[str, ...] = ()


def _applies_dir(state_dir: str | os.PathLike[str]) -> str:
    return os.path.join(os.fspath(state_dir), "applies")


@contextlib.contextmanager
def _locked(state_dir: str | os.PathLike[str]) -> Iterator[str]:
    """Serialize applies and recoveries sharing a state directory (an flock)."""
    applies = _applies_dir(state_dir)
    os.makedirs(applies, exist_ok=True)
    fd = os.open(os.path.join(applies, ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield applies
    finally:
        os.close(fd)


def _write_blob(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_blob(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def _blob_digest(path: str) -> str | None:
    """The digest of a journaled content, streamed (None if it cannot be read)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return digest_fd(fd)
    except OSError:
        return None
    finally:
        os.close(fd)


def disk_digest(root: str, path: str) -> str | None:
    """The digest of workspace path ``path`` under ``root`` as it is now (None if absent)."""
    return _disk(root, path)[0]


def _disk(root: str, path: str) -> tuple[str | None, int | None]:
    """Digest and mode of a workspace path as it is now (None, None if absent); a file is
    hashed as it streams by, never held."""
    full = os.path.join(root, path)
    try:
        st = os.lstat(full)
        if stat.S_ISLNK(st.st_mode):
            return digest(name_bytes(os.readlink(full))), normalize_mode(st.st_mode)
        fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            return digest_fd(fd), normalize_mode(st.st_mode)
        finally:
            os.close(fd)
    except (FileNotFoundError, NotADirectoryError):
        return None, None
    except IsADirectoryError:
        return "a directory", None  # neither version: never overwritten


def _check_parents(root: str, path: str, deleted: set[str]) -> str | None:
    """Why ``path``'s directories cannot be used, or None: each must be absent, a real directory,
    or a path this apply deletes first."""
    parts = path.split("/")[:-1]
    for depth in range(1, len(parts) + 1):
        rel = "/".join(parts[:depth])
        full = os.path.join(root, rel)
        if rel in deleted or not os.path.lexists(full):
            continue
        if os.path.islink(full) or not os.path.isdir(full):
            return f"{rel} is not a directory in the workspace"
    return None


def _outside_change(snapshot: Snapshot, path: str, deleted: set[str]) -> str | None:
    """Why workspace path ``path`` is not what the snapshot held, or None. A real directory
    where the snapshot held no file is in the way unless it holds only files this apply
    deletes (then a file can take its place): the reason names a file it holds that the apply
    does not delete (one the snapshot never held: ignored, or new)."""
    full = os.path.join(snapshot.root, path)
    if not snapshot.exists(path) and os.path.isdir(full) and not os.path.islink(full):
        return dir_in_the_way(snapshot.root, path, deleted)
    return snapshot.disk_differs(path)


def dir_in_the_way(root: str, path: str, deleted: Set[str]) -> str | None:
    """None when workspace path ``path`` (under ``root``) is a real directory holding only
    files in ``deleted``: deleting them makes room for a file there. Else why not."""
    full = os.path.join(root, path)
    if os.path.islink(full) or not os.path.isdir(full):
        return "not a directory being emptied"
    found, _ = in_the_way(root, path, deleted, 1)
    return f"{found[0]} is in the way" if found else None


def in_the_way(root: str, path: str, deleted: Set[str], limit: int) -> tuple[list[str], bool]:
    """What stops the real directory ``path`` of the workspace ``root`` from going once the
    files in ``deleted`` are deleted (the apply removes a directory that deleting files left
    empty, never another): the first ``limit`` entries found, walking in name order
    (anything not a directory that is not in ``deleted``, and a directory holding nothing,
    named with a trailing ``/``: no deletion below it makes it go), and whether there are
    more. An unreadable directory is in the way too."""
    found: list[str] = []
    stack = [os.path.join(root, path)]
    while stack:
        directory = stack.pop()
        try:
            with os.scandir(directory) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            entries = []
        if not entries:  # empty, or unreadable: it stays
            found.append(os.path.relpath(directory, root).replace(os.sep, "/") + "/")
        below = []
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                below.append(entry.path)
                continue
            rel = os.path.relpath(entry.path, root).replace(os.sep, "/")
            if rel not in deleted:
                found.append(rel)
        stack.extend(reversed(below))
        if len(found) > limit:
            return found[:limit], True
    return found, False


def _remove_empty_parents(root: str, path: str) -> None:
    parent = path.rpartition("/")[0]
    while parent:
        try:
            os.rmdir(os.path.join(root, parent))
        except OSError:
            return
        parent = parent.rpartition("/")[0]


def _parents(root: str, path: str) -> None:
    """Make the directories of a workspace path, refusing one that leads elsewhere."""
    head = path.rpartition("/")[0]
    if head:
        full_head = os.path.join(root, head)
        make_dirs(full_head)
        if os.path.realpath(full_head) != os.path.join(os.path.realpath(root), head):
            raise ApplyError(f"{display_name(head)} resolves outside its place in the workspace")


def _put(root: str, path: str, data: bytes, mode: int) -> None:
    """Write a workspace file atomically (parents created, never through a symlink)."""
    _parents(root, path)
    write_entry_atomic(os.path.join(root, path), data, mode, fsync=True)


def _put_journaled(root: str, path: str, blob: str, want: str, mode: int, what: str) -> None:
    """Write a workspace file atomically from a journaled content, copied as it streams by (a
    reflink where the filesystem can) and checked against its digest ``want`` on the way.

    A symlink's content (its target) is read: it is small.
    """
    if stat.S_ISLNK(mode):
        data = _read_blob(blob)
        if data is None or digest(data) != want:
            raise ApplyError(f"{what} is missing or corrupt")
        _put(root, path, data, mode)
        return
    _parents(root, path)
    full = os.path.join(root, path)
    head, name = os.path.split(full)
    tmp = os.path.join(head, temp_name(name))
    try:
        src = os.open(blob, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise ApplyError(f"{what} is missing or corrupt") from e
    try:
        dst = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            size, devices = os.fstat(src).st_size, (os.fstat(src).st_dev, os.fstat(dst).st_dev)
            intact = copy_fd_hashed(src, dst, size, devices) == want
            if intact:
                os.fchmod(dst, stat.S_IMODE(mode))
                os.fsync(dst)
        except BaseException:
            intact = False
            raise
        finally:
            os.close(dst)
            if not intact:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
        if not intact:
            raise ApplyError(f"{what} is missing or corrupt")
        os.replace(tmp, full)
    finally:
        os.close(src)


def _remove(root: str, path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(root, path))
    _remove_empty_parents(root, path)


def _sources(
    source: ChangeSource | Snapshot, changes: Mapping[str, Change] | None, allow_conflicts: bool
) -> tuple[Snapshot, ChangeSet]:
    if isinstance(source, Snapshot):
        if changes is None:
            raise TypeError("apply_changes(snapshot, changes): the changes are missing")
        return source, ChangeSet.of(changes)
    conflicts = getattr(source, "conflicts", ())
    if conflicts and not allow_conflicts:
        raise MergeConflictError(conflicts)
    root = source.root
    if not isinstance(root, Snapshot):
        raise TypeError("only changes over a workspace snapshot can be applied")
    return root, ChangeSet.of(changes) if changes is not None else source.net_changes()


def check_symlinks(root: str | os.PathLike[str], changes: Mapping[str, Change]) -> None:
    """Raise :class:`~orchestrator.vfs.errors.SymlinkOutside` if ``changes`` would make a symlink
    in the workspace ``root`` that leads outside it (see the module docs). Blocking (it looks
    at the links on disk that the new ones lead through)."""
    refused = refused_links(os.path.realpath(root), changes)
    if refused:
        log.warning("apply refused: symlinks the workspace cannot take", links=refused)
        raise SymlinkOutside([(p, t) for p, t, _ in refused], [why for _, _, why in refused])


def apply_changes(
    source: ChangeSource | Snapshot,
    changes: Mapping[str, Change] | None = None,
    *,
    state_dir: str | os.PathLike[str],
    on_file: Callable[[str], None] | None = None,
    allow_conflicts: bool = False,
    origin: Mapping[str, Any] | None = None,
) -> ApplyResult:
    """Write changes to the workspace, all or nothing (see the module docs).

    ``source`` is a branch or a merge result (its net changes are applied), or a snapshot with
    explicit ``changes`` relative to it. A merge result with conflicts raises
    :class:`MergeConflictError` unless ``allow_conflicts`` (then only the clean part is applied).
    ``on_file(path)`` is called after each file is changed on disk (a test hook: raising from it
    rolls everything back). A symlink leading outside the workspace raises
    :class:`~orchestrator.vfs.errors.SymlinkOutside`. ``origin`` (JSON values) is kept in the
    journal: if a crash interrupts the apply, :func:`interrupted_applies` and the recovery
    report give it back. Blocking: from trio, use :func:`apply_changes_async`.
    """
    snapshot, change_set = _sources(source, changes, allow_conflicts)
    root = snapshot.root
    check_symlinks(root, change_set)
    deleted_paths = {p for p, c in change_set.items() if isinstance(c, Delete)}
    conflicts: list[OutsideChange] = []
    for path, _change in change_set.items():
        reason = _outside_change(snapshot, path, deleted_paths)
        reason = reason or _check_parents(root, path, deleted_paths)
        if reason is not None:
            conflicts.append(OutsideChange(path, reason))
    if conflicts:
        log.warning(
            "apply refused: these paths cannot take the changes",
            files={c.path: c.reason for c in conflicts},
        )
        return ApplyResult(False, conflicts=tuple(conflicts))
    if not change_set:
        return ApplyResult(True)
    with _locked(state_dir) as applies:
        journal_dir = os.path.join(
            applies, f"{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(4)}"
        )
        try:
            entries = _prepare(journal_dir, snapshot, change_set, origin)
        except WorkspaceChanged as e:
            shutil.rmtree(journal_dir, ignore_errors=True)
            found = tuple(
                OutsideChange(p, "changed in the workspace during the apply") for p in e.paths
            )
            return ApplyResult(False, conflicts=found)
        except BaseException:
            shutil.rmtree(journal_dir, ignore_errors=True)
            raise
        try:
            raced = _roll(root, journal_dir, entries, "forward", on_file)
        except BaseException as e:
            # one line: the caller gets the error (ApplyError); the traceback for debugging
            log.warning("apply failed, rolling back", journal=journal_dir, error=str(e))
            log.debug("apply failed", exc_info=e)
            _roll(root, journal_dir, entries, "back", None)
            shutil.rmtree(journal_dir, ignore_errors=True)
            if isinstance(e, Exception):
                raise ApplyError(f"apply failed and was rolled back: {e}") from e
            raise
        if raced:
            # Someone edited these files between the check and the write: undo everything.
            _roll(root, journal_dir, entries, "back", None)
            shutil.rmtree(journal_dir, ignore_errors=True)
            log.warning("apply undone: workspace changed during the apply", files=raced)
            found = tuple(
                OutsideChange(p, "changed in the workspace during the apply") for p in raced
            )
            return ApplyResult(False, conflicts=found)
        shutil.rmtree(journal_dir)
        fsync_dir(applies)
    result = ApplyResult(True, change_set.written, change_set.deleted, change_set.mode_changed)
    log.info("applied", root=root, summary=change_set.summary())
    return result


async def apply_changes_async(
    source: ChangeSource | Snapshot,
    changes: Mapping[str, Change] | None = None,
    *,
    state_dir: str | os.PathLike[str],
    allow_conflicts: bool = False,
    origin: Mapping[str, Any] | None = None,
) -> ApplyResult:
    """:func:`apply_changes` in a worker thread (not cancellable once writing has started)."""
    return await trio.to_thread.run_sync(
        lambda: apply_changes(
            source, changes, state_dir=state_dir, allow_conflicts=allow_conflicts, origin=origin
        )
    )


def _prepare(
    journal_dir: str,
    snapshot: Snapshot,
    change_set: ChangeSet,
    origin: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Write new contents and backups, then ``journal.json`` (the commit point)."""
    os.makedirs(os.path.join(journal_dir, "new"))
    os.makedirs(os.path.join(journal_dir, "old"))
    entries: list[dict[str, Any]] = []
    for i, (path, change) in enumerate(change_set.items()):
        entry: dict[str, Any] = {"path": path}
        if isinstance(change, Write):
            entry.update(
                action="write", new=f"new/{i}", new_digest=change.digest, new_mode=change.mode
            )
            _write_blob(os.path.join(journal_dir, "new", str(i)), change.data)
        elif isinstance(change, ModeChange):
            entry.update(action="chmod", new_mode=change.mode)
        else:
            entry.update(action="delete")
        if snapshot.exists(path):
            old = snapshot.read(path)  # re-verified against the snapshot: raises if changed
            entry.update(old=f"old/{i}", old_digest=digest(old), old_mode=snapshot.mode(path))
            _write_blob(os.path.join(journal_dir, "old", str(i)), old)
        entries.append(entry)
    fsync_dir(os.path.join(journal_dir, "new"))
    fsync_dir(os.path.join(journal_dir, "old"))
    body = {
        "version": 1,
        "workspace": snapshot.root,
        "created": time.time(),
        "origin": None if origin is None else dict(origin),
        "entries": entries,
    }
    tmp = os.path.join(journal_dir, _JOURNAL + ".tmp")
    _write_blob(tmp, json.dumps(body, indent=1).encode())
    os.replace(tmp, os.path.join(journal_dir, _JOURNAL))
    fsync_dir(journal_dir)
    return entries


def _roll(
    root: str,
    journal_dir: str,
    entries: list[dict[str, Any]],
    direction: Literal["forward", "back"],
    on_file: Callable[[str], None] | None,
) -> list[str]:
    """Bring every entry to its new (forward) or old (back) version; the paths left alone."""
    problems: list[str] = []
    # Deletions first (a file may become a directory), writes last (a directory may become a file).
    order = {"delete": 0, "chmod": 1, "write": 2}
    ordered = sorted(entries, key=lambda e: order[e["action"]])
    if direction == "back":
        ordered.reverse()
    touched_dirs: set[str] = set()
    for entry in ordered:
        path = entry["path"]
        now_digest, now_mode = _disk(root, path)
        old, new = _old_and_new(entry)
        want, other = (new, old) if direction == "forward" else (old, new)
        if (now_digest, now_mode) == want:
            continue
        if (now_digest, now_mode) != other:
            problems.append(path)
            continue
        try:
            _set(root, journal_dir, entry, direction, now_digest)
        except OSError as e:
            raise _EntryFailed(path, entry["action"], e) from e
        touched_dirs.add(os.path.dirname(os.path.join(root, path)))
        if on_file is not None:
            on_file(path)
    for directory in touched_dirs:
        with contextlib.suppress(OSError):
            fsync_dir(directory)
    return problems


class _EntryFailed(OSError):
    """A file of an apply that could not be written, deleted or given its mode: named by its
    own path, not by its temp file's (nor by none, as a full disk says)."""

    def __init__(self, path: str, action: str, error: OSError) -> None:
        super().__init__(error.errno, error.strerror or str(error))
        verb = {"delete": "delete", "chmod": "change the mode of"}.get(action, "write")
        self.path = path
        self.action = action
        self.error = error
        self.message = f"could not {verb} {display_name(path)}: {error.strerror or error}"

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.path, self.action, self.error))


def _old_and_new(entry: Mapping[str, Any]) -> tuple[tuple[Any, Any], tuple[Any, Any]]:
    """A journal entry's path before and after the apply, as :func:`_disk` sees it."""
    old = (entry.get("old_digest"), entry.get("old_mode"))
    if entry["action"] == "delete":
        return old, (None, None)
    return old, (entry.get("new_digest") or entry.get("old_digest"), entry.get("new_mode"))


def _set(
    root: str,
    journal_dir: str,
    entry: dict[str, Any],
    direction: Literal["forward", "back"],
    now_digest: str | None,
) -> None:
    path = entry["path"]
    if direction == "forward":
        if entry["action"] == "delete":
            _remove(root, path)
        elif entry["action"] == "chmod":
            os.chmod(os.path.join(root, path), stat.S_IMODE(entry["new_mode"]))
        else:
            blob = os.path.join(journal_dir, entry["new"])
            what = f"journaled content of {display_name(path)}"
            _put_journaled(root, path, blob, entry["new_digest"], entry["new_mode"], what)
        return
    if "old" not in entry:
        _remove(root, path)
        return
    if entry["action"] == "chmod" and now_digest == entry["old_digest"]:
        os.chmod(os.path.join(root, path), stat.S_IMODE(entry["old_mode"]))
        return
    blob = os.path.join(journal_dir, entry["old"])
    _put_journaled(
        root, path, blob, entry["old_digest"], entry["old_mode"], f"backup of {display_name(path)}"
    )


def _remove_temp_files(root: str, entries: list[dict[str, Any]]) -> None:
    """Delete temporary files an interrupted write left next to its target."""
    for entry in entries:
        head, _, name = entry["path"].rpartition("/")
        directory = os.path.join(root, head) if head else root
        with contextlib.suppress(OSError), os.scandir(directory) as it:
            for found in it:
                if is_temp_name(found.name, name):
                    os.unlink(found.path)


def _journaled(journal_dir: str, body: Mapping[str, Any], *, look: bool) -> InterruptedApply:
    """The apply a ``journal.json`` body describes; with ``look``, the files edited since are
    found (each touched file is read)."""
    entries: list[dict[str, Any]] = body["entries"]
    edited: list[str] = []
    for entry in entries if look else ():
        try:
            now = _disk(body["workspace"], entry["path"])
        except OSError:  # unreadable: neither version as far as anyone can tell
            now = ("unreadable", None)
        if now not in _old_and_new(entry):
            edited.append(entry["path"])

    def paths(action: str) -> tuple[str, ...]:
        return tuple(sorted(e["path"] for e in entries if e["action"] == action))

    origin = body.get("origin")
    return InterruptedApply(
        journal_dir,
        body["workspace"],
        origin if isinstance(origin, dict) else None,
        body.get("created"),
        paths("write"),
        paths("delete"),
        paths("chmod"),
        tuple(sorted(edited)),
    )


_ACTIONS = ("write", "delete", "chmod")


def _journal_damage(body: Any) -> str | None:
    """What keeps a ``journal.json`` body from being the journal :func:`_prepare` writes."""
    if not isinstance(body, dict):
        return "it is not a JSON object"
    if not isinstance(body.get("workspace"), str) or not os.path.isabs(body["workspace"]):
        return "it names no workspace"
    entries = body.get("entries")
    if not isinstance(entries, list):
        return "it lists no files"
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
            return "an entry names no file"
        action = entry.get("action")
        if action not in _ACTIONS:
            return f"an entry has no known action ({display_name(entry['path'])})"
        needed = {"write": ("new", "new_digest", "new_mode"), "chmod": ("new_mode",)}
        fields = list(needed.get(action, ()))
        if "old" in entry:
            fields += ["old", "old_digest", "old_mode"]
        for field in fields:
            want = int if field.endswith("_mode") else str
            if not isinstance(entry.get(field), want) or isinstance(entry.get(field), bool):
                return f"the entry of {display_name(entry['path'])} has no valid {field}"
    return None


def _read_journal(journal_dir: str) -> dict[str, Any] | None:
    """The body of the journal in ``journal_dir``; None when it has no ``journal.json`` (the
    crash came before anything was written).

    A journal that cannot be read, or is not one, is damage to the state directory: the
    workspace it writes may be half written, so it is neither skipped nor guessed at; a
    :class:`~orchestrator.errors.StateDirectoryError` names it and what to do.
    """
    path = os.path.join(journal_dir, _JOURNAL)
    body: Any = None
    damage: str | None
    try:
        with open(path, "rb") as f:
            body = json.load(f)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        damage = f"it cannot be read: {e.strerror or e}"
    except ValueError as e:  # not JSON, or not UTF-8
        damage = f"it is not valid JSON: {e}"
    else:
        damage = _journal_damage(body)
    if damage is None:
        return dict(body)
    workspace = body.get("workspace") if isinstance(body, dict) else None
    where = (
        f"the workspace {display_name(workspace)}"
        if isinstance(workspace, str) and workspace
        else "the workspace it wrote"
    )
    raise StateDirectoryError(
        f"the apply journal {display_name(path)} is damaged ({damage}): an interrupted apply "
        f"may have left {where} half written; check that workspace, then move "
        f"{display_name(journal_dir)} out of {display_name(os.path.dirname(journal_dir))}"
    )


def interrupted_applies(state_dir: str | os.PathLike[str]) -> list[InterruptedApply]:
    """The applies journaled in ``state_dir`` that a crash interrupted, oldest first.

    Reads only (nothing is recovered, nothing created; each file an apply touches is read, to
    tell those edited since). An apply under way in another process is not an interrupted
    one: while one holds the lock, nothing is listed. A journal without ``journal.json`` (the
    crash came before anything was written) is not listed either.
    """
    applies = _applies_dir(state_dir)
    try:
        names = sorted(os.listdir(applies))
    except (FileNotFoundError, NotADirectoryError):
        return []
    with contextlib.ExitStack() as stack:
        with contextlib.suppress(OSError):
            fd = os.open(os.path.join(applies, ".lock"), os.O_RDONLY | os.O_CLOEXEC)
            stack.callback(os.close, fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return []  # an apply or a recovery is under way: its journal is not a crash's
        found: list[InterruptedApply] = []
        for name in names:
            journal_dir = os.path.join(applies, name)
            if name.startswith("."):
                continue
            body = _read_journal(journal_dir)
            if body is not None:
                found.append(_journaled(journal_dir, body, look=True))
        return found


def recover_applies(state_dir: str | os.PathLike[str]) -> list[RecoveryReport]:
    """Finish or undo every interrupted apply journaled in ``state_dir`` (see module docs)."""
    reports: list[RecoveryReport] = []
    with _locked(state_dir) as applies:
        for name in sorted(os.listdir(applies)):
            journal_dir = os.path.join(applies, name)
            if name.startswith(".") or not os.path.isdir(journal_dir):
                continue
            reports.append(_recover_one(journal_dir))
    return reports


def _recover_one(journal_dir: str) -> RecoveryReport:
    body = _read_journal(journal_dir)
    if body is None:
        shutil.rmtree(journal_dir)
        log.info("discarded an unfinished apply journal (nothing was written)", journal=journal_dir)
        return RecoveryReport(journal_dir, "discarded")
    root: str = body["workspace"]
    entries: list[dict[str, Any]] = body["entries"]
    complete = all(
        _blob_digest(os.path.join(journal_dir, e["new"])) == e["new_digest"]
        for e in entries
        if e["action"] == "write"
    )
    _remove_temp_files(root, entries)
    apply = _journaled(journal_dir, body, look=True)
    # An edited file keeps the user's version, so the apply cannot be completed: all or nothing
    # means the rest goes back to what it held before, and the workspace is in one known state.
    direction: Literal["forward", "back"] = "forward" if complete and not apply.edited else "back"
    changed: list[str] = []
    action: Literal["completed", "rolled back"] = (
        "completed" if direction == "forward" else "rolled back"
    )
    try:
        problems = _roll(root, journal_dir, entries, direction, changed.append)
    except OSError as e:
        # the journal stays: once the cause is gone, the next recovery goes on from here
        verb = "completed" if direction == "forward" else "rolled back"
        raise StateDirectoryError(
            f"the interrupted apply journaled in {display_name(journal_dir)} could not be "
            f"{verb}: {e}; the workspace {display_name(root)} is half written until the cause "
            "is gone and it is recovered (any apply or run does it first)"
        ) from e
    paths = tuple(sorted(e["path"] for e in entries if e["path"] not in problems))
    if problems:
        # what the edited files held before the apply is only here now: kept, out of the way
        head, name = os.path.split(journal_dir)
        kept = os.path.join(head, f".kept-{name}")
        os.replace(journal_dir, kept)
        fsync_dir(head)
        journal_dir = kept
        log.error(
            "apply recovery left edited files alone",
            journal=journal_dir,
            count=len(problems),
            files=logged_paths(sorted(problems)),
        )
    else:
        shutil.rmtree(journal_dir)
    log.warning("recovered an interrupted apply", journal=journal_dir, action=action, root=root)
    return RecoveryReport(
        journal_dir,
        action,
        paths,
        tuple(sorted(problems)),
        attrs.evolve(apply, journal=journal_dir),
        tuple(sorted(changed)),
    )
