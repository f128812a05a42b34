"""Exports of a change set: a unified diff, a git patch, or a git commit on a new branch.

- :func:`unified_diff` is for people: a plain unified diff (``--- a/path`` / ``+++ b/path``), with
  ``Binary files ... differ`` for binary files and ``Large files ... differ (OLD -> NEW; ...)``
  with both sizes for a file over :data:`~orchestrator.vfs._fileio.LARGE_FILE_SIZE` (8 MiB),
  whose lines are not compared (nor read). A symlink (its content is its target) is marked
  as git marks one: a ``diff --git`` line and ``new file mode 120000``, ``deleted file mode
  120000``, or ``old mode``/``new mode`` lines when it is there before and after.
- :func:`git_patch` is for ``git apply``: git's extended headers (new/deleted file modes, mode
  changes, full ``index`` lines), ``\\ No newline at end of file`` markers, and binary files as
  ``GIT binary patch`` literals. Paths with unusual characters are quoted as git quotes them. A
  path whose type changes (a file become a symlink, or the reverse) is, as ``git diff`` writes
  it, a deletion of the old entry followed by a creation of the new one.
  A file over 8 MiB is left out (:func:`large_paths` names them): its patch would hold it
  whole, base85-encoded.
- :func:`git_commit` records the changes as a commit on a new branch of the workspace's git
  repository with plumbing only (``hash-object -w``, ``read-tree``/``update-index`` into a
  temporary index named by ``GIT_INDEX_FILE``, ``write-tree``, ``commit-tree``, ``update-ref``):
  the checked-out tree, the index and ``HEAD`` are untouched. The commit's parent is ``HEAD``;
  its tree is ``HEAD``'s with every changed path set to the branch's version (so a touched file
  that had uncommitted edits in the workspace carries them). :func:`check_git_branch` tells
  beforehand whether the branch can be made, and :func:`git_head_tree` what ``HEAD`` holds for
  the changed paths (to check changes against ``HEAD`` rather than the working tree).

All take a branch or a merge result (their net changes over the workspace snapshot), or a tree
plus explicit changes relative to it. A merge's unresolved conflicts are not part of its changes.
"""

from __future__ import annotations

import base64
import hashlib
import os
import stat
import subprocess
import tempfile
import zlib
from collections.abc import Iterable, Iterator, Mapping
from typing import Literal

import trio

from .._log import get_logger
from .._names import decode_text, git_quote, name_bytes, name_of
from .._sizes import format_size
from ._fileio import LARGE_FILE_SIZE, SYMLINK_MODE, git_mode, is_binary, is_symlink
from ._lines import LineMatcher
from .changes import Change, ChangeSet, Delete, FileState, ModeChange, Write
from .errors import VfsError, WorkspaceChanged
from .snapshot import Snapshot
from .tree import ChangeSource, Layer, MemoryTree, Tree

__all__ = [
    "GitBranchRefused",
    "check_git_branch",
    "git_commit",
    "git_commit_async",
    "git_head_tree",
    "git_patch",
    "large_paths",
    "unified_diff",
]

log = get_logger(__name__)

_ZERO = "0" * 40
# Variables that would point git at another repository, work tree or index than ours.
_REPO_ENV = frozenset(
    {"GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_PREFIX", "GIT_COMMON_DIR", "GIT_NAMESPACE"}
)


def _resolve(
    source: ChangeSource | Tree, changes: Mapping[str, Change] | None
) -> tuple[Tree, ChangeSet]:
    if isinstance(source, Tree):
        if changes is None:
            raise TypeError("give the changes explicitly when exporting from a tree")
        return source, ChangeSet.of(changes)
    if changes is not None:
        return source.root, ChangeSet.of(changes)
    if getattr(source, "conflicts", ()):
        log.warning("exporting a merge with unresolved conflicts: they are left out")
    return source.root, source.net_changes()


def _lines(data: bytes) -> list[bytes]:
    """Split on ``\\n`` only (as diff and git do), keeping the line ends."""
    parts = data.split(b"\n")
    lines = [p + b"\n" for p in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def _range(start: int, stop: int) -> str:
    length = stop - start
    first = start + 1 if length else start
    return str(first) if length == 1 else f"{first},{length}"


def _hunks(old: bytes, new: bytes, context: int) -> Iterator[bytes]:
    a, b = _lines(old), _lines(new)
    matcher = LineMatcher(None, a, b)
    for group in matcher.get_grouped_opcodes(context):
        i1, i2, j1, j2 = group[0][1], group[-1][2], group[0][3], group[-1][4]
        yield f"@@ -{_range(i1, i2)} +{_range(j1, j2)} @@\n".encode()
        for tag, a1, a2, b1, b2 in group:
            if tag == "equal":
                marked = [(b" ", line) for line in a[a1:a2]]
            else:
                marked = [(b"-", line) for line in a[a1:a2]] + [(b"+", line) for line in b[b1:b2]]
            for sign, line in marked:
                yield sign + line
                if not line.endswith(b"\n"):
                    yield b"\n\\ No newline at end of file\n"


def _quote(name: str) -> bytes:
    """A path as git writes it in a patch: C-quoted with octal escapes when it needs it."""
    return git_quote(name).encode("ascii")


def _shown(name: str) -> bytes:
    """A path in a diff for people: UTF-8 text as it is, quoted as git quotes it only when it
    is not UTF-8 or holds a character that would break the line (a control, ``"``, ``\\``)."""
    raw = name_bytes(name)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return _quote(name)
    if any(c < " " or c in '"\\\x7f' for c in text):
        return _quote(name)
    return raw


def _git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def _binary_literal(data: bytes) -> bytes:
    """One ``literal`` hunk of a git binary patch: zlib data in base85 lines of 52 bytes."""
    z = zlib.compress(data, 9)
    out = [b"literal %d\n" % len(data)]
    for i in range(0, len(z), 52):
        chunk = z[i : i + 52]
        n = len(chunk)
        out.append(bytes([ord("A") + n - 1 if n <= 26 else ord("a") + n - 27]))
        out.append(base64.b85encode(chunk, pad=True) + b"\n")
    out.append(b"\n")
    return b"".join(out)


def _versions(
    base: Tree, path: str, change: Change
) -> tuple[bytes | None, int | None, bytes | None, int | None]:
    old = base.state(path)
    old_data, old_mode = (None, None) if old is None else (old.data, old.mode)
    if isinstance(change, Write):
        return old_data, old_mode, change.data, change.mode
    if isinstance(change, ModeChange):
        return old_data, old_mode, old_data, change.mode
    return old_data, old_mode, None, None


def _size(tree: Tree, path: str) -> int | None:
    """The size of ``path``'s content in ``tree``, found without reading it; None when absent,
    or for a kind of tree that cannot tell."""
    current: Tree | None = tree
    while isinstance(current, Layer):
        change = current.changes.get(path)
        if isinstance(change, Write):
            return len(change.data)
        if isinstance(change, Delete):
            return None
        current = current.parent
    if isinstance(current, Snapshot):
        return current.stat(path).size if current.exists(path) else None
    if isinstance(current, MemoryTree):
        state = current.state(path)
        return None if state is None else len(state.data)
    return None


def _sizes(base: Tree, path: str, change: Change) -> tuple[int | None, int | None]:
    """The sizes of ``path`` before and after ``change`` (None: absent or unknown), unread."""
    old = _size(base, path)
    if isinstance(change, Write):
        return old, len(change.data)
    if isinstance(change, ModeChange):
        return old, old
    return old, None


def _is_large(sizes: tuple[int | None, int | None]) -> bool:
    return any(size is not None and size > LARGE_FILE_SIZE for size in sizes)


def large_paths(
    source: ChangeSource | Tree, changes: Mapping[str, Change] | None = None
) -> tuple[str, ...]:
    """The paths whose change writes or deletes a file over ``LARGE_FILE_SIZE`` (8 MiB), either
    version: :func:`unified_diff` gives their sizes instead of lines and :func:`git_patch`
    leaves them out. A mode change is never one (its patch holds no content)."""
    base, change_set = _resolve(source, changes)
    return tuple(
        path
        for path, change in change_set.items()
        if not isinstance(change, ModeChange) and _is_large(_sizes(base, path, change))
    )


def _large_note(
    path: str, change: Change, old_mode: int | None, sizes: tuple[int | None, int | None]
) -> bytes:
    """What a diff says of a change to a large file: its sizes, not its lines (never read)."""
    new_mode = None if isinstance(change, Delete) else change.mode
    header = _links_header(path, old_mode, new_mode)
    if isinstance(change, ModeChange):
        return header or b"mode change %o -> %o %s\n" % (old_mode or 0, change.mode, _shown(path))
    a = _shown("a/" + path) if old_mode is not None else b"/dev/null"
    b = _shown("b/" + path) if new_mode is not None else b"/dev/null"
    shown = [("none" if size is None else format_size(size)).encode() for size in sizes]
    limit = format_size(LARGE_FILE_SIZE).encode()
    return header + b"Large files %s and %s differ (%s -> %s; files over %s are not diffed)\n" % (
        a,
        b,
        shown[0],
        shown[1],
        limit,
    )


#: the hunk header of a change whose base content is gone (see :func:`unified_diff`)
BASE_GONE = b"base changed in the workspace during the run"


def _links_header(path: str, old_mode: int | None, new_mode: int | None) -> bytes:
    """The git header lines that mark a change involving a symlink; empty when none does.

    The ``diff --git`` line opens the file (the mode lines come before its ``---``); the mode
    lines are there even for a link that stays a link, to say it is one.
    """
    if not (is_symlink(old_mode or 0) or is_symlink(new_mode or 0)):
        return b""
    out = [b"diff --git %s %s\n" % (_shown("a/" + path), _shown("b/" + path))]
    if old_mode is None:
        out.append(b"new file mode %s\n" % git_mode(new_mode or 0).encode())
    elif new_mode is None:
        out.append(b"deleted file mode %s\n" % git_mode(old_mode).encode())
    else:
        out.append(
            b"old mode %s\nnew mode %s\n"
            % (git_mode(old_mode).encode(), git_mode(new_mode).encode())
        )
    return b"".join(out)


def _whole(path: str, change: Change, old_mode: int | None) -> bytes:
    """A change whose base content is gone, shown whole (no line of the base can be shown)."""
    a, b = _shown("a/" + path), _shown("b/" + path)
    if isinstance(change, ModeChange):
        return b"mode change %o -> %o %s\n" % (old_mode or 0, change.mode, _shown(path))
    if isinstance(change, Delete):
        header = _links_header(path, old_mode, None)
        return header + b"--- %s\n+++ /dev/null\n@@ %s: deleted @@\n" % (a, BASE_GONE)
    assert isinstance(change, Write)
    header = _links_header(path, old_mode, change.mode)
    if is_binary(change.data):
        return header + b"Binary files %s and %s differ\n" % (a, b)
    out = [
        header,
        b"--- %s\n+++ %s\n@@ %s: the new version, whole @@\n" % (a, b, BASE_GONE),
    ]
    for line in _lines(change.data):
        out.append(b"+" + line)
        if not line.endswith(b"\n"):
            out.append(b"\n\\ No newline at end of file\n")
    return b"".join(out)


def unified_diff(
    source: ChangeSource | Tree,
    changes: Mapping[str, Change] | None = None,
    *,
    context: int = 3,
    base_gone: Literal["raise", "whole"] = "raise",
) -> str:
    """A unified diff of the changes (text; undecodable bytes of content shown as U+FFFD).

    A name that is not UTF-8, or holds a control character, ``"`` or ``\\``, is quoted as git
    quotes it (``"a/caf\\351.txt"``); other names are shown as they are.

    A file whose base content is gone (it changed in the workspace since the snapshot, which did
    not keep it) cannot be diffed: :class:`WorkspaceChanged` is raised, or with
    ``base_gone="whole"`` its new version is shown whole under the hunk header
    ``@@ base changed in the workspace during the run: ... @@`` (which ``patch`` and
    ``git apply`` refuse, rather than apply it to another base). A large file (see
    :func:`large_paths`) is given by its sizes, never read.
    """
    base, change_set = _resolve(source, changes)
    out: list[bytes] = []
    for path in change_set:
        sizes = _sizes(base, path, change_set[path])
        if _is_large(sizes):
            out.append(_large_note(path, change_set[path], base.mode(path), sizes))
            continue
        try:
            old, old_mode, new, new_mode = _versions(base, path, change_set[path])
        except WorkspaceChanged:
            if base_gone == "raise":
                raise
            out.append(_whole(path, change_set[path], base.mode(path)))
            continue
        header = _links_header(path, old_mode, new_mode)
        if header:
            out.append(header)
        elif old == new:
            out.append(b"mode change %o -> %o %s\n" % (old_mode or 0, new_mode or 0, _shown(path)))
            continue
        if old == new:
            continue  # a file become a link to the same text: the header says it
        a = _shown("a/" + path) if old is not None else b"/dev/null"
        b = _shown("b/" + path) if new is not None else b"/dev/null"
        if is_binary(old or b"") or is_binary(new or b""):
            out.append(b"Binary files %s and %s differ\n" % (a, b))
            continue
        out.append(b"--- %s\n+++ %s\n" % (a, b))
        out.extend(_hunks(old or b"", new or b"", context))
    return b"".join(out).decode("utf-8", "replace")


def git_patch(
    source: ChangeSource | Tree,
    changes: Mapping[str, Change] | None = None,
    *,
    context: int = 3,
    base_gone: Literal["raise", "omit"] = "raise",
) -> bytes:
    """A patch ``git apply`` accepts (run at the workspace root), binary files included.

    A file whose base content is gone (as for :func:`unified_diff`) has no base to patch:
    :class:`WorkspaceChanged` is raised, or with ``base_gone="omit"`` it is left out (logged).
    A large file (see :func:`large_paths`) is left out (logged), never read; a mode change of
    one is kept (it holds no content).
    """
    base, change_set = _resolve(source, changes)
    out: list[bytes] = []
    gone: list[str] = []
    large: list[str] = []
    for path in change_set:
        change = change_set[path]
        if _is_large(_sizes(base, path, change)):
            if not isinstance(change, ModeChange):
                large.append(path)
                continue
            # the same content on both sides: its headers only, the content never read
            out.extend(_patch_entry(path, b"", base.mode(path), b"", change.mode, context))
            continue
        try:
            old, old_mode, new, new_mode = _versions(base, path, change_set[path])
        except WorkspaceChanged:
            if base_gone == "raise":
                raise
            gone.append(path)
            continue
        if _type_changed(old_mode, new_mode):
            # git cannot change an entry's type in place ("new mode 120000" under "old mode
            # 100644" is refused): like git diff, delete the old entry, then create the new one
            out.extend(_patch_entry(path, old, old_mode, None, None, context))
            out.extend(_patch_entry(path, None, None, new, new_mode, context))
        else:
            out.extend(_patch_entry(path, old, old_mode, new, new_mode, context))
    if gone:
        log.warning("base changed in the workspace; left out of the patch", files=gone)
    if large:
        log.warning("files too large to patch; left out of the patch", files=large)
    return b"".join(out)


def _type_changed(old_mode: int | None, new_mode: int | None) -> bool:
    """Whether a path that exists before and after changes its type (a file become a link)."""
    if old_mode is None or new_mode is None:
        return False
    return stat.S_IFMT(old_mode) != stat.S_IFMT(new_mode)


def _patch_entry(
    path: str,
    old: bytes | None,
    old_mode: int | None,
    new: bytes | None,
    new_mode: int | None,
    context: int,
) -> Iterator[bytes]:
    """One ``diff --git`` section of a git patch: ``old`` (None: absent) becomes ``new``."""
    a, b = _quote("a/" + path), _quote("b/" + path)
    yield b"diff --git %s %s\n" % (a, b)
    if old is None:
        yield b"new file mode %s\n" % git_mode(new_mode or 0).encode()
    elif new is None:
        yield b"deleted file mode %s\n" % git_mode(old_mode or 0).encode()
    elif git_mode(old_mode or 0) != git_mode(new_mode or 0):
        yield b"old mode %s\nnew mode %s\n" % (
            git_mode(old_mode or 0).encode(),
            git_mode(new_mode or 0).encode(),
        )
    if old == new:
        return
    old_id = _git_blob_id(old) if old is not None else _ZERO
    new_id = _git_blob_id(new) if new is not None else _ZERO
    same_mode = old is not None and new is not None and old_mode == new_mode
    suffix = b" %s" % git_mode(old_mode or 0).encode() if same_mode else b""
    yield b"index %s..%s%s\n" % (old_id.encode(), new_id.encode(), suffix)
    if is_binary(old or b"") or is_binary(new or b""):
        yield b"GIT binary patch\n"
        yield _binary_literal(new or b"")
        yield _binary_literal(old or b"")
        return
    if not old and not new:
        return
    yield b"--- %s\n" % (a if old is not None else b"/dev/null")
    yield b"+++ %s\n" % (b if new is not None else b"/dev/null")
    yield from _hunks(old or b"", new or b"", context)


#: git, with the repository's file-system monitor off: plumbing needs none, and a command
#: configured there is not run
_GIT = ("git", "-c", "core.fsmonitor=false")


def _git(args: list[str], cwd: str, env: Mapping[str, str], stdin: bytes | None = None) -> str:
    proc = subprocess.run(
        [*_GIT, *args], cwd=cwd, env=dict(env), input=stdin, capture_output=True, check=False
    )
    if proc.returncode != 0:
        raise VfsError(f"git {args[0]} failed: {decode_text(proc.stderr).strip()}")
    return name_of(proc.stdout).strip()


class GitBranchRefused(VfsError):
    """A new git branch cannot be made: no git repository, a bad name, or the branch exists."""


def _git_env() -> dict[str, str]:
    # our own repository, work tree and index, whatever the caller's environment points at
    return {k: v for k, v in os.environ.items() if k not in _REPO_ENV}


def _repo_prefix(root: str, env: Mapping[str, str]) -> str:
    """Where ``root`` is in its repository: ``""`` at the top, else ``"sub/dir/"``."""
    top = _git(["rev-parse", "--show-toplevel"], root, env)
    prefix = os.path.relpath(os.path.realpath(root), os.path.realpath(top))
    return "" if prefix == "." else prefix.replace(os.sep, "/") + "/"


def _head(root: str, env: Mapping[str, str]) -> str:
    """The commit ``HEAD`` names; empty in a repository with no commit yet."""
    done = subprocess.run(
        [*_GIT, "rev-parse", "--verify", "-q", "HEAD^{commit}"],
        cwd=root,
        env=dict(env),
        capture_output=True,
        check=False,
    )
    return done.stdout.decode().strip()


def check_git_branch(root: str | os.PathLike[str], branch: str) -> str:
    """The ref ``refs/heads/BRANCH`` for a new branch of the repository ``root`` is in.

    Raises :class:`GitBranchRefused` if ``root`` is not in a git work tree (or git is not
    installed), ``branch`` is not a valid branch name, or the branch exists. Blocking.
    """
    cwd = os.path.realpath(root)
    env = _git_env()
    try:
        _repo_prefix(cwd, env)
    except (VfsError, OSError) as e:
        raise GitBranchRefused(f"{cwd} is not in a git repository") from e
    try:
        name = _git(["check-ref-format", "--branch", branch], cwd, env)
    except VfsError as e:
        raise GitBranchRefused(f"{branch!r} is not a valid git branch name") from e
    ref = "refs/heads/" + name
    exists = subprocess.run(
        [*_GIT, "rev-parse", "--verify", "-q", ref],
        cwd=cwd,
        env=env,
        capture_output=True,
        check=False,
    )
    if exists.returncode == 0:
        raise GitBranchRefused(f"git branch {name!r} already exists")
    return ref


_GIT_MODES = {"100644": 0o100644, "100755": 0o100755, "120000": SYMLINK_MODE}


def git_head_tree(root: str | os.PathLike[str], paths: Iterable[str]) -> MemoryTree:
    """``HEAD``'s version of ``paths`` (relative to ``root``, a directory in a git work tree).

    The content is the blob as committed (no filters). A path ``HEAD`` does not hold as a file
    or symlink (absent, a directory, a submodule) is absent from the tree, and so is every path
    when ``HEAD`` has no commit yet. Blocking.
    """
    cwd = os.path.realpath(root)
    env = {**_git_env(), "GIT_LITERAL_PATHSPECS": "1"}
    prefix = _repo_prefix(cwd, env)
    wanted = sorted(set(paths))
    head = _head(cwd, env)
    if not head or not wanted:
        return MemoryTree({})
    entries: list[tuple[str, int, str]] = []
    for i in range(0, len(wanted), 500):  # a bounded command line
        chunk = [prefix + p for p in wanted[i : i + 500]]
        listing = subprocess.run(
            [*_GIT, "ls-tree", "-z", "--full-tree", head, "--", *chunk],
            cwd=cwd,
            env=env,
            capture_output=True,
            check=False,
        )
        if listing.returncode != 0:
            raise VfsError(f"git ls-tree failed: {decode_text(listing.stderr)}")
        for record in listing.stdout.split(b"\0"):
            if not record:
                continue
            meta, _, name = record.partition(b"\t")
            tree_mode, kind, blob = meta.decode().split(" ")
            path = name_of(name)
            if kind == "blob" and tree_mode in _GIT_MODES and path.startswith(prefix):
                entries.append((path[len(prefix) :], _GIT_MODES[tree_mode], blob))
    files: dict[str, FileState] = {}
    if entries:
        batch = subprocess.run(
            [*_GIT, "cat-file", "--batch"],
            cwd=cwd,
            env=env,
            input="".join(f"{blob}\n" for _, _, blob in entries).encode(),
            capture_output=True,
            check=False,
        )
        if batch.returncode != 0:
            raise VfsError(f"git cat-file failed: {decode_text(batch.stderr)}")
        out, at = batch.stdout, 0
        for rel, mode, _blob in entries:
            end = out.index(b"\n", at)
            size = int(out[at:end].split(b" ")[2])
            files[rel] = FileState(out[end + 1 : end + 1 + size], mode)
            at = end + 1 + size + 1  # the content is followed by a newline
    return MemoryTree(files)


def git_commit(
    source: ChangeSource | Tree,
    changes: Mapping[str, Change] | None = None,
    *,
    branch: str,
    message: str,
    author: tuple[str, str] | None = None,
    workspace: str | os.PathLike[str] | None = None,
) -> str:
    """Commit the changes on the new branch ``branch`` of the workspace's repository.

    The paths are relative to ``workspace`` (a directory in a git work tree; by default the
    root of the changes' workspace snapshot); a mode change takes its content from the changes'
    base tree. ``author`` is ``(name, email)`` (also used as committer); without it git's
    configured identity is used, or ``acp-orchestrator <orchestrator@localhost>`` when there is
    none. Returns the commit id. Refuses an existing branch name. Blocking: see
    :func:`git_commit_async`.
    """
    base, change_set = _resolve(source, changes)
    if workspace is None:
        if not isinstance(base, Snapshot):
            raise TypeError("a git commit of changes over a tree needs workspace=")
        workspace = base.root
    env = _git_env()
    cwd = os.path.realpath(workspace)
    prefix = _repo_prefix(cwd, env)
    ref = "refs/heads/" + _git(["check-ref-format", "--branch", branch], cwd, env)
    if author is not None:
        env.update(
            GIT_AUTHOR_NAME=author[0],
            GIT_AUTHOR_EMAIL=author[1],
            GIT_COMMITTER_NAME=author[0],
            GIT_COMMITTER_EMAIL=author[1],
        )
    elif subprocess.run(
        [*_GIT, "var", "GIT_COMMITTER_IDENT"], cwd=cwd, env=env, capture_output=True, check=False
    ).returncode:
        env.update(
            GIT_AUTHOR_NAME="acp-orchestrator",
            GIT_AUTHOR_EMAIL="orchestrator@localhost",
            GIT_COMMITTER_NAME="acp-orchestrator",
            GIT_COMMITTER_EMAIL="orchestrator@localhost",
        )
    head = _head(cwd, env)
    with tempfile.TemporaryDirectory(prefix="orch-commit-") as tmp:
        env["GIT_INDEX_FILE"] = os.path.join(tmp, "index")
        _git(["read-tree", head] if head else ["read-tree", "--empty"], cwd, env)
        records: list[bytes] = []
        blobs: list[tuple[str, int, bytes]] = []
        for path in change_set:
            change = change_set[path]
            if isinstance(change, Delete):
                records.append(b"0 %s\t%s\0" % (_ZERO.encode(), name_bytes(prefix + path)))
                continue
            data = change.data if isinstance(change, Write) else base.read(path)
            blobs.append((path, change.mode, data))
        files = []
        for i, (_path, _mode, data) in enumerate(blobs):
            name = os.path.join(tmp, f"blob{i}")
            with open(name, "wb") as f:
                f.write(data)
            files.append(name)
        if files:
            ids = _git(
                ["hash-object", "-w", "--no-filters", "--stdin-paths"],
                cwd,
                env,
                ("\n".join(files) + "\n").encode(),
            ).split()
            for (path, mode, _data), blob_id in zip(blobs, ids, strict=True):
                records.append(
                    b"%s %s\t%s\0"
                    % (
                        git_mode(mode).encode(),
                        blob_id.encode(),
                        name_bytes(prefix + path),
                    )
                )
        _git(["update-index", "-z", "--index-info"], cwd, env, b"".join(records))
        tree = _git(["write-tree"], cwd, env)
    del env["GIT_INDEX_FILE"]
    commit = _git(
        ["commit-tree", tree, *(["-p", head] if head else []), "-F", "-"],
        cwd,
        env,
        message.encode(),
    )
    _git(
        [
            "update-ref",
            "-m",
            f"orchestrator: {message.splitlines()[0] if message else 'commit'}",
            ref,
            commit,
            _ZERO,
        ],
        cwd,
        env,
    )
    log.info("committed changes", branch=branch, commit=commit, files=len(change_set))
    return commit


async def git_commit_async(
    source: ChangeSource | Tree,
    changes: Mapping[str, Change] | None = None,
    *,
    branch: str,
    message: str,
    author: tuple[str, str] | None = None,
    workspace: str | os.PathLike[str] | None = None,
) -> str:
    """:func:`git_commit` in a worker thread."""
    return await trio.to_thread.run_sync(
        lambda: git_commit(
            source, changes, branch=branch, message=message, author=author, workspace=workspace
        )
    )
