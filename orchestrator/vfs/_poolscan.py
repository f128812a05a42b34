"""What a pooled directory holds that its tree does not, found and removed (see
:mod:`orchestrator.vfs.pool`).

Three ways to look, with one result (:class:`Scanned`): the paths the directory's watches saw
touched since it was last proven its tree (:func:`scan_by_events`, every directory and file of it
watched by inode: see :mod:`orchestrator.vfs._inotify`), the lines of GNU ``find``
(:func:`scan_by_lines`, the stat of every entry taken in another process, see
:mod:`orchestrator.vfs._statwalk`), and a walk of the tree in this one (:func:`scan_by_walk`,
where there is no such ``find``). Either removes what is not as written (and whatever the tree
does not hold), gives directories their mode and owner back, and says which files of the tree
are to be written again; neither acts in a directory that is on another mount than the
directory itself (a bind mount made while it was pooled), nor below another filesystem.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable

from attrs import define, field

from .._names import name_of
from . import _inotify
from ._fileio import remove_tree
from ._harvestlines import Lines, expected_lines
from ._links import LinkMap
from ._mounts import mount_id
from ._statwalk import dir_line, file_line, split_dir, split_file, walk
from .workdir import _Key

__all__ = [
    "LineCache",
    "NotTold",
    "Scanned",
    "Unclean",
    "remove_dir",
    "scan_by_events",
    "scan_by_lines",
    "scan_by_walk",
]

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_S_IFMT = 0o170000


class Unclean(Exception):
    """The directory cannot be proven to be its tree."""


class NotTold(Exception):
    """The events kept do not tell all that changed (a directory of the tree made, removed or
    moved): the directory is to be listed instead."""


# what may befall a directory of the tree without moving a path below it: a chmod, a chown,
# being listed
_DIR_KEPT = _inotify.IN_ATTRIB | _inotify.IN_ISDIR | _inotify.IN_OPEN


@define(eq=False)
class Scanned:
    """What a scan found and did: ``paths`` and ``size`` removed or fixed, the files it
    ``removed``, the files of the tree to write again (``stale``), the directories found."""

    paths: int = 0
    size: int = 0
    removed: set[str] = field(factory=set)
    stale: list[str] = field(factory=list)
    found_dirs: set[str] = field(factory=set)


@define(eq=False)
class LineCache:
    """The line ``find`` prints for each file of a directory as written, and back (kept with
    the directory: only the paths a reset writes are formatted again)."""

    device: int
    #: each file's stat and line, by path (what a harvest keeps too)
    lines: Lines
    rel_of: dict[bytes, str]
    #: the paths that are symlinks
    links: frozenset[str]

    @classmethod
    def of(cls, records: dict[str, _Key], device: int, kept: Lines | None = None) -> LineCache:
        """The lines of ``records`` on ``device`` (those of ``kept`` of the same stat reused)."""
        lines, rel_of = expected_lines(records, kept or {}, device)
        links = frozenset(rel for rel, key in records.items() if stat.S_ISLNK(key[3]))
        return cls(device, lines, rel_of, links)

    def updated(self, gone: Iterable[str], made: Iterable[tuple[str, _Key]]) -> LineCache:
        """A copy without the lines of ``gone`` and with those of ``made``."""
        lines, rel_of = dict(self.lines), dict(self.rel_of)
        links = set(self.links)
        for rel in gone:
            was = lines.pop(rel, None)
            if was is not None:
                rel_of.pop(was[1], None)
            links.discard(rel)
        for rel, key in made:
            line = file_line(os.fsencode(rel), key, self.device)
            was = lines.get(rel)
            if was is not None:
                rel_of.pop(was[1], None)
            lines[rel], rel_of[line] = (key, line), rel
            if stat.S_ISLNK(key[3]):
                links.add(rel)
            else:
                links.discard(rel)
        return LineCache(self.device, lines, rel_of, frozenset(links))


def scan_by_lines(
    find: str,
    target: str,
    *,
    lines: LineCache,
    expect: dict[str, _Key],
    changed: set[str],
    dirs: frozenset[str],
    added: list[str],
    dir_mode: int,
    owner: tuple[int, int],
    mount: int | None,
    link_intact: Callable[[str, str], bool],
) -> Scanned:
    """Scan ``target`` from ``find``'s lines: every entry whose line is not the one expected
    (``lines``, for the files of ``expect``; the directories ``dirs`` with ``dir_mode`` and
    ``owner``) is removed, or for a directory of the tree, given its mode and owner back.
    Nothing is removed or fixed before every directory acted in is known to be on ``mount``.
    ``link_intact(rel, on_disk)`` tells whether a link found as written leads where it
    should."""
    device = lines.device
    rel_of = lines.rel_of
    decode = os.fsdecode
    expected_dirs = {dir_line(os.fsencode(d), device, dir_mode, owner): d for d in dirs}
    out = Scanned()
    found = walk(find, target)
    intact = 0
    unlink: list[tuple[str, bool, int]] = []  # (path, a regular file, its size)
    remove: list[str] = []
    fix: list[tuple[str, int, tuple[int, int]]] = []
    skip: bytes | None = None  # below a directory to remove: find lists it just after
    for line in found:
        rel = rel_of.get(line)
        if rel is not None and rel not in changed:
            intact += 1
            continue
        known_dir = expected_dirs.get(line)
        if known_dir is not None:
            out.found_dirs.add(known_dir)
            continue
        if line[:2] == b"d ":
            dev, perm, own, raw = split_dir(line)
        else:
            kind, dev, _links, size, raw = split_file(line)
        if skip is not None and raw.startswith(skip):
            continue
        rel = decode(raw)
        if dev != device:
            raise Unclean(f"{rel or '.'}: another filesystem")
        if line[:2] == b"d ":
            if rel in dirs:
                out.found_dirs.add(rel)
                fix.append((rel, perm, own))
                continue
            if rel in expect:  # a file of the tree made a directory
                out.stale.append(rel)
            remove.append(rel)
            skip = raw + b"/"
            continue
        if rel in expect:
            out.stale.append(rel)
        unlink.append((rel, kind == b"f", size))
    if intact + len(out.stale) < len(expect):  # some are not there
        there = set(found)
        handled = set(out.stale)
        out.stale += [
            rel
            for rel, (_, line) in lines.lines.items()
            if rel in expect and rel not in handled and line not in there
        ]
    # a link as written, but written leading into the directory's old path
    gone = set(out.stale)
    for rel in lines.links:
        if rel in expect and rel not in gone:
            path = os.path.join(target, rel)
            if not link_intact(rel, os.readlink(path)):
                out.stale.append(rel)
                unlink.append((rel, False, 0))
    acted = {rel.rpartition("/")[0] for rel in (*remove, *(u[0] for u in unlink))}
    acted.update(rel.rpartition("/")[0] for rel in (*out.stale, *added))
    acted.update(rel for rel, _, _ in fix)
    _check_mounts(target, acted, mount)
    for rel, perm, own in fix:
        _fix_dir(target, rel, dir_mode, owner, out, (perm, own))
    _remove(target, remove, unlink, device, out)
    return out


def _fix_dir(
    target: str,
    rel: str,
    dir_mode: int,
    owner: tuple[int, int],
    out: Scanned,
    found: tuple[int, tuple[int, int]] | None = None,
) -> None:
    """Give directory ``rel`` its mode and owner back, if ``found`` (its mode and owner as
    listed; looked at here when None) says they differ."""
    fd = os.open(os.path.join(target, rel) if rel else target, _DIR)
    try:
        if found is None:
            st = os.fstat(fd)
            found = (stat.S_IMODE(st.st_mode), (st.st_uid, st.st_gid))
        if found[0] != dir_mode:
            os.fchmod(fd, dir_mode)
            out.paths += 1
        if found[1] != owner:
            os.fchown(fd, *owner)
            out.paths += 1
    finally:
        os.close(fd)


def _remove(
    target: str,
    dirs: Iterable[str],
    files: Iterable[tuple[str, bool, int]],
    device: int,
    out: Scanned,
) -> None:
    """Remove ``dirs`` with all in them, then ``files`` (path, a regular file, its size),
    counted into ``out``."""
    for rel in dirs:
        n, b = remove_dir(target, rel, device)
        out.paths, out.size = out.paths + n, out.size + b
    for rel, regular, size in files:
        os.unlink(os.path.join(target, rel))
        out.removed.add(rel)
        out.paths += 1
        if regular:
            out.size += size


def scan_by_events(
    target: str,
    *,
    touched: dict[str, int],
    written_dirs: frozenset[str],
    expect: dict[str, _Key],
    changed: set[str],
    dirs: frozenset[str],
    added: list[str],
    rewritten: Iterable[str],
    device: int,
    dir_mode: int,
    owner: tuple[int, int],
    mount: int | None,
    link_intact: Callable[[str, str], bool],
) -> Scanned:
    """Scan ``target`` by the paths its watches saw touched since it was last proven its
    tree (``touched``, see :mod:`orchestrator.vfs._inotify`), every directory and file of it
    watched then: a path of the tree touched is written again whatever its stat, one it does
    not hold is removed (a directory made since with all in it), and a directory chmod-ed gets
    its mode and owner back; a file only opened (read: an open for writing ends in a close
    event, unless still open, which the holders check tells) is written again only if its
    stat is not as written. Nothing else is looked at: an untouched file is as written. The
    paths the trees differ in (``changed``) are removed, and the directories ``written_dirs``
    holds that ``dirs`` does not. Raises :class:`NotTold` if a directory of the tree was
    made, removed or moved (its watches and its files' paths no longer tell), before anything
    is done; nothing is removed or fixed before every directory acted in is known to be on
    ``mount``."""
    out = Scanned()
    chmodded: list[str] = []
    for rel, mask in touched.items():
        if rel in written_dirs:
            kept = _DIR_KEPT | (_inotify.IN_MOVE_SELF if not rel else 0)  # the pool moves it
            if mask & ~kept:
                raise NotTold(f"{rel or '.'}: made, removed or moved")
            if mask & _inotify.IN_ATTRIB:
                chmodded.append(rel)
    # a directory of the tree written that the new tree does not hold goes with all in it
    drop = sorted(d for d in written_dirs - dirs if d.rpartition("/")[0] in dirs)
    below = tuple(f"{d}/" for d in drop)
    # a path below a directory made since goes with it: its creation was told in a directory
    # of the tree
    candidates = sorted(
        rel
        for rel in {*touched, *changed}
        if rel not in written_dirs
        and rel.rpartition("/")[0] in written_dirs
        and not (below and rel.startswith(below))
    )
    unlink: list[tuple[str, bool, int]] = []  # (path, a regular file, its size)
    remove: list[str] = list(drop)
    for rel in candidates:
        try:
            st = os.lstat(os.path.join(target, rel))
        except FileNotFoundError:
            if rel in expect:
                out.stale.append(rel)
            continue
        if st.st_dev != device:
            raise Unclean(f"{rel}: another filesystem")
        was = expect.get(rel)
        if was is not None:
            if (
                touched.get(rel, 0) & ~_inotify.IN_OPEN == 0
                and rel not in changed
                and was == (st.st_size, st.st_mtime_ns, st.st_ino, st.st_mode, st.st_ctime_ns)
                and (st.st_nlink == 1 or stat.S_ISLNK(st.st_mode))
            ):
                continue  # only read
            out.stale.append(rel)
        if stat.S_ISDIR(st.st_mode):
            remove.append(rel)
        else:
            unlink.append((rel, stat.S_ISREG(st.st_mode), st.st_size))
    # a link untouched, but written leading into the directory's old path
    gone = set(out.stale)
    for rel in rewritten:
        if (
            rel in expect
            and rel not in gone
            and not link_intact(rel, os.readlink(os.path.join(target, rel)))
        ):
            out.stale.append(rel)
            unlink.append((rel, False, 0))
    acted = {rel.rpartition("/")[0] for rel in (*remove, *(u[0] for u in unlink))}
    acted.update(rel.rpartition("/")[0] for rel in (*out.stale, *added))
    acted.update(chmodded)
    _check_mounts(target, acted, mount)
    for rel in chmodded:
        _fix_dir(target, rel, dir_mode, owner, out)
    _remove(target, remove, unlink, device, out)
    gone_dirs = tuple(f"{d}/" for d in remove)
    out.found_dirs = {d for d in written_dirs & dirs if not f"{d}/".startswith(gone_dirs)}
    return out


def _check_mounts(target: str, acted: Iterable[str], mount: int | None) -> None:
    """Raise :class:`Unclean` if a directory of ``acted`` that is there is on another mount
    than ``mount`` (a bind mount the mount table read before did not list)."""
    if mount is None:
        return
    todo, checked = sorted(acted), set()
    while todo:
        rel = todo.pop()
        if rel in checked:
            continue
        checked.add(rel)
        try:
            fd = os.open(os.path.join(target, rel) if rel else target, _DIR)
        except (FileNotFoundError, NotADirectoryError):
            # to be made by the reset (a file in its place is removed first): where
            todo.append(rel.rpartition("/")[0])
            continue
        try:
            if mount_id(fd) != mount:
                raise Unclean(f"{rel or '.'}: a mount point")
        finally:
            os.close(fd)


def scan_by_walk(
    target: str,
    *,
    by_dir: dict[str, dict[str, _Key]],
    dirs: frozenset[str],
    device: int,
    dir_mode: int,
    owner: tuple[int, int],
    mount: int | None,
    link_intact: Callable[[str, str], bool],
) -> Scanned:
    """Scan ``target`` by walking it here: each entry is compared with the stat it was
    written with (``by_dir``: by directory and name), each directory's mount is told once it
    is open (a mount made during the walk too)."""
    out = Scanned()
    none: dict[str, _Key] = {}
    stack = [""]
    while stack:
        parent = stack.pop()
        fd = os.open(os.path.join(target, parent) if parent else target, _DIR)
        try:
            st = os.fstat(fd)
            if st.st_dev != device:
                raise Unclean(f"{parent}: another filesystem")
            if mount is not None and mount_id(fd) != mount:
                raise Unclean(f"{parent or '.'}: a mount point")
            if stat.S_IMODE(st.st_mode) != dir_mode:
                os.fchmod(fd, dir_mode)
                out.paths += 1
            if (st.st_uid, st.st_gid) != owner:
                os.fchown(fd, *owner)
                out.paths += 1
            out.found_dirs.add(parent)
            prefix = f"{parent}/" if parent else ""
            names = by_dir.get(parent, none)
            intact, stale_before = 0, len(out.stale)
            with os.scandir(fd) as it:
                entries = list(it)
            # the loop runs for every entry of the tree: nothing allocated for one found
            # as written but its stat
            for entry in entries:
                est = entry.stat(follow_symlinks=False)
                if est.st_dev != device:
                    raise Unclean(f"{prefix}{entry.name}: another filesystem")
                mode = est.st_mode
                name = entry.name
                if mode & _S_IFMT == stat.S_IFDIR:
                    rel = prefix + name
                    if rel in dirs:
                        stack.append(rel)
                        continue
                    if name in names:  # a file of the tree made a directory
                        out.stale.append(rel)
                    n, b = remove_dir(target, rel, device)
                    out.paths, out.size = out.paths + n, out.size + b
                    continue
                # as written: the same stat (no write, chmod, rename or link leaves ctime
                # alone) and, for a file, no second name a hard link could write it by
                was = names.get(name)
                if was is not None:
                    if (
                        was[2] == est.st_ino
                        and was[4] == est.st_ctime_ns
                        and was[1] == est.st_mtime_ns
                        and was[0] == est.st_size
                        and was[3] == mode
                    ):
                        if mode & _S_IFMT == stat.S_IFREG:
                            if est.st_nlink == 1:
                                intact += 1
                                continue
                        elif link_intact(prefix + name, os.readlink(name, dir_fd=fd)):
                            intact += 1
                            continue
                    out.stale.append(prefix + name)
                rel = prefix + name
                os.unlink(name, dir_fd=fd)
                out.removed.add(rel)
                out.paths += 1
                if mode & _S_IFMT == stat.S_IFREG:
                    out.size += est.st_size
            if intact + len(out.stale) - stale_before < len(names):  # some are not there
                there = {entry.name for entry in entries}
                out.stale += [prefix + name for name in names if name not in there]
        finally:
            os.close(fd)
    for parent, names in by_dir.items():
        if names and parent not in out.found_dirs:  # the whole directory is gone
            prefix = f"{parent}/" if parent else ""
            out.stale += [prefix + name for name in names]
    return out


def link_intact_for(
    rewritten: dict[str, tuple[bytes, bytes]], links: LinkMap
) -> Callable[[str, str], bool]:
    """Whether a symlink, unchanged since it was written (its target ``on_disk``), leads where
    it should from the directory's new path: one written leading into the directory leads to
    its old path, and is written again."""

    def intact(rel: str, on_disk: str) -> bool:
        known = rewritten.get(rel)
        recorded = name_of(known[1]) if known is not None else on_disk
        mapped = links.to_branch(rel, recorded)
        return (mapped if mapped is not None else recorded) == on_disk

    return intact


def remove_dir(top: str, rel: str, device: int) -> tuple[int, int]:
    """Delete directory ``rel`` of ``top`` and all in it; (entries, bytes) removed. Raises
    :class:`Unclean` if it is not all gone or holds another filesystem."""
    entries = size = 0
    path = os.path.join(top, rel)
    stack = [path]
    # counted first (never following links), then removed: remove_tree ignores errors
    while stack:
        current = stack.pop()
        entries += 1
        fd = os.open(current, _DIR)
        try:
            with os.scandir(fd) as it:
                found = [(entry, entry.stat(follow_symlinks=False)) for entry in it]
        finally:
            os.close(fd)
        for entry, st in found:
            if st.st_dev != device:
                raise Unclean(f"{rel}: another filesystem below")
            if stat.S_ISDIR(st.st_mode):
                stack.append(os.path.join(current, entry.name))
            else:
                entries += 1
                if stat.S_ISREG(st.st_mode):
                    size += st.st_size
    remove_tree(path)
    if os.path.lexists(path):
        raise Unclean(f"{rel}: could not be removed")
    return entries, size
