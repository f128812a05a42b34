"""Tests for orchestrator.vfs.ignore: gitignore patterns, precedence, VCS internals."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.vfs.ignore import IgnoreMatcher, IgnoreRules, is_vcs_name, tracked_files
from orchestrator.vfs.testing import git, git_repo, make_tree


def matcher(text: str = "", *, extra: tuple[str, ...] = ()) -> IgnoreMatcher:
    m = IgnoreMatcher.from_rules(IgnoreRules(extra=extra))
    m.add_patterns("", text)
    return m


@pytest.mark.parametrize(
    ("pattern", "path", "is_dir", "ignored"),
    [
        ("*.log", "a.log", False, True),
        ("*.log", "deep/dir/a.log", False, True),
        ("*.log", "a.logx", False, False),
        ("/top.txt", "top.txt", False, True),
        ("/top.txt", "sub/top.txt", False, False),
        ("build/", "build", True, True),
        ("build/", "build", False, False),
        ("build/", "src/build", True, True),
        ("doc/*.txt", "doc/a.txt", False, True),
        ("doc/*.txt", "doc/sub/a.txt", False, False),
        ("**/cache", "a/b/cache", True, True),
        ("**/cache", "cache", False, True),
        ("a/**/z", "a/z", False, True),
        ("a/**/z", "a/b/c/z", False, True),
        ("out/**", "out/x/y", False, True),
        ("f?le", "file", False, True),
        ("f?le", "fi/le", False, False),
        ("[ab].c", "a.c", False, True),
        ("[!ab].c", "a.c", False, False),
        ("[!ab].c", "x.c", False, True),
        ("\\#hash", "#hash", False, True),
        ("# comment", "# comment", False, False),
        ("trailing   ", "trailing", False, True),
        ("*.log", "n\nd/z.log", False, True),  # a line break in a directory's name
        ("*.log", "a\nb.log", False, True),  # and in the file's own
        ("**/cache", "x\ny/cache", True, True),
        ("a?b", "a\nb", False, True),
        ("build/", "n\nd/build", True, True),
    ],
)
def test_pattern_semantics(pattern: str, path: str, is_dir: bool, ignored: bool) -> None:
    """Each gitignore pattern form matches as gitignore(5) says."""
    assert matcher(pattern).is_ignored(path, is_dir=is_dir) is ignored


def test_last_matching_line_wins_and_negation() -> None:
    """A later ``!`` line re-includes a file an earlier line excluded."""
    m = matcher("*.log\n!keep.log\n")
    assert m.is_ignored("x.log")
    assert not m.is_ignored("keep.log")


def test_nothing_inside_an_ignored_directory_is_reincluded() -> None:
    """A file under an ignored directory stays ignored even if a negation names it."""
    m = matcher("build/\n!build/keep.txt\n")
    assert m.is_ignored("build/keep.txt")


def test_deeper_gitignore_overrides_shallower() -> None:
    """Rules in ``sub/.gitignore`` apply relative to ``sub`` and win over the root's."""
    m = matcher("*.tmp\n")
    m.add_patterns("sub", "!*.tmp\n/only-here\n")
    assert m.is_ignored("a.tmp")
    assert not m.is_ignored("sub/a.tmp")
    assert m.is_ignored("sub/only-here")
    assert not m.is_ignored("sub/deeper/only-here")


def test_extra_globs_take_precedence() -> None:
    """Configured extra globs apply everywhere and beat .gitignore negations."""
    m = matcher("!node_modules/\n", extra=("node_modules/",))
    assert m.is_ignored("node_modules", is_dir=True)
    assert m.is_ignored("pkg/node_modules/x.js")


def test_vcs_directories_always_ignored() -> None:
    """VCS internals are skipped at any depth, without any pattern."""
    m = matcher()
    assert m.is_ignored(".git", is_dir=True)
    assert m.is_ignored("vendor/lib/.git/config")
    assert m.is_ignored(".hg/store", is_dir=True)
    assert not m.is_ignored("src/git.py")


def test_exclude_file_has_lowest_precedence() -> None:
    """``.git/info/exclude`` applies, but a .gitignore negation overrides it."""
    m = matcher("!secret.txt\n")
    m.set_exclude("secret.txt\nlocal.cfg\n")
    assert not m.is_ignored("secret.txt")
    assert m.is_ignored("local.cfg")


def test_gitignore_disabled() -> None:
    """With use_gitignore off, .gitignore files are not read (VCS dirs still skipped)."""
    m = IgnoreMatcher.from_rules(IgnoreRules(use_gitignore=False))
    m.load_dir("/nonexistent", "")
    assert not m.has_rules("")
    assert m.is_ignored(".git", is_dir=True)


def test_patterns_of_a_directory_are_replaced_or_removed() -> None:
    """Adding a directory's patterns again replaces them; removing them un-ignores."""
    m = matcher("*.log\n")
    m.add_patterns("sub", "*.tmp\n")
    assert m.is_ignored("sub/a.tmp")
    m.add_patterns("sub", "*.bak\n")
    assert not m.is_ignored("sub/a.tmp") and m.is_ignored("sub/a.bak")
    m.add_patterns("sub", "# only a comment\n")
    assert not m.is_ignored("sub/a.bak")
    m.add_patterns("sub", "*.bak\n")
    m.remove_patterns("sub")
    assert not m.is_ignored("sub/a.bak") and m.is_ignored("sub/a.log")


def test_fork_takes_patterns_without_changing_the_original() -> None:
    """A fork shares what is loaded so far; patterns added to it stay its own."""
    m = matcher("*.log\n")
    m.set_exclude("*.local\n")
    fork = m.fork()
    fork.add_patterns(".pytest_cache", "*\n")
    fork.remove_patterns("")
    assert fork.is_ignored(".pytest_cache/README.md") and fork.is_ignored("x.local")
    assert not fork.is_ignored("a.log")
    assert m.is_ignored("a.log") and not m.is_ignored(".pytest_cache/README.md")


def test_a_gitignore_ignoring_everything_but_itself() -> None:
    """``*`` then ``!.gitignore`` in a directory keeps only that .gitignore."""
    m = matcher()
    m.add_patterns("tmp", "*\n!.gitignore\n")
    assert m.is_ignored("tmp/scratch.txt")
    assert m.is_ignored("tmp/deep", is_dir=True)
    assert not m.is_ignored("tmp/.gitignore")
    assert not m.is_ignored("tmp", is_dir=True)


def test_a_tracked_file_is_kept_whatever_the_patterns_say() -> None:
    """A tracked file the patterns ignore is kept, with the directories above it; what else
    those directories hold stays ignored, even where a pattern re-includes it."""
    m = matcher("dist/\n*.gen\n!dist/keep.txt\n")
    m.set_tracked(frozenset({"dist/app.js", "dist/sub/deep.js", "src/x.gen"}))
    assert not m.is_ignored("dist", is_dir=True)
    assert not m.is_ignored("dist/sub", is_dir=True)
    assert not m.is_ignored("dist/app.js") and not m.is_ignored("dist/sub/deep.js")
    assert m.is_ignored("dist/other.js") and m.is_ignored("dist/sub/other.js")
    assert m.is_ignored("dist/keep.txt")  # inside an ignored directory: never re-included
    assert m.is_ignored("dist/cache", is_dir=True)
    assert not m.is_ignored("src/x.gen") and m.is_ignored("src/y.gen")
    assert m.has_rules("dist/sub")
    assert m.tracked == frozenset({"dist/app.js", "dist/sub/deep.js", "src/x.gen"})


def test_a_tracked_file_in_a_directory_not_ignored_leaves_its_siblings_alone() -> None:
    """Where only the file matches, the untracked files beside it are judged by the patterns."""
    m = matcher("*.js\n")
    m.set_tracked(frozenset({"lib/vendor.js"}))
    assert not m.is_ignored("lib/vendor.js")
    assert m.is_ignored("lib/other.js") and not m.is_ignored("lib/readme.md")


def test_extra_globs_and_vcs_names_still_leave_tracked_files_out() -> None:
    """The run's own globs and the VCS names apply to tracked files too."""
    m = matcher("dist/\n", extra=("vendor/",))
    m.set_tracked(frozenset({"vendor/lib.js", "dist/app.js", "dist/.git/config"}))
    assert m.is_ignored("vendor/lib.js") and m.is_ignored("vendor", is_dir=True)
    assert not m.is_ignored("dist/app.js")
    assert m.is_ignored("dist/.git", is_dir=True)


def test_tracked_files_follow_a_fork_and_changed_patterns() -> None:
    """A fork keeps the tracked files; a pattern added later neither hides them nor leaves
    the directories' other files in."""
    m = matcher()
    m.set_tracked(frozenset({"out/kept.txt"}))
    fork = m.fork()
    assert not fork.is_ignored("out/other.txt")
    fork.add_patterns("", "out/\n")
    assert not fork.is_ignored("out/kept.txt") and fork.is_ignored("out/other.txt")
    fork.remove_patterns("")
    assert not fork.is_ignored("out/other.txt")
    assert not m.is_ignored("out/other.txt")


def test_git_lists_the_tracked_files(tmp_path: Path) -> None:
    """Asked of a work tree (at its top or below it), git names the files it tracks, those
    added with ``git add -f`` among them, relative to the directory asked; elsewhere, nothing
    is known."""
    repo = git_repo(tmp_path / "repo", {".gitignore": "dist/\n*.tmp\n", "pkg/a.py": "a\n"})
    make_tree(repo, {"dist/app.js": "x\n", "pkg/dist/b.js": "y\n", "pkg/n.tmp": "t\n"})
    git(repo, "add", "-f", "dist/app.js", "pkg/dist/b.js")
    git(repo, "commit", "-q", "-m", "forced")
    make_tree(repo, {"dist/untracked.js": "u\n"})
    assert tracked_files(str(repo)) == frozenset(
        {".gitignore", "pkg/a.py", "dist/app.js", "pkg/dist/b.js"}
    )
    assert tracked_files(str(repo / "pkg")) == frozenset({"a.py", "dist/b.js"})
    plain = tmp_path / "plain"
    plain.mkdir()
    assert tracked_files(str(plain)) is None


def test_no_git_on_the_path_means_no_tracked_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without git the patterns alone decide."""
    repo = git_repo(tmp_path / "repo", {".gitignore": "dist/\n", "a": "a\n"})
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert tracked_files(str(repo)) is None


def test_the_repository_configuration_runs_nothing(tmp_path: Path) -> None:
    """A ``core.fsmonitor`` command in the repository's configuration is never run."""
    repo = git_repo(tmp_path / "repo", {".gitignore": "dist/\n", "a": "a\n"})
    make_tree(repo, {"dist/app.js": "x\n"})
    git(repo, "add", "-f", "dist/app.js")
    marker = tmp_path / "ran"
    git(repo, "config", "core.fsmonitor", f"touch {marker}; false")
    assert tracked_files(str(repo)) == frozenset({".gitignore", "a", "dist/app.js"})
    assert not marker.exists()


def test_a_tracked_file_at_the_top_is_kept() -> None:
    """A tracked file the patterns match at the workspace's top is kept, with no directory
    above it."""
    m = matcher("*.log\n")
    m.set_tracked(frozenset({"app.log"}))
    assert not m.is_ignored("app.log") and m.is_ignored("other.log")


def test_a_tracked_file_thousands_deep_is_judged_without_recursion() -> None:
    """The directories above a tracked file are judged iteratively, however deep."""
    deep = "/".join(["gen", *["d"] * 3000])
    m = matcher("gen/\n")
    m.set_tracked(frozenset({f"{deep}/f.txt"}))
    assert m.is_ignored(f"{deep}/u.txt") and not m.is_ignored(f"{deep}/f.txt")


def test_the_patterns_above_a_workspace_below_the_top_apply(tmp_path: Path) -> None:
    """In a workspace below the top of its work tree, the .gitignore files above it and
    info/exclude apply, each from its own directory, below the workspace's own files."""
    repo = git_repo(
        tmp_path / "repo",
        {
            ".gitignore": "*.gen\n/sub/only.txt\n/top.txt\nbuild/\n",
            "sub/.gitignore": "!keep.gen\n",
            "sub/a.py": "a\n",
        },
    )
    (repo / ".git" / "info" / "exclude").write_text("sub/secret.env\n")
    m = IgnoreMatcher.from_rules(IgnoreRules())
    m.load_exclude(str(repo / "sub"))
    m.load_dir(str(repo / "sub"), "")
    assert m.is_ignored("b.gen") and not m.is_ignored("keep.gen")
    assert m.is_ignored("only.txt") and not m.is_ignored("top.txt")
    assert m.is_ignored("build", is_dir=True) and m.is_ignored("secret.env")
    assert not m.is_ignored("a.py")
    top = IgnoreMatcher.from_rules(IgnoreRules())
    top.load_exclude(str(repo))
    assert top.is_ignored("sub/secret.env") and not top.is_ignored("secret.env")


def test_a_linked_worktree_reads_its_repository_exclude_file(tmp_path: Path) -> None:
    """A linked worktree's ``.git`` is a file: the repository's info/exclude applies there."""
    repo = git_repo(tmp_path / "repo", {"a.txt": "a\n"})
    (repo / ".git" / "info" / "exclude").write_text("*.env\n")
    git(repo, "worktree", "add", "-q", "--detach", str(tmp_path / "wt"))
    m = IgnoreMatcher.from_rules(IgnoreRules())
    m.load_exclude(str(tmp_path / "wt"))
    assert m.is_ignored("secret.env") and not m.is_ignored("a.txt")


def test_a_gitignore_symlink_or_fifo_is_not_read(tmp_path: Path) -> None:
    """As git, a symlinked .gitignore is not followed; a FIFO of that name is passed over
    at once instead of waiting for a writer."""
    make_tree(tmp_path, {"patterns": "*\n", "f/x": ""})
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / ".gitignore").symlink_to(tmp_path / "patterns")
    os.mkfifo(tmp_path / "f" / ".gitignore")
    m = IgnoreMatcher.from_rules(IgnoreRules())
    m.load_dir(str(tmp_path), "g")
    m.load_dir(str(tmp_path), "f")
    assert not m.is_ignored("g/x") and not m.is_ignored("f/x")


def test_version_control_names_are_matched_in_any_case() -> None:
    """On a case-insensitive file system ``.GIT`` is ``.git``: every case is ignored."""
    m = matcher()
    for rel in (".GIT/config", "a/.Git/hooks/x", "_DARCS/y", ".\u017fvn/z", ".HG"):
        assert m.is_ignored(rel), rel
    assert not m.is_ignored(".github/workflows/ci.yml") and not m.is_ignored("git/x")
    assert is_vcs_name(".GiT") and not is_vcs_name(".gitx")


def test_lines_are_read_as_git_reads_them() -> None:
    """A byte-order mark is dropped, lines end at "\\n" alone (a CRLF's "\\r" dropped), and
    a form feed or a lone "\\r" is part of the pattern."""
    m = matcher("\ufeffsecret.txt\r\nfoo\fbar\nbaz\rqux\n")
    assert m.is_ignored("secret.txt")
    assert not m.is_ignored("foo") and not m.is_ignored("bar")
    assert not m.is_ignored("baz") and not m.is_ignored("qux")
    assert m.is_ignored("foo\fbar")


def test_a_workspace_in_a_directory_the_repository_ignores(tmp_path: Path) -> None:
    """Where a directory from the top down to the workspace is ignored, every untracked file
    of the workspace is; a tracked one is kept, and a negation below does not bring back."""
    repo = git_repo(tmp_path / "repo", {".gitignore": "vendor/\n/p\n", "a.txt": "a\n"})
    make_tree(repo, {"vendor/lib/kept.c": "k\n", "p/sub/x": "x\n", "q/sub/y": "y\n"})
    git(repo, "add", "-f", "vendor/lib/kept.c")
    for below, hidden in (("vendor/lib", True), ("p/sub", True), ("q/sub", False)):
        m = IgnoreMatcher.from_rules(IgnoreRules())
        m.load_exclude(str(repo / below))
        m.load_tracked(str(repo / below))
        m.add_patterns("", "!*\n")
        assert m.is_ignored("untracked.o") is hidden, below
        assert m.is_ignored("deep", is_dir=True) is hidden, below
    m = IgnoreMatcher.from_rules(IgnoreRules())
    m.load_exclude(str(repo / "vendor/lib"))
    m.load_tracked(str(repo / "vendor/lib"))
    assert not m.is_ignored("kept.c")


def test_the_repository_files_are_followed_and_never_waited_on(tmp_path: Path) -> None:
    """A symlinked info/exclude and a .git that is a symlink are followed, as git follows
    them; a FIFO where a worktree's commondir should be is passed over at once."""
    repo = git_repo(tmp_path / "repo", {"a.txt": "a\n"})
    (tmp_path / "excl").write_text("secret.txt\n")
    exclude = repo / ".git" / "info" / "exclude"
    exclude.unlink()
    exclude.symlink_to(tmp_path / "excl")
    m = IgnoreMatcher.from_rules(IgnoreRules())
    m.load_exclude(str(repo))
    assert m.is_ignored("secret.txt")
    (tmp_path / "linked").mkdir()
    (tmp_path / "linked" / ".git").symlink_to(repo / ".git")
    m = IgnoreMatcher.from_rules(IgnoreRules())
    m.load_exclude(str(tmp_path / "linked"))
    assert m.is_ignored("secret.txt")
    fake = repo / ".git" / "worktrees" / "w"
    fake.mkdir(parents=True)
    os.mkfifo(fake / "commondir")
    (tmp_path / "wt").mkdir()
    (tmp_path / "wt" / ".git").write_text(f"gitdir: {fake}\n")
    m = IgnoreMatcher.from_rules(IgnoreRules())
    m.load_exclude(str(tmp_path / "wt"))  # returns: nothing waits for a writer
    assert not m.is_ignored("secret.txt")
