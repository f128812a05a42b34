"""Trees that travel between machines: content-addressed manifests, blobs, and their directories.

A node of a cluster does not share the driver's disk. A step instance's tree (a workspace
:class:`~orchestrator.vfs.Snapshot`, or a :class:`~orchestrator.vfs.Branch` over one) goes to
the node as a :class:`Manifest` (path -> content hash and mode) plus the blobs the node lacks,
and the instance's changes come back as file states. The exchange, with the caller shipping
the values (nothing here talks to another machine)::

    manifest = manifest_of(branch)                       # driver
    missing = store.missing(manifest.digests())          # node
    blobs = blobs_for(branch, manifest, have=manifest.digests() - missing)   # driver
    for d, data in blobs.items(): store.put(d, data)     # node (each blob verified)
    with cache.open(manifest) as directory: ...          # node: the tree as a plain directory
    states = change_states(node_branch)                  # node
    apply_states(branch, states)                         # driver

Everything a node receives is checked before it is used: a manifest is refused (before
anything is written) when its digest does not match its entries, or an entry has a path that
could lead out of the tree (absolute, ``..``, empty parts, NUL), a path under another entry
(which, were that one a symlink, would lead out too), a mode that is neither a file's nor a
symlink's, or a content hash that is not one; a blob is refused when its content does not hash
to its name. States coming back are checked the same way before any is applied.

Names are ``str`` as the ``os`` module gives them (undecodable bytes as lone surrogates, see
:mod:`orchestrator._names`); a manifest's digest is taken over their exact bytes.

Everything here is synchronous and thread-safe; async callers run it in worker threads.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import stat
import threading
from collections import OrderedDict
from collections.abc import Collection, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, suppress
from pathlib import Path

from attrs import define, field, frozen, validators

from .._names import logged_name, name_bytes, name_of
from ..errors import ClusterError
from ..vfs import Branch, FileState
from ..vfs._fileio import SYMLINK_MODE, normalize_mode, normalize_path, remove_tree
from ..vfs.errors import PathRefused
from ..vfs.tree import Tree

__all__ = [
    "BlobStore",
    "Entry",
    "Manifest",
    "TreeCache",
    "apply_states",
    "blobs_for",
    "change_states",
    "manifest_of",
]

# what a content hash looks like (SHA-256, lowercase hex): anything else never names a file
_DIGEST = re.compile(r"[0-9a-f]{64}")
# the first line of a manifest's canonical encoding: a later format must not hash alike
_MANIFEST_HEADER = b"acp-orchestrator tree manifest 1\n"
# names the tree cache gives what is not (yet, or any more) a tree
_TEMP_PREFIX = ".tmp-"
_TRASH_PREFIX = ".trash-"
_BLOB_TEMP_PREFIX = ".blob-"


@frozen
class Entry:
    """One file of a tree."""

    #: the path as the tree names it (relative, ``/``-separated)
    path: str
    #: SHA-256 (hex) of the content; a symlink's content is its target's bytes
    digest: str
    #: type and permission bits, normalized as a tree holds them (``0o100644``, ``0o100755``,
    #: ``0o120777`` for a symlink)
    mode: int


def _encode(entries: Iterable[Entry]) -> bytes:
    """The canonical encoding of ``entries`` (sorted by path): what a manifest's digest hashes.

    One record per entry: the mode in octal, the digest, the path's exact bytes, NUL (a path
    never holds one, so the encoding reads back one way only).
    """
    parts = [_MANIFEST_HEADER]
    for entry in entries:
        parts.append(b"%o %s " % (entry.mode, entry.digest.encode("ascii")))
        parts.append(name_bytes(entry.path))
        parts.append(b"\0")
    return b"".join(parts)


@frozen
class Manifest:
    """A tree as what travels: every entry, sorted by path, and a digest of them all.

    Equal trees (same paths, contents and modes) have equal digests, whichever tree they came
    from. Make one with :func:`manifest_of` or :meth:`of`.
    """

    #: the tree's files, sorted by path
    entries: tuple[Entry, ...]
    #: SHA-256 (hex) of the entries' canonical encoding
    digest: str

    @classmethod
    def of(cls, entries: Iterable[Entry]) -> Manifest:
        """The manifest of ``entries`` (in any order), its digest computed."""
        ordered = tuple(sorted(entries, key=lambda e: e.path))
        return cls(ordered, hashlib.sha256(_encode(ordered)).hexdigest())

    @property
    def size(self) -> int:
        """The number of entries."""
        return len(self.entries)

    def digests(self) -> frozenset[str]:
        """The content hashes of the entries, each once."""
        return frozenset(entry.digest for entry in self.entries)


def manifest_of(tree: Tree | Branch) -> Manifest:
    """The manifest of every file of ``tree`` (a branch: its base with its changes).

    A :class:`~orchestrator.vfs.Snapshot` hashes the files it has not hashed yet, and raises
    :class:`~orchestrator.vfs.WorkspaceChanged` for a file that changed since it was taken.
    """
    entries = []
    for path in tree.paths():
        digest, mode = tree.digest(path), tree.mode(path)
        if digest is None or mode is None:  # gone meanwhile (a branch changed): not in the tree
            continue
        entries.append(Entry(path, digest, mode))
    return Manifest.of(entries)


def blobs_for(
    tree: Tree | Branch,
    manifest: Manifest,
    have: Collection[str],
    *,
    limit: int | None = None,
) -> dict[str, bytes]:
    """The content of every hash of ``manifest`` not in ``have``, read from ``tree`` once each.

    ``manifest`` is ``tree``'s (:func:`manifest_of`); ``have`` what the receiving node holds
    already (what :meth:`BlobStore.missing` did not name). ``limit``: stop once the blobs read
    hold that many bytes (one blob at least), for shipping a large tree in parts.
    """
    out: dict[str, bytes] = {}
    size = 0
    for entry in manifest.entries:
        if entry.digest not in have and entry.digest not in out:
            data = out[entry.digest] = tree.read(entry.path)
            size += len(data)
            if limit is not None and size >= limit:
                break
    return out


def _check_digest(digest: object) -> str:
    """``digest`` if it is a content hash, else :class:`ClusterError` (it names a file)."""
    if not isinstance(digest, str) or _DIGEST.fullmatch(digest) is None:
        raise ClusterError(f"not a content hash: {logged_name(str(digest))!r}")
    return digest


def _check_path(path: object) -> str:
    """``path`` if it is a canonical branch path that stays inside a tree, else ClusterError."""
    if not isinstance(path, str):
        raise ClusterError(f"a tree path that is not a string: {path!r}")
    try:
        canonical = normalize_path(path)
    except PathRefused as e:
        raise ClusterError(f"refused tree path {logged_name(path)!r}: {e.reason}") from None
    if canonical != path:
        # "a//b", "./a", "a/": the same file under another name, or a trick; a tree never
        # names a file so
        raise ClusterError(f"refused tree path {logged_name(path)!r}: not in canonical form")
    return path


def _check_mode(path: str, mode: object) -> int:
    """``mode`` if it is a tree file's or symlink's normalized mode, else ClusterError."""
    if (
        not isinstance(mode, int)
        or normalize_mode(mode) != mode
        or stat.S_IFMT(mode) not in (stat.S_IFREG, stat.S_IFLNK)
    ):
        raise ClusterError(f"refused tree entry {logged_name(path)!r}: bad mode {mode!r}")
    return mode


def _check_manifest(manifest: Manifest) -> None:
    """Raise :class:`ClusterError` unless ``manifest`` is one a tree could have made."""
    seen: set[str] = set()
    previous: str | None = None
    for entry in manifest.entries:
        path = _check_path(entry.path)
        _check_digest(entry.digest)
        _check_mode(path, entry.mode)
        if previous is not None and path <= previous:
            raise ClusterError(
                f"refused manifest: entry {logged_name(path)!r} duplicated or out of order"
            )
        previous = path
        seen.add(path)
    for path in seen:
        # a file under another entry would be written through it: through a symlink, anywhere
        head = path
        while "/" in head:
            head = head.rpartition("/")[0]
            if head in seen:
                raise ClusterError(
                    f"refused manifest: {logged_name(path)!r} is under the file "
                    f"{logged_name(head)!r}"
                )
    try:
        encoded = _encode(manifest.entries)
    except UnicodeEncodeError:  # checked paths encode; a defence all the same
        raise ClusterError("refused manifest: a path that is no file name") from None
    if not isinstance(manifest.digest, str) or (
        hashlib.sha256(encoded).hexdigest() != manifest.digest
    ):
        raise ClusterError("refused manifest: its digest does not match its entries")


@define
class BlobStore:
    """A node's blobs, by content hash, under :attr:`root` (``ab/cdef...``: 256 fan-out
    directories). Blobs are only ever added; each is verified when stored and when read."""

    root: Path = field(converter=Path)

    def path(self, digest: str) -> Path:
        """Where the blob ``digest`` is kept (whether or not it is); ClusterError if
        ``digest`` is not a content hash."""
        _check_digest(digest)
        return self.root / digest[:2] / digest[2:]

    def missing(self, digests: Iterable[str]) -> set[str]:
        """Those of ``digests`` the store does not hold."""
        return {d for d in digests if not self.path(d).is_file()}

    def put(self, digest: str, data: bytes) -> None:
        """Store ``data`` as the blob ``digest``; :class:`ClusterError` if it does not hash
        to ``digest``. Written under a temporary name and renamed: a blob is whole or absent."""
        target = self.path(digest)
        if hashlib.sha256(data).hexdigest() != digest:
            raise ClusterError(f"refused blob {digest}: its content has another hash")
        if target.is_file():
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.parent / f"{_BLOB_TEMP_PREFIX}{secrets.token_hex(8)}"
        try:
            with open(tmp, "xb") as f:
                f.write(data)
            os.replace(tmp, target)
        except BaseException:
            with suppress(FileNotFoundError):
                tmp.unlink()
            raise

    def read(self, digest: str) -> bytes:
        """The blob ``digest``; :class:`ClusterError` if the store lacks it, or holds other
        content under its name (then that blob is removed: it can be sent again)."""
        target = self.path(digest)
        try:
            data = target.read_bytes()
        except FileNotFoundError:
            raise ClusterError(f"no blob {digest} in {self.root}") from None
        if hashlib.sha256(data).hexdigest() != digest:
            with suppress(FileNotFoundError):
                target.unlink()
            raise ClusterError(f"blob {digest} in {self.root} is corrupt (removed)")
        return data


@define(eq=False)
class _Slot:
    """What the cache knows of one tree directory."""

    #: callers holding it (the one making it included): never evicted while above 0
    holders: int = 0
    #: whether the directory is complete (else a thread is making it)
    ready: bool = False


@define(eq=False)
class TreeCache:
    """A node's tree directories: one per manifest digest under :attr:`root`, each holding
    exactly that tree, made from the blobs of :attr:`store`.

    :attr:`root` belongs to this cache: what an earlier cache left there (trees and
    half-made ones) is removed when it is created, since a tree not made by this process is
    not known to be whole. Callers must not change a tree's directory (copy from it).
    Thread-safe.
    """

    root: Path = field(converter=Path)
    store: BlobStore
    #: how many trees are kept; beyond that, the least recently used that no caller holds
    #: are deleted
    max_trees: int = field(default=8, validator=validators.ge(0))
    _slots: OrderedDict[str, _Slot] = field(factory=OrderedDict, init=False, repr=False)
    _lock: threading.Lock = field(factory=threading.Lock, init=False, repr=False)
    _changed: threading.Condition = field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        self._changed = threading.Condition(self._lock)
        self.root.mkdir(parents=True, exist_ok=True)
        with os.scandir(self.root) as it:
            leftovers = [
                e.path
                for e in it
                if e.name.startswith((_TEMP_PREFIX, _TRASH_PREFIX)) or _DIGEST.fullmatch(e.name)
            ]
        for leftover in leftovers:
            remove_tree(leftover)

    def open(self, manifest: Manifest) -> AbstractContextManager[Path]:
        """The directory of ``manifest``'s tree, held (never evicted) until the context exits.

        Made once per manifest, in a temporary directory renamed into place when complete:
        a crash never leaves a partial tree that passes for one. Files have their modes,
        symlinks their targets. A manifest that is refused (see the module docs) or whose
        blobs the store lacks raises :class:`ClusterError` before anything is written; another
        thread opening the same manifest meanwhile waits for it to be made. Entering may block
        (making the tree, or waiting for another thread to) and so may exiting (deleting
        evicted trees): async callers run both in worker threads.
        """
        _check_manifest(manifest)
        return self._held(manifest)

    @contextmanager
    def _held(self, manifest: Manifest) -> Iterator[Path]:
        key = manifest.digest
        target = self.root / key
        self._acquire(key, manifest, target)
        try:
            yield target
        finally:
            self._release(key)

    def _acquire(self, key: str, manifest: Manifest, target: Path) -> None:
        """Hold the tree ``key``, making it first if no one has."""
        with self._lock:
            while True:
                slot = self._slots.get(key)
                if slot is None:
                    slot = self._slots[key] = _Slot(holders=1)
                    break
                if slot.ready:
                    slot.holders += 1
                    self._slots.move_to_end(key)
                    return
                self._changed.wait()  # another thread is making it
        try:
            self._make(manifest, target)
        except BaseException:
            with self._lock:
                del self._slots[key]  # a waiting thread tries again
                self._changed.notify_all()
            raise
        with self._lock:
            slot.ready = True
            self._changed.notify_all()

    def _release(self, key: str) -> None:
        """Stop holding the tree ``key``; delete the trees beyond :attr:`max_trees`."""
        doomed: list[Path] = []
        with self._lock:
            self._slots[key].holders -= 1
            self._slots.move_to_end(key)
            excess = len(self._slots) - self.max_trees
            for name, slot in list(self._slots.items()):
                if excess <= 0:
                    break
                if slot.ready and slot.holders == 0:
                    # renamed under the lock: a thread opening it next makes it anew, never
                    # finding it half deleted
                    trash = self.root / f"{_TRASH_PREFIX}{secrets.token_hex(8)}"
                    del self._slots[name]
                    excess -= 1
                    try:
                        os.rename(self.root / name, trash)
                    except FileNotFoundError:  # removed by someone else: nothing to delete
                        continue
                    doomed.append(trash)
        for trash in doomed:
            remove_tree(str(trash))

    def _make(self, manifest: Manifest, target: Path) -> None:
        """Write ``manifest``'s tree to ``target`` through a temporary directory."""
        lacking = self.store.missing(manifest.digests())
        for entry in manifest.entries:
            if entry.digest in lacking:
                raise ClusterError(
                    f"no blob for {logged_name(entry.path)!r} ({entry.digest}) in {self.store.root}"
                )
        tmp = self.root / f"{_TEMP_PREFIX}{secrets.token_hex(8)}"
        tmp.mkdir()
        try:
            made: set[str] = set()
            for entry in manifest.entries:
                head = entry.path.rpartition("/")[0]
                if head and head not in made:
                    # every parent is a directory made here: checked paths are never under an
                    # entry, so no symlink stands in the way
                    os.makedirs(tmp / head, exist_ok=True)
                    while head and head not in made:
                        made.add(head)
                        head = head.rpartition("/")[0]
                _write_entry(tmp, entry, self.store)
            if os.path.lexists(target):  # made by another process on this root: not trusted
                remove_tree(str(target))
            os.rename(tmp, target)
        except BaseException:
            remove_tree(str(tmp))
            raise


def _write_entry(tmp: Path, entry: Entry, store: BlobStore) -> None:
    """Write one entry of a tree under the directory ``tmp``."""
    data = store.read(entry.digest)
    full = os.path.join(tmp, entry.path)
    if entry.mode == SYMLINK_MODE:
        if not data or b"\0" in data:
            raise ClusterError(f"refused symlink {logged_name(entry.path)!r}: bad target")
        os.symlink(name_of(data), full)
        return
    fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        # the mode exactly, whatever the umask
        os.fchmod(fd, stat.S_IMODE(entry.mode))
    finally:
        os.close(fd)


def change_states(branch: Branch) -> dict[str, FileState | None]:
    """The branch's own changes (relative to its base) as the states to set: each changed
    path's content and mode now, None for a deleted one."""
    return {path: branch.state(path) for path in branch.changes}


def apply_states(branch: Branch, states: Mapping[str, FileState | None]) -> None:
    """Make ``branch`` hold ``states`` (:func:`change_states` of a node's branch over the same
    tree): then it holds what that branch held.

    All are checked before any is set (:class:`ClusterError`: a path that could lead out of
    the tree, a mode that is neither a file's nor a symlink's, content that does not hash to
    its digest), so a refused set leaves the branch unchanged.
    """
    for path, state in states.items():
        _check_path(path)
        if state is None:
            continue
        if not isinstance(state, FileState) or not isinstance(state.data, bytes):
            raise ClusterError(f"refused state of {logged_name(path)!r}: not a file state")
        _check_mode(path, state.mode)
        if hashlib.sha256(state.data).hexdigest() != state.digest:
            raise ClusterError(f"refused state of {logged_name(path)!r}: content has another hash")
        if state.mode == SYMLINK_MODE and (not state.data or b"\0" in state.data):
            raise ClusterError(f"refused state of {logged_name(path)!r}: bad symlink target")
    for path, state in states.items():
        branch.set_state(path, state)
