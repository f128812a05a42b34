"""The repository list of a batch: parse_repos, repo_spec, label_repos and RepoSpec's JSON."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import StoreError, UsageError
from orchestrator.runs._repos import (
    RepoSpec,
    cache_key,
    label_repos,
    parse_repos,
    redact,
    repo_spec,
)

BASE = Path("/work/batch")


def parse(text: str) -> tuple[RepoSpec, ...]:
    return parse_repos(text, base=BASE, origin="repos.txt")


def refused(text: str) -> str:
    """The one-line message parse_repos refuses ``text`` with."""
    with pytest.raises(UsageError) as caught:
        parse(text)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_lines_comments_and_blank_lines() -> None:
    """Blank lines and whole-line or trailing comments are ignored; fields split on whitespace."""
    specs = parse(
        "# the services\n"
        "\n"
        "   ../svc-a   # the first\n"
        "https://example.com/org/svc-b.git main\n"
        "\tgit@example.com:org/svc-c.git\tv1.2   # a tag\n"
        "file:///srv/git/svc-d.git 0123abcd\n"
        "~/src/svc-e\n"
    )
    assert [(s.source, s.url, s.path, s.ref, s.name) for s in specs] == [
        ("../svc-a", None, Path("/work/svc-a"), None, "svc-a"),
        (
            "https://example.com/org/svc-b.git",
            "https://example.com/org/svc-b.git",
            None,
            "main",
            "svc-b",
        ),
        ("git@example.com:org/svc-c.git", "git@example.com:org/svc-c.git", None, "v1.2", "svc-c"),
        ("file:///srv/git/svc-d.git", "file:///srv/git/svc-d.git", None, "0123abcd", "svc-d"),
        ("~/src/svc-e", None, Path(os.path.expanduser("~/src/svc-e")), None, "svc-e"),
    ]


def test_a_hash_inside_a_field_is_not_a_comment_and_quotes_keep_spaces() -> None:
    """'#' starts a comment only at the start of a field; a quoted field keeps its spaces."""
    specs = parse("dir#1\n\"my dir\"  # spaces\n'it is # here'\n")
    assert [s.path for s in specs] == [
        BASE / "dir#1",
        BASE / "my dir",
        BASE / "it is # here",
    ]
    assert [s.name for s in specs] == ["dir-1", "my-dir", "it-is-here"]


def test_local_paths_are_absolute_lexically_and_keep_symlinks(tmp_path: Path) -> None:
    """A relative path is taken from the base, '..' removed as written, symlinks not resolved."""
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    spec = repo_spec("./link/../link", base=tmp_path)
    assert spec.path == tmp_path / "link"
    assert spec.name == "link"
    assert repo_spec(str(tmp_path / "real") + "/", base=BASE).path == tmp_path / "real"


def test_every_url_form_is_a_url() -> None:
    """Each scheme git clones from, and scp-like user@host:path, is a URL; others are paths."""
    for url in (
        "https://h.example/a/b.git",
        "http://h.example/b",
        "ssh://git@h.example:2222/b.git",
        "git://h.example/b",
        "git+ssh://h.example/b",
        "file:///srv/b.git",
        "HTTPS://H.example/b",
        "git@h.example:b.git",
    ):
        spec = repo_spec(url, base=BASE)
        assert (spec.url, spec.path, spec.name) == (url, None, "b"), url
    local = repo_spec("h.example:b", base=BASE)
    assert (local.url, local.path) == (None, BASE / "h.example:b")


def test_repo_spec_takes_a_url_and_a_ref() -> None:
    """One value given by itself is LOCATION [REF], as a line of a file."""
    spec = repo_spec("https://h.example/x/svc.git  release/1.x", base=BASE)
    assert (spec.url, spec.ref, spec.name) == ("https://h.example/x/svc.git", "release/1.x", "svc")
    assert repo_spec("svc", base=Path("/here")).path == Path("/here/svc")


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("a b c", "repos.txt:2: a: expected LOCATION [REF], found 3 fields (extra: 'c')"),
        ("../svc main", "repos.txt:2: ../svc: a ref ('main') is given for a local directory"),
        ("ftp://h/x", "repos.txt:2: ftp://h/x: unsupported URL scheme 'ftp'"),
        ("https://h.example", "repos.txt:2: https://h.example: no repository path in the URL"),
        ("https:///x", "repos.txt:2: https:///x: no host in the URL"),
        ("file://", "repos.txt:2: file://: no path in the file:// URL"),
        ("git@h:", "repos.txt:2: git@h:: no repository path after the ':'"),
        (
            "https://h/x#main",
            "repos.txt:2: https://h/x#main: a URL fragment ('#main') is not a ref",
        ),
        ("https://h/x -f", "repos.txt:2: https://h/x: the ref '-f': a ref does not start with '-'"),
        ("https://h/x a:b", "repos.txt:2: https://h/x: the ref 'a:b': a ref has no spaces"),
        ("https://h/x a..b", "repos.txt:2: https://h/x: the ref 'a..b': a ref has no '..'"),
        ("https://h/x +main", "repos.txt:2: https://h/x: the ref '+main': a ref does not start"),
        ('"unclosed', 'repos.txt:2: no closing " for the field "unclosed'),
        ('"a"b', 'repos.txt:2: text right after the closing ": quote a field whole'),
        ('""', "repos.txt:2: an empty quoted field"),
        ("a\x1bb", "repos.txt:2: a control character (0x1b) in the line"),
        ("~no-such-user-here/x", "repos.txt:2: ~no-such-user-here/x: no such user for '~'"),
    ],
)
def test_bad_lines_are_refused_with_file_and_line(line: str, expected: str) -> None:
    """Each mistake is one line naming the file and the line."""
    assert refused(f"# first\n{line}\n").startswith(expected)


def test_an_empty_list_is_refused() -> None:
    """A file with no repository in it (empty, or only comments) is refused."""
    for text in ("", "\n\n", "# nothing\n  # here\n", "\ufeff"):
        assert refused(text) == "repos.txt: lists no repository (only blank lines and comments)"


def test_the_same_repository_twice_in_a_file_is_refused() -> None:
    """A path or URL+ref listed twice names both lines; a URL at two refs is two repositories."""
    assert refused("svc\n./svc/\n") == "repos.txt:2: ./svc/ is listed twice (line 1 lists it first)"
    assert refused("https://h/x main\n\nhttps://h/x/ main\n").startswith("repos.txt:3: ")
    assert len(parse("https://h/x main\nhttps://h/x v2\nhttps://h/x\n")) == 3


def test_credentials_are_redacted_in_errors_and_shown() -> None:
    """A password (or an http(s) user name alone, a token) never shows in a message."""
    assert redact("https://user:s3cret@h.example/x.git") == "https://user:***@h.example/x.git"
    assert redact("https://t0ken@h.example/x") == "https://***@h.example/x"
    assert redact("ssh://git@h.example/x") == "ssh://git@h.example/x"
    assert redact("ssh://git:pw@h.example/x") == "ssh://git:***@h.example/x"
    assert redact("../local@dir") == "../local@dir"
    for line in (
        "https://user:s3cret@h.example/x#frag",
        "https://user:s3cret@h.example/x a b",
        "https://s3cret@h.example/x -main",
        "svc https://user:s3cret@h.example/x",
    ):
        message = refused(line)
        assert "s3cret" not in message, message
        assert "***" in message, message
    with pytest.raises(UsageError) as caught:
        repo_spec("https://s3cret@h.example/x y z", base=BASE)
    assert "s3cret" not in str(caught.value)
    spec = repo_spec("https://user:s3cret@h.example/x main", base=BASE)
    assert spec.url == "https://user:s3cret@h.example/x"  # the clone needs it
    assert spec.shown == "https://user:***@h.example/x main"
    with pytest.raises(UsageError) as caught:
        label_repos([spec, repo_spec("https://user:other@h.example/x main", base=BASE)])
    assert "s3cret" not in str(caught.value)
    assert "other" not in str(caught.value)


def test_repo_spec_errors_name_the_value() -> None:
    """A bad value given by itself is named in its one-line error."""
    with pytest.raises(UsageError, match=r"^repository 'x main': a ref \('main'\) is given"):
        repo_spec("x main", base=BASE)
    with pytest.raises(UsageError, match=r"^an empty repository location$"):
        repo_spec("  # nothing", base=BASE)


def test_labels_are_unique_in_order() -> None:
    """Alike names get -2, -3 ... after the first; a name taken by another keeps it."""
    specs = [
        repo_spec(s, base=BASE)
        for s in (
            "a/svc",
            "https://h/x/svc.git",
            "b/svc",
            "c/svc-2",
            "git@h:y/svc",
            "/",
        )
    ]
    labelled = label_repos(specs)
    assert [s.name for s in labelled] == ["svc", "svc-3", "svc-4", "svc-2", "svc-5", "repo"]
    assert [s.source for s in labelled] == [s.source for s in specs]


def test_label_repos_refuses_duplicates_and_nothing(tmp_path: Path) -> None:
    """The same directory (also through a symlink), the same URL and ref, or no repository."""
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(UsageError, match=r"^the repository link is given twice \(as real\)$"):
        label_repos([repo_spec("real", base=tmp_path), repo_spec("link", base=tmp_path)])
    with pytest.raises(UsageError, match="given twice"):
        label_repos(
            [
                repo_spec("https://a:1@H.example/x v1", base=BASE),
                repo_spec("https://h.example/x/ v1", base=BASE),
            ]
        )
    with pytest.raises(UsageError, match=r"^no repositories given"):
        label_repos([])
    both = label_repos(
        [
            repo_spec("https://h.example/x", base=BASE),
            repo_spec("https://h.example/x v1", base=BASE),
        ]
    )
    assert [s.name for s in both] == ["x", "x-2"]


def test_json_round_trip_and_bad_json() -> None:
    """to_json/from_json keep every field; a record that is not a repository is a StoreError."""
    for spec in label_repos(parse("../a\nhttps://u:p@h.example/b.git v1\nfile:///srv/c.git\n")):
        data = spec.to_json()
        assert set(data) == {"source", "url", "path", "ref", "name"}
        assert RepoSpec.from_json(data) == spec
    good: dict[str, Any] = {"source": "x", "url": None, "path": "/x", "ref": None, "name": "x"}
    bad: Any
    for bad in (
        [],
        {**good, "path": None},
        {**good, "url": "https://h/x"},
        {**good, "path": "relative"},
        {**good, "ref": "main"},
        {**good, "name": ""},
        {**good, "name": 3},
        {k: v for k, v in good.items() if k != "source"},
        {**good, "path": None, "url": "ftp://h/x"},
        {**good, "path": None, "url": "https://h/x", "ref": "-x"},
    ):
        with pytest.raises(StoreError):
            RepoSpec.from_json(bad)


def test_cache_key_is_stable_and_safe() -> None:
    """One URL, one cache name, whatever its password; a different URL, another."""
    key = cache_key("https://user:one@h.example/org/My Repo.git")
    assert key == cache_key("https://user:two@H.EXAMPLE/org/My Repo.git/")
    assert key == cache_key("https://h.example/org/My Repo.git")
    assert key.endswith("-My-Repo")
    assert key != cache_key("https://h.example/other/My Repo.git")
    assert cache_key("ssh://a@h/x") != cache_key("ssh://b@h/x")
    assert all(c.isalnum() or c in "-._" for c in cache_key("git@h:../../x y"))
