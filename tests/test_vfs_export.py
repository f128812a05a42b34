"""Tests for orchestrator.vfs.export: unified diff, git patch (git apply) and git commit."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from orchestrator.report._diff import parse_diff
from orchestrator.vfs.branch import Branch
from orchestrator.vfs.changes import Change, Delete, FileState, Write
from orchestrator.vfs.errors import VfsError, WorkspaceChanged
from orchestrator.vfs.export import (
    GitBranchRefused,
    check_git_branch,
    git_commit,
    git_commit_async,
    git_head_tree,
    git_patch,
    unified_diff,
)
from orchestrator.vfs.merge import merge_branches
from orchestrator.vfs.snapshot import Workspace
from orchestrator.vfs.testing import Captured, capture, git, git_repo, make_tree
from orchestrator.vfs.tree import MemoryTree

FILES: dict[str, bytes | str] = {
    "src/app.py": "def f():\n    return 1\n\n\ndef g():\n    return 2\n",
    "README.md": "# Title\n",
    "old.txt": "to be deleted\n",
    "no-eol.txt": "last line without newline",
    "image.bin": b"\x89PNG\r\n\x1a\n\0\0\0" + bytes(range(256)),
    "run.sh": "#!/bin/sh\necho hi\n",
    "with space.txt": "spaced\n",
    "ünïcode.txt": "unicode\n",
}


def changed_branch(root: Path) -> Branch:
    br = Branch.from_tree(Workspace.open(root).snapshot(), "agent")
    br.write("src/app.py", b"def f():\n    return 10\n\n\ndef g():\n    return 2\n")
    br.write("new/module.py", b"NEW = True\n")
    br.delete("old.txt")
    br.write("no-eol.txt", b"last line changed, still no newline")
    br.write("image.bin", b"\x89PNG\r\n\x1a\n\0\0\1" + bytes(range(255, -1, -1)))
    br.write("new.bin", b"\0\1\2\3" * 100)
    br.chmod("run.sh", 0o755)
    br.write("with space.txt", b"spaced out\n")
    br.write("ünïcode.txt", b"still unicode\n")
    br.write("link", b"README.md", 0o120777)
    br.write("empty.txt", b"")
    return br


def without_git(captured: Captured) -> Captured:
    return {k: v for k, v in captured.items() if not k.startswith(".git")}


def test_unified_diff(tmp_path: Path) -> None:
    """The unified diff shows text hunks, new/deleted files, binaries and mode changes."""
    root = make_tree(tmp_path / "ws", FILES)
    diff = unified_diff(changed_branch(root))
    assert (
        "--- a/src/app.py\n+++ b/src/app.py\n@@ -1,5 +1,5 @@\n"
        " def f():\n-    return 1\n+    return 10\n" in diff
    )
    assert "--- /dev/null\n+++ b/new/module.py\n@@ -0,0 +1 @@\n+NEW = True\n" in diff
    assert "--- a/old.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-to be deleted\n" in diff
    assert "\\ No newline at end of file" in diff
    assert "Binary files a/image.bin and b/image.bin differ" in diff
    assert "mode change 100644 -> 100755 run.sh" in diff


def test_git_patch_applies_with_git(tmp_path: Path) -> None:
    """`git apply --check` accepts the patch, and applying it reproduces the branch exactly."""
    root = git_repo(tmp_path / "ws", FILES)
    br = changed_branch(root)
    patch = git_patch(br)
    assert b"GIT binary patch" in patch
    assert b"new file mode 100644" in patch and b"deleted file mode 100644" in patch
    assert b"old mode 100644\nnew mode 100755" in patch
    assert b'"a/\\303\\274n\\303\\257code.txt"' in patch
    target = tmp_path / "target"
    shutil.copytree(root, target, symlinks=True)
    (tmp_path / "p.diff").write_bytes(patch)
    git(target, "apply", "--check", str(tmp_path / "p.diff"))
    git(target, "apply", str(tmp_path / "p.diff"))
    expected = tmp_path / "expected"
    shutil.copytree(root, expected, symlinks=True)
    from orchestrator.vfs.apply import apply_changes

    assert apply_changes(
        Workspace.open(expected).snapshot(), br.net_changes(), state_dir=tmp_path / "state"
    ).ok
    assert without_git(capture(target)) == without_git(capture(expected))


def test_git_patch_of_memory_tree_and_explicit_changes() -> None:
    """Exports also work from a tree plus explicit changes; a tree alone is an error."""
    tree = MemoryTree.from_files({"a": b"1\n"})
    patch = git_patch(tree, {"a": Write(b"2\n")})
    assert b"-1\n+2\n" in patch
    with pytest.raises(TypeError):
        git_patch(tree)
    br = Branch.from_tree(tree, "x")
    assert unified_diff(br, {"a": Write(b"3\n")}).endswith("-1\n+3\n")


def test_git_commit_leaves_checkout_and_index_alone(tmp_path: Path) -> None:
    """The commit lands on a new branch; the working tree, index and HEAD are untouched."""
    root = git_repo(tmp_path / "ws", FILES)
    (root / "untracked.txt").write_text("mine\n")
    before_tree = capture(root)
    head = git(root, "rev-parse", "HEAD").strip()
    status = git(root, "status", "--porcelain")
    br = changed_branch(root)
    index = (root / ".git" / "index").read_bytes()
    commit = git_commit(br, branch="agent/result", message="Agent changes\n\nDetails.")
    assert (root / ".git" / "index").read_bytes() == index
    assert git(root, "rev-parse", "agent/result").strip() == commit
    assert git(root, "rev-parse", "HEAD").strip() == head
    assert git(root, "status", "--porcelain") == status
    after = capture(root)
    assert {k: v for k, v in after.items() if not k.startswith(".git")} == {
        k: v for k, v in before_tree.items() if not k.startswith(".git")
    }
    assert git(root, "show", "agent/result:src/app.py").endswith(
        "return 10\n\n\ndef g():\n    return 2\n"
    )
    assert git(root, "show", "agent/result:new/module.py") == "NEW = True\n"
    names = git(root, "diff", "--name-status", "HEAD", "agent/result").split("\n")
    assert "D\told.txt" in names and "A\tnew.bin" in names
    modes = git(root, "ls-tree", "agent/result", "run.sh", "link")
    assert "100755 blob" in modes and "120000 blob" in modes
    assert git(root, "log", "-1", "--format=%s%n%P", "agent/result").split() == [
        "Agent",
        "changes",
        head,
    ]
    with pytest.raises(VfsError):
        git_commit(br, branch="agent/result", message="again")
    with pytest.raises(VfsError):
        git_commit(br, branch="bad..name", message="x")


def test_git_commit_in_subdirectory_and_unborn_repo(tmp_path: Path) -> None:
    """A workspace below the repository root commits at the right paths; no HEAD is fine."""
    repo = tmp_path / "repo"
    make_tree(repo, {"pkg/lib.py": "x = 1\n"})
    git(repo, "init", "-q", "-b", "main")
    br = Branch.from_tree(Workspace.open(repo / "pkg").snapshot(), "sub")
    br.write("lib.py", b"x = 2\n")
    commit = git_commit(br, branch="first", message="first", author=("Bot", "bot@example.com"))
    assert git(repo, "show", "first:pkg/lib.py") == "x = 2\n"
    assert git(repo, "log", "-1", "--format=%an <%ae>", commit).strip() == "Bot <bot@example.com>"
    assert (
        subprocess.run(
            ["git", "rev-parse", "--verify", "-q", "HEAD"],
            cwd=repo,
            capture_output=True,
            check=False,
        ).returncode
        != 0
    )


async def test_git_commit_async_from_merge(tmp_path: Path) -> None:
    """A merge result commits through the async wrapper."""
    root = git_repo(tmp_path / "ws", {"a.txt": "1\n2\n3\n4\n5\n"})
    snap = Workspace.open(root).snapshot()
    a, b = Branch.from_tree(snap, "a"), Branch.from_tree(snap, "b")
    a.write("a.txt", b"one\n2\n3\n4\n5\n")
    b.write("a.txt", b"1\n2\n3\n4\nfive\n")
    await git_commit_async(merge_branches([a, b]), branch="merged", message="merge")
    assert git(root, "show", "merged:a.txt") == "one\n2\n3\n4\nfive\n"


def test_git_head_tree_reads_committed_files_below_a_subdirectory(tmp_path: Path) -> None:
    """git_head_tree gives HEAD's content and mode of the paths asked, relative to a subdirectory;
    a path HEAD does not hold is absent, and an uncommitted edit does not show."""
    repo = tmp_path / "repo"
    make_tree(repo, {"pkg/lib.py": "x = 1\n", "pkg/run.sh": "#!/bin/sh\n", "top.txt": "t\n"})
    (repo / "pkg" / "run.sh").chmod(0o755)
    (repo / "pkg" / "link").symlink_to("lib.py")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "start")
    (repo / "pkg" / "lib.py").write_text("x = 2\n")
    tree = git_head_tree(repo / "pkg", ["lib.py", "run.sh", "link", "missing.txt", "sub"])
    assert tree.read("lib.py") == b"x = 1\n"
    assert (tree.mode("lib.py"), tree.mode("run.sh")) == (0o100644, 0o100755)
    assert tree.read("link") == b"lib.py" and tree.mode("link") == 0o120777
    assert sorted(tree.paths()) == ["lib.py", "link", "run.sh"]


def test_check_git_branch_refuses_outside_git_a_bad_name_and_an_existing_branch(
    tmp_path: Path,
) -> None:
    """check_git_branch says why a branch cannot be made, and gives the ref when it can."""
    root = git_repo(tmp_path / "ws", {"a.txt": "a\n"})
    assert check_git_branch(root, "agent/x") == "refs/heads/agent/x"
    with pytest.raises(GitBranchRefused, match="already exists"):
        check_git_branch(root, "main")
    with pytest.raises(GitBranchRefused, match="not a valid git branch name"):
        check_git_branch(root, "bad..name")
    outside = tmp_path / "plain"
    outside.mkdir()
    with pytest.raises(GitBranchRefused, match="not in a git repository"):
        check_git_branch(outside, "x")


def test_unified_diff_shows_a_change_whose_base_is_gone_whole(tmp_path: Path) -> None:
    """base_gone='whole' shows the new version under a marked hunk; the default raises; a git
    patch leaves it out with base_gone='omit'."""
    root = tmp_path / "ws"
    make_tree(root, {"a.txt": "one\n", "b.txt": "b\n"})
    snap = Workspace.open(root).snapshot()
    (root / "a.txt").write_text("someone else's\n")
    changes = {"a.txt": Write(b"new\nlast"), "b.txt": Write(b"b2\n")}
    with pytest.raises(WorkspaceChanged):
        unified_diff(snap, changes)
    diff = unified_diff(snap, changes, base_gone="whole")
    assert diff.startswith(
        "--- a/a.txt\n+++ b/a.txt\n"
        "@@ base changed in the workspace during the run: the new version, whole @@\n"
        "+new\n+last\n\\ No newline at end of file\n"
    )
    assert "+b2\n" in diff
    patch = git_patch(snap, changes, base_gone="omit")
    assert b"a.txt" not in patch and b"+b2" in patch


def test_unified_diff_marks_symlinks_as_git_does(tmp_path: Path) -> None:
    """A symlink added, deleted, retargeted or made from a file is marked with git's mode lines
    under a diff --git line, and a report reads each as a file of its own."""
    tree = MemoryTree.from_files(
        {
            "a.txt": b"a\n",
            "old-link": FileState(b"a.txt", 0o120777),
            "moved-link": FileState(b"a.txt", 0o120777),
            "was-file": b"/etc/hosts",
        }
    )
    changes: dict[str, Change] = {
        "evil.md": Write(b"/etc/passwd", 0o120777),
        "old-link": Delete(),
        "moved-link": Write(b"b.txt", 0o120777),
        "was-file": Write(b"/etc/hosts", 0o120777),
        "a.txt": Write(b"A\n"),
    }
    diff = unified_diff(tree, changes)
    assert (
        "diff --git a/evil.md b/evil.md\nnew file mode 120000\n--- /dev/null\n+++ b/evil.md\n"
        "@@ -0,0 +1 @@\n+/etc/passwd\n\\ No newline at end of file\n" in diff
    )
    assert "diff --git a/old-link b/old-link\ndeleted file mode 120000\n--- a/old-link\n" in diff
    assert (
        "diff --git a/moved-link b/moved-link\nold mode 120000\nnew mode 120000\n"
        "--- a/moved-link\n+++ b/moved-link\n" in diff
    )
    assert "diff --git a/was-file b/was-file\nold mode 100644\nnew mode 120000\n" in diff
    assert "--- a/a.txt\n+++ b/a.txt\n" in diff and "diff --git a/a.txt" not in diff
    files = {f.path: f for f in parse_diff(diff)}
    assert sorted(files) == ["a.txt", "evil.md", "moved-link", "old-link", "was-file"]
    assert (files["evil.md"].change, files["old-link"].change) == ("added", "deleted")
    assert [line.text for line in files["evil.md"].lines if line.kind == "meta"] == [
        "new file mode 120000"
    ]


def test_git_patch_of_type_changes_is_what_git_diff_writes(tmp_path: Path) -> None:
    """A file become a symlink, a symlink become a file, a directory become a file and a file
    become a directory: the patch is git diff's own (a deletion, then a creation, in git's
    order), git apply takes it, and it makes the tree that apply_changes makes."""
    root = git_repo(tmp_path / "ws", {"f": "hello\n", "g": "y\n", "d/x": "x\n", "k": "k\n"})
    (root / "l").symlink_to("target")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "a link")
    br = Branch.from_tree(Workspace.open(root).snapshot(), "agent")
    br.write("f", b"f-target", 0o120777)
    br.write("l", b"now a file\n", 0o100644)
    br.delete("d/x")
    br.write("d", b"dfile\n")
    br.delete("g")
    br.write("g/in", b"in\n")
    patch = git_patch(br)
    by_git, by_apply = tmp_path / "by-git", tmp_path / "by-apply"
    shutil.copytree(root, by_git, symlinks=True)
    shutil.copytree(root, by_apply, symlinks=True)
    (tmp_path / "p.diff").write_bytes(patch)
    git(by_git, "apply", "--check", str(tmp_path / "p.diff"))
    git(by_git, "apply", str(tmp_path / "p.diff"))
    from orchestrator.vfs.apply import apply_changes

    snap = Workspace.open(by_apply).snapshot()
    assert apply_changes(snap, br.net_changes(), state_dir=tmp_path / "state").ok
    assert without_git(capture(by_git)) == without_git(capture(by_apply))
    git(by_apply, "add", "-A")
    assert patch.decode() == git(by_apply, "diff", "--cached", "--full-index", "--binary")
