"""A full harvest's walk from GNU ``find``'s lines (see :mod:`orchestrator.vfs._statwalk`).

What :meth:`~orchestrator.vfs.workdir.Workdir.harvest` walks itself where there is no such
``find``, this takes from one listing made by another process: a file whose line is the one
its record foretells is unchanged, without a Python step of its own; the other lines are
judged as the walk judges them. Directories the ignore rules leave out are not looked into
(their ``.gitignore`` files are read on the way down, as the walk reads them), and a file of
the branch found in one is compared with its record all the same, as the walk's check of the
files it did not see compares it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from . import _inotify
from ._statwalk import ListingFailed, file_line, split_file, walk
from .ignore import is_vcs_name

if TYPE_CHECKING:
    from .workdir import Workdir, _Key

__all__ = ["Lines", "expected_lines", "scan_by_lines"]

_GITIGNORE = ".gitignore"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

#: a record's stat and its line, by path (kept with the directory: a record whose stat did
#: not change keeps its line)
Lines = dict[str, tuple["_Key", bytes]]


def expected_lines(
    records: dict[str, _Key], kept: Lines, device: int
) -> tuple[Lines, dict[bytes, str]]:
    """The line of each record (those of ``kept`` whose stat is the same reused), and back."""
    encode = os.fsencode
    lines: Lines = {}
    for rel, key in records.items():
        was = kept.get(rel)
        if was is None or was[0] != key:
            was = (key, file_line(encode(rel), key, device))
        lines[rel] = was
    return lines, {line: rel for rel, (_, line) in lines.items()}


def scan_by_lines(
    workdir: Workdir, find: str, root_fd: int, watcher: _inotify.Inotify | None
) -> tuple[set[str], list[str]] | None:
    """The records seen and the paths to check, as the walk of a full harvest finds them;
    None when ``find`` could not list the directory (the caller walks it). ``root_fd`` is
    the directory, open."""
    if watcher is not None and not watcher.watches(""):
        return None  # watches to make everywhere: the walk makes each before it lists it
    matcher = workdir.ignore
    vcs = matcher.rules.vcs_dirs
    # directories found ignored before are not listed (a walk does not enter them either);
    # each is looked at again below, in case the patterns changed since
    skipped = frozenset(workdir._ignored_dirs)
    try:
        # not into another filesystem: a directory mounted below is left to the walk
        found = walk(find, workdir.root, paths_of_dirs=True, prune=vcs, prune_dirs=skipped)
    except ListingFailed:
        return None
    records, racy = workdir._records, workdir._racy
    device = os.fstat(root_fd).st_dev
    workdir._lines, rel_of = expected_lines(records, workdir._lines, device)
    own_device = b"%d" % device
    rule_files = workdir._rule_files if matcher.rules.use_gitignore else None
    seen: list[str] = []
    candidates: list[str] = []
    subdirs: dict[str, list[str]] = {}
    unknown: dict[str, list[tuple[str, bytes]]] = {}  # by directory: (name, type)
    decode = os.fsdecode
    for line in found:
        rel = rel_of.get(line)
        if rel is not None and rel not in racy:
            seen.append(rel)
            continue
        if line[:2] == b"d ":
            _d, dev, raw = line.split(b" ", 2)
            if dev != own_device:
                return None  # a mount point: the walk enters it, as it enters any directory
            rel = decode(raw)
            if rel:
                head, _, name = rel.rpartition("/")
                subdirs.setdefault(head, []).append(name)
            continue
        kind, _dev, _links, _size, raw = split_file(line)
        rel = decode(raw)
        if rel in records:
            seen.append(rel)
            candidates.append(rel)  # its stat differs (or is too recent to tell)
            continue
        head, _, name = rel.rpartition("/")
        unknown.setdefault(head, []).append((name, kind))
    seen_set = set(seen)
    for rel in skipped:  # not listed: looked at as a subdirectory of its directory
        head, _, name = rel.rpartition("/")
        subdirs.setdefault(head, []).append(name)
    ignored: set[str] = set()
    stack = [""]
    while stack:
        parent = stack.pop()
        prefix = f"{parent}/" if parent else ""
        if watcher is not None and not watcher.watches(parent):
            if not watcher.add(parent):
                watcher.close()
                workdir._watcher = watcher = None
            else:
                # watched only now, after the listing: what came meanwhile is listed again
                again = (parent, prefix, root_fd, vcs, records)
                if not _list_again(*again, seen_set, candidates, subdirs, unknown):
                    return None
        names = unknown.get(parent, ())
        if rule_files is not None:
            present = prefix + _GITIGNORE in seen_set or any(n == _GITIGNORE for n, _ in names)
            if present or parent in rule_files:
                try:
                    fd = os.open(parent, _DIR_FLAGS, dir_fd=root_fd) if parent else root_fd
                except OSError:
                    # vanished, replaced, or too deep to open: the walk says which
                    return None
                try:
                    workdir._sync_rules(parent, fd, present)
                finally:
                    if fd != root_fd:
                        os.close(fd)
        filtered = matcher.has_rules(parent)
        for name in subdirs.get(parent, ()):
            rel = prefix + name
            if is_vcs_name(name, vcs):
                continue  # named so in a case ``find`` does not fold: never looked into
            if filtered and matcher.ignored(rel, parent, name, True):
                ignored.add(rel)
            elif rel in skipped:
                if os.path.isdir(os.path.join(workdir.root, rel)):
                    return None  # ignored no more: what it holds was not listed
            else:
                stack.append(rel)
        for name, kind in names:
            rel = prefix + name
            if is_vcs_name(name, vcs) or (filtered and matcher.ignored(rel, parent, name, False)):
                continue
            if kind in (b"f", b"l"):
                candidates.append(rel)
    # a skipped one found ignored again is among them; one gone is not
    workdir._ignored_dirs = ignored
    return seen_set, candidates


def _list_again(
    parent: str,
    prefix: str,
    root_fd: int,
    vcs: frozenset[str],
    records: dict[str, _Key],
    seen: set[str],
    candidates: list[str],
    subdirs: dict[str, list[str]],
    unknown: dict[str, list[tuple[str, bytes]]],
) -> bool:
    """Add what directory ``parent`` holds that ``find`` did not list (made since); False
    if it cannot be opened."""
    try:
        fd = os.open(parent, _DIR_FLAGS, dir_fd=root_fd) if parent else os.dup(root_fd)
    except OSError:
        return False  # vanished, replaced, or too deep to open: the walk says which
    try:
        with os.scandir(fd) as it:
            entries = list(it)
    finally:
        os.close(fd)
    dirs = set(subdirs.get(parent, ()))
    files = {name for name, _ in unknown.get(parent, ())}
    for entry in entries:
        name, rel = entry.name, prefix + entry.name
        if is_vcs_name(name, vcs):
            continue
        if entry.is_dir(follow_symlinks=False):
            if name not in dirs:
                subdirs.setdefault(parent, []).append(name)
        elif rel in records:
            if rel not in seen:
                seen.add(rel)
                candidates.append(rel)
        elif name not in files:
            kind = (
                b"l"
                if entry.is_symlink()
                else b"f"
                if entry.is_file(follow_symlinks=False)
                else b"?"
            )
            unknown.setdefault(parent, []).append((name, kind))
    return True
