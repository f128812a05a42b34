"""Working directories: harvesting what changed on disk into the branch.

A :class:`Workdir` is a branch materialized as real files (see
:func:`~orchestrator.vfs.checkout.materialize`). :meth:`Workdir.harvest` brings what changed
on disk into the branch: new, modified and deleted files and mode changes. It compares ``lstat``
(size, mtime, ctime, inode, mode) with what was recorded, reads and hashes a file only when that
differs, and compares by content a file changed too recently for its mtime to be trusted. On
Linux an inotify watch tells it which paths the kernel saw change, so an unchanged tree is
harvested without stat-ing every file; a full scan runs when inotify is unavailable or
overflows, after a directory rename, or when asked (``full=True``); asked in a directory every
directory and file of which is watched by inode since it was proven its tree (a pooled one reset,
see :mod:`orchestrator.vfs.pool` and :mod:`orchestrator.vfs._inotify`), the harvest still goes by
the events, which then name every path touched through any name, opens included, unless a mount
is below the directory. A full scan takes the stat
of every entry from GNU ``find``, run in its own process, where there is one (see
:mod:`orchestrator.vfs._harvestlines`): a walk in a worker thread waits for the GIL after each
``stat`` while the event loop's thread runs. Harvest after every turn and every terminal
command.

What git would ignore in the branch is never harvested. The ignore rules are those of the
workspace (its ``.gitignore`` files, ``.git/info/exclude``, the extra globs) kept in step with the
``.gitignore`` files of the directory as they are when harvested, at every depth: a tool that
writes one during the step (``pytest`` puts ``*`` in ``.pytest_cache/.gitignore``) keeps its
output out of the branch, and a file harvested before a ``.gitignore`` came to ignore it leaves the
branch again. As in git, the rules apply to files new to the branch only: a file of the tree the
branch forked from (the workspace snapshot and what earlier steps wrote) stays part of it, so its
edits, mode changes and deletion still count even where a pattern now matches it. A
``.gitignore`` is read again only when its stat changed, and ignored directories are not walked.

Change a materialized branch through :meth:`Workdir.write` / :meth:`Workdir.delete` (the fs
service does) or on disk: either way the directory and the branch stay in step.

With a limit on a changed file (:attr:`Workdir.max_file_size`), a write larger than it is
refused before anything is written (:class:`~orchestrator.vfs.errors.FileTooLarge`), and a
harvest never reads a file on disk larger than it: the file is left out of the branch and
listed in :attr:`Workdir.too_large` (and the report's ``too_large``) until it is deleted or
shrinks, so the caller can fail the work that made it. Only its size is looked at, unless it is
a file of the branch whose stat changed: then it is hashed as it streams by (never held), and a
file whose content is what the branch holds (touched, or only its mode changed) is no change of
content.

A symlink is harvested as its target text. A link the checkout wrote leading into this directory
rather than into the workspace (see :mod:`orchestrator.vfs.checkout`) reads back as the target
the branch records, so that rewrite is never a change; a write through it changes the file it
leads to here. A link the agent makes with an absolute target into this directory is recorded
with the workspace's same path, as it was meant.
"""

from __future__ import annotations

import errno
import operator
import os
import stat
import threading
import time
from collections.abc import Iterable, Iterator, Mapping

import trio
from attrs import define, field, frozen

from .._log import get_logger
from .._names import name_bytes, name_of
from . import _inotify, _statwalk
from ._fileio import (
    _DIR_NOFOLLOW,
    DEFAULT_MODE,
    LARGE_FILE_SIZE,
    CopyStats,
    digest_fd,
    normalize_mode,
    normalize_path,
    remove_tree,
    write_entry_atomic,
)
from ._harvestlines import Lines, scan_by_lines
from ._links import LinkMap
from ._mounts import mounts_under
from .branch import Branch
from .changes import Change, Delete, FileState, Write
from .errors import FileTooLarge, PathNotFound, PathRefused, VfsError, WorkspaceChanged
from .ignore import IgnoreMatcher, is_vcs_name, read_rules
from .snapshot import RACY_WINDOW_NS, Snapshot

__all__ = ["HarvestReport", "Workdir", "harvest"]

log = get_logger(__name__)

# What harvest compares: size, mtime, inode, st_mode, ctime.
_Key = tuple[int, int, int, int, int]


_SIZE = operator.itemgetter(0)


def _key(st: os.stat_result) -> _Key:
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_mode, st.st_ctime_ns)


@frozen
class HarvestReport:
    """What one harvest found and recorded into the branch."""

    #: the branch harvested into
    branch: str
    #: new files
    added: tuple[str, ...] = ()
    #: files with new content
    modified: tuple[str, ...] = ()
    #: files gone from the directory
    deleted: tuple[str, ...] = ()
    #: files whose mode only changed
    mode_changed: tuple[str, ...] = ()
    #: files new to the branch that a ``.gitignore`` written since they were harvested ignores:
    #: taken out of the branch again (they stay on disk)
    ignored: tuple[str, ...] = ()
    #: entries stat-ed
    scanned: int = 0
    #: files read and hashed
    hashed: int = 0
    #: True when every file was stat-ed (no inotify, overflow, or asked for)
    full_scan: bool = True
    #: wall-clock duration
    seconds: float = 0.0
    #: files on disk larger than the limit on a changed file after the harvest: not recorded
    #: (see :attr:`Workdir.too_large`)
    too_large: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        """Whether anything was recorded."""
        return bool(
            self.added or self.modified or self.deleted or self.mode_changed or self.ignored
        )


def _needs_resync(events: list[_inotify.Event]) -> bool:
    """Whether the events include a directory rename (watches keep their old paths) or the root
    itself going away."""
    for rel_dir, mask, name in events:
        if not name and mask & (_inotify.IN_MOVE_SELF | _inotify.IN_DELETE_SELF):
            if mask & _inotify.IN_MOVE_SELF or not rel_dir:
                return True
        elif mask & _inotify.IN_ISDIR and mask & (_inotify.IN_MOVED_FROM | _inotify.IN_MOVED_TO):
            return True
    return False


_GITIGNORE = ".gitignore"


def _touches_rules(events: list[_inotify.Event]) -> bool:
    """Whether the events include a ``.gitignore`` file written, deleted or renamed (not only
    opened)."""
    return any(
        name == _GITIGNORE and not mask & _inotify.IN_ISDIR and mask & ~_inotify.IN_OPEN
        for _, mask, name in events
    )


def _read_rules(dir_fd: int) -> tuple[str, _Key] | None:
    """The text of ``.gitignore`` in ``dir_fd`` and the stat it was read with; None if there is
    no regular file of that name (see :func:`~orchestrator.vfs.ignore.read_rules`)."""
    read = read_rules(dir_fd)
    return None if read is None else (read[0], _key(read[1]))


#: a file larger than this whose stat cannot be trusted is compared by a streamed hash before it
#: is read: read, it is held a second time while the branch holds its earlier content
_HOLD_MAX = 1 << 20


def _settled(key: _Key) -> _Key | None:
    """``key``, or None when its mtime is too recent to tell a later same-size rewrite."""
    return None if key[1] >= time.time_ns() - RACY_WINDOW_NS else key


@define(eq=False)
class _Scan:
    added: list[str] = field(factory=list)
    modified: list[str] = field(factory=list)
    deleted: list[str] = field(factory=list)
    mode_changed: list[str] = field(factory=list)
    ignored: list[str] = field(factory=list)
    too_large: list[str] = field(factory=list)
    scanned: int = 0
    hashed: int = 0
    #: directories this harvest found missing or not a directory (a symlink, a file): what
    #: was below them is gone without another lookup (a deleted tree of many files)
    not_dirs: set[str] = field(factory=set)


@define(eq=False)
class Workdir:
    """A branch materialized in a directory: the agent's ``cwd``. Thread-safe.

    Close it (or use it as a context manager) to release the inotify watch; :meth:`remove` also
    deletes the directory. Make one with :func:`~orchestrator.vfs.checkout.materialize`.
    """

    #: absolute path of the directory
    root: str
    branch: Branch
    #: the ignore rules of this directory (its own: they follow its ``.gitignore`` files)
    ignore: IgnoreMatcher = field(repr=False)
    _records: dict[str, _Key] = field(alias="_records", repr=False)
    _racy: set[str] = field(factory=set, alias="_racy", repr=False)
    _watcher: _inotify.Inotify | None = field(default=None, alias="_watcher", repr=False)
    _lock: threading.RLock = field(factory=threading.RLock, alias="_lock", repr=False)
    #: directory -> (stat key, text) of the ``.gitignore`` on disk its patterns were read from;
    #: a None key is read again at the next scan, a None text was not read here
    #: the line ``find`` prints for each record as last seen (see :mod:`._harvestlines`)
    _lines: Lines = field(factory=dict, alias="_lines", repr=False)
    #: directories found ignored (not entered) by the last full scan or since: a listing by
    #: ``find`` leaves them out (and looks at each again)
    _ignored_dirs: set[str] = field(factory=set, alias="_ignored_dirs", repr=False)
    _rule_files: dict[str, tuple[_Key | None, str | None]] = field(
        factory=dict, alias="_rule_files", repr=False
    )
    #: the patterns changed since files new to the branch were last checked against them
    _rules_dirty: bool = field(default=False, alias="_rules_dirty", repr=False)
    #: the patterns differ from the workspace's: a file of the base may be in an ignored directory
    _rules_moved: bool = field(default=False, alias="_rules_moved", repr=False)
    #: files of the base deleted on disk: looked for again while the patterns have moved, since
    #: a walk does not enter the ignored directory one may come back in
    _gone: set[str] = field(factory=set, alias="_gone", repr=False)
    #: how the workspace's links read here (None: the branch is not of a workspace on disk)
    links: LinkMap | None = field(default=None, repr=False)
    #: link path -> (target written here, target the branch records) for the links written
    #: here leading to this directory instead of the workspace
    _rewritten: dict[str, tuple[bytes, bytes]] = field(factory=dict, alias="_rewritten", repr=False)
    #: the largest content (bytes) a changed file may have; None: no limit
    max_file_size: int | None = field(default=None, kw_only=True)
    #: files on disk over :attr:`max_file_size`, left out of the branch: path -> (the stat key
    #: they were judged with, size)
    _too_large: dict[str, tuple[_Key, int]] = field(factory=dict, alias="_too_large", repr=False)
    #: how the checkout made the files: reflinked (blocks shared with the workspace) or copied
    copies: CopyStats = field(factory=CopyStats, kw_only=True)

    @classmethod
    def open(
        cls,
        root: str,
        branch: Branch,
        ignore: IgnoreMatcher,
        records: dict[str, _Key],
        changed: Mapping[str, Change],
        links: LinkMap | None = None,
        rewritten: dict[str, tuple[bytes, bytes]] | None = None,
        *,
        max_file_size: int | None = None,
        copies: CopyStats | None = None,
        rule_files: Iterable[str] | None = None,
    ) -> Workdir:
        """The workdir of ``branch`` just written into ``root`` (``records``: what was written).

        ``ignore`` holds the workspace's rules, ``changed`` what the branch holds over the
        workspace (what earlier steps wrote and its own changes): the ``.gitignore`` files among
        them replace the workspace's. ``links`` maps link targets between the workspace and this
        directory; ``rewritten`` holds the links written here with another target than the
        branch records (path -> (target here, recorded target)). ``max_file_size`` is the limit
        on a changed file (see the module doc); ``copies`` how the files were made;
        ``rule_files``, when known, paths among which are all those of ``records`` named
        ``.gitignore`` (spares looking through every record).
        """
        own = ignore.fork()
        moved = False
        if ignore.rules.use_gitignore:
            for path, change in changed.items():
                if not path.endswith(_GITIGNORE):
                    continue
                head, _, name = path.rpartition("/")
                if name != _GITIGNORE:
                    continue
                if isinstance(change, Write) and stat.S_ISREG(change.mode):
                    own.add_patterns(head, name_of(change.data))
                    moved = True
                elif isinstance(change, Write | Delete):  # gone, or a symlink (not followed)
                    own.remove_patterns(head)
                    moved = True
        workdir = cls(
            root,
            branch,
            own,
            records,
            _rules_moved=moved,
            links=links,
            _rewritten=dict(rewritten or {}),
            max_file_size=max_file_size,
            copies=copies or CopyStats(),
        )
        if ignore.rules.use_gitignore:
            for rel in records if rule_files is None else rule_files:
                key = records.get(rel)
                if key is not None and rel.endswith(_GITIGNORE) and stat.S_ISREG(key[3]):
                    head, _, name = rel.rpartition("/")
                    if name == _GITIGNORE:
                        workdir._rule_files[head] = (_settled(key), None)
        return workdir

    @property
    def too_large(self) -> dict[str, int]:
        """The files on disk over :attr:`max_file_size` as of the last harvest, with their size:
        left out of the branch (the branch keeps what it held before)."""
        with self._lock:
            return {path: size for path, (_, size) in self._too_large.items()}

    def too_large_error(self) -> FileTooLarge | None:
        """:class:`FileTooLarge` naming :attr:`too_large`, or None when there is none."""
        found = self.too_large
        if not found or self.max_file_size is None:
            return None
        return FileTooLarge(found.items(), self.max_file_size)

    @property
    def watching(self) -> bool:
        """Whether harvests are accelerated by inotify right now."""
        return self._watcher is not None

    def __enter__(self) -> Workdir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop watching the directory (harvests still work, by full scans)."""
        with self._lock:
            if self._watcher is not None:
                self._watcher.close()
                self._watcher = None

    def detach_watcher(self) -> _inotify.Inotify | None:
        """Stop watching, handing the watch over (with the events not yet read) instead of
        closing it: None when there was none."""
        with self._lock:
            watcher, self._watcher = self._watcher, None
            return watcher

    def recorded_bytes(self) -> int:
        """Bytes of the files the directory holds as last recorded: as written, or as the last
        harvest found them (ignored files are never recorded)."""
        with self._lock:
            # summed in C: called on the event loop's thread, 10,000 records take 0.3 ms
            return sum(map(_SIZE, self._records.values()))

    def remove(self) -> None:
        """Close and delete the directory."""
        self.close()
        remove_tree(self.root)

    def path_of(self, path: str) -> str:
        """The absolute on-disk path of branch path ``path``."""
        return os.path.join(self.root, normalize_path(path))

    # ---------------------------------------------------------------- harvest

    def harvest(self, *, full: bool = False) -> HarvestReport:
        """Record into the branch what changed on disk since the last harvest (blocking)."""
        started = time.perf_counter()
        with self._lock:
            scan = _Scan()
            watcher = self._watcher
            events = watcher.read() if watcher is not None else []
            resync = watcher is not None and (watcher.overflowed or _needs_resync(events))
            if watcher is not None and resync:
                # Stale watches (a renamed directory) or lost events: start over with a new
                # instance; the full scan below re-adds a watch to each directory before listing it.
                watcher.close()
                self._watcher = watcher = _inotify.Inotify.open(self.root)
            if self.ignore.rules.use_gitignore and _touches_rules(events):
                # a .gitignore ignores or re-includes files anywhere below it, not only the
                # paths that the events name
                full = True
            elif (
                full
                and watcher is not None
                and not resync
                and watcher.complete
                and not mounts_under(self.root)  # a mount shows other files: no event says so
            ):
                # every directory and file watched, through any of its names, opens included,
                # since the directory was proven its tree: the events name every path touched
                full = False
            if full or resync or watcher is None:
                self._note_ignored(events)
                self._full_scan(scan, watcher)
                full = True
            else:
                self._incremental(scan, watcher, events)
            # a file over the limit is not recorded, so no listing finds it gone: look again
            for rel in list(self._too_large):
                if self._left_out(rel):
                    del self._too_large[rel]
                else:
                    self._check(rel, scan)
        report = HarvestReport(
            self.branch.name,
            tuple(sorted(scan.added)),
            tuple(sorted(scan.modified)),
            tuple(sorted(scan.deleted)),
            tuple(sorted(scan.mode_changed)),
            tuple(sorted(scan.ignored)),
            scan.scanned,
            scan.hashed,
            full,
            time.perf_counter() - started,
            tuple(sorted(self._too_large)),
        )
        if scan.too_large:
            log.warning(
                "files over the limit on a changed file, not recorded",
                branch=self.branch.name,
                files=sorted(scan.too_large),
                limit=self.max_file_size,
            )
        if report.changed:
            log.info(
                "harvested",
                branch=self.branch.name,
                added=len(report.added),
                modified=len(report.modified),
                deleted=len(report.deleted),
                mode_changed=len(report.mode_changed),
                ignored=len(report.ignored),
                full_scan=full,
            )
        return report

    async def harvest_async(self, *, full: bool = False) -> HarvestReport:
        """:meth:`harvest` in a worker thread."""
        return await trio.to_thread.run_sync(lambda: self.harvest(full=full))

    def _note_ignored(self, events: list[_inotify.Event]) -> None:
        """Remember the directories ``events`` say were made where the patterns ignore them:
        a full scan by ``find`` leaves them out (checking each against the patterns again)."""
        for rel_dir, mask, name in events:
            if name and mask & _inotify.IN_ISDIR and mask & _inotify.IN_CREATE:
                rel = f"{rel_dir}/{name}" if rel_dir else name
                if self.ignore.is_ignored(rel, is_dir=True):
                    self._ignored_dirs.add(rel)

    def _full_scan(self, scan: _Scan, watcher: _inotify.Inotify | None) -> None:
        records = self._records
        root_fd = _open_root(self.root)
        try:
            big = len(records) >= _statwalk.FIND_MIN_ENTRIES
            find = _statwalk.find_command() if big else None
            found = None if find is None else scan_by_lines(self, find, root_fd, watcher)
            seen, candidates = found if found is not None else self._walk(root_fd, watcher)
        finally:
            os.close(root_fd)
        if self._rules_dirty:
            dropped = self._drop_ignored(scan)
            if dropped:
                candidates = [rel for rel in candidates if rel not in dropped]
        scan.scanned += len(seen) + sum(1 for rel in candidates if rel not in records)
        # recorded files the walk did not see (deleted, or in a directory it skipped), listed
        # before the candidates are recorded: a file checked now is not read a second time
        # compared path by path: a count would be fooled by a file the patterns dropped from
        # the records above (seen, and counted) standing for one deleted (unseen)
        unseen = [r for r in records if r not in seen]
        for rel in candidates:
            self._check(rel, scan)
        for rel in unseen:
            self._check(rel, scan)
        self._check_gone(scan)

    def _walk(self, root_fd: int, watcher: _inotify.Inotify | None) -> tuple[set[str], list[str]]:
        """The records seen and the paths to check, found by walking the directory here."""
        records, racy, matcher = self._records, self._racy, self.ignore
        vcs = matcher.rules.vcs_dirs
        rule_files = self._rule_files if matcher.rules.use_gitignore else None
        seen: set[str] = set()
        candidates: list[str] = []
        ignored: set[str] = set()
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        stack = [""]
        while stack:
            parent = stack.pop()
            if watcher is not None and not watcher.add(parent):
                watcher.close()
                self._watcher = watcher = None
            try:
                # Listing through a directory fd makes each entry's stat a one-component
                # fstatat instead of a full path lookup.
                fd = os.open(parent, flags, dir_fd=root_fd) if parent else os.dup(root_fd)
            except OSError as e:
                _refuse_too_long(e, parent)
                continue  # vanished or replaced meanwhile: its files count as missing
            prefix = f"{parent}/" if parent else ""
            # Directories and unknown files are judged once the whole listing is seen: the
            # directory's own .gitignore, wherever it comes in it, may have changed.
            dirs: list[str] = []
            unknown: list[os.DirEntry[str]] = []
            has_rules_file = False
            try:
                with os.scandir(fd) as it:
                    for entry in it:
                        name = entry.name
                        if entry.is_dir(follow_symlinks=False):
                            if not is_vcs_name(name, vcs):
                                dirs.append(name)
                            continue
                        if name == _GITIGNORE:
                            has_rules_file = True
                        rel = prefix + name
                        known = records.get(rel)
                        if known is None:
                            if not is_vcs_name(name, vcs):
                                unknown.append(entry)
                            continue
                        try:
                            st = entry.stat(follow_symlinks=False)
                        except FileNotFoundError:
                            continue
                        seen.add(rel)
                        if rel in racy or known != (
                            st.st_size,
                            st.st_mtime_ns,
                            st.st_ino,
                            st.st_mode,
                            st.st_ctime_ns,
                        ):
                            candidates.append(rel)
                if rule_files is not None and (has_rules_file or parent in rule_files):
                    self._sync_rules(parent, fd, has_rules_file)
                filtered = matcher.has_rules(parent)
                for name in dirs:
                    rel = prefix + name
                    if filtered and matcher.ignored(rel, parent, name, True):
                        ignored.add(rel)
                    else:
                        stack.append(rel)
                for entry in unknown:
                    # Only unknown paths need the ignore rules and a type check.
                    name = entry.name
                    rel = prefix + name
                    if filtered and matcher.ignored(rel, parent, name, False):
                        continue
                    if entry.is_file(follow_symlinks=False) or entry.is_symlink():
                        candidates.append(rel)
            finally:
                os.close(fd)
        self._ignored_dirs = ignored
        return seen, candidates

    def _sync_rules(self, parent: str, dir_fd: int, present: bool) -> None:
        """Bring the patterns of directory ``parent`` in step with its ``.gitignore`` on disk
        (``dir_fd`` is the directory; ``present``: the listing showed the file).

        The file is read only when its stat differs from the one it was last read with.
        """
        known = self._rule_files.get(parent)
        read = None
        if present:
            try:
                st = os.stat(_GITIGNORE, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                st = None
            if st is not None and stat.S_ISREG(st.st_mode):
                if known is not None and known[0] == _key(st):
                    return
                read = _read_rules(dir_fd)
        if read is None:
            if known is None:
                # Patterns the workspace had from a .gitignore it ignores itself (never copied
                # here): nothing on disk says otherwise.
                return
            del self._rule_files[parent]
            self.ignore.remove_patterns(parent)
        else:
            text, key = read
            self._rule_files[parent] = (_settled(key), text)
            if known is not None and known[1] == text:
                return
            self.ignore.add_patterns(parent, text)
        self._rules_dirty = self._rules_moved = True

    def _drop_ignored(self, scan: _Scan) -> set[str]:
        """Take the files new to the branch that the patterns now ignore out of it again."""
        self._rules_dirty = False
        base, dropped = self.branch.base, set()
        for rel, change in self.branch.changes.items():
            if isinstance(change, Write) and not base.exists(rel) and self.ignore.is_ignored(rel):
                self.branch.revert(rel)
                self._records.pop(rel, None)
                self._racy.discard(rel)
                dropped.add(rel)
        scan.ignored.extend(dropped)
        return dropped

    def _check_gone(self, scan: _Scan) -> None:
        """Look for deleted files of the base again, where a walk may not see them come back."""
        if self._rules_moved and self._gone:
            for rel in [r for r in self._gone if r not in self._records]:
                self._check(rel, scan)

    def _left_out(self, rel: str) -> bool:
        """Whether ``rel`` is no part of the branch: ignored, and neither recorded nor a file of
        the base (git ignores untracked files only)."""
        return (
            rel not in self._records
            and self.ignore.is_ignored(rel)
            and not self.branch.base.exists(rel)
        )

    def _incremental(
        self, scan: _Scan, watcher: _inotify.Inotify, events: list[_inotify.Event]
    ) -> None:
        paths: set[str] = set()
        new_dirs: list[str] = []
        gone_dirs: list[str] = []
        for rel_dir, mask, name in events:
            if not name:
                continue
            rel = f"{rel_dir}/{name}" if rel_dir else name
            if mask & _inotify.IN_ISDIR:
                if mask & _inotify.IN_CREATE:
                    new_dirs.append(rel)
                elif mask & _inotify.IN_DELETE:
                    gone_dirs.append(rel)
            else:
                paths.add(rel)
        for gone in gone_dirs:
            prefix = gone + "/"
            paths.update(r for r in self._records if r.startswith(prefix))
        if new_dirs:
            # recorded there before it was watched (written through fs/*): changed since
            # without an event
            below = tuple(f"{new}/" for new in new_dirs)
            paths.update(r for r in self._records if r.startswith(below))
        for new in new_dirs:
            if not self.ignore.is_ignored(new, is_dir=True):
                paths.update(self._watch_tree(new, watcher))
            else:
                self._ignored_dirs.add(new)
        if self._rules_dirty:  # a new directory came with a .gitignore
            self._drop_ignored(scan)
        for rel in sorted(paths):
            if not self._left_out(rel):
                scan.scanned += 1
                self._check(rel, scan)
        self._check_gone(scan)

    def _watch_tree(self, rel_dir: str, watcher: _inotify.Inotify) -> list[str]:
        """Watch a new directory and everything below it (watch first, then list)."""
        files: list[str] = []
        stack = [rel_dir]
        while stack:
            parent = stack.pop()
            if not watcher.add(parent):
                watcher.overflowed = True  # forces a full scan next time
            try:
                fd = os.open(
                    os.path.join(self.root, parent),
                    os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                )
            except OSError:
                continue  # gone or replaced meanwhile
            try:
                with os.scandir(fd) as it:
                    entries = list(it)
                if self.ignore.rules.use_gitignore:
                    present = any(e.name == _GITIGNORE for e in entries)
                    # a directory made again where one with a .gitignore was: drop its patterns
                    if present or parent in self._rule_files:
                        self._sync_rules(parent, fd, present)
                for entry in entries:
                    rel = f"{parent}/{entry.name}"
                    is_dir = entry.is_dir(follow_symlinks=False)
                    if self.ignore.ignored(rel, parent, entry.name, is_dir):
                        if is_dir:
                            self._ignored_dirs.add(rel)
                        continue
                    (stack if is_dir else files).append(rel)
            finally:
                os.close(fd)
        return files

    def _check(self, rel: str, scan: _Scan) -> None:
        """Compare one path on disk with its record; record any change into the branch.

        The path is looked up without following a symlink anywhere along it: below a directory
        made a symlink (or a file) since, it is gone, whatever the link leads to.
        """
        watcher = self._watcher
        if watcher is not None and watcher.complete:
            # watched (again: perhaps another inode now) before its stat: what is done to it
            # after the stat, through any name, is told
            watcher.add_files((rel,))
        head, _, name = rel.rpartition("/")
        if not head:
            return self._check_at(rel, os.path.join(self.root, rel), scan)
        if scan.not_dirs and any(d in scan.not_dirs for d in _dirs_of(head)):
            return self._check_at(rel, None, scan)
        parent = _open_below(self.root, head)
        if isinstance(parent, str):
            scan.not_dirs.add(parent)
            return self._check_at(rel, None, scan)
        try:
            # through the open directory: nothing renamed meanwhile leads the lookup elsewhere
            full = f"{_PROC_FD}/{parent}/{name}" if _PROC_FD else os.path.join(self.root, rel)
            return self._check_at(rel, full, scan)
        finally:
            os.close(parent)

    def _check_at(self, rel: str, full: str | None, scan: _Scan) -> None:
        """:meth:`_check` of ``rel`` found at ``full`` (None: not there)."""
        known = self._records.get(rel)
        try:
            st = os.lstat(full) if full is not None else None
        except (FileNotFoundError, NotADirectoryError):
            st = None
        except OSError as e:
            _refuse_too_long(e, rel)
            raise
        if st is None or not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
            self._too_large.pop(rel, None)
            if known is not None:
                del self._records[rel]
                self._racy.discard(rel)
                existed = self.branch.mode(rel) is not None
                if isinstance(self.branch.set_state(rel, None), Delete):
                    self._gone.add(rel)
                if existed:
                    scan.deleted.append(rel)
            return
        assert full is not None  # it was found there
        if known == _key(st):
            if rel not in self._racy:
                return
            # a stat too recent to trust: compared by content, a large file without holding it
            if st.st_size > _HOLD_MAX and stat.S_ISREG(st.st_mode) and self._unchanged(rel, full):
                return
        limit = self.max_file_size
        if limit is not None and st.st_size > limit and stat.S_ISREG(st.st_mode):
            return self._check_large(rel, full, st, scan)
        try:
            state, key = _read_state(full, limit)
        except (FileNotFoundError, NotADirectoryError):
            return self._check(rel, scan)
        if limit is not None and len(state.data) > limit:  # it grew while being read
            return self._check(rel, scan)
        self._too_large.pop(rel, None)
        if stat.S_ISLNK(state.mode):
            state = FileState(self._recorded_target(rel, state.data), state.mode)
        scan.hashed += 1
        try:
            old_digest, old_mode = self.branch.digest(rel), self.branch.mode(rel)
        except WorkspaceChanged:
            old_digest, old_mode = None, self.branch.mode(rel)
        self._records[rel] = key
        self._gone.discard(rel)
        if key[1] >= time.time_ns() - RACY_WINDOW_NS:
            self._racy.add(rel)
        else:
            self._racy.discard(rel)
        if old_digest == state.digest and old_mode == state.mode:
            return
        self.branch.set_state(rel, state)
        if old_mode is None:
            scan.added.append(rel)
        elif old_digest != state.digest:
            scan.modified.append(rel)
        else:
            scan.mode_changed.append(rel)

    def _unchanged(self, rel: str, full: str) -> bool:
        """Whether the file at ``rel``, whose stat is as recorded, holds what the branch does
        (hashed as it streams by); its record is settled if so."""
        try:
            old_digest = self.branch.digest(rel)
            now_digest, key = _hash_file(full)
        except (OSError, WorkspaceChanged):
            return False
        if now_digest != old_digest or key != self._records.get(rel):
            return False
        if key[1] < time.time_ns() - RACY_WINDOW_NS:
            self._racy.discard(rel)
        return True

    def _check_large(self, rel: str, full: str, st: os.stat_result, scan: _Scan) -> None:
        """A file over the limit: never read whole. Unless its content is what the branch holds
        (a file of the branch touched, or its mode changed), it is left out of the branch."""
        assert self.max_file_size is not None
        judged = self._too_large.get(rel)
        if judged is not None and judged[0] == _key(st):
            return  # as it was when judged
        try:
            old_digest = self.branch.digest(rel)
        except WorkspaceChanged:
            old_digest = None
        key = _key(st)
        if old_digest is not None:
            try:
                now_digest, key = _hash_file(full)
            except OSError as e:
                gone = isinstance(e, FileNotFoundError | NotADirectoryError | IsADirectoryError)
                if not gone and e.errno != errno.ELOOP:  # ELOOP: a symlink now
                    raise
                return self._check(rel, scan)
            if key[0] <= self.max_file_size:  # it shrank meanwhile: judged again
                return self._check(rel, scan)
            if now_digest == old_digest:
                self._too_large.pop(rel, None)
                self._records[rel] = key
                scan.hashed += 1
                if key[1] >= time.time_ns() - RACY_WINDOW_NS:
                    self._racy.add(rel)
                else:
                    self._racy.discard(rel)
                mode = normalize_mode(key[3])
                if mode != self.branch.mode(rel):
                    self.branch.set_mode(rel, mode)
                    scan.mode_changed.append(rel)
                return
        if judged is None:
            scan.too_large.append(rel)
        self._too_large[rel] = (key, key[0])

    def sync_path(self, path: str) -> None:
        """Harvest just ``path`` (e.g. before serving a read of it)."""
        rel = normalize_path(path)
        with self._lock:
            if not self._left_out(rel):
                self._check(rel, _Scan())

    def _start_watching(self, dirs: Iterable[str]) -> None:
        watcher = _inotify.Inotify.open(self.root)
        if watcher is None:
            return
        for rel_dir in dirs:
            if not watcher.add(rel_dir):
                watcher.close()
                log.info("inotify watch limit reached, harvests will scan", directory=self.root)
                return
        self._watcher = watcher

    # ---------------------------------------------------------------- writing

    def read(self, path: str) -> bytes:
        """Current content of ``path`` on disk, harvested first so the branch agrees with it.

        An ignored path (not part of the branch) is read as it is. A symlink's content is its
        target.
        """
        rel = normalize_path(path)
        with self._lock:
            if not self._left_out(rel):
                self._check(rel, _Scan())
            head, _, name = rel.rpartition("/")
            dir_fd = _open_dir(self.root, head, create=False)
            try:
                data, link = _read_at(dir_fd, name, rel)
            finally:
                os.close(dir_fd)
            return self._recorded_target(rel, data) if link else data

    def read_nowait(self, path: str, max_bytes: int) -> bytes | None:
        """:meth:`read`, if that can be done at once: None (nothing read) while another thread
        holds the directory (a harvest, a write) or when the file is larger than ``max_bytes``.
        """
        rel = normalize_path(path)
        if not self._lock.acquire(blocking=False):
            return None
        try:
            # looked up as read() does: one directory at a time, never through a symlink
            head, _, name = rel.rpartition("/")
            dir_fd = _open_dir(self.root, head, create=False)
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                raise PathNotFound(rel) from None
            finally:
                os.close(dir_fd)
            if st.st_size > max_bytes:
                return None
            return self.read(rel)
        finally:
            self._lock.release()

    def write_nowait(self, path: str, data: bytes, mode: int | None = None) -> bool:
        """:meth:`write`, if that can be done at once: False (nothing written) while another
        thread holds the directory (a harvest, a write)."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            self.write(path, data, mode)
        finally:
            self._lock.release()
        return True

    def write(self, path: str, data: bytes, mode: int | None = None) -> None:
        """Write ``path`` in the branch and on disk (parents created; atomic replace).

        Content over :attr:`max_file_size` is refused (:class:`FileTooLarge`) before anything
        is written.
        """
        rel = normalize_path(path)
        limit = self.max_file_size
        if limit is not None and len(data) > limit:
            raise FileTooLarge([(rel, len(data))], limit)
        with self._lock:
            head, _, name = rel.rpartition("/")
            # parents are opened one at a time without following symlinks, so a path through a
            # file or out of the branch is refused before anything is looked at or written
            dir_fd = _open_dir(self.root, head, create=True)
            try:
                if mode is None:
                    try:
                        mode = normalize_mode(
                            os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
                        )
                    except FileNotFoundError:
                        mode = self.branch.mode(rel) or DEFAULT_MODE
                    if stat.S_ISLNK(mode):
                        mode = DEFAULT_MODE
                self._keep_base(rel, name, dir_fd)
                self._rewritten.pop(rel, None)
                on_disk = data
                if stat.S_ISLNK(mode) and self.links is not None:
                    mapped = self.links.to_branch(rel, name_of(data))
                    if mapped is not None:
                        on_disk = name_bytes(mapped)
                        self._rewritten[rel] = (on_disk, bytes(data))
                write_entry_atomic(name, on_disk, normalize_mode(mode), dir_fd=dir_fd)
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            finally:
                os.close(dir_fd)
            if name == _GITIGNORE and stat.S_ISREG(st.st_mode):
                self._rules_written(head, name_of(bytes(data)), st)
            if self._left_out(rel):
                return
            self._records[rel] = _key(st)
            self._racy.add(rel)
            self._gone.discard(rel)
            self._too_large.pop(rel, None)
            self.branch.set_state(rel, FileState(bytes(data), normalize_mode(mode)))

    def delete(self, path: str) -> None:
        """Delete ``path`` in the branch and on disk."""
        rel = normalize_path(path)
        with self._lock:
            head, _, name = rel.rpartition("/")
            dir_fd = _open_dir(self.root, head, create=False)
            try:
                os.unlink(name, dir_fd=dir_fd)
            except FileNotFoundError:
                raise PathNotFound(rel) from None
            finally:
                os.close(dir_fd)
            self._records.pop(rel, None)
            self._racy.discard(rel)
            self._rewritten.pop(rel, None)
            self._too_large.pop(rel, None)
            if isinstance(self.branch.set_state(rel, None), Delete):
                self._gone.add(rel)
            if name == _GITIGNORE and self._rule_files.pop(head, None) is not None:
                self.ignore.remove_patterns(head)
                self._rules_dirty = self._rules_moved = True

    def _recorded_target(self, rel: str, target: bytes) -> bytes:
        """The target the branch records for the link at ``rel`` that reads ``target`` here: the
        recorded one for a link written here mapped, else the workspace's path for an absolute
        path into this directory (see :class:`~orchestrator.vfs._links.LinkMap`)."""
        known = self._rewritten.get(rel)
        if known is not None and known[0] == target:
            return known[1]
        if self.links is None:
            return target
        return name_bytes(self.links.to_recorded(name_of(target)))

    def _keep_base(self, rel: str, name: str, dir_fd: int) -> None:
        """Before the copy of a workspace file is written over: give its content to the snapshot.

        While the branch holds the workspace's version, the copy is the content the run started
        from, which the workspace file may no longer have (changed meanwhile): kept, diffs and
        patches can show the branch's change against it. Read once per file, on its first change.
        """
        root = self.branch.root
        if not isinstance(root, Snapshot) or not root.exists(rel) or root.has_content(rel):
            return
        if root.stat(rel).size > LARGE_FILE_SIZE:
            return  # diffs and patches do not show its lines: not read, not kept
        known = root.known_digest(rel)
        if known is None or self.branch.digest(rel) != known:
            return
        try:
            data, is_link = _read_at(dir_fd, name, rel)
        except (PathNotFound, OSError):
            return
        if is_link:  # the branch's copy of a link may lead into this directory: its recorded
            data = self._recorded_target(rel, data)  # target is the workspace's
        root.keep(rel, data)  # only if it is that content (the copy may be changed on disk)

    def _rules_written(self, head: str, text: str, st: os.stat_result) -> None:
        """Take the patterns of a ``.gitignore`` just written in directory ``head``."""
        if not self.ignore.rules.use_gitignore:
            return
        known = self._rule_files.get(head)
        self._rule_files[head] = (_settled(_key(st)), text)
        if known is None or known[1] != text:
            self.ignore.add_patterns(head, text)
            self._rules_dirty = self._rules_moved = True


#: a directory open in this process, by descriptor, as a path (Linux); None without ``/proc``
_PROC_FD = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else None


def _no_dir(error: OSError) -> bool:
    """Whether ``error``, opening a directory without following a symlink, says none is there
    (missing, a file, or a symlink)."""
    return isinstance(error, FileNotFoundError | NotADirectoryError) or error.errno == errno.ELOOP


def _open_root(root: str) -> int:
    """A descriptor of branch directory ``root``; :class:`VfsError` if it is gone or is not a
    directory any more (removed, or replaced by a file or a symlink, during the step)."""
    try:
        return os.open(root, _DIR_NOFOLLOW)
    except OSError as e:
        if _no_dir(e):
            raise VfsError(
                f"the branch directory {root} was removed or replaced during the step"
            ) from None
        raise


def _open_below(root: str, rel_dir: str) -> int | str:
    """A descriptor of directory ``rel_dir`` below ``root``, each component entered without
    following a symlink; if one is missing or is not a directory (a symlink included), its
    path (``rel_dir`` or a directory above it) instead."""
    fd = _open_root(root)
    try:
        parts = rel_dir.split("/")
        for depth, part in enumerate(parts, 1):
            try:
                below = os.open(part, _DIR_NOFOLLOW, dir_fd=fd)
            except OSError as e:
                if _no_dir(e):
                    return "/".join(parts[:depth])
                _refuse_too_long(e, rel_dir)
                raise
            os.close(fd)
            fd = below
        result, fd = fd, -1
        return result
    finally:
        if fd >= 0:
            os.close(fd)


def _dirs_of(rel_dir: str) -> Iterator[str]:
    """``rel_dir`` and the directories above it (``a``, ``a/b``, ``a/b/c``)."""
    at = rel_dir.find("/")
    while at != -1:
        yield rel_dir[:at]
        at = rel_dir.find("/", at + 1)
    yield rel_dir


def _refuse_too_long(error: OSError, rel: str) -> None:
    """Raise :class:`PathRefused` if ``error`` says the path of ``rel`` is too long to look up:
    made on disk in the branch directory (by the agent's own tools), it cannot be harvested."""
    if error.errno == errno.ENAMETOOLONG:
        raise PathRefused(rel, "a path too long for the system to look up") from error


def _read_state(full: str, limit: int | None = None) -> tuple[FileState, _Key]:
    """Content, mode and stat key of a file or symlink, re-read until it holds still.

    With ``limit``, at most ``limit + 1`` bytes are read: content longer than ``limit`` is a
    file that grew past it while being read (the caller looks at it again).
    """
    cap = -1 if limit is None else limit + 1
    for _ in range(5):
        before = os.lstat(full)
        if stat.S_ISLNK(before.st_mode):
            data = name_bytes(os.readlink(full))
            after = os.lstat(full)
        elif stat.S_ISREG(before.st_mode):
            fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                before = os.fstat(fd)
                chunks = []
                left = cap
                # one read of the whole file, as a rule: its bytes are the content, not copied
                while left and (chunk := os.read(fd, _next_read(before.st_size, left))):
                    chunks.append(chunk)
                    left -= len(chunk) if left > 0 else 0
                data = b"".join(chunks)
                after = os.fstat(fd)
            finally:
                os.close(fd)
        else:
            raise IsADirectoryError(full)
        if _key(before) == _key(after):
            return FileState(data, normalize_mode(before.st_mode)), _key(after)
    # Still being written: take what we have; the racy mark makes the next harvest look again.
    return FileState(data, normalize_mode(after.st_mode)), _key(after)


def _next_read(size: int, left: int) -> int:
    """How much to ask of one ``read`` of a file of ``size`` bytes, ``left`` to go (-1: no cap)."""
    want = max(size + 1, 65536)
    return want if left < 0 else min(want, left)


def _hash_file(full: str) -> tuple[str, _Key]:
    """Content hash (streamed: never held) and stat key of a regular file, re-read until it
    holds still."""
    for _ in range(5):
        fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            before = os.fstat(fd)
            if not stat.S_ISREG(before.st_mode):
                raise IsADirectoryError(full)
            hashed = digest_fd(fd)
            after = os.fstat(fd)
        finally:
            os.close(fd)
        if _key(before) == _key(after):
            break
    return hashed, _key(after)


def _read_at(dir_fd: int, name: str, rel: str) -> tuple[bytes, bool]:
    """Content of ``name`` in ``dir_fd`` (a symlink's: its target) and whether it is a link."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        raise PathNotFound(rel) from None
    if stat.S_ISLNK(st.st_mode):
        return name_bytes(os.readlink(name, dir_fd=dir_fd)), True
    if not stat.S_ISREG(st.st_mode):
        raise IsADirectoryError(rel)
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    with open(fd, "rb") as f:
        return f.read(), False


def _open_dir(root: str, rel_dir: str, *, create: bool) -> int:
    """An fd for ``root/rel_dir`` opened one component at a time, never following a symlink."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in rel_dir.split("/") if rel_dir else ():
            try:
                nxt = os.open(
                    part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd
                )
            except FileNotFoundError:
                if not create:
                    raise PathNotFound(rel_dir) from None
                os.mkdir(part, dir_fd=fd)
                nxt = os.open(
                    part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd
                )
            except OSError as e:
                raise PathRefused(
                    rel_dir, f"not a plain directory inside the branch ({e.strerror})"
                ) from e
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def harvest(workdir: Workdir, *, full: bool = False) -> HarvestReport:
    """Record what changed in ``workdir`` on disk into its branch (same as ``workdir.harvest``)."""
    return workdir.harvest(full=full)
