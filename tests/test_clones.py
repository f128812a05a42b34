"""The directory a batch runs a repository in (open_checkout): local checkouts used as they
are, and URLs cloned into the clone cache and fetched again, with real git and local remotes."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from orchestrator._log import ROOT
from orchestrator.errors import RepoUnavailable
from orchestrator.runs._clones import CLONES, Checkout, open_checkout
from orchestrator.runs._repos import RepoSpec, cache_key, repo_spec
from orchestrator.vfs.testing import capture, git, git_repo

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")

#: seconds a test may take at most before it counts as hung (not a timing assertion)
LIMIT = 60


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """A repository with a tracked file, an ignore rule and a subdirectory, on ``main``."""
    return git_repo(
        tmp_path / "work",
        {"a.txt": "one\n", ".gitignore": "*.log\nbuild/\n", "src/m.py": "x = 1\n"},
    )


@pytest.fixture
def remote(tmp_path: Path, work: Path) -> Path:
    """A bare repository cloned from ``work`` (push to it with :func:`publish`)."""
    bare = tmp_path / "remote.git"
    git(tmp_path, "clone", "-q", "--bare", str(work), str(bare))
    git(work, "remote", "add", "origin", str(bare))
    return bare


def publish(work: Path, files: dict[str, str], message: str, *, ref: str = "main") -> str:
    """Commit ``files`` in ``work`` and push ``ref`` to its origin; the new commit."""
    for name, content in files.items():
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text(content)
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", message)
    git(work, "push", "-q", "origin", f"HEAD:refs/heads/{ref}")
    return git(work, "rev-parse", "HEAD").strip()


def head_of(repo: Path, rev: str = "HEAD") -> str:
    return git(repo, "rev-parse", f"{rev}^{{commit}}").strip()


def files_of(directory: Path) -> dict[str, str]:
    """The files of a work tree (its .git left out): path -> text."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(directory):
        dirnames[:] = [d for d in dirnames if d != ".git" or dirpath != str(directory)]
        for name in filenames:
            full = Path(dirpath, name)
            out[str(full.relative_to(directory))] = full.read_text()
    return out


def url_of(bare: Path, ref: str | None = None) -> RepoSpec:
    return repo_spec(f"{bare.as_uri()} {ref or ''}", base=bare.parent)


async def checkout(spec: RepoSpec, state: Path, *, timeout: float | None = 600) -> Checkout:
    with trio.fail_after(LIMIT):
        async with open_checkout(spec, state, timeout=timeout) as done:
            return done


def cache_entries(state: Path) -> list[str]:
    try:
        return sorted(os.listdir(state / CLONES))
    except FileNotFoundError:
        return []


# --------------------------------------------------------------------------- local


async def test_a_local_checkout_is_used_as_it_is_and_not_modified(
    work: Path, state_dir: Path
) -> None:
    """A local work tree: its own path, its HEAD, and nothing in it (.git included) changed."""
    (work / "dirty.txt").write_text("not committed\n")
    (work / "a.txt").write_text("changed\n")
    before = capture(work)
    done = await checkout(repo_spec(str(work), base=work.parent), state_dir)
    assert done == Checkout(work, head_of(work), "local")
    assert capture(work) == before
    assert cache_entries(state_dir) == []


async def test_a_local_directory_outside_git_or_without_commits_has_no_head(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain directory, or a repository with no commit yet, has no head."""
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))  # tmp_path may be in a repo
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "f").write_text("x")
    assert (await checkout(repo_spec("plain", base=tmp_path), state_dir)).head is None
    git(tmp_path, "init", "-q", "unborn")
    assert (await checkout(repo_spec("unborn", base=tmp_path), state_dir)).head is None


async def test_a_local_directory_missing_a_file_or_a_git_directory_is_unavailable(
    tmp_path: Path, remote: Path, work: Path, state_dir: Path
) -> None:
    """Missing, not a directory, a bare repository or a .git directory: one line each."""
    (tmp_path / "file").write_text("x")
    cases = {
        "missing": "missing: no such directory",
        "file": "file: not a directory",
        "remote.git": "remote.git: is a git repository's own directory",
        "work/.git": "work/.git: is a git repository's own directory",
    }
    for source, expected in cases.items():
        with pytest.raises(RepoUnavailable) as caught:
            await checkout(repo_spec(source, base=tmp_path), state_dir)
        assert str(caught.value).startswith(expected), caught.value
        assert "\n" not in str(caught.value)


# --------------------------------------------------------------------------- cloning


async def test_a_url_is_cloned_into_the_cache_then_fetched(
    remote: Path, work: Path, state_dir: Path
) -> None:
    """file:// URL: cloned shallow under state/clones the first time, fetched the next."""
    spec = url_of(remote)
    first = await checkout(spec, state_dir)
    key = cache_key(spec.url or "")
    assert first == Checkout(state_dir / CLONES / key, head_of(work), "cloned")
    assert files_of(first.path) == files_of(work)
    assert git(first.path, "rev-parse", "--is-shallow-repository").strip() == "true"
    assert cache_entries(state_dir) == [key, f"{key}.lock"]
    again = await checkout(spec, state_dir)
    assert again == Checkout(first.path, head_of(work), "fetched")


async def test_a_bare_repository_given_by_path_as_the_url_is_cloned(
    remote: Path, work: Path, state_dir: Path
) -> None:
    """git takes a plain path as a remote: a spec with one as its URL clones it."""
    spec = RepoSpec(str(remote), str(remote), None, None, "remote")
    done = await checkout(spec, state_dir)
    assert (done.how, done.head) == ("cloned", head_of(work))
    assert files_of(done.path) == files_of(work)


async def test_a_ref_branch_tag_or_commit_is_checked_out(
    remote: Path, work: Path, state_dir: Path
) -> None:
    """A branch, an annotated tag, a full commit id and an abbreviated one (a full fetch)."""
    first = head_of(work)
    git(work, "tag", "-a", "v1", "-m", "release one")
    git(work, "push", "-q", "origin", "v1")
    second = publish(work, {"a.txt": "two\n"}, "second")
    git(work, "checkout", "-q", "-b", "topic", first)
    topic = publish(work, {"t.txt": "topic\n"}, "topic", ref="topic")
    cases = [
        (None, second, "two\n"),
        ("topic", topic, "one\n"),
        ("v1", first, "one\n"),
        (first, first, "one\n"),
        (first[:10], first, "one\n"),
        ("main", second, "two\n"),
    ]
    for ref, commit, text in cases:
        done = await checkout(url_of(remote, ref), state_dir)
        assert done.head == commit, ref
        assert head_of(done.path) == commit, ref
        assert (done.path / "a.txt").read_text() == text, ref
        assert ((done.path / "t.txt").exists()) == (ref == "topic"), ref
        assert git(done.path, "status", "--porcelain", "--ignored") == "", ref


async def test_the_next_checkout_fetches_and_leaves_nothing_of_the_last(
    remote: Path, work: Path, state_dir: Path
) -> None:
    """A new commit on the remote appears; untracked, ignored, modified and staged files, a
    merge in progress and a stale index lock go; local branches stay."""
    spec = url_of(remote)
    first = await checkout(spec, state_dir)
    clone = first.path
    (clone / "a.txt").write_text("modified by a run\n")
    (clone / "new.txt").write_text("untracked\n")
    (clone / "debug.log").write_text("ignored\n")
    (clone / "build" / "deep").mkdir(parents=True)
    (clone / "build" / "deep" / "out.o").write_text("ignored\n")
    (clone / "staged.txt").write_text("staged\n")
    git(clone, "add", "staged.txt")
    git(clone, "checkout", "-q", "-b", "agent/fix")
    git(clone, "commit", "-q", "-am", "a batch's branch")
    branch_commit = head_of(clone)
    (clone / "later.txt").write_text("after the commit\n")
    (clone / ".git" / "MERGE_HEAD").write_text(branch_commit + "\n")
    (clone / ".git" / "index.lock").write_text("")
    new = publish(work, {"a.txt": "two\n", "src/n.py": "y = 2\n"}, "second")
    again = await checkout(spec, state_dir)
    assert again == Checkout(clone, new, "fetched")
    assert files_of(clone) == files_of(work)
    assert git(clone, "status", "--porcelain", "--ignored") == ""
    assert git(clone, "rev-parse", "--abbrev-ref", "HEAD").strip() == "HEAD"  # detached
    assert head_of(clone, "refs/heads/agent/fix") == branch_commit
    assert not (clone / ".git" / "MERGE_HEAD").exists()


# --------------------------------------------------------------------------- failures


async def test_a_wrong_url_is_unavailable_and_leaves_nothing_that_looks_cloned(
    tmp_path: Path, remote: Path, state_dir: Path
) -> None:
    """A URL with no repository behind it: one line naming the clone and git's reason; the
    cache holds no directory for it, and a later right URL clones as usual."""
    spec = url_of(tmp_path / "nowhere.git")
    with pytest.raises(RepoUnavailable) as caught:
        await checkout(spec, state_dir)
    message = str(caught.value)
    assert message.startswith(f"clone of {spec.url} failed: fatal: ")
    assert "nowhere.git" in message
    assert "\n" not in message
    assert [n for n in cache_entries(state_dir) if not n.endswith(".lock")] == []
    assert (await checkout(url_of(remote), state_dir)).how == "cloned"


async def test_a_failed_fetch_is_unavailable_and_keeps_the_clone(
    remote: Path, work: Path, state_dir: Path
) -> None:
    """The remote gone at the next checkout: 'fetch of' failed, and the clone is kept for when
    it is back."""
    spec = url_of(remote)
    first = await checkout(spec, state_dir)
    remote.rename(remote.with_name("moved.git"))
    with pytest.raises(RepoUnavailable) as caught:
        await checkout(spec, state_dir)
    assert str(caught.value).startswith(f"fetch of {spec.url} failed: fatal: ")
    assert first.path.is_dir()
    remote.with_name("moved.git").rename(remote)
    assert await checkout(spec, state_dir) == Checkout(first.path, head_of(work), "fetched")


async def test_a_ref_the_remote_does_not_have_is_unavailable(remote: Path, state_dir: Path) -> None:
    """A missing branch, or a commit id found nowhere (after the full fetch), is one line."""
    with pytest.raises(RepoUnavailable, match="couldn't find remote ref no-such-branch"):
        await checkout(url_of(remote, "no-such-branch"), state_dir)
    with pytest.raises(RepoUnavailable, match="no branch, tag or commit 'deadbeef00' there"):
        await checkout(url_of(remote, "deadbeef00"), state_dir)
    assert [n for n in cache_entries(state_dir) if not n.endswith(".lock")] == []


async def test_credentials_never_show_in_a_failure(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A URL with a password, refused (nothing listens on port 1 here): redacted."""
    for name in (
        "http_proxy",
        "HTTP_PROXY",
        "https_proxy",
        "HTTPS_PROXY",
        "all_proxy",
        "ALL_PROXY",
    ):
        monkeypatch.delenv(name, raising=False)  # straight to this machine, never elsewhere
    spec = repo_spec("http://user:s3cret-token@127.0.0.1:1/x.git", base=state_dir)
    with pytest.raises(RepoUnavailable) as caught:
        await checkout(spec, state_dir)
    message = str(caught.value)
    assert message.startswith("clone of http://user:***@127.0.0.1:1/x.git failed: "), message
    assert "s3cret" not in message


async def test_without_git_a_url_is_unavailable_and_a_local_directory_has_no_head(
    remote: Path, work: Path, tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """git missing from PATH: a URL cannot be cloned (said so); a local directory still works."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(RepoUnavailable, match=r"^git is not installed \(not found on PATH\)"):
        await checkout(url_of(remote), state_dir)
    assert await checkout(repo_spec(str(work), base=tmp_path), state_dir) == Checkout(
        work, None, "local"
    )


async def test_leftovers_of_a_crash_are_removed_and_a_broken_clone_is_made_again(
    remote: Path, work: Path, state_dir: Path
) -> None:
    """A temporary directory a killed clone left goes; a cache directory without its .git is
    cloned again."""
    spec = url_of(remote)
    key = cache_key(spec.url or "")
    half = state_dir / CLONES / f"{key}.tmp-0badc0de"
    (half / ".git").mkdir(parents=True)
    (half / "a.txt").write_text("half\n")
    done = await checkout(spec, state_dir)
    assert done.how == "cloned"
    assert cache_entries(state_dir) == [key, f"{key}.lock"]
    shutil.rmtree(done.path / ".git")
    (done.path / "stray.txt").write_text("x")
    again = await checkout(spec, state_dir)
    assert (again.how, again.head) == ("cloned", head_of(work))
    assert files_of(again.path) == files_of(work)
    assert cache_entries(state_dir) == [key, f"{key}.lock"]


# --------------------------------------------------------------------------- turns


class _Waiting(logging.Handler):
    """Sets an event when the clone module logs that it waits for the clone's lock."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.event = trio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if "waiting for another batch" in record.getMessage():
            self.event.set()


@pytest.fixture
def waiting() -> Iterator[_Waiting]:
    logger = logging.getLogger(ROOT)
    handler = _Waiting()
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


async def test_two_checkouts_of_one_url_take_turns(
    remote: Path, state_dir: Path, waiting: _Waiting
) -> None:
    """The second waits for the first's whole block (same URL, another ref too)."""
    order: list[str] = []
    a_in, a_go = trio.Event(), trio.Event()

    async def first() -> None:
        async with open_checkout(url_of(remote), state_dir):
            order.append("a in")
            a_in.set()
            await a_go.wait()
            order.append("a out")

    async def second() -> None:
        async with open_checkout(url_of(remote, "main"), state_dir) as done:
            order.append(f"b in {done.how}")

    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(first)
            await a_in.wait()
            nursery.start_soon(second)
            await waiting.event.wait()
            order.append("b waits")
            a_go.set()
    assert order == ["a in", "b waits", "a out", "b in fetched"]


HOLDER = textwrap.dedent(
    """
    import sys, trio
    from pathlib import Path
    from orchestrator.runs._clones import open_checkout
    from orchestrator.runs._repos import repo_spec

    async def main():
        spec = repo_spec(sys.argv[1], base=Path("."))
        async with open_checkout(spec, Path(sys.argv[2])):
            print("in", flush=True)
            sys.stdin.read()
            Path(sys.argv[3]).write_text("out")

    trio.run(main)
    """
)


async def test_another_process_holding_the_clone_makes_this_one_wait(
    remote: Path, tmp_path: Path, state_dir: Path, waiting: _Waiting
) -> None:
    """A batch in another process holds the clone: this one waits until that one is done."""
    spec = url_of(remote)
    marker = tmp_path / "holder-done"
    with trio.fail_after(LIMIT):
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-c", HOLDER, spec.source, str(state_dir), str(marker)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        try:
            assert proc.stdout is not None and proc.stdin is not None
            said = b""
            while not said.endswith(b"\n"):
                chunk = await proc.stdout.receive_some()
                assert chunk, f"the holder ended, having said {said!r}"
                said += chunk
            assert said == b"in\n"
            seen: list[str] = []

            async def mine() -> None:
                async with open_checkout(spec, state_dir) as done:
                    seen.append(marker.read_text() if marker.exists() else "holder still in")
                    seen.append(done.how)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(mine)
                await waiting.event.wait()
                assert seen == []
                await proc.stdin.aclose()
            assert seen == ["out", "fetched"]
            assert await proc.wait() == 0
        finally:
            proc.kill()
            await proc.wait()


def _hanging_ssh(tmp_path: Path) -> tuple[Path, Path]:
    """A stand-in for ssh that reports its pid and its parent's on a FIFO, then hangs."""
    fifo = tmp_path / "started"
    os.mkfifo(fifo)
    script = tmp_path / "fake-ssh"
    script.write_text(f'#!/bin/sh\necho "$$ $PPID" > {fifo}\nexec sleep 1000\n')
    script.chmod(0o755)
    return script, fifo


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (not gone, not a zombie)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return fields[0] not in ("Z", "X")


def _working_in(directory: Path) -> list[int]:
    """Live processes whose working directory is ``directory`` or below it."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cwd = os.readlink(f"/proc/{name}/cwd")
        except OSError:
            continue
        if (cwd == str(directory) or cwd.startswith(f"{directory}/")) and _alive(int(name)):
            found.append(int(name))
    return found


async def _wait_gone(pids: list[int]) -> list[int]:
    """The pids still alive after a bounded wait for killed processes to finish dying."""
    with trio.move_on_after(10):
        for pid in pids:
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:
                continue
            try:
                await trio.lowlevel.wait_readable(fd)  # readable once the process has ended
            finally:
                os.close(fd)
    return [p for p in pids if _alive(p)]


async def test_a_cancelled_clone_leaves_no_process_and_no_clone(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while git waits on its transport: git and what it started are gone, and the
    cache holds nothing that passes for a clone."""
    script, fifo = _hanging_ssh(tmp_path)
    monkeypatch.setenv("GIT_SSH_COMMAND", str(script))
    monkeypatch.setenv("GIT_SSH_VARIANT", "simple")
    spec = repo_spec("ssh://git@example.invalid/x.git", base=tmp_path)
    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:

            async def clone() -> None:
                async with open_checkout(spec, state_dir):
                    raise AssertionError("the clone cannot succeed")

            nursery.start_soon(clone)
            started = await trio.to_thread.run_sync(fifo.read_text, abandon_on_cancel=True)
            nursery.cancel_scope.cancel()
    pids = [int(p) for p in started.split()]
    assert len(pids) == 2
    assert await _wait_gone(pids) == []
    assert await _wait_gone(_working_in(state_dir)) == []
    assert [n for n in cache_entries(state_dir) if not n.endswith(".lock")] == []


async def test_a_clone_past_its_timeout_is_unavailable_and_stopped(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transport that never answers: RepoUnavailable saying it timed out, nothing left."""
    script, fifo = _hanging_ssh(tmp_path)
    monkeypatch.setenv("GIT_SSH_COMMAND", str(script))
    monkeypatch.setenv("GIT_SSH_VARIANT", "simple")
    spec = repo_spec("ssh://git@example.invalid/x.git", base=tmp_path)
    started: list[str] = []

    async def report() -> None:
        started.append(await trio.to_thread.run_sync(fifo.read_text, abandon_on_cancel=True))

    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(report)
            with pytest.raises(RepoUnavailable) as caught:
                await checkout(spec, state_dir, timeout=0.5)
    assert str(caught.value) == "clone of ssh://git@example.invalid/x.git timed out after 0.5s"
    pids = [int(p) for p in started[0].split()]
    assert await _wait_gone(pids) == []
    assert [n for n in cache_entries(state_dir) if not n.endswith(".lock")] == []


CLONER = textwrap.dedent(
    """
    import sys, trio
    from pathlib import Path
    from orchestrator.runs._clones import open_checkout
    from orchestrator.runs._repos import repo_spec

    async def main():
        async with open_checkout(repo_spec(sys.argv[1], base=Path(".")), Path(sys.argv[2])):
            pass

    trio.run(main)
    """
)


async def test_a_clone_killed_with_its_process_leaves_nothing_in_place(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL of the process cloning: its git goes too, no directory stands at the clone's
    place, and the next checkout removes what it left."""
    script, fifo = _hanging_ssh(tmp_path)
    monkeypatch.setenv("GIT_SSH_COMMAND", str(script))
    monkeypatch.setenv("GIT_SSH_VARIANT", "simple")
    source = "ssh://git@example.invalid/x.git"
    with trio.fail_after(LIMIT):
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-c", CLONER, source, str(state_dir)]
        )
        try:
            started = await trio.to_thread.run_sync(fifo.read_text, abandon_on_cancel=True)
        finally:
            proc.kill()
            await proc.wait()
        pids = [int(p) for p in started.split()]
        assert await _wait_gone(pids) == []
    key = cache_key(source)
    left = cache_entries(state_dir)
    assert key not in left
    assert [n for n in left if n.startswith(f"{key}.tmp-")] != []  # what the crash left
    monkeypatch.setenv("GIT_SSH_COMMAND", "false")
    with pytest.raises(
        RepoUnavailable, match=r"^clone of ssh://git@example\.invalid/x\.git failed"
    ):
        await checkout(repo_spec(source, base=tmp_path), state_dir)
    assert cache_entries(state_dir) == [f"{key}.lock"]


async def test_a_symlink_in_the_clone_s_place_is_not_followed(
    remote: Path, work: Path, tmp_path: Path, state_dir: Path
) -> None:
    """A symlink where the clone should be is replaced by a clone; what it led to is untouched."""
    spec = url_of(remote)
    elsewhere = git_repo(tmp_path / "elsewhere", {"keep.txt": "mine\n"})
    (elsewhere / "untracked.txt").write_text("mine too\n")
    before = capture(elsewhere)
    place = state_dir / CLONES / cache_key(spec.url or "")
    place.parent.mkdir(parents=True)
    place.symlink_to(elsewhere)
    done = await checkout(spec, state_dir)
    assert (done.how, done.path, done.head) == ("cloned", place, head_of(work))
    assert not place.is_symlink()
    assert capture(elsewhere) == before
    assert cache_entries(state_dir) == [place.name, f"{place.name}.lock"]
