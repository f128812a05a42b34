"""Tests for orchestrator.vfs.apply: all-or-nothing writes to the workspace, and recovery."""

from __future__ import annotations

import errno
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import orchestrator.vfs as vfs
from orchestrator.vfs import apply as apply_module
from orchestrator.vfs._fileio import temp_name
from orchestrator.vfs.apply import (
    _locked,
    apply_changes,
    apply_changes_async,
    in_the_way,
    interrupted_applies,
    recover_applies,
)
from orchestrator.vfs.branch import Branch
from orchestrator.vfs.changes import Change, Delete, ModeChange, Write
from orchestrator.vfs.errors import ApplyError, MergeConflictError, VfsError
from orchestrator.vfs.merge import merge_branches
from orchestrator.vfs.snapshot import Snapshot, Workspace
from orchestrator.vfs.testing import capture, make_tree
from orchestrator.vfs.tree import MemoryTree

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    return make_tree(
        tmp_path / "ws",
        {"a.txt": "a\n", "b.txt": "b\n", "dir/c.txt": "c\n", "run.sh": "#!/bin/sh\n"},
    )


def branch_of(root: Path) -> Branch:
    return Branch.from_tree(Workspace.open(root).snapshot(), "agent")


def journals(state: Path) -> list[str]:
    applies = state / "applies"
    return (
        sorted(p for p in os.listdir(applies) if not p.startswith(".")) if applies.exists() else []
    )


def test_apply_writes_every_kind_of_change(ws: Path, tmp_path: Path) -> None:
    """Writes, new files in new directories, deletions, mode changes and symlinks land on disk."""
    br = branch_of(ws)
    br.write("a.txt", b"A\n")
    br.write("new/deep/n.txt", b"n\n")
    br.delete("dir/c.txt")
    br.chmod("run.sh", 0o755)
    br.write("link", b"a.txt", 0o120777)
    result = apply_changes(br, state_dir=tmp_path / "state")
    assert result.ok and result.applied
    assert result.written == ("a.txt", "link", "new/deep/n.txt")
    assert result.deleted == ("dir/c.txt",) and result.mode_changed == ("run.sh",)
    assert (ws / "a.txt").read_text() == "A\n"
    assert (ws / "new/deep/n.txt").read_text() == "n\n"
    assert not (ws / "dir").exists()  # emptied directories go, as with git
    assert stat.S_IMODE((ws / "run.sh").stat().st_mode) == 0o755
    assert os.readlink(ws / "link") == "a.txt"
    assert journals(tmp_path / "state") == []
    assert not [n for n in os.listdir(ws) if n.endswith(".orch-tmp")]


def test_apply_preserves_modes_of_rewritten_files(ws: Path, tmp_path: Path) -> None:
    """A rewritten executable stays executable."""
    (ws / "run.sh").chmod(0o750)
    br = branch_of(ws)
    br.write("run.sh", b"#!/bin/sh\necho\n")
    assert apply_changes(br, state_dir=tmp_path / "state").ok
    assert stat.S_IMODE((ws / "run.sh").stat().st_mode) == 0o750


def test_apply_refuses_outside_changes_and_writes_nothing(ws: Path, tmp_path: Path) -> None:
    """A file changed (or created) in the workspace after the snapshot blocks the whole apply."""
    br = branch_of(ws)
    br.write("a.txt", b"A\n")
    br.write("b.txt", b"B\n")
    br.write("fresh.txt", b"mine\n")
    (ws / "b.txt").write_text("user edit\n")
    (ws / "fresh.txt").write_text("user's new file\n")
    before = capture(ws)
    result = apply_changes(br, state_dir=tmp_path / "state")
    assert not result.applied and not result.ok
    assert {c.path for c in result.conflicts} == {"b.txt", "fresh.txt"}
    assert capture(ws) == before
    assert journals(tmp_path / "state") == []


def test_apply_refuses_a_file_in_place_of_a_directory(ws: Path, tmp_path: Path) -> None:
    """A new file whose parent became a file in the workspace is an outside conflict."""
    br = branch_of(ws)
    br.write("later/x.txt", b"x\n")
    (ws / "later").write_text("a file now\n")
    result = apply_changes(br, state_dir=tmp_path / "state")
    assert [c.path for c in result.conflicts] == ["later/x.txt"]


def test_a_file_over_a_directory_names_the_file_in_the_way(ws: Path, tmp_path: Path) -> None:
    """A file made where the workspace's directory holds, besides the files the branch
    deletes, one the snapshot never held (ignored): the conflict names that file as in the
    way, not the directory as changed, and nothing is written."""
    (ws / ".gitignore").write_text("*.log\n")
    br = branch_of(ws)
    (ws / "dir" / "x.log").write_text("mine\n")
    br.delete("dir/c.txt")
    br.write("dir", b"a file now\n")
    before = capture(ws)
    result = apply_changes(br, state_dir=tmp_path / "state")
    assert [(c.path, c.reason) for c in result.conflicts] == [("dir", "dir/x.log is in the way")]
    assert capture(ws) == before


@pytest.mark.parametrize(
    ("made", "why"),
    [("dir/empty", "dir/empty/ is in the way"), ("dir/e/f", "dir/e/f/ is in the way")],
)
def test_an_empty_directory_in_the_way_of_a_file_is_named_before_anything_is_written(
    ws: Path, tmp_path: Path, made: str, why: str
) -> None:
    """An empty directory (at any depth) in a directory the branch empties to make a file:
    no deletion removes it, so the apply refuses up front naming it, instead of failing
    midway as changed during the apply."""
    br = branch_of(ws)
    (ws / made).mkdir(parents=True)
    br.delete("dir/c.txt")
    br.write("dir", b"a file now\n")
    before = capture(ws)
    result = apply_changes(br, state_dir=tmp_path / "state")
    assert [(c.path, c.reason) for c in result.conflicts] == [("dir", why)]
    assert capture(ws) == before
    assert journals(tmp_path / "state") == []


def test_in_the_way_lists_what_stays_in_name_order_and_says_there_is_more(ws: Path) -> None:
    """in_the_way walks in name order, leaves out the files deleted, names empty directories
    with a slash, and stops at the limit saying there is more."""
    for name in ("b.log", "a.log", "sub/z.log"):
        make_tree(ws / "dir", {name: "x\n"})
    (ws / "dir" / "void").mkdir()
    deleted = {"dir/c.txt"}
    assert in_the_way(str(ws), "dir", deleted, 10) == (
        ["dir/a.log", "dir/b.log", "dir/sub/z.log", "dir/void/"],
        False,
    )
    assert in_the_way(str(ws), "dir", deleted, 2) == (["dir/a.log", "dir/b.log"], True)
    assert in_the_way(str(ws), "dir", deleted | {"dir/a.log", "dir/b.log"}, 1) == (
        ["dir/sub/z.log"],
        True,
    )


def test_apply_is_atomic_when_a_write_fails(ws: Path, tmp_path: Path) -> None:
    """An error after some files were written rolls every file back."""
    br = branch_of(ws)
    for name in ("a.txt", "b.txt", "dir/c.txt"):
        br.write(name, b"changed\n")
    br.write("brand/new.txt", b"new\n")
    br.delete("run.sh")
    before = capture(ws)
    done: list[str] = []

    def fail_after_two(path: str) -> None:
        done.append(path)
        if len(done) == 2:
            raise RuntimeError("disk on fire")

    with pytest.raises(ApplyError, match="rolled back"):
        apply_changes(br, state_dir=tmp_path / "state", on_file=fail_after_two)
    assert len(done) == 2
    assert capture(ws) == before
    assert journals(tmp_path / "state") == []


def test_directory_and_file_swap_places(ws: Path, tmp_path: Path) -> None:
    """A directory replaced by a file, and a file replaced by a directory, apply in order."""
    br = branch_of(ws)
    br.delete("dir/c.txt")
    br.write("dir", b"now a file\n")
    br.delete("a.txt")
    br.write("a.txt/inner", b"now a dir\n")
    assert apply_changes(br, state_dir=tmp_path / "state").ok
    assert (ws / "dir").read_text() == "now a file\n"
    assert (ws / "a.txt/inner").read_text() == "now a dir\n"


def test_apply_from_snapshot_and_explicit_changes(ws: Path, tmp_path: Path) -> None:
    """A snapshot plus a change mapping applies; a missing mapping or memory tree is an error."""
    snap = Workspace.open(ws).snapshot()
    changes: dict[str, Change] = {
        "a.txt": Write(b"x\n"),
        "b.txt": Delete(),
        "run.sh": ModeChange(0o700),
    }
    assert apply_changes(snap, changes, state_dir=tmp_path / "state").ok
    assert (ws / "a.txt").read_text() == "x\n" and not (ws / "b.txt").exists()
    with pytest.raises(TypeError):
        apply_changes(snap, state_dir=tmp_path / "state")
    with pytest.raises(TypeError):
        apply_changes(Branch.from_tree(MemoryTree.from_files({}), "m"), state_dir=tmp_path)
    assert apply_changes(snap, {}, state_dir=tmp_path / "state").ok


def test_merge_with_conflicts_needs_consent(ws: Path, tmp_path: Path) -> None:
    """A conflicted merge is applied only with allow_conflicts, and then only its clean part."""
    snap = Workspace.open(ws).snapshot()
    a, b = Branch.from_tree(snap, "a"), Branch.from_tree(snap, "b")
    a.write("a.txt", b"A\n")
    b.write("a.txt", b"B\n")
    b.write("b.txt", b"clean\n")
    result = merge_branches([a, b])
    with pytest.raises(MergeConflictError):
        apply_changes(result, state_dir=tmp_path / "state")
    assert apply_changes(result, state_dir=tmp_path / "state", allow_conflicts=True).ok
    assert (ws / "a.txt").read_text() == "a\n" and (ws / "b.txt").read_text() == "clean\n"


async def test_apply_changes_async(ws: Path, tmp_path: Path) -> None:
    """apply_changes_async writes in a worker thread."""
    br = branch_of(ws)
    br.write("a.txt", b"async\n")
    assert (await apply_changes_async(br, state_dir=tmp_path / "state")).ok
    assert (ws / "a.txt").read_text() == "async\n"


# --------------------------------------------------------------------------- crash and recovery

CHILD = r"""
import sys, time
from orchestrator.vfs import Branch, Workspace, apply_changes
ws, state, marker = sys.argv[1:4]
br = Branch.from_tree(Workspace.open(ws).snapshot(), "child")
for i in range(5):
    br.write(f"f{i}.txt", b"new %d\n" % i)
br.delete("gone.txt")
br.write("sub/added.txt", b"added\n")

def pause(path):
    with open(marker, "a") as f:
        f.write(path + "\n")
    time.sleep(120)

apply_changes(br, state_dir=state, on_file=pause, origin={"by": "child"})
"""


def killed_mid_apply(tmp_path: Path) -> tuple[Path, Path, dict[str, tuple[bytes, int]]]:
    """Run an apply in a child process and SIGKILL it after its first file."""
    ws = make_tree(
        tmp_path / "ws", {**{f"f{i}.txt": f"old {i}\n" for i in range(5)}, "gone.txt": "g\n"}
    )
    before = capture(ws)
    state, marker = tmp_path / "state", tmp_path / "marker"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(ws), str(state), str(marker)], cwd=REPO
    )
    try:
        deadline = time.monotonic() + 60
        while not (marker.exists() and marker.read_text().strip()):
            assert child.poll() is None, "the child apply exited early"
            assert time.monotonic() < deadline, "the child apply never reached its first file"
            time.sleep(0.05)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    return ws, state, before


def expected_new(ws: Path) -> dict[str, bytes]:
    return {**{f"f{i}.txt": b"new %d\n" % i for i in range(5)}, "sub/added.txt": b"added\n"}


def test_sigkill_mid_apply_is_completed_by_recovery(tmp_path: Path) -> None:
    """An apply killed between files is half-done on disk; recovery completes it."""
    ws, state, before = killed_mid_apply(tmp_path)
    assert capture(ws) != before  # the first file (a deletion) is done, the rest are not
    assert (ws / "f4.txt").read_text() == "old 4\n"
    assert len(journals(state)) == 1
    (report,) = recover_applies(state)
    assert report.action == "completed" and not report.problems
    for rel, data in expected_new(ws).items():
        assert (ws / rel).read_bytes() == data
    assert not (ws / "gone.txt").exists()
    assert journals(state) == []
    assert recover_applies(state) == []


def test_sigkill_mid_apply_with_lost_content_is_rolled_back(tmp_path: Path) -> None:
    """If a journaled new content is missing, recovery rolls back to the original tree."""
    ws, state, before = killed_mid_apply(tmp_path)
    journal_dir = state / "applies" / journals(state)[0]
    body = json.loads((journal_dir / "journal.json").read_text())
    victim = next(e for e in body["entries"] if e["action"] == "write")
    (journal_dir / victim["new"]).unlink()
    (report,) = recover_applies(state)
    assert report.action == "rolled back" and not report.problems
    assert capture(ws) == before
    assert journals(state) == []


def test_interrupted_applies_name_a_crashed_apply_without_touching_it(tmp_path: Path) -> None:
    """A crashed apply is listed with its workspace, origin and files (and those edited since),
    nothing is written; an apply under way is not listed; recovery reports the same apply."""
    ws, state, _before = killed_mid_apply(tmp_path)
    half = capture(ws)
    (found,) = interrupted_applies(state)
    assert (found.workspace, found.origin) == (str(ws.resolve()), {"by": "child"})
    assert found.written == (*(f"f{i}.txt" for i in range(5)), "sub/added.txt")
    assert (found.deleted, found.paths[0], found.edited) == (("gone.txt",), "f0.txt", ())
    assert found.started is not None and Path(found.journal).is_dir()
    assert capture(ws) == half and len(journals(state)) == 1
    (ws / "f3.txt").write_text("edited after the crash\n")
    assert interrupted_applies(state)[0].edited == ("f3.txt",)
    with _locked(state):  # as an apply in another process holds it
        assert interrupted_applies(state) == []
    (report,) = recover_applies(state)
    assert report.problems == ("f3.txt",)
    assert report.apply is not None and report.apply.origin == {"by": "child"}
    assert interrupted_applies(tmp_path / "no-state") == []


def test_recovery_discards_an_unfinished_journal(tmp_path: Path) -> None:
    """A journal without journal.json (crash while preparing) is dropped; nothing was written."""
    partial = tmp_path / "state" / "applies" / "20990101T000000-dead"
    (partial / "new").mkdir(parents=True)
    (partial / "new" / "0").write_bytes(b"half")
    (report,) = recover_applies(tmp_path / "state")
    assert report.action == "discarded"
    assert not partial.exists()


def test_recovery_never_clobbers_a_file_edited_after_the_crash(tmp_path: Path) -> None:
    """A file that is neither old nor new is left alone, the rest rolled back to what it held
    before, and the journal kept aside where recovery no longer finds it."""
    ws, state, before = killed_mid_apply(tmp_path)
    (ws / "f3.txt").write_text("someone edited this after the crash\n")
    (report,) = recover_applies(state)
    assert (report.action, report.problems, report.changed) == (
        "rolled back",
        ("f3.txt",),
        ("gone.txt",),
    )
    assert report.apply is not None and report.apply.edited == ("f3.txt",)
    edited = {"f3.txt": (b"someone edited this after the crash\n", before["f3.txt"][1])}
    assert capture(ws) == {**before, **edited}
    kept = Path(report.journal)
    assert kept.name.startswith(".kept-") and (kept / "journal.json").is_file()
    assert journals(state) == [] and interrupted_applies(state) == []
    assert recover_applies(state) == []


LONG = "l" * 251 + ".txt"


@pytest.mark.parametrize(
    ("name", "leftover"),
    [
        pytest.param("a.txt", ".a.txt.0123456789ab.orch-tmp", id="short-name"),
        pytest.param(LONG, temp_name(LONG), id="255-byte-name"),
    ],
)
def test_interrupted_temp_files_are_cleaned(
    ws: Path, tmp_path: Path, name: str, leftover: str
) -> None:
    """Recovery removes temporary files an interrupted write left behind, whatever the length
    of the name they were for."""
    (ws / name).write_bytes(b"a\n")
    snap: Snapshot = Workspace.open(ws).snapshot()
    br = Branch.from_tree(snap, "x")
    br.write("a.txt", b"A\n")
    state = tmp_path / "state"
    with pytest.raises(ApplyError):
        apply_changes(br, state_dir=state, on_file=lambda p: (_ for _ in ()).throw(OSError("x")))
    (ws / leftover).write_bytes(b"partial")
    journal_dir = state / "applies" / "20990101T000000-beef"
    (journal_dir / "new").mkdir(parents=True)
    (journal_dir / "old").mkdir()
    (journal_dir / "new" / "0").write_bytes(b"A\n")
    (journal_dir / "old" / "0").write_bytes(b"a\n")
    entry = {
        "path": name,
        "action": "write",
        "new": "new/0",
        "new_digest": Write(b"A\n").digest,
        "new_mode": 0o100644,
        "old": "old/0",
        "old_digest": Write(b"a\n").digest,
        "old_mode": 0o100644,
    }
    body = {"version": 1, "workspace": str(ws), "entries": [entry]}
    (journal_dir / "journal.json").write_text(json.dumps(body))
    (report,) = recover_applies(state)
    assert report.action == "completed"
    assert (ws / name).read_text() == "A\n"
    assert not [n for n in os.listdir(ws) if n.endswith(".orch-tmp")]


# --------------------------------------------------------------------------- symlinks


@pytest.mark.parametrize(
    ("link", "target"),
    [
        ("evil.md", "/etc/passwd"),  # absolute, outside
        ("dir/evil.md", "../../outside/secret.txt"),  # relative, climbing out
        ("via.md", "out-link/secret.txt"),  # through a link of the workspace that leads out
        ("hop.md", "new-out"),  # through a link the same changes make, leading out
        ("loop.md", "loop.md"),  # a loop: where it leads cannot be told
    ],
)
def test_apply_refuses_a_symlink_leading_outside_and_writes_nothing(
    ws: Path, tmp_path: Path, link: str, target: str
) -> None:
    """A symlink leading outside the workspace, however it gets there, refuses the whole apply
    naming it; nothing is written, not even the other changes."""
    ws = ws.resolve()
    make_tree(tmp_path / "outside", {"secret.txt": "secret\n"})
    (ws / "out-link").symlink_to(tmp_path / "outside")
    before = capture(ws)
    br = branch_of(ws)
    br.write("a.txt", b"A\n")
    br.write("dir/inside.md", b"c.txt", 0o120777)
    br.write(link, target.encode(), 0o120777)
    if link == "hop.md":
        br.write("new-out", b"/etc", 0o120777)
    with pytest.raises(VfsError, match=link) as refused:
        apply_changes(br, state_dir=tmp_path / "state")
    assert isinstance(refused.value, vfs.SymlinkOutside)
    assert (link, target) in refused.value.links
    assert ("dir/inside.md", "c.txt") not in refused.value.links
    assert capture(ws) == before
    assert journals(tmp_path / "state") == []


@pytest.mark.parametrize(
    ("link", "target", "why"),
    [
        ("d", ".git", "into .git"),  # the repository's own directory
        ("dir/hooks", "../.git/hooks", "into .git"),  # climbing to it
        ("via", "git-link/hooks", "into .git"),  # through a link the same changes make
        ("sub/x", "../sub/.hg/store", "into .hg"),  # any VCS directory, at any depth
        ("loop.md", "loop.md", "a loop of links"),
        ("evil.md", "/etc/passwd", "outside the workspace"),
    ],
)
def test_apply_refuses_a_symlink_into_a_vcs_directory_saying_where_it_leads(
    ws: Path, tmp_path: Path, link: str, target: str, why: str
) -> None:
    """A symlink leading into .git (or another VCS directory) is refused like one leading out:
    the next write through it would change the repository's hooks; the error says where each
    refused link leads; nothing is written."""
    ws = ws.resolve()
    (ws / ".git" / "hooks").mkdir(parents=True)
    (ws / "sub" / ".hg" / "store").mkdir(parents=True)
    before = capture(ws)
    br = branch_of(ws)
    br.write("a.txt", b"A\n")
    br.write(link, target.encode(), 0o120777)
    if link == "via":
        br.write("git-link", b".git", 0o120777)
    with pytest.raises(vfs.SymlinkOutside) as refused:
        apply_changes(br, state_dir=tmp_path / "state")
    assert f"{link} -> {target} ({why})" in str(refused.value)
    assert capture(ws) == before


def test_a_symlink_to_a_file_named_like_a_vcs_directory_elsewhere_is_kept(
    ws: Path, tmp_path: Path
) -> None:
    """Only a path component that is a VCS directory's name refuses a link: one to
    ``docs/.github`` or to ``a.git.txt`` is written."""
    ws = ws.resolve()
    br = branch_of(ws)
    br.write("docs/.github/x.yml", b"x\n")
    br.write("gh", b"docs/.github", 0o120777)
    br.write("named", b"a.git.txt", 0o120777)
    assert apply_changes(br, state_dir=tmp_path / "state").applied
    assert os.readlink(ws / "gh") == "docs/.github"
    assert os.readlink(ws / "named") == "a.git.txt"


def test_apply_writes_symlinks_within_the_workspace_as_links(ws: Path, tmp_path: Path) -> None:
    """Links leading inside, relative (climbing and coming back in too) or absolute, and dangling
    ones, are written as links."""
    ws = ws.resolve()
    br = branch_of(ws)
    links = {
        "rel.md": "a.txt",
        "dir/up.md": "../b.txt",
        "dir/round.md": "../../ws/a.txt",
        "abs.md": str(ws / "dir" / "c.txt"),
        "dangling.md": "not-yet.txt",
    }
    for path, target in links.items():
        br.write(path, target.encode(), 0o120777)
    assert apply_changes(br, state_dir=tmp_path / "state").ok
    assert {path: os.readlink(ws / path) for path in links} == links
    assert (ws / "dir/round.md").read_text() == "a\n"


def test_a_refused_symlink_named_with_a_line_break_stays_on_one_line(
    ws: Path, tmp_path: Path
) -> None:
    """A refused link whose name or target holds a line break or a tab is named with them
    escaped: the agent cannot make the refusal print a line of its own."""
    ws = ws.resolve()
    br = branch_of(ws)
    br.write("evil\nok: applied\tx", b"/etc\npasswd", 0o120777)
    with pytest.raises(vfs.SymlinkOutside) as refused:
        apply_changes(br, state_dir=tmp_path / "state")
    message = str(refused.value)
    assert "\n" not in message and "\t" not in message
    assert "evil\\nok: applied\\tx -> /etc\\npasswd" in message


def test_a_failed_write_names_the_file_not_its_temp_file(
    ws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk while a file is written: the error names that file and the reason, and
    everything is rolled back."""
    br = branch_of(ws)
    br.write("a.txt", b"changed\n")
    br.write("dir/new name.txt", b"new\n")
    before = capture(ws)
    real = apply_module._put_journaled

    def full_disk(root: str, path: str, *args: Any) -> None:
        if path == "dir/new name.txt":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(root, path, *args)

    monkeypatch.setattr(apply_module, "_put_journaled", full_disk)
    with pytest.raises(ApplyError) as raised:
        apply_changes(br, state_dir=tmp_path / "state")
    assert str(raised.value) == (
        "apply failed and was rolled back: could not write dir/new name.txt: "
        "No space left on device"
    )
    assert capture(ws) == before


def test_a_failed_write_survives_a_trip_between_processes() -> None:
    """The error of a file that could not be written pickles with its message."""
    import pickle

    from orchestrator.vfs.apply import _EntryFailed

    error = _EntryFailed("a b.txt", "write", OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
    again = pickle.loads(pickle.dumps(error))
    assert str(again) == "could not write a b.txt: No space left on device"
    assert isinstance(again, OSError) and again.errno == errno.ENOSPC
