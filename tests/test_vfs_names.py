"""File names that are not UTF-8 (``caf\\xe9.txt`` in latin-1) through the VFS, its exports, and
the fs service and terminals that show them to the agent and take them back.

The workspace holds ``caf\\xe9.txt`` (the byte 0xe9), a directory ``d\\xe9j\\xe0`` and, beside
them, a file literally named ``caf\\xe9.txt`` with a backslash: every step must keep the three
apart and reach the exact bytes.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from orchestrator._names import name_bytes, name_of
from orchestrator.agent.branchfs import BranchFileSystem
from orchestrator.agent.services import SessionContext
from orchestrator.agent.terminals import OutputBuffer, _resolve_cwd
from orchestrator.errors import InvalidParams
from orchestrator.pipeline.branches import (
    change_kinds,
    diff_of,
    patch_of,
    rebuild_branch,
    stored_changes,
    symlink_targets,
)
from orchestrator.pipeline.results import changes_from_json, changes_json
from orchestrator.protocol import types as t
from orchestrator.report._diff import parse_diff
from orchestrator.store import RunRecord, open_run_store
from orchestrator.vfs import Branch, Workspace, apply_changes, materialize
from orchestrator.vfs.errors import PathNotFound, WorkspaceChanged
from orchestrator.vfs.testing import git

LATIN1 = name_of(b"caf\xe9.txt")
IN_DIR = name_of(b"d\xe9j\xe0/notes.txt")
LITERAL = "caf\\xe9.txt"
NEW = name_of(b"n\xffw.txt")
LINK = name_of(b"l\xefnk")


def workspace(root: Path) -> Path:
    """A git repository holding the latin-1 names and the literal lookalike."""
    root.mkdir(parents=True)
    os.makedirs(os.path.join(root, name_of(b"d\xe9j\xe0")))
    for name, text in ((LATIN1, b"hello\n"), (IN_DIR, b"notes\n"), (LITERAL, b"literal\n")):
        with open(os.path.join(root, name), "wb") as f:
            f.write(text)
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "initial")
    return root


def agent_edits(tmp_path: Path, root: Path) -> Branch:
    """A branch whose agent, in its working directory, edited the latin-1 file on disk, made a
    new file whose name is not UTF-8 and a link to the latin-1 file; harvested."""
    branch = Branch.from_tree(Workspace.open(root).snapshot(), "agent")
    with materialize(branch, tmp_path / "state" / "agent") as wd:
        here = os.fsencode(wd.root)
        assert sorted(os.listdir(here)) == [b"caf\\xe9.txt", b"caf\xe9.txt", b"d\xe9j\xe0"]
        with open(os.path.join(here, b"caf\xe9.txt"), "wb") as f:
            f.write(b"bonjour\n")
        with open(os.path.join(here, b"n\xffw.txt"), "wb") as f:
            f.write(b"new\n")
        os.symlink(b"caf\xe9.txt", os.path.join(here, b"l\xefnk"))
        report = wd.harvest(full=True)
    assert report.modified == (LATIN1,)
    assert sorted(report.added) == sorted([LINK, NEW])
    return branch


def test_harvested_names_are_the_exact_files_and_json_names_them_so(tmp_path: Path) -> None:
    """The edit lands on the latin-1 file itself (modified, not a new file), and the changes as
    ``--json`` shows them give the escaped display and the exact bytes, and read back."""
    root = workspace(tmp_path / "ws")
    branch = agent_edits(tmp_path, root)
    net = branch.net_changes()
    assert sorted(net) == sorted([LATIN1, LINK, NEW])
    kinds = change_kinds(branch.root, net)
    links = symlink_targets(net)
    shown = changes_json(kinds, links)
    assert shown == [
        {"path": "caf\\xe9.txt", "pathBytes": "Y2Fm6S50eHQ=", "change": "modified"},
        {
            "path": "l\\xefnk",
            "pathBytes": "bO9uaw==",
            "change": "added",
            "symlink": "caf\\xe9.txt",
            "symlinkBytes": "Y2Fm6S50eHQ=",
        },
        {"path": "n\\xffw.txt", "pathBytes": "bv93LnR4dA==", "change": "added"},
    ]
    assert changes_from_json(shown) == (kinds, links)


def test_the_diff_names_files_as_git_does_and_reports_read_them_back(tmp_path: Path) -> None:
    """The unified diff quotes a name that is not UTF-8 as git does (octal escapes), never
    with U+FFFD, and a report reads each file back under its display name."""
    root = workspace(tmp_path / "ws")
    branch = agent_edits(tmp_path, root)
    diff = diff_of(branch, branch.net_changes())
    assert '--- "a/caf\\351.txt"\n+++ "b/caf\\351.txt"\n' in diff
    assert '+++ "b/n\\377w.txt"\n' in diff
    headers = [line for line in diff.splitlines() if line.startswith(("---", "+++", "diff"))]
    assert not [line for line in headers if "\ufffd" in line]
    assert [f.path for f in parse_diff(diff)] == ["caf\\xe9.txt", "l\\xefnk", "n\\xffw.txt"]


async def test_stored_changes_apply_to_the_exact_files(tmp_path: Path) -> None:
    """Recorded in the run store and read back, the changes make a patch ``git apply`` takes
    and apply to the latin-1 file itself; the literal lookalike is left alone."""
    root = workspace(tmp_path / "ws")
    pristine = tmp_path / "copy"
    shutil.copytree(root, pristine, symlinks=True)
    branch = agent_edits(tmp_path, root)
    snapshot = Workspace.open(root).snapshot()
    async with open_run_store(tmp_path / "store") as store:
        await store.create_run(RunRecord("r1", "prompt", "running", 1.0, str(root)))
        net = branch.net_changes()
        await store.put_changes("r1", "(final)", stored_changes(snapshot, net), diff="")
        stored = await store.changes("r1", "(final)")
    assert [c.to_json()["path"] for c in stored] == ["caf\\xe9.txt", "l\\xefnk", "n\\xffw.txt"]
    assert [name_bytes(c.path) for c in stored] == [b"caf\xe9.txt", b"l\xefnk", b"n\xffw.txt"]
    rebuilt = rebuild_branch(snapshot, "again", stored).net_changes()
    (tmp_path / "changes.patch").write_bytes(patch_of(snapshot, rebuilt))
    git(pristine, "apply", "--check", str(tmp_path / "changes.patch"))
    git(pristine, "apply", str(tmp_path / "changes.patch"))
    result = apply_changes(snapshot, rebuilt, state_dir=tmp_path / "state")
    assert result.ok
    assert sorted(result.written) == sorted([LATIN1, LINK, NEW])
    for tree in (root, pristine):
        assert (tree / LATIN1).read_bytes() == b"bonjour\n"
        assert (tree / LITERAL).read_bytes() == b"literal\n"
        assert (tree / NEW).read_bytes() == b"new\n"
        assert os.readlink(os.path.join(os.fsencode(tree), b"l\xefnk")) == b"caf\xe9.txt"


def test_errors_name_files_in_the_display_form() -> None:
    """An error about a file that is not UTF-8 names it as text that can be printed or stored."""
    assert str(PathNotFound(LATIN1)) == "no such file: caf\\xe9.txt"
    assert str(WorkspaceChanged([LATIN1, LITERAL])).endswith(": caf\\\\xe9.txt, caf\\xe9.txt")


async def test_the_agent_reaches_each_file_by_the_text_it_was_shown(tmp_path: Path) -> None:
    """``fs/*`` paths are read in the display form: ``caf\\xe9.txt`` is the latin-1 file,
    ``caf\\\\xe9.txt`` the literal lookalike; no new file appears."""
    root = workspace(tmp_path / "ws")
    branch = Branch.from_tree(Workspace.open(root).snapshot(), "agent")
    with materialize(branch, tmp_path / "state" / "agent") as wd:
        fs = BranchFileSystem(wd)
        ctx = SessionContext(agent="a", session_id="s1", cwd=wd.root)

        async def read(name: str) -> str:
            request = t.ReadTextFileRequest(session_id="s1", path=os.path.join(wd.root, name))
            return (await fs.read_text_file(request, ctx)).content

        async def write(name: str, content: str) -> None:
            path = os.path.join(wd.root, name)
            request = t.WriteTextFileRequest(session_id="s1", path=path, content=content)
            await fs.write_text_file(request, ctx)

        assert await read("caf\\xe9.txt") == "hello\n"
        assert await read("caf\\\\xe9.txt") == "literal\n"
        assert await read("d\\xe9j\\xe0/notes.txt") == "notes\n"
        await write("caf\\xe9.txt", "bonjour\n")
        await write("d\\xe9j\\xe0/notes.txt", "notes 2\n")
        assert sorted(branch.changes) == sorted([LATIN1, IN_DIR])
        assert (Path(wd.root) / LATIN1).read_bytes() == b"bonjour\n"
        assert (Path(wd.root) / LITERAL).read_bytes() == b"literal\n"
        with pytest.raises(InvalidParams) as refused:
            await write("d\\xe9j\\xe0/notes.txt/x", "no\n")
        assert refused.value.data == {"path": "d\\xe9j\\xe0/notes.txt"}


def test_terminal_output_shows_names_as_the_agent_sends_them() -> None:
    """``ls`` output shows a byte that is not UTF-8 as ``\\xHH``, the text the fs service
    takes back for that file."""
    buffer = OutputBuffer(1000)
    buffer.feed(b"a.txt\ncaf\xe9.txt\n")
    assert buffer.text(final=True) == ("a.txt\ncaf\\xe9.txt\n", False)


def test_a_terminal_cwd_is_read_in_the_display_form(tmp_path: Path) -> None:
    """``terminal/create``'s ``cwd`` names a latin-1 directory by its display form."""
    root = workspace(tmp_path / "ws")
    assert _resolve_cwd("d\\xe9j\\xe0", str(root)) == os.path.join(root, name_of(b"d\xe9j\xe0"))
