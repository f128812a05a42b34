"""Reusing branch directories: a finished one is reset to the tree the next branch holds.

A fan-out forks many branches from one tree, and materializing each copies the whole tree. A
:class:`DirPool` keeps the directories of finished branches, keyed by the tree they were made
from (:func:`tree_key`: the snapshot and the changes layered on it, by content), and resets one
for the next branch instead of copying the tree again (:meth:`DirPool.take`): one made from the
same tree if there is one, else one made from the same snapshot with other changes layered on
it (a step forked from an earlier step's merged result gets that step's directories), the one
whose tree differs from the branch's in the fewest paths. A reset costs a stat of every entry
(as a full harvest does) plus the paths that differ: whatever the agent wrote, deleted,
renamed, chmod-ed or created, through ``fs/*`` or on disk, ignored files, ``.git`` directories
and empty directories included, is deleted and written again from the tree, and so is every
path whose content or mode differs between the two trees' changes (compared by digest and
mode, deletions included). Nothing else is read or copied. What a directory was written as (its
files' stat, its directories, the longest path, the ``.gitignore`` files) is kept with it, so a
reset plans nothing for the paths it finds as written.

What makes a reused directory the tree it claims to be:

- **No writer left.** A directory given back (:meth:`DirPool.give`) is renamed into the pool's
  parking folder at once: a process still writing by absolute path writes to a path that no
  longer exists. Before a reset, ``/proc`` is searched for any process whose working directory,
  root, open files or mapped files are inside it (a background job the agent left behind, an
  agent process still exiting), by path and by device and inode (a process that reached it
  through a bind mount unmounted since is shown a path elsewhere): if one is, the directory
  is not reset; it waits in the pool, evicted first.
- **Proof by stat.** Each entry is compared with the stat recorded when it was written (size,
  mtime, inode, mode and ctime: no write, chmod, rename or link leaves ctime alone), and a
  regular file must have no second name (a hard link elsewhere could write it later). Anything
  that differs, anything the tree does not hold and any path the tree holds other content or
  another mode for than the one written, is removed and written again; directories
  get their mode and owner back; an entry on another filesystem or any error (an unreadable
  path, a file that will not go) discards the directory instead. The stats are taken by GNU
  ``find`` in its own process where there is one (see :mod:`orchestrator.vfs._statwalk`), and
  compared as lines: a walk in a worker thread would wait for the GIL after every ``stat``
  while the event loop's thread runs, and took seconds instead of tens of milliseconds.
- **Then proof by events.** Before that listing every directory and file is watched by inode
  (see :mod:`orchestrator.vfs._inotify`; where there is room for the watches), and the watch
  is kept while the directory serves its next branch and while it is pooled: every path
  touched since, through any name, is told, and the next reset looks at those alone
  (:func:`~orchestrator.vfs._poolscan.scan_by_events`): a touched file of the tree is written
  again, one only opened is compared by its stat, what the tree does not hold is removed, a
  chmod-ed directory gets its mode back. The directory is listed (and watched afresh) instead
  when the events cannot tell: the queue overflowed, a watch could not be added, a directory
  of the tree was made, removed or moved, or the directory in the pool is not the inode the
  watches are on. A write through a shared mapping makes no event, but the last close of the
  open it was mapped from does, once the mapping is gone, and a process still holding the
  mapping holds the directory (above).
- **No mount point.** A bind mount of a directory elsewhere on the same filesystem has the
  same device: no stat tells it. Before a reset, and when a directory is given back, the
  mount table is read (``/proc/self/mountinfo``, see :mod:`orchestrator.vfs._mounts`), and
  the mount of each directory the reset acts in (removes, writes, fixes) is checked before
  anything is done (a mount made since the table was read: the tree's files under it are not
  found as written, so the reset acts there), and a walk made here checks each directory's
  mount once it is open: a directory with a mount point at or below it is never pooled nor
  reset, but discarded before anything in it is removed or written; its deletion
  (:func:`~orchestrator.vfs._fileio.remove_tree`) leaves the mount and what it shows alone.
  Limit: a mount made after those checks, while the reset writes the files it found stale,
  is written through (only a process running as root can mount).
- **Self-contained links again.** A symlink leading into the workspace leads into the branch
  directory (see :mod:`orchestrator.vfs.checkout`): the directory now has another path, so such
  links are written again for it.

A discarded directory is renamed into the parking folder and handed back for deletion; the
caller materializes a fresh one. The pool holds at most :attr:`DirPool.limit` directories: one
more evicts the oldest (handed back for deletion). Limit (as the process reaper's): a process
running under another user id whose ``/proc`` entries cannot be read is not looked at.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import stat
import threading
from collections.abc import Callable, Iterable

from attrs import define, field, frozen

from .._log import get_logger
from .._names import name_bytes
from ..errors import UsageError
from . import _inotify, _statwalk
from ._fileio import CopyTally, _parent_mount, make_dirs, remove_tree
from ._harvestlines import Lines
from ._holders import find_holders
from ._links import LinkMap
from ._mounts import mounts_under
from ._poolscan import (
    LineCache,
    NotTold,
    Unclean,
    link_intact_for,
    scan_by_events,
    scan_by_lines,
    scan_by_walk,
)
from ._statwalk import ListingFailed
from .branch import Branch
from .changes import Change, ModeChange, Write
from .checkout import (
    WATCH_MIN_FILES,
    _check_lengths,
    _Job,
    _job,
    _make_dirs,
    _overrides,
    _room,
    _run_batch,
)
from .snapshot import Snapshot
from .workdir import Workdir, _Key

__all__ = ["DirPool", "PoolStats", "find_holders", "tree_key"]

log = get_logger(__name__)


#: the environment variable that turns reuse off (``0``, ``no``, ``off``, ``false``)
REUSE_ENV = "ORCHESTRATOR_REUSE_DIRS"


#: trees of fewer files than this are not pooled: writing them afresh costs less than looking
#: through ``/proc`` for a process holding a pooled directory
REUSE_MIN_FILES = 256


_OFF = frozenset({"0", "no", "off", "false"})
_ON = frozenset({"", "1", "yes", "on", "true"})


def reuse_enabled_by_env() -> bool:
    """Whether :data:`REUSE_ENV` leaves directory reuse on (unset or empty: on); a value that
    is neither a yes nor a no raises :class:`~orchestrator.errors.UsageError` rather than be
    taken for either."""
    value = os.environ.get(REUSE_ENV, "")
    said = value.strip().lower()
    if said in _OFF:
        return False
    if said in _ON:
        return True
    raise UsageError(
        f"{REUSE_ENV}={value!r} is neither on (1, yes, on, true) nor off (0, no, off, false)"
    )


def tree_key(branch: Branch) -> tuple[int, str] | None:
    """The identity of the tree ``branch`` holds: its snapshot, and a digest of what is layered
    on it (path, kind, content digest, mode). None when the branch is not layered on a
    snapshot of a workspace."""
    layered = _layered(branch)
    return None if layered is None else _key_of(layered[0], layered[1])


def _layered(branch: Branch) -> tuple[Snapshot, dict[str, Change]] | None:
    """The snapshot ``branch`` is layered on and what it holds over it (as the checkout
    composes it); None when it is not layered on a snapshot of a workspace."""
    root = branch.root
    if not isinstance(root, Snapshot):
        return None
    try:
        return root, _overrides(branch)
    except TypeError:
        return None


def _key_of(root: Snapshot, overrides: dict[str, Change]) -> tuple[int, str]:
    """The :func:`tree_key` of the tree holding ``overrides`` over ``root``."""
    h = hashlib.sha256()
    for path in sorted(overrides):
        change = overrides[path]
        if isinstance(change, Write):
            part = f"w\0{change.digest}\0{change.mode:o}"
        elif isinstance(change, ModeChange):
            part = f"m\0{change.mode:o}"
        else:
            part = "d"
        h.update(name_bytes(path) + b"\0" + part.encode() + b"\n")
    return id(root), h.hexdigest()


def _sig(change: Change) -> tuple[object, ...]:
    """What ``change`` says of a path's content and mode."""
    if isinstance(change, Write):
        return ("w", change.digest, change.mode)
    if isinstance(change, ModeChange):
        return ("m", change.mode)
    return ("d",)


def _differing(before: dict[str, Change], after: dict[str, Change]) -> set[str]:
    """The paths whose content or mode differs between the tree holding ``before`` over a
    snapshot and the one holding ``after`` over the same snapshot."""
    out = set()
    for path in before.keys() | after.keys():
        old, new = before.get(path), after.get(path)
        if old is not new and (old is None or new is None or _sig(old) != _sig(new)):
            out.add(path)
    return out


@frozen
class PoolStats:
    """What a :class:`DirPool` did: directories materialized afresh, reused, discarded
    (not proven clean), evicted (over the limit), and what the resets cost: ``reset_paths``,
    the paths removed, written again or given their mode back (each counted once, an entry
    of a removed directory too), and ``reset_bytes``, the bytes of the files removed plus
    those written."""

    made: int = 0
    reused: int = 0
    discarded: int = 0
    evicted: int = 0
    reset_paths: int = 0
    reset_bytes: int = 0


@define(eq=False)
class _Origin:
    """What a directory was written as: the tree (its snapshot and what is layered on it), the
    stat of each file written and the links written with another target than the branch
    records. Kept as they are: the next reset of the same tree needs nothing recomputed."""

    key: tuple[int, str]
    root: Snapshot
    #: what the tree holds over the snapshot (:func:`~orchestrator.vfs.checkout._overrides`)
    overrides: dict[str, Change]
    #: the stat key of each file as written (or as last found written), by path
    records: dict[str, _Key]
    #: the same by directory and name (each inner dict copied before it is changed)
    by_dir: dict[str, dict[str, _Key]]
    rewritten: dict[str, tuple[bytes, bytes]]
    dirs: frozenset[str]
    #: no path of the tree is longer (in characters, each at most 4 bytes): the room for paths
    #: under the next path is checked against it
    longest: int
    #: the paths of the tree named ``.gitignore`` (and perhaps others)
    rules: frozenset[str]
    #: mode and owner every directory was made with
    dir_mode: int
    owner: tuple[int, int]
    #: whether harvests of the directory were watched with inotify (reused: watched again)
    watch: bool
    #: the lines ``find`` prints for ``records`` (made by the first reset that uses them)
    lines: LineCache | None = None
    #: the lines the directory's harvests made (given back: most are those of ``records``)
    kept: Lines | None = None
    #: the inodes of ``records`` (made by the first search for the directory's holders)
    inodes: frozenset[int] | None = None


@define(eq=False)
class _Parked:
    path: str
    origin: _Origin
    #: the watch of every directory and file of it kept since it was last proven its tree,
    #: with the paths touched since (None: a reset lists it)
    watcher: _inotify.Inotify | None = None

    def unwatch(self) -> None:
        """Release the watches (the directory is not reset by them)."""
        if self.watcher is not None:
            self.watcher.close()
            self.watcher = None


@define(eq=False)
class DirPool:
    """Finished branch directories waiting to be reset for a branch of the same snapshot.

    ``parking`` is the folder pooled (and discarded) directories are renamed into: on the same
    filesystem as the branch directories, and never given to an agent. Thread-safe.
    """

    parking: str
    #: the most directories held at once (the run's session limit)
    limit: int
    #: directories of trees with fewer files are not pooled (see :data:`REUSE_MIN_FILES`)
    min_files: int = field(factory=lambda: REUSE_MIN_FILES, kw_only=True)
    #: what the pool did so far
    made: int = 0
    reused: int = 0
    discarded: int = 0
    evicted: int = 0
    reset_paths: int = 0
    reset_bytes: int = 0
    #: resets that listed the directory (the others went by the paths its watches named)
    listed: int = 0
    _origins: dict[Workdir, _Origin] = field(factory=dict, alias="_origins")
    _parked: list[_Parked] = field(factory=list, alias="_parked")
    _lock: threading.Lock = field(factory=threading.Lock, alias="_lock")
    _names: itertools.count[int] = field(factory=itertools.count, alias="_names")

    @property
    def stats(self) -> PoolStats:
        """The counters as one value."""
        with self._lock:
            return PoolStats(
                self.made,
                self.reused,
                self.discarded,
                self.evicted,
                self.reset_paths,
                self.reset_bytes,
            )

    def _park_name(self, kind: str) -> str:
        make_dirs(self.parking)
        return os.path.join(self.parking, f"{kind}-{next(self._names)}")

    def adopt(self, workdir: Workdir) -> None:
        """Count the freshly materialized ``workdir`` and remember what it holds, so that it
        can be pooled when given back (a workdir of a tree too small, or not of a snapshot, is
        never pooled)."""
        with self._lock:
            self.made += 1
        if len(workdir._records) < self.min_files:
            return
        layered = _layered(workdir.branch)
        if layered is None:
            return
        root, overrides = layered
        st = os.lstat(workdir.root)
        origin = _Origin(
            _key_of(root, overrides),
            root,
            overrides,
            dict(workdir._records),
            _by_dir(workdir._records),
            dict(workdir._rewritten),
            _parents(workdir._records),
            max(map(len, workdir._records), default=0),
            frozenset(filter(_is_rules, workdir._records)),
            stat.S_IMODE(st.st_mode),
            (st.st_uid, st.st_gid),
            workdir.watching or len(workdir._records) >= WATCH_MIN_FILES,
        )
        with self._lock:
            self._origins[workdir] = origin

    def holds(self, workdir: Workdir) -> bool:
        """Whether ``workdir`` would be pooled when given back (it was adopted)."""
        with self._lock:
            return workdir in self._origins

    def give(self, workdir: Workdir) -> list[str]:
        """Take back a finished, harvested ``workdir`` (closed here); the directories to delete:
        it, if it cannot be pooled, and the one it evicts."""
        watcher = workdir.detach_watcher()
        if watcher is not None and (not watcher.complete or watcher.touched is None):
            watcher.close()  # not every path watched since the directory was proven its tree
            watcher = None
        try:
            out = self._give(workdir, watcher)
        except BaseException:
            if watcher is not None:
                watcher.close()
            raise
        return out

    def _give(self, workdir: Workdir, watcher: _inotify.Inotify | None) -> list[str]:
        with self._lock:
            origin = self._origins.pop(workdir, None)
        unpooled = [workdir.root]
        if origin is None or self.limit <= 0:
            return _unwatched(watcher, unpooled)
        origin.kept = workdir._lines
        try:
            st = os.lstat(workdir.root)
        except OSError:
            return _unwatched(watcher, unpooled)
        if not stat.S_ISDIR(st.st_mode):
            return _unwatched(watcher, unpooled)  # replaced by the agent (a link): not made here
        if mounts := mounts_under(workdir.root):  # made by the agent: never reset through it
            log.info("branch directory not pooled", directory=workdir.root, mounts=mounts)
            return _unwatched(watcher, unpooled)
        try:
            parked = self._park_name("pool")
            os.rename(workdir.root, parked)
        except OSError as e:
            log.info("branch directory not pooled", directory=workdir.root, error=str(e))
            return _unwatched(watcher, unpooled)
        out: list[str] = []
        evicted: list[_Parked] = []
        with self._lock:
            self._parked.append(_Parked(parked, origin, watcher))
            while len(self._parked) > self.limit:
                evicted.append(self._parked.pop(0))
                self.evicted += 1
        for gone in evicted:
            gone.unwatch()
            out.append(gone.path)
        return out

    def clear(self) -> list[str]:
        """Forget every pooled directory; their paths, to delete."""
        with self._lock:
            parked = list(self._parked)
            self._parked.clear()
            self._origins.clear()
        for p in parked:
            p.unwatch()
        return [p.path for p in parked]

    def close(self) -> None:
        """Remove the parking folder once what it held is deleted (left if not empty)."""
        with contextlib.suppress(OSError):
            os.rmdir(self.parking)

    def take(
        self,
        branch: Branch,
        directory: str | os.PathLike[str],
        *,
        max_file_size: int | None = None,
        discard: Callable[[str], None],
    ) -> Workdir | None:
        """A pooled directory reset to ``branch``'s tree, moved to the new, absent ``directory``
        (its :class:`Workdir`, adopted); None when the pool has none of that tree's snapshot.
        One made from the very tree is preferred; else the one whose tree differs from it in
        the fewest paths.

        A directory that cannot be proven clean is renamed aside and passed to ``discard``
        (to be deleted), and None is returned. Blocking.
        """
        with self._lock:
            if not self._parked:
                return None
        layered = _layered(branch)
        if layered is None:
            return None
        root, overrides = layered
        key = _key_of(root, overrides)
        target = os.path.abspath(os.fspath(directory))
        busy: list[_Parked] = []
        try:
            while True:
                chosen = self._choose(key, root, overrides)
                if chosen is None:
                    return None
                parked, changed = chosen
                try:
                    os.rename(parked.path, target)
                    holders = find_holders(target, *_identities(target, parked.origin))
                except OSError as e:
                    parked.unwatch()
                    self._discard(parked.path, target, e, discard)
                    continue
                if holders:
                    # still in use (an agent process exiting, a job left running): not reset
                    # now, perhaps later; evicted first
                    try:
                        os.rename(target, parked.path)
                    except OSError as e:
                        parked.unwatch()
                        self._discard(parked.path, target, e, discard)
                        continue
                    log.debug("pooled directory in use", directory=parked.path, pids=holders)
                    busy.append(parked)
                    continue
                try:
                    workdir = self._reset(
                        branch, key, overrides, changed, target, parked, max_file_size
                    )
                except Exception as e:  # whatever it was, it is not proven to be the tree
                    parked.unwatch()
                    self._discard(parked.path, target, e, discard)
                    continue
                with self._lock:
                    self.reused += 1
                return workdir
        finally:
            with self._lock:
                self._parked[:0] = busy

    def _choose(
        self, key: tuple[int, str], root: Snapshot, overrides: dict[str, Change]
    ) -> tuple[_Parked, set[str]] | None:
        """Take out of the pool the directory to reset for the tree holding ``overrides`` over
        ``root`` (``key``), with the paths whose content differs between its tree and that
        one: a directory of that very tree if there is one, else the one of the same snapshot
        whose tree differs in the fewest paths. None when there is none of that snapshot."""
        while True:
            with self._lock:
                candidates = [p for p in self._parked if p.origin.root is root]
                for i, parked in enumerate(self._parked):
                    if parked.origin.key == key and parked.origin.root is root:
                        del self._parked[i]
                        return parked, set()
            if not candidates:
                return None
            # compared without the lock: another thread may take the one chosen meanwhile
            changed, chosen = min(
                ((_differing(p.origin.overrides, overrides), p) for p in candidates),
                key=lambda pair: len(pair[0]),
            )
            with self._lock:
                for i, parked in enumerate(self._parked):
                    if parked is chosen:
                        del self._parked[i]
                        return parked, changed

    def _discard(
        self, parked: str, target: str, error: Exception, discard: Callable[[str], None]
    ) -> None:
        """Put aside a pooled directory that cannot be reused (at ``target`` or still at
        ``parked``), for ``discard`` to delete; ``target`` is left absent."""
        log.info("pooled directory discarded", directory=parked, reason=str(error))
        with self._lock:
            self.discarded += 1
        where = target if os.path.lexists(target) else parked
        try:
            aside = self._park_name("discard")
            os.rename(where, aside)
        except OSError:
            remove_tree(where)
            if os.path.lexists(target):
                raise error from None  # the branch cannot be made there: this says why
            return
        discard(aside)

    def _reset(
        self,
        branch: Branch,
        key: tuple[int, str],
        overrides: dict[str, Change],
        changed: set[str],
        target: str,
        parked: _Parked,
        max_file_size: int | None,
    ) -> Workdir:
        """Reset the directory ``parked`` now at ``target`` to the tree holding ``overrides``
        over the same snapshot (``key``); ``changed``: the paths whose content differs between
        the two trees. Raises if the directory cannot be proven to be it."""
        watcher, parked.watcher = parked.watcher, None
        try:
            return self._reset_watched(
                branch, key, overrides, changed, target, parked, max_file_size, watcher
            )
        except BaseException:
            if watcher is not None:
                watcher.close()
            raise

    def _reset_watched(
        self,
        branch: Branch,
        key: tuple[int, str],
        overrides: dict[str, Change],
        changed: set[str],
        target: str,
        parked: _Parked,
        max_file_size: int | None,
        watcher: _inotify.Inotify | None,
    ) -> Workdir:
        """:meth:`_reset`, by the paths ``watcher`` saw touched if it tells them all; else by
        a listing, with every directory and file watched first when there is room."""
        origin = parked.origin
        # a mount made while pooled: what the reset removes and writes below it is elsewhere
        if mounts := mounts_under(target):
            raise Unclean(f"mount point below: {', '.join(mounts)}")
        snapshot = origin.root
        # the files as written, by path and by directory and name: unchanged since (by their
        # stat), each is what the tree holds; the paths the trees differ in are not among them
        expect, by_dir = origin.records, origin.by_dir
        dirs, longest, rules = origin.dirs, origin.longest, origin.rules
        added: list[str] = []  # files of the tree not written as it holds them
        if changed:
            expect, by_dir = dict(expect), dict(by_dir)
            for rel in changed:
                if expect.pop(rel, None) is not None:
                    head, _, name = rel.rpartition("/")
                    by_dir[head] = {n: k for n, k in by_dir[head].items() if n != name}
            added = [rel for rel in changed if _has_file(snapshot, rel, overrides.get(rel))]
            if any(rel in origin.records for rel in changed.difference(added)):
                dirs = _parents(itertools.chain(expect, added))  # files gone: directories too?
            elif added:
                dirs = dirs | _parents(added)
            if added:
                longest = max(longest, *map(len, added))
                rules = rules.union(filter(_is_rules, added))
        if 4 * longest > _room(target, snapshot.root):  # perhaps one is too long: which
            _check_lengths(itertools.chain(expect, added), target, snapshot.root)
        links = LinkMap(snapshot.root, target)
        top = os.lstat(target)
        if not stat.S_ISDIR(top.st_mode):
            raise Unclean("not a directory")
        device = top.st_dev
        # each directory's mount, told before anything is done in it
        mount: int | None = _parent_mount(target)
        link_intact = link_intact_for(origin.rewritten, links)
        lines = origin.lines
        scanned = None
        if watcher is not None:
            touched = watcher.take_touched()
            if (
                watcher.overflowed
                or not watcher.complete
                # another directory in its place (since the watches were added)
                or watcher.root_ident != (device, top.st_ino)
            ):
                watcher.close()
                watcher = None
            else:
                watcher.root = target
                try:
                    scanned = scan_by_events(
                        target,
                        touched=touched,
                        written_dirs=origin.dirs,
                        expect=expect,
                        changed=changed,
                        dirs=dirs,
                        added=added,
                        rewritten=origin.rewritten,
                        device=device,
                        dir_mode=origin.dir_mode,
                        owner=origin.owner,
                        mount=mount,
                        link_intact=link_intact,
                    )
                except NotTold as e:
                    log.debug("pooled directory listed", directory=target, reason=str(e))
                    watcher.close()
                    watcher = None
        listed = scanned is None
        if listed and origin.watch:
            # every path watched before the listing: what changes after it is told
            watcher = _watch_all(target, origin)
        big = len(origin.records) >= _statwalk.FIND_MIN_ENTRIES
        find = _statwalk.find_command() if big and scanned is None else None
        if find is not None:
            if lines is None or lines.device != device:
                lines = LineCache.of(origin.records, device, origin.kept)
            with contextlib.suppress(ListingFailed):  # nothing done: walked here instead
                scanned = scan_by_lines(
                    find,
                    target,
                    lines=lines,
                    expect=expect,
                    changed=changed,
                    dirs=dirs,
                    added=added,
                    dir_mode=origin.dir_mode,
                    owner=origin.owner,
                    mount=mount,
                    link_intact=link_intact,
                )
        if scanned is None:
            scanned = scan_by_walk(
                target,
                by_dir=by_dir,
                dirs=dirs,
                device=device,
                dir_mode=origin.dir_mode,
                owner=origin.owner,
                mount=mount,
                link_intact=link_intact,
            )
        if listed:
            with self._lock:
                self.listed += 1
        paths, size = scanned.paths, scanned.size
        removed, stale, found_dirs = scanned.removed, scanned.stale, scanned.found_dirs
        missing_dirs = sorted(dirs - found_dirs)
        _make_dirs(target, missing_dirs)
        for rel in missing_dirs:  # made with the umask's mode: as the fresh one was
            os.chmod(os.path.join(target, rel), origin.dir_mode)
            if watcher is not None and not watcher.add(rel):
                watcher.close()
                watcher = None
        # what is found as written keeps its stat, and its rewritten link target
        records = dict(expect)
        rewritten = dict(origin.rewritten)
        for rel in itertools.chain(stale, changed):
            rewritten.pop(rel, None)
        tally = CopyTally()  # what the reset wrote: the directory's copies
        missing = stale + added
        written: list[tuple[str, _Key]] = []
        none: dict[str, _Key] = {}
        if missing:
            todo: list[_Job] = []
            for rel in sorted(missing):
                job = _job(snapshot, rel, overrides.get(rel))
                assert job is not None
                todo.append(job)
            made = _run_batch(todo, snapshot.root, target, links, rewritten, tally)
            by_dir = dict(by_dir)
            heads: set[str] = set()  # directories of by_dir copied (never changed in place)
            for rel, (made_key, hashed) in made:
                written.append((rel, made_key))
                records[rel] = made_key
                head, _, name = rel.rpartition("/")
                if head not in heads:
                    by_dir[head] = dict(by_dir.get(head, none))
                    heads.add(head)
                by_dir[head][name] = made_key
                if hashed is not None:
                    snapshot.record_digest(rel, hashed)
                if stat.S_ISREG(made_key[3]):
                    size += made_key[0]
            paths += sum(1 for rel in missing if rel not in removed)
        if watcher is not None:
            # the files written watched (new inodes), then the reset's own events dropped:
            # from here on, what the events name is what was touched since the tree was proven
            watcher.add_files(rel for rel, _ in written)
            watcher.keep_files(records)
            watcher.take_touched()
            if watcher.overflowed or not watcher.watches_all(dirs, records):
                watcher.close()
                watcher = None
        workdir = Workdir.open(
            target,
            branch,
            snapshot.ignore,
            records,
            overrides,
            links,
            rewritten,
            max_file_size=max_file_size,
            copies=tally.stats(),
            rule_files=rules,
        )
        if watcher is not None:
            workdir._watcher, watcher = watcher, None
        elif origin.watch:  # as it was made
            workdir._start_watching(["", *sorted(dirs - {""})])
        origin = _Origin(
            key,
            snapshot,
            overrides,
            dict(records),
            by_dir,
            dict(rewritten),
            dirs,
            longest,
            rules if not changed else frozenset(rules.intersection(records)),
            origin.dir_mode,
            origin.owner,
            origin.watch,
            None if lines is None else lines.updated(itertools.chain(stale, changed), written),
        )
        if origin.lines is not None:
            workdir._lines = origin.lines.lines  # the records it was opened with: the same
        with self._lock:
            self._origins[workdir] = origin
            self.reset_paths += paths
            self.reset_bytes += size
        log.info(
            "branch directory reused",
            branch=branch.name,
            directory=target,
            reset=paths,
            differing=len(changed),
        )
        return workdir


def _identities(target: str, origin: _Origin) -> tuple[frozenset[int], int]:
    """The inodes of the files ``origin`` wrote at ``target`` and of its directories as they
    are now, and their device: what a process may hold of the tree."""
    device = os.lstat(target).st_dev
    if origin.inodes is None:
        origin.inodes = frozenset(key[2] for key in origin.records.values())
    dirs: set[int] = set()
    for rel in origin.dirs:
        try:
            st = os.lstat(os.path.join(target, rel) if rel else target)
        except OSError:
            continue  # gone: nothing to hold there
        if st.st_dev == device:
            dirs.add(st.st_ino)
    return origin.inodes | dirs, device


def _watch_all(target: str, origin: _Origin) -> _inotify.Inotify | None:
    """A watch of every directory and file ``origin`` wrote at ``target``, keeping the paths
    touched from now on; None where inotify is missing or there is no room for the watches
    (the directory is listed at each reset, as without them)."""
    if len(origin.records) > _inotify.file_watch_room():
        return None
    st = os.lstat(target)  # before the watch: a directory swapped in after it is told apart
    watcher = _inotify.Inotify.open(target)
    if watcher is None:
        return None
    watcher.root_ident = (st.st_dev, st.st_ino)
    watcher.touched = {}
    watcher.complete = watcher.opens = True
    if not all(map(watcher.add, ["", *sorted(origin.dirs - {""})])) or not watcher.add_files(
        origin.records
    ):
        watcher.close()
        return None
    return watcher


def _unwatched(watcher: _inotify.Inotify | None, out: list[str]) -> list[str]:
    """``out``, ``watcher`` released."""
    if watcher is not None:
        watcher.close()
    return out


def _has_file(snapshot: Snapshot, rel: str, change: Change | None) -> bool:
    """Whether the tree holding ``change`` over ``snapshot`` for ``rel`` has a file there."""
    if change is None or isinstance(change, ModeChange):
        return snapshot.exists(rel)
    return isinstance(change, Write)


def _by_dir(records: dict[str, _Key]) -> dict[str, dict[str, _Key]]:
    """``records`` by directory and name."""
    out: dict[str, dict[str, _Key]] = {}
    for rel, key in records.items():
        head, _, name = rel.rpartition("/")
        names = out.get(head)
        if names is None:
            names = out[head] = {}
        names[name] = key
    return out


def _is_rules(rel: str) -> bool:
    """Whether ``rel`` is named ``.gitignore``."""
    return rel.rpartition("/")[2] == ".gitignore"


def _parents(paths: Iterable[str]) -> frozenset[str]:
    """Every directory holding one of ``paths``, with their parents and the top (``""``)."""
    out = {""}
    for rel in paths:
        head = rel.rpartition("/")[0]
        while head not in out:
            out.add(head)
            head = head.rpartition("/")[0]
    return frozenset(out)
