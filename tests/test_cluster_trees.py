"""Tests for orchestrator.cluster._trees: manifests, blobs and tree directories between machines."""

from __future__ import annotations

import os
import pickle
import stat
import tempfile
import threading
from collections.abc import Set
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator._names import name_of
from orchestrator.cluster._trees import (
    BlobStore,
    Entry,
    Manifest,
    TreeCache,
    apply_states,
    blobs_for,
    change_states,
    manifest_of,
)
from orchestrator.errors import ClusterError
from orchestrator.vfs import Branch, FileState, MemoryTree, Workspace
from orchestrator.vfs.testing import capture, make_tree
from orchestrator.vfs.tree import Tree

# names a tree may hold: spaces, unicode, a newline, a backslash, a byte that is not UTF-8
ODD_NAMES = ["with space.txt", "ünïcødé.md", "new\nline", "back\\x41slash", name_of(b"caf\xe9.txt")]


def make_workspace(root: Path) -> Path:
    """A workspace with files, an executable, symlinks, nested directories and odd names."""
    make_tree(
        root,
        {
            "README": "hello\n",
            "src/pkg/mod.py": "print('x')\n",
            "src/pkg/deep/er/leaf.bin": b"\0\1\2\xff",
            "empty": b"",
            "dup-a": "same\n",
            "dup-b": "same\n",
            ".gitignore": "*.log\n",
            **{f"odd/{name}": f"content of {name!r}\n" for name in ODD_NAMES},
        },
    )
    (root / "tool.sh").write_text("#!/bin/sh\necho hi\n")
    (root / "tool.sh").chmod(0o755)
    (root / "private").write_text("secret-ish\n")
    (root / "private").chmod(0o600)
    os.symlink("src/pkg/mod.py", root / "link-rel")
    os.symlink("/nowhere/at/all", root / "link-abs")
    os.symlink("missing", root / "odd" / name_of(b"l\xefnk"))
    return root


def ship(tree: Tree | Branch, store: BlobStore) -> Manifest:
    """What a driver and a node do: the manifest, then the blobs the store lacks."""
    # what travels is pickled (as Ray does): odd names must survive it
    manifest: Manifest = pickle.loads(pickle.dumps(manifest_of(tree)))
    missing = store.missing(manifest.digests())
    for digest, data in blobs_for(tree, manifest, manifest.digests() - missing).items():
        store.put(digest, data)
    return manifest


def tree_dirs(root: Path) -> list[str]:
    """The names the cache directory holds."""
    return sorted(os.listdir(root))


@pytest.fixture
def store(tmp_path: Path) -> BlobStore:
    return BlobStore(tmp_path / "blobs")


@pytest.fixture
def cache(tmp_path: Path, store: BlobStore) -> TreeCache:
    return TreeCache(tmp_path / "trees", store)


def test_snapshot_round_trips_through_a_tree_directory(tmp_path: Path, cache: TreeCache) -> None:
    """A snapshot's tree, shipped and made a directory, snapshots to the same manifest."""
    ws = make_workspace(tmp_path / "ws")
    snap = Workspace.open(ws).snapshot()
    manifest = ship(snap, cache.store)
    assert manifest.size == len(snap.paths()) == 17
    with cache.open(manifest) as directory:
        again = manifest_of(Workspace.open(directory).snapshot())
        assert again == manifest
        # byte for byte and mode for mode (directories aside: a tree does not hold them)
        want = {k: v for k, v in capture(ws).items() if not k.endswith("/")}
        got = {k: v for k, v in capture(directory).items() if not k.endswith("/")}
        assert got == want
        assert stat.S_IMODE(os.lstat(directory / "tool.sh").st_mode) == 0o755
        assert os.readlink(directory / "link-abs") == "/nowhere/at/all"


def test_manifest_digest_is_the_trees_not_its_origin() -> None:
    """Equal trees have equal digests; a changed content, mode or name changes it."""
    files = {"a": FileState(b"1"), "b/c": FileState(b"2", 0o100755)}
    one = manifest_of(MemoryTree.from_files(files))
    assert one == manifest_of(MemoryTree.from_files(dict(reversed(files.items()))))
    assert one.entries == tuple(sorted(one.entries, key=lambda e: e.path))
    assert one.digests() == {FileState(b"1").digest, FileState(b"2").digest}
    variants = [
        {"a": FileState(b"1"), "b/c": FileState(b"2")},
        {"a": FileState(b"1"), "b/c": FileState(b"3", 0o100755)},
        {"a": FileState(b"1"), "b/d": FileState(b"2", 0o100755)},
        {"a": FileState(b"1", 0o120777), "b/c": FileState(b"2", 0o100755)},
    ]
    digests = {manifest_of(MemoryTree.from_files(v)).digest for v in variants}
    assert one.digest not in digests and len(digests) == len(variants)


def test_branch_changes_come_back_to_the_driver(tmp_path: Path, cache: TreeCache) -> None:
    """A node's write, delete, chmod and new symlink, applied to the driver's branch, give the
    same net changes."""
    snap = Workspace.open(make_workspace(tmp_path / "ws")).snapshot()
    driver = Branch.from_tree(snap, "step")
    driver.write("README", b"driver's\n")  # changes before the fork travel with the tree
    fork = driver.fork("step.1")
    manifest = ship(fork, cache.store)
    with cache.open(manifest) as directory:
        node = Branch.from_tree(Workspace.open(directory).snapshot(), "node")
        node.write("src/pkg/mod.py", b"print('y')\n")
        node.write("new/file.txt", b"new\n")
        node.write(f"odd/{ODD_NAMES[-1]}", b"recoded\n")
        node.delete("dup-a")
        node.delete(f"odd/{ODD_NAMES[2]}")
        node.chmod("README", 0o755)
        node.set_state("link-new", FileState(b"../README", 0o120777))
        node.set_state("tool.sh", FileState(b"README", 0o120777))  # a file becomes a link
        states = pickle.loads(pickle.dumps(change_states(node)))
    assert set(states) == set(node.changes) and states["dup-a"] is None
    apply_states(fork, states)
    assert fork.net_changes(fork.base) == node.net_changes()
    assert fork.read("README") == b"driver's\n" and fork.mode("README") == 0o100755
    assert fork.mode("tool.sh") == 0o120777 and not fork.exists("dup-a")


def test_blobs_for_skips_what_the_node_has_and_reads_each_once() -> None:
    """Blobs already held are not sent; a content shared by several paths is read once."""
    reads: list[str] = []

    class Counting:
        """A tree that counts reads."""

        def __init__(self, inner: MemoryTree) -> None:
            self.inner = inner

        def paths(self) -> Set[str]:
            return self.inner.paths()

        def digest(self, path: str) -> str | None:
            return self.inner.digest(path)

        def mode(self, path: str) -> int | None:
            return self.inner.mode(path)

        def read(self, path: str) -> bytes:
            reads.append(path)
            return self.inner.read(path)

    tree = Counting(MemoryTree.from_files({"a": b"same", "b": b"same", "c": b"other", "d": b"x"}))
    manifest = manifest_of(tree)  # type: ignore[arg-type]
    have = {FileState(b"x").digest}
    blobs = blobs_for(tree, manifest, have)  # type: ignore[arg-type]
    assert blobs == {FileState(b"same").digest: b"same", FileState(b"other").digest: b"other"}
    assert sorted(reads) in (["a", "c"], ["b", "c"])
    assert blobs_for(tree, manifest, manifest.digests()) == {}  # type: ignore[arg-type]


def test_blob_store_refuses_corrupt_blobs(store: BlobStore) -> None:
    """A blob whose content has another hash is refused, and one corrupted on disk is dropped."""
    good = FileState(b"payload").digest
    with pytest.raises(ClusterError, match="another hash"):
        store.put(good, b"tampered")
    assert store.missing([good]) == {good}
    store.put(good, b"payload")
    store.put(good, b"payload")  # again: a no-op
    assert store.missing([good]) == set() and store.read(good) == b"payload"
    assert store.path(good) == store.root / good[:2] / good[2:]
    store.path(good).write_bytes(b"bit rot")
    with pytest.raises(ClusterError, match="corrupt"):
        store.read(good)
    assert store.missing([good]) == {good}
    with pytest.raises(ClusterError, match="no blob"):
        store.read(good)
    for bad in ("../../etc/passwd", good.upper(), good[:-1], "", good + "0"):
        with pytest.raises(ClusterError, match="not a content hash"):
            store.put(bad, b"")
        with pytest.raises(ClusterError, match="not a content hash"):
            store.missing([bad])
    assert [p.name for p in store.root.rglob("*") if p.is_file()] == []


def test_missing_or_corrupt_blob_leaves_no_tree(tmp_path: Path, cache: TreeCache) -> None:
    """A blob the store lacks names the path; a corrupt one stops the make; neither leaves a
    directory behind, and the tree is made once the blob is there."""
    tree = MemoryTree.from_files({"a/one": b"1", "b/two words": b"2", "c": b"3"})
    manifest = manifest_of(tree)
    blobs = blobs_for(tree, manifest, ())
    two = FileState(b"2").digest
    for digest, data in blobs.items():
        if digest != two:
            cache.store.put(digest, data)
    with pytest.raises(ClusterError, match="no blob for 'b/two words'"):
        cache.open(manifest).__enter__()
    assert tree_dirs(cache.root) == []
    cache.store.put(two, b"2")
    cache.store.path(FileState(b"3").digest).write_bytes(b"rotten")
    with pytest.raises(ClusterError, match="corrupt"):
        cache.open(manifest).__enter__()
    assert tree_dirs(cache.root) == []
    cache.store.put(FileState(b"3").digest, b"3")
    with cache.open(manifest) as directory:
        assert (directory / "b" / "two words").read_bytes() == b"2"
        assert tree_dirs(cache.root) == [manifest.digest]


HOSTILE_PATHS = [
    "/etc/passwd",
    "../outside",
    "a/../../outside",
    "a//b",
    "a/",
    "./a",
    "a/./b",
    "",
    "a\0b",
    "x" * 300,
]


@pytest.mark.parametrize("path", HOSTILE_PATHS)
def test_hostile_manifest_paths_are_refused(tmp_path: Path, cache: TreeCache, path: str) -> None:
    """A manifest entry whose path could leave the tree is refused before anything is written."""
    content = FileState(b"pwned")
    cache.store.put(content.digest, content.data)
    manifest = Manifest.of(
        [Entry("fine", content.digest, 0o100644), Entry(path, content.digest, 0o100644)]
    )
    with pytest.raises(ClusterError, match="refused"):
        cache.open(manifest)
    assert tree_dirs(cache.root) == []
    assert sorted(os.listdir(tmp_path)) == ["blobs", "trees"]


def test_hostile_manifests_are_refused(tmp_path: Path, cache: TreeCache) -> None:
    """A path under a symlink, a duplicate, a bad mode or digest, or a digest that does not
    match the entries: refused, nothing written anywhere."""
    outside = tmp_path / "outside"
    outside.mkdir()
    target = FileState(os.fsencode(outside))
    payload = FileState(b"pwned")
    for state in (target, payload):
        cache.store.put(state.digest, state.data)
    link = Entry("ln", target.digest, 0o120777)
    cases = [
        Manifest.of([link, Entry("ln/planted", payload.digest, 0o100644)]),
        Manifest.of(
            [Entry("a", payload.digest, 0o100644), Entry("a/b/c", payload.digest, 0o100644)]
        ),
        Manifest(
            (Entry("a", payload.digest, 0o100644), Entry("a", payload.digest, 0o100644)), "0" * 64
        ),
        Manifest.of([Entry("dir", payload.digest, 0o040755)]),
        Manifest.of([Entry("dev", payload.digest, 0o020644)]),
        Manifest.of([Entry("suid", payload.digest, 0o104755)]),
        Manifest.of([Entry("f", "../../../etc/passwd", 0o100644)]),
        Manifest(
            (Entry("b", payload.digest, 0o100644), Entry("a", payload.digest, 0o100644)), "0" * 64
        ),
    ]
    genuine = Manifest.of([Entry("a", payload.digest, 0o100644)])
    cases.append(Manifest((Entry("b", payload.digest, 0o100644),), genuine.digest))
    for manifest in cases:
        with pytest.raises(ClusterError, match=r"refused|not a content hash"):
            cache.open(manifest)
    assert tree_dirs(cache.root) == [] and os.listdir(outside) == []


def test_apply_states_refuses_bad_states_and_changes_nothing() -> None:
    """States with a hostile path, a forged digest or a bad mode are refused as a whole."""
    branch = Branch.from_tree(MemoryTree.from_files({"a": b"1"}), "b")
    good = FileState(b"ok")
    forged = FileState(b"evil", 0o100644, FileState(b"harmless").digest)
    for states in (
        {"fine": good, "../escape": good},
        {"fine": good, "/abs": None},
        {"fine": good, "a": forged},
        {"fine": good, "link": FileState(b"", 0o120777)},
    ):
        with pytest.raises(ClusterError, match="refused"):
            apply_states(branch, states)
    assert len(branch.changes) == 0


def test_eviction_keeps_held_trees(tmp_path: Path, cache: TreeCache) -> None:
    """Trees beyond max_trees are deleted least recently used first, never while held."""
    small = TreeCache(tmp_path / "small", cache.store, max_trees=1)
    manifests = [ship(MemoryTree.from_files({"f": str(i).encode()}), cache.store) for i in range(3)]
    a, b, c = (m.digest for m in manifests)
    with small.open(manifests[0]) as held:
        with small.open(manifests[1]):
            pass
        assert tree_dirs(small.root) == [a]  # b released and beyond the limit; a held
        with small.open(manifests[2]), small.open(manifests[1]):
            assert tree_dirs(small.root) == sorted([a, b, c])
        assert tree_dirs(small.root) == [a]
        assert (held / "f").read_bytes() == b"0"
    assert tree_dirs(small.root) == [a]  # the only one: within the limit
    with small.open(manifests[2]):
        pass
    assert tree_dirs(small.root) == [c]
    roomy = TreeCache(tmp_path / "roomy", cache.store, max_trees=2)
    for manifest in (manifests[0], manifests[1], manifests[0], manifests[2]):
        with roomy.open(manifest):
            pass
    assert tree_dirs(roomy.root) == sorted([a, c])  # b was the least recently used


def test_two_threads_opening_one_manifest_make_it_once(
    tmp_path: Path, cache: TreeCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second thread opening a tree being made waits for it instead of making it again."""
    manifest = ship(MemoryTree.from_files({"x/y": b"z"}), cache.store)
    making = threading.Event()
    proceed = threading.Event()
    second_waits = threading.Event()
    made: list[Path] = []
    real_make = TreeCache._make

    def slow_make(self: TreeCache, manifest: Manifest, target: Path) -> None:
        made.append(target)
        making.set()
        assert proceed.wait(30)
        real_make(self, manifest, target)

    monkeypatch.setattr(TreeCache, "_make", slow_make)
    real = cache._changed

    class Watched:
        """The cache's condition, telling when a thread waits on it."""

        def wait(self) -> bool:
            second_waits.set()
            return real.wait()

        def notify_all(self) -> None:
            real.notify_all()

    monkeypatch.setattr(cache, "_changed", Watched())
    seen: list[bytes] = []
    errors: list[BaseException] = []

    def opener() -> None:
        try:
            with cache.open(manifest) as directory:
                seen.append((directory / "x" / "y").read_bytes())
        except BaseException as e:
            errors.append(e)

    first = threading.Thread(target=opener)
    first.start()
    assert making.wait(30)
    second = threading.Thread(target=opener)
    second.start()
    assert second_waits.wait(30)
    proceed.set()
    first.join(30)
    second.join(30)
    assert errors == [] and seen == [b"z", b"z"] and len(made) == 1
    assert tree_dirs(cache.root) == [manifest.digest]


def test_leftovers_of_an_earlier_cache_are_removed(tmp_path: Path, store: BlobStore) -> None:
    """Half-made and earlier trees are never taken for trees; other files are left alone."""
    root = tmp_path / "trees"
    make_tree(root, {".tmp-0123/a": "partial", f"{'ab' * 32}/a": "stale", "keep.txt": "mine"})
    TreeCache(root, store)
    assert tree_dirs(root) == ["keep.txt"]


# ------------------------------------------------------------------ property test

_NAME = st.one_of(
    st.text(
        st.characters(codec="utf-8", exclude_characters="/\0"),
        min_size=1,
        max_size=12,
    ),
    st.binary(min_size=1, max_size=8).map(name_of),
).filter(
    lambda n: (
        n not in (".", "..", ".git", ".gitignore", ".hg", ".svn", ".bzr", ".jj", "_darcs")
        and "/" not in n
        and "\0" not in n
    )
)

_STATE = st.one_of(
    st.builds(FileState, st.binary(max_size=64), st.sampled_from([0o100644, 0o100755, 0o100600])),
    st.builds(
        lambda target: FileState(target, 0o120777),
        st.binary(min_size=1, max_size=20).filter(lambda b: b"\0" not in b),
    ),
)


@st.composite
def _trees(draw: st.DrawFn) -> dict[str, FileState]:
    """A random tree: nested names, contents, modes and symlinks, no file under another."""
    paths = draw(st.lists(st.lists(_NAME, min_size=1, max_size=3).map("/".join), max_size=12))
    out: dict[str, FileState] = {}
    for path in paths:
        parts = path.split("/")
        prefixes = {"/".join(parts[:i]) for i in range(1, len(parts))}
        if path in out or prefixes & out.keys() or any(p.startswith(path + "/") for p in out):
            continue
        out[path] = draw(_STATE)
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(files=_trees())
def test_random_trees_round_trip(files: dict[str, FileState]) -> None:
    """Any tree, made a directory through blobs and a cache, snapshots to its own manifest."""
    manifest = manifest_of(MemoryTree.from_files(files))
    with tempfile.TemporaryDirectory() as scratch:
        store = BlobStore(Path(scratch) / "blobs")
        cache = TreeCache(Path(scratch) / "trees", store, max_trees=0)
        for digest, data in blobs_for(MemoryTree.from_files(files), manifest, ()).items():
            store.put(digest, data)
        with cache.open(manifest) as directory:
            snap = Workspace.open(directory, use_gitignore=False).snapshot()
            assert manifest_of(snap) == manifest
        assert tree_dirs(cache.root) == []  # max_trees=0: gone once released
