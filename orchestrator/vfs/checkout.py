"""Check out: materialize a branch into a real working directory, cheaply.

:func:`materialize` writes a branch's files into a fresh directory (under the run's state or
scratch directory, never inside the workspace) that becomes the agent's ``cwd``, so the agent's
own tools and terminals see real files. Files from the workspace are copied as cheaply as the
filesystem allows — a reflink (``FICLONE``) where supported, else an in-kernel
``copy_file_range`` — and never hard linked: nothing writable is shared with the workspace.
Every copied file is checked against the snapshot's stat, so the directory holds exactly the
snapshot's content. A file's first copy from a snapshot is hashed as it is copied, so the
snapshot knows the hash of the content the run started from even if the workspace file changes
later: a change the run makes to it can be applied once the file is as it was. Ignored files
(``.gitignore``, VCS internals such as ``.git/``, extra globs) are skipped unless asked for.
Modes and mtimes are preserved (like ``cp -a``).

Symlinks stay symlinks, and the directory is self-contained: a link that would lead from it into
the workspace (an absolute target there, or a relative one climbing out with ``..`` and back in)
leads to the same path of this directory instead, so nothing done here reaches the workspace
through a link. The branch keeps the link's recorded target; a harvest reads the rewritten one
back as that (see :mod:`orchestrator.vfs._links`). A link leading outside the workspace leads to
the same place from here as from the workspace: the agent process is not confined, only the fs
requests it sends are.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

import trio
from attrs import field, frozen

from .._log import get_logger
from .._names import name_bytes, name_of
from ._fileio import (
    PATH_MAX,
    CopyTally,
    copy_fd,
    copy_fd_digest,
    digest,
    make_dirs,
    remove_tree,
)
from ._links import LinkMap
from .branch import Branch
from .changes import Change, Delete, ModeChange, Write
from .errors import PathRefused, WorkspaceChanged
from .ignore import IgnoreMatcher, is_vcs_name
from .snapshot import Snapshot, StatInfo
from .tree import Tree, compose
from .workdir import Workdir, _Key, _key

__all__ = ["materialize", "materialize_async"]

log = get_logger(__name__)


def _umask() -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return None


_UMASK = _umask()


@frozen
class _Job:
    rel: str
    mode: int
    #: content to write, or None to copy the snapshot's file
    data: bytes | None = None
    expected: StatInfo | None = None
    #: whether to hash the copied bytes (the snapshot does not know their digest yet)
    hashed: bool = False
    #: permission bits to set
    perm: int = field(init=False)
    #: whether creating the file with ``perm`` already gives ``perm`` (no fchmod needed)
    direct: bool = field(init=False)

    def __attrs_post_init__(self) -> None:
        perm = stat.S_IMODE(self.mode)
        object.__setattr__(self, "perm", perm)
        direct = _UMASK is not None and perm & _UMASK == 0 and perm & 0o7000 == 0
        object.__setattr__(self, "direct", direct)


def _overrides(branch: Branch) -> dict[str, Change]:
    """What ``branch`` holds over its root tree: the changes of the trees it is layered on and
    its own, composed (a mode change of a file written is that write with the new mode).
    Raises :class:`TypeError` when the branch is not layered on its root."""
    overrides = compose(branch.base, branch.root)
    for path, own in branch.changes.items():
        previous = overrides.get(path)
        if isinstance(own, ModeChange) and isinstance(previous, Write):
            own = Write(previous.data, own.mode, previous.digest)
        overrides[path] = own
    return overrides


def _job(root: Tree, path: str, change: Change | None) -> _Job | None:
    """What to write for ``path`` of the tree that holds ``change`` over ``root`` (None: no
    change): a copy from the workspace, or bytes; None when the tree has no such file."""
    if isinstance(change, Write):
        return _Job(path, change.mode, change.data)
    if isinstance(change, Delete) or not root.exists(path):
        return None
    snapshot = root if isinstance(root, Snapshot) else None
    # copied by stat, unless the content is known: hashed at snapshot time (racy), or kept (the
    # workspace file may have changed since)
    if snapshot is not None and not snapshot.is_racy(path) and not snapshot.has_content(path):
        info = snapshot.stat(path)
        mode = change.mode if isinstance(change, ModeChange) else info.mode
        return _Job(path, mode, None, info, snapshot.known_digest(path) is None)
    state = root.state(path)
    assert state is not None
    mode = change.mode if isinstance(change, ModeChange) else state.mode
    return _Job(path, mode, state.data)


def _plan(branch: Branch) -> tuple[list[_Job], dict[str, Change]]:
    """What to write for every file of the branch (a copy from the workspace, or bytes), and
    what the branch holds over the workspace (:func:`_overrides`)."""
    root = branch.root
    overrides = _overrides(branch)
    jobs: list[_Job] = []
    for path in root.paths():
        change = overrides.get(path)
        if change is None or isinstance(change, ModeChange):
            job = _job(root, path, change)
            assert job is not None
            jobs.append(job)
    for path, change in overrides.items():
        if isinstance(change, Write):
            jobs.append(_Job(path, change.mode, change.data))
    # Name order, as cp does: files of one directory are created together.
    jobs.sort(key=lambda job: job.rel)
    return jobs, overrides


_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def _create(
    job: _Job,
    name: str,
    src_dir: int,
    dst_dir: int,
    dst_dev: int,
    links: LinkMap | None,
    rewritten: dict[str, tuple[bytes, bytes]],
    tally: CopyTally,
) -> tuple[_Key, str | None]:
    """Write one job's file as ``name`` in ``dst_dir`` (copying from ``src_dir``); its key, and
    the digest of the copied content when the job asks for it.

    Both are directory fds, so every call below looks up a single path component. A symlink
    that would lead into the workspace from here is written leading to the same path of this
    directory (``links``), and recorded in ``rewritten`` with the target the branch holds. A
    file is counted in ``tally`` as reflinked or copied.
    """
    if stat.S_ISLNK(job.mode):
        hashed = None
        if job.data is not None:
            target = name_of(job.data)
        else:
            target = os.readlink(name, dir_fd=src_dir)
            if StatInfo.from_stat(os.stat(name, dir_fd=src_dir, follow_symlinks=False)) != (
                job.expected
            ):
                raise WorkspaceChanged([job.rel])
            if job.hashed:
                hashed = digest(name_bytes(target))
        mapped = links.to_branch(job.rel, target) if links is not None else None
        if mapped is not None:
            rewritten[job.rel] = (name_bytes(mapped), name_bytes(target))
            target = mapped
        os.symlink(target, name, dir_fd=dst_dir)
        return _key(os.stat(name, dir_fd=dst_dir, follow_symlinks=False)), hashed
    perm, direct = job.perm, job.direct
    if job.data is not None:
        fd = os.open(name, _CREATE, perm, dir_fd=dst_dir)
        try:
            view = memoryview(job.data)
            while view:
                view = view[os.write(fd, view) :]
            if not direct:
                os.fchmod(fd, perm)
            tally.add(len(job.data), reflinked=False)
            return _key(os.fstat(fd)), None
        finally:
            os.close(fd)
    src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=src_dir)
    try:
        before = os.fstat(src)
        want = job.expected
        if (
            want is None
            or before.st_mtime_ns != want.mtime_ns
            or before.st_size != want.size
            or before.st_ino != want.ino
            or before.st_mode != want.mode
        ):
            raise WorkspaceChanged([job.rel])
        fd = os.open(name, _CREATE, perm, dir_fd=dst_dir)
        hashed = None
        try:
            devices = (before.st_dev, dst_dev)
            if job.hashed:
                hashed, reflinked = copy_fd_digest(src, fd, before.st_size, devices)
            else:
                reflinked = copy_fd(src, fd, before.st_size, devices)
            tally.add(before.st_size, reflinked=reflinked)
            if not direct:
                os.fchmod(fd, perm)
            os.utime(fd, ns=(before.st_atime_ns, before.st_mtime_ns))
            st = os.fstat(fd)
            key = (st.st_size, st.st_mtime_ns, st.st_ino, st.st_mode, st.st_ctime_ns)
        finally:
            os.close(fd)
        after = os.fstat(src)
        if after.st_mtime_ns != before.st_mtime_ns or after.st_ctime_ns != before.st_ctime_ns:
            raise WorkspaceChanged([job.rel])
        return key, hashed
    finally:
        os.close(src)


#: what creating one file gives: its path, its key, the digest of its content if hashed
_Made = tuple[str, tuple[_Key, str | None]]


def _run_batch(
    jobs: list[_Job],
    src_root: str,
    dst_root: str,
    links: LinkMap | None,
    rewritten: dict[str, tuple[bytes, bytes]],
    tally: CopyTally,
) -> list[_Made]:
    """Create a batch of jobs (sorted by path: one directory's files come together)."""
    dst_dev = os.stat(dst_root).st_dev
    out: list[_Made] = []
    current: str | None = None
    src_dir = dst_dir = -1
    try:
        for job in jobs:
            head, _, name = job.rel.rpartition("/")
            if head != current:
                for fd in (src_dir, dst_dir):
                    if fd >= 0:
                        os.close(fd)
                src_dir = -1
                dst_dir = os.open(f"{dst_root}/{head}" if head else dst_root, _DIR)
                current = head
            if src_dir < 0 and job.data is None:
                # Only copies need the source directory (a new directory has none).
                src_dir = os.open(f"{src_root}/{head}" if head else src_root, _DIR)
            made = _create(job, name, src_dir, dst_dir, dst_dev, links, rewritten, tally)
            out.append((job.rel, made))
    finally:
        for fd in (src_dir, dst_dir):
            if fd >= 0:
                os.close(fd)
    return out


# Copy this many files on one thread, then judge whether threads would help.
_PROBE = 256
# Slower than this per file, copying waits on the disk (or on data) rather than on the
# interpreter, and threads overlap those waits; faster, threads only contend for the GIL.
_SLOW_FILE_S = 250e-6


def _run_jobs(
    jobs: list[_Job],
    src_root: str,
    dst_root: str,
    workers: int | None,
    links: LinkMap | None,
    rewritten: dict[str, tuple[bytes, bytes]],
    tally: CopyTally,
) -> tuple[dict[str, tuple[_Key, str | None]], int]:
    """Create every job's file; what each gave and the number of threads used at the end."""

    def run(batch: list[_Job]) -> list[_Made]:
        # each thread sets keys of its own paths in ``rewritten``: safe under the GIL
        return _run_batch(batch, src_root, dst_root, links, rewritten, tally)

    def parallel(rest: list[_Job], n: int) -> dict[str, tuple[_Key, str | None]]:
        size = max(16, len(rest) // (n * 8))
        batches = [rest[i : i + size] for i in range(0, len(rest), size)]
        out: dict[str, tuple[_Key, str | None]] = {}
        with ThreadPoolExecutor(n, thread_name_prefix="vfs-materialize") as pool:
            for result in pool.map(run, batches):
                out.update(result)
        return out

    if workers is not None:
        if workers <= 1 or len(jobs) < 64:
            return dict(run(jobs)), 1
        return parallel(jobs, workers), workers
    records: dict[str, tuple[_Key, str | None]] = {}
    done = 0
    while done < len(jobs):
        chunk = jobs[done : done + _PROBE]
        started = time.perf_counter()
        records.update(run(chunk))
        done += len(chunk)
        slow = (time.perf_counter() - started) / len(chunk) > _SLOW_FILE_S
        if slow and len(jobs) - done >= 64:
            n = min(8, 2 * (os.cpu_count() or 1))
            records.update(parallel(jobs[done:], n))
            return records, n
    return records, 1


def _copy_extras(
    src_root: str,
    dst_root: str,
    matcher: IgnoreMatcher,
    links: LinkMap,
    tally: CopyTally,
    *,
    ignored: bool,
    vcs: bool,
) -> list[str]:
    """Copy the ignored entries asked for; the non-ignored directories created on the way.

    Their symlinks are mapped as the branch's are (never harvested, so nothing maps them back).
    """
    created: list[str] = []
    stack = [""]
    while stack:
        parent = stack.pop()
        with os.scandir(os.path.join(src_root, parent) if parent else src_root) as it:
            entries = list(it)
        for entry in entries:
            rel = f"{parent}/{entry.name}" if parent else entry.name
            is_dir = entry.is_dir(follow_symlinks=False)
            if not matcher.ignored(rel, parent, entry.name, is_dir):
                if is_dir:
                    stack.append(rel)
                continue
            is_vcs = is_vcs_name(entry.name, matcher.rules.vcs_dirs)
            if not (vcs if is_vcs else ignored):
                continue
            dst = os.path.join(dst_root, rel)
            missing = parent
            while missing and not os.path.isdir(os.path.join(dst_root, missing)):
                created.append(missing)
                missing = missing.rpartition("/")[0]
            if parent:
                make_dirs(os.path.join(dst_root, parent))
            if is_dir:
                _copy_tree(entry.path, dst, rel, links, tally)
            elif entry.is_symlink():
                _copy_link(entry.path, dst, rel, links)
            elif entry.is_file(follow_symlinks=False):
                _copy_plain_file(entry.path, dst, tally)
    return created


def _copy_link(src: str, dst: str, rel: str, links: LinkMap) -> None:
    target = os.readlink(src)
    os.symlink(links.to_branch(rel, target) or target, dst)


def _copy_tree(src: str, dst: str, rel: str, links: LinkMap, tally: CopyTally) -> None:
    """Copy a directory as ``cp -a`` would (other kinds of files skipped), links mapped."""
    copied: list[tuple[str, str]] = []  # parents first; their stats are copied last
    stack = [(src, dst, rel)]
    while stack:
        src_dir, dst_dir, rel_dir = stack.pop()
        os.mkdir(dst_dir)
        copied.append((src_dir, dst_dir))
        with os.scandir(src_dir) as it:
            entries = list(it)
        for entry in entries:
            child, out = f"{rel_dir}/{entry.name}", os.path.join(dst_dir, entry.name)
            if entry.is_dir(follow_symlinks=False):
                stack.append((entry.path, out, child))
            elif entry.is_symlink():
                _copy_link(entry.path, out, child, links)
            elif entry.is_file(follow_symlinks=False):
                _copy_plain_file(entry.path, out, tally)
    # children before their parents: filling a directory changes its mtime
    for src_dir, dst_dir in reversed(copied):
        shutil.copystat(src_dir, dst_dir, follow_symlinks=False)


def _copy_plain_file(src: str, dst: str, tally: CopyTally) -> str:
    st = os.lstat(src)
    with open(src, "rb") as fsrc, open(dst, "xb") as fdst:
        devices = (st.st_dev, os.fstat(fdst.fileno()).st_dev)
        reflinked = copy_fd(fsrc.fileno(), fdst.fileno(), st.st_size, devices)
        tally.add(st.st_size, reflinked=reflinked)
        os.fchmod(fdst.fileno(), stat.S_IMODE(st.st_mode))
    os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
    return dst


def _make_dirs(root: str, dirs: list[str]) -> None:
    """Create ``dirs`` and their parents under ``root``."""
    made: set[str] = {""}
    for rel_dir in dirs:
        # the parents not made yet, nearest first (a loop: a chain may be thousands deep)
        missing = []
        while rel_dir not in made:
            missing.append(rel_dir)
            rel_dir = rel_dir.rpartition("/")[0]
        for rel in reversed(missing):
            with contextlib.suppress(FileExistsError):
                os.mkdir(f"{root}/{rel}")
            made.add(rel)


def _check_lengths(paths: Iterable[str], *roots: str) -> None:
    """Refuse (:class:`PathRefused`) a file whose path under one of ``roots`` would be too long
    for the system to look up (:data:`~orchestrator.vfs._fileio.PATH_MAX`)."""
    room = _room(*roots)
    for rel in paths:
        # a character is at most 4 bytes: shorter paths need no encoding
        if len(rel) > room // 4 and (size := len(os.fsencode(rel))) > room:
            raise PathRefused(
                rel,
                f"a path of {size} bytes, too long to check out: under {roots[0]} there is "
                f"room for {room} (the system's limit is {PATH_MAX - 1} bytes in all)",
            )


def _room(*roots: str) -> int:
    """The most bytes a relative path may have under each of ``roots``."""
    return PATH_MAX - 2 - max(len(os.fsencode(root)) for root in roots)  # a "/" and a NUL


def _check_location(directory: str, root: Tree) -> None:
    if isinstance(root, Snapshot):
        ws = root.root.rstrip("/") + "/"
        target = directory.rstrip("/") + "/"
        if target.startswith(ws) or ws.startswith(target):
            raise PathRefused(directory, "a working directory may not be inside the workspace")
    if os.path.lexists(directory) and (not os.path.isdir(directory) or os.listdir(directory)):
        raise PathRefused(directory, "working directory exists and is not empty")


#: the tree size from which :func:`materialize` watches a branch with inotify by default
WATCH_MIN_FILES = 2000


def materialize(
    branch: Branch,
    directory: str | os.PathLike[str],
    *,
    include_ignored: bool = False,
    include_vcs: bool = False,
    workers: int | None = None,
    watch: bool | None = None,
    max_file_size: int | None = None,
) -> Workdir:
    """Write ``branch`` into the new or empty ``directory`` and return its :class:`Workdir`.

    ``include_ignored`` also copies what the ignore rules skip (``node_modules/``, build output)
    and ``include_vcs`` the VCS internals (``.git/``); neither is ever harvested. ``workers``
    threads copy in parallel; by default the first files are copied on one thread and the rest
    moves to a pool only if copying turns out to wait on the disk or on large files (measured:
    for small files on a fast filesystem, threads just contend for the GIL and are slower).
    ``watch`` enables the inotify accelerator for harvests; by default (None) it is on for trees
    of :data:`WATCH_MIN_FILES` files or more: below that a full stat scan is cheaper than setting
    up a watch and tearing it down (closing an inotify instance alone takes milliseconds).
    ``max_file_size`` is the workdir's limit on a changed file (see
    :attr:`Workdir.max_file_size <orchestrator.vfs.workdir.Workdir.max_file_size>`).
    Blocking: from trio, use :func:`materialize_async`.
    """
    started = time.perf_counter()
    root = branch.root
    target = os.path.realpath(directory)
    _check_location(target, root)
    make_dirs(target)
    snapshot = root if isinstance(root, Snapshot) else None
    # a tree that is not on disk has no workspace its links could lead into
    links = LinkMap(snapshot.root, target) if snapshot is not None else None
    rewritten: dict[str, tuple[bytes, bytes]] = {}
    tally = CopyTally()
    try:
        jobs, overrides = _plan(branch)
        src_root = snapshot.root if snapshot else ""
        _check_lengths((job.rel for job in jobs), target, src_root)
        dirs = sorted({j.rel.rpartition("/")[0] for j in jobs} - {""})
        _make_dirs(target, dirs)
        made, n = _run_jobs(jobs, src_root, target, workers, links, rewritten, tally)
        records: dict[str, _Key] = {}
        for rel, (key, hashed) in made.items():
            records[rel] = key
            if hashed is not None:
                assert snapshot is not None
                snapshot.record_digest(rel, hashed)
        if links is not None and (include_ignored or include_vcs):
            dirs += _copy_extras(
                src_root,
                target,
                root.ignore,
                links,
                tally,
                ignored=include_ignored,
                vcs=include_vcs,
            )
    except BaseException:
        remove_tree(target)
        raise
    workdir = Workdir.open(
        target,
        branch,
        root.ignore,
        records,
        overrides,
        links,
        rewritten,
        max_file_size=max_file_size,
        copies=(copies := tally.stats()),
    )
    if watch or (watch is None and len(jobs) >= WATCH_MIN_FILES):
        workdir._start_watching(["", *dirs])
    seconds = time.perf_counter() - started
    log.info(
        "branch materialized",
        branch=branch.name,
        directory=target,
        files=len(jobs),
        workers=n,
        reflinked=copies.reflinked,
        copied=copies.copied,
        copied_bytes=copies.copied_bytes,
        inotify=workdir.watching,
        seconds=round(seconds, 3),
    )
    return workdir


async def materialize_async(
    branch: Branch,
    directory: str | os.PathLike[str],
    *,
    include_ignored: bool = False,
    include_vcs: bool = False,
    workers: int | None = None,
    watch: bool | None = None,
    max_file_size: int | None = None,
) -> Workdir:
    """:func:`materialize` in a worker thread."""
    return await trio.to_thread.run_sync(
        lambda: materialize(
            branch,
            directory,
            include_ignored=include_ignored,
            include_vcs=include_vcs,
            workers=workers,
            watch=watch,
            max_file_size=max_file_size,
        )
    )
