"""The directory a batch runs a repository in: a local checkout as it is, or a clone of a URL
kept in the clone cache of the state directory.

:func:`open_checkout` gives the directory for the duration of an ``async with`` block.

- **A local directory** is checked (it exists and is a directory) and never modified; its
  ``HEAD`` is read when it is in a git work tree.
- **A URL** has one directory in ``STATE/clones/``, named by :func:`~._repos.cache_key` (the
  same URL gets the same directory in every batch). The first time, it is made by ``git init``
  and a shallow fetch (``--depth 1``) of the ref, or of the remote's ``HEAD``, in a temporary
  directory renamed into place once checked out: an interrupted clone (Ctrl-C, a crash, a
  timeout) never leaves a directory that later passes for a clone, and the next use removes
  what it left. A shallow fetch the remote refuses (an abbreviated commit id, a server that
  serves no shallow fetch) falls back to a full fetch of its branches and tags. Later, the
  clone is fetched again (not cloned again), the fetched commit is checked out detached and
  forced, and ``git clean -ffdx`` removes everything else, so the tree is exactly the ref's
  whatever an earlier batch left in it (local branches stay, unused).
- The whole block holds an exclusive lock (``flock`` on ``STATE/clones/KEY.lock``): batches,
  in one process or several, that use the same URL take turns. The wait is cancellable.

git runs without a terminal and without prompts (``GIT_TERMINAL_PROMPT=0``, no askpass, stdin
closed, in a session of its own so ssh cannot ask either), without background ``gc``, and
killed with everything it started when cancelled or past ``timeout``. Every failure is
:class:`~orchestrator.errors.RepoUnavailable`, one line, credentials redacted.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import stat
import subprocess
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Literal

import trio
from attrs import frozen

from .._log import get_logger
from ..agent import reaper
from ..errors import RepoUnavailable
from ..vfs._fileio import remove_tree
from ._repos import RepoSpec, cache_key, is_commit_id, redact

__all__ = ["CLONES", "Checkout", "open_checkout"]

log = get_logger(__name__)

#: the clone cache's directory in the state directory
CLONES = "clones"
#: the variables that would point git at another repository, work tree or object store
_REPO_ENV = frozenset(
    {
        "GIT_DIR",
        "GIT_WORK_TREE",
        "GIT_INDEX_FILE",
        "GIT_PREFIX",
        "GIT_COMMON_DIR",
        "GIT_NAMESPACE",
        "GIT_OBJECT_DIRECTORY",
        "GIT_ALTERNATE_OBJECT_DIRECTORIES",
        "GIT_SHALLOW_FILE",
    }
)
#: git's settings on every call in the cache: no background gc or maintenance left running,
#: no submodules fetched, no advice
_CONFIG = (
    "-c",
    "gc.autoDetach=false",
    "-c",
    "maintenance.autoDetach=false",
    "-c",
    "fetch.recurseSubmodules=false",
    "-c",
    "submodule.recurse=false",
    "-c",
    "advice.detachedHead=false",
    "-c",
    "init.defaultBranch=main",
)
#: the lock files git leaves in a repository when killed; stale whenever the cache lock is held
_GIT_LOCKS = ("index.lock", "shallow.lock", "HEAD.lock", "config.lock", "packed-refs.lock")
#: what a merge, rebase, cherry-pick, revert or am in progress keeps in a repository
_GIT_STATES = (
    "MERGE_HEAD",
    "MERGE_MSG",
    "MERGE_MODE",
    "CHERRY_PICK_HEAD",
    "REVERT_HEAD",
    "BISECT_LOG",
    "rebase-merge",
    "rebase-apply",
    "sequencer",
)
#: seconds between two looks at a busy cache lock, at most
_LOCK_POLL_MAX = 0.5
#: seconds git has after SIGTERM before SIGKILL
_TERM_GRACE = 2.0


@frozen
class Checkout:
    """A repository's directory, ready for a run."""

    #: the directory to run the pipeline in
    path: Path
    #: the commit checked out (for a local directory: its ``HEAD``, None when it is not in a
    #: git work tree or has no commit)
    head: str | None
    #: ``local`` (used as it is), ``cloned`` (cloned now) or ``fetched`` (the cached clone
    #: fetched again)
    how: Literal["local", "cloned", "fetched"]


@asynccontextmanager
async def open_checkout(
    spec: RepoSpec, state: Path, *, timeout: float | None = 600
) -> AsyncIterator[Checkout]:
    """The directory to run ``spec`` in, for the block (see the module's docstring).

    ``state`` is the state directory (the cache is ``state/clones``). ``timeout`` bounds, in
    seconds, the clone or fetch with its checkout (None: no bound); waiting for another batch
    to release the clone is not bounded, and is cancellable. Raises
    :class:`~orchestrator.errors.RepoUnavailable` for a local directory that is missing or not
    a directory, a git repository's own directory, and a clone or fetch that failed or timed
    out (nothing left that passes for a clone).
    """
    if spec.url is None:
        yield await _local(spec, timeout)
        return
    if shutil.which("git") is None:
        raise RepoUnavailable(
            f"git is not installed (not found on PATH): cannot clone {spec.shown}"
        )
    clones = state / CLONES
    key = cache_key(spec.url)
    async with _cache_lock(clones, key, spec):
        deadline = trio.current_time() + timeout if timeout is not None else float("inf")
        with trio.move_on_at(deadline) as scope:
            try:
                checkout = await _prepare(spec, clones, key)
            except _GitFailed as e:
                raise RepoUnavailable(str(e)) from None
            except OSError as e:  # renaming in the cache
                raise RepoUnavailable(
                    f"the clone cache cannot be used for {spec.shown} ({e.strerror}): {clones}"
                ) from None
        if scope.cancelled_caught:
            assert timeout is not None
            what = "fetch" if (clones / key).is_dir() else "clone"
            raise RepoUnavailable(f"{what} of {spec.shown} timed out after {timeout:g}s")
        yield checkout


# --------------------------------------------------------------------------- local


async def _local(spec: RepoSpec, timeout: float | None) -> Checkout:
    assert spec.path is not None
    path = spec.path
    try:
        st = await trio.to_thread.run_sync(os.stat, path)
    except FileNotFoundError:
        raise RepoUnavailable(f"{spec.shown}: no such directory ({path})") from None
    except OSError as e:
        raise RepoUnavailable(f"{spec.shown}: cannot be read ({e.strerror}): {path}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise RepoUnavailable(f"{spec.shown}: not a directory ({path})")
    if not os.access(path, os.R_OK | os.X_OK):
        raise RepoUnavailable(f"{spec.shown}: cannot be read (permission denied): {path}")
    head = None
    with trio.move_on_after(timeout if timeout is not None else float("inf")):
        head = await _local_head(spec, path)
    return Checkout(path, head, "local")


async def _local_head(spec: RepoSpec, path: Path) -> str | None:
    """``HEAD`` of the work tree ``path`` is in; None outside one, unborn, or without git."""
    args = [
        "git",
        "rev-parse",
        "--is-bare-repository",
        "--is-inside-git-dir",
        "--verify",
        "-q",
        "HEAD^{commit}",
    ]
    env = {**_base_env(), "GIT_OPTIONAL_LOCKS": "0"}
    try:
        # rev-parse reads and starts nothing: killed by itself on cancel, with no tree to sweep
        done = await trio.run_process(
            args,
            cwd=path,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    except OSError:  # no git: a directory is used without it
        return None
    lines = done.stdout.decode("utf-8", "replace").split()
    if lines[:2] != ["false", "false"]:
        if "true" in lines[:2]:
            raise RepoUnavailable(
                f"{spec.shown}: is a git repository's own directory (bare, or .git), with no"
                f" files to work on; give it as a file:// URL to clone it: {path}"
            )
        return None  # not in a repository at all
    return lines[2] if done.returncode == 0 and len(lines) >= 3 else None


# --------------------------------------------------------------------------- the cache


@asynccontextmanager
async def _cache_lock(clones: Path, key: str, spec: RepoSpec) -> AsyncIterator[None]:
    """Hold the exclusive lock of ``key``'s clone; waits, cancellably, while another holds it."""
    try:
        await trio.to_thread.run_sync(lambda: clones.mkdir(parents=True, exist_ok=True))
        fd = os.open(clones / f"{key}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise RepoUnavailable(f"the clone cache cannot be used ({e.strerror}): {clones}") from None
    try:
        delay = 0.01
        waiting = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                pass
            if not waiting:
                waiting = True
                log.info("waiting for another batch to release the clone", repo=spec.shown)
            # polled rather than waited for in a thread: a thread blocked in flock cannot be
            # abandoned without the lock being taken later by nobody
            await trio.sleep(delay)
            delay = min(delay * 2, _LOCK_POLL_MAX)
        if waiting:
            log.info("took the clone", repo=spec.shown)
        yield
    finally:
        os.close(fd)  # closing the file releases the lock


async def _prepare(spec: RepoSpec, clones: Path, key: str) -> Checkout:
    """The clone of ``spec`` in ``clones/key``, made or fetched, checked out; under its lock."""
    assert spec.url is not None
    final = clones / key
    await trio.to_thread.run_sync(_remove_leftovers, clones, key)
    if final.is_dir() and not final.is_symlink() and await _usable(final):
        await trio.to_thread.run_sync(_remove_git_leftovers, final / ".git")
        log.info("fetching the cached clone", repo=spec.shown, path=str(final))
        head = await _sync(spec, final, "fetch", clean=True)
        return Checkout(final, head, "fetched")
    if final.exists() or final.is_symlink():
        # not a clone any more (removed in part by hand?): set aside and cloned again
        aside = clones / f"{key}.old-{uuid.uuid4().hex[:8]}"
        os.rename(final, aside)
        await trio.to_thread.run_sync(_discard, aside)
    log.info("cloning", repo=spec.shown, path=str(final))
    temporary = clones / f"{key}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        await _git(spec, "clone", ["init", "-q", "--template=", str(temporary)], None)
        await _git(spec, "clone", ["remote", "add", "origin", spec.url], temporary)
        head = await _sync(spec, temporary, "clone", clean=False)
        os.rename(temporary, final)
    except BaseException:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(remove_tree, str(temporary))
        raise
    return Checkout(final, head, "cloned")


def _remove_git_leftovers(git_dir: Path) -> None:
    """Remove what a git killed in the clone, or an earlier batch's own git commands, left
    in its repository: stale lock files, a merge, rebase or cherry-pick in progress (the cache
    lock is held: no git works here now)."""
    for name in _GIT_LOCKS + _GIT_STATES:
        path = git_dir / name
        if path.is_dir() and not path.is_symlink():
            remove_tree(str(path))
        else:
            with suppress(FileNotFoundError, IsADirectoryError):
                path.unlink()


def _remove_leftovers(clones: Path, key: str) -> None:
    """Remove the temporary directories an interrupted clone of ``key`` left (its lock is held:
    no clone of it is being made)."""
    try:
        names = os.listdir(clones)
    except OSError:
        return
    for name in names:
        if name.startswith((f"{key}.tmp-", f"{key}.old-")):
            _discard(clones / name)


def _discard(path: Path) -> None:
    """Remove ``path``: a directory with everything in it, or a file or symlink (never what
    a symlink leads to)."""
    if path.is_dir() and not path.is_symlink():
        remove_tree(str(path))
    else:
        with suppress(FileNotFoundError):
            path.unlink()


async def _usable(directory: Path) -> bool:
    """Whether ``directory`` is still a repository of its own (its ``.git`` there and sound)."""
    if not (directory / ".git").is_dir() or (directory / ".git").is_symlink():
        return False
    try:
        await _git(None, "check", ["rev-parse", "--git-dir"], directory)
    except _GitFailed:
        return False
    return True


async def _sync(spec: RepoSpec, directory: Path, what: str, *, clean: bool) -> str:
    """Fetch ``spec``'s ref into the repository ``directory`` and check it out exactly; the
    commit checked out."""
    assert spec.url is not None
    if clean:
        # the URL may have changed credentials since (the cache key leaves passwords out)
        await _git(spec, what, ["remote", "set-url", "origin", spec.url], directory)
    want = spec.ref or "HEAD"
    try:
        await _git(
            spec, what, ["fetch", "-q", "--no-tags", "--depth", "1", "origin", want], directory
        )
        target = "FETCH_HEAD"
    except _GitFailed as e:
        if not (spec.ref and is_commit_id(spec.ref)) and "shallow" not in e.detail.lower():
            raise
        log.info("shallow fetch refused, fetching in full", repo=spec.shown, detail=e.detail)
        target = await _fetch_all(spec, directory, what, refused=e)
    head = (
        await _git(spec, what, ["rev-parse", "--verify", "-q", f"{target}^{{commit}}"], directory)
    ).strip()
    if clean:
        await _git(spec, what, ["clean", "-ffdxq"], directory)
    await _git(spec, what, ["checkout", "-q", "--detach", "--force", head], directory)
    if clean:
        await _git(spec, what, ["clean", "-ffdxq"], directory)
    return head


async def _fetch_all(spec: RepoSpec, directory: Path, what: str, *, refused: _GitFailed) -> str:
    """Fetch every branch and tag of the remote (the whole history); what names the commit."""
    args = ["fetch", "-q", "--no-tags"]
    if (directory / ".git" / "shallow").exists():
        args.append("--unshallow")
    args += [
        "origin",
        "+HEAD:refs/remotes/origin/HEAD",
        "+refs/heads/*:refs/remotes/origin/*",
        "+refs/tags/*:refs/tags/*",
    ]
    await _git(spec, what, args, directory)
    ref = spec.ref
    if ref is None:
        return "refs/remotes/origin/HEAD"
    candidates = [f"refs/remotes/origin/{ref.removeprefix('refs/heads/')}", f"refs/tags/{ref}"]
    if ref.startswith("refs/"):
        candidates.append(ref)
    if is_commit_id(ref):
        candidates.append(ref)
    for candidate in candidates:
        try:
            await _git(
                spec, what, ["rev-parse", "--verify", "-q", f"{candidate}^{{commit}}"], directory
            )
        except _GitFailed:
            continue
        return candidate
    raise RepoUnavailable(
        f"{what} of {spec.shown} failed: no branch, tag or commit {ref!r} there ({refused.detail})"
    )


# --------------------------------------------------------------------------- running git


class _GitFailed(Exception):
    """A git command that exited with an error (:func:`open_checkout` raises it as
    :class:`~orchestrator.errors.RepoUnavailable`): ``detail`` is git's telling line."""

    def __init__(self, spec: RepoSpec | None, what: str, detail: str):
        self.detail = detail
        shown = spec.shown if spec is not None else "the clone"
        super().__init__(f"{what} of {shown} failed: {detail}")


def _base_env() -> dict[str, str]:
    """This process's environment for git: no repository of the caller's, no prompt."""
    env = {k: v for k, v in os.environ.items() if k not in _REPO_ENV}
    env.update(
        GIT_TERMINAL_PROMPT="0",
        GIT_ASKPASS="",  # set and empty: git asks no askpass program, nor core.askPass
        SSH_ASKPASS_REQUIRE="never",
        GCM_INTERACTIVE="never",
        LC_ALL="C",  # messages in English: the caller reads them
        LANGUAGE="C",
    )
    return env


async def _git(spec: RepoSpec | None, what: str, args: list[str], directory: Path | None) -> str:
    """Run ``git ARGS`` on the repository ``directory`` (None: none), in a session and process
    tree of its own, all of it killed if cancelled; its stdout. :class:`_GitFailed` if it fails.
    """
    env = _base_env()
    if directory is not None:
        # named outright: a directory whose .git is gone must not lead git to a repository
        # above it (the state directory may well be inside one)
        env.update(GIT_DIR=str(directory / ".git"), GIT_WORK_TREE=str(directory))
    tree = reaper.open_tree()
    try:
        done = await trio.run_process(
            ["git", *_CONFIG, *args],
            cwd=directory,
            env=tree.environment(env),
            stdin=subprocess.DEVNULL,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            start_new_session=True,  # no terminal: ssh cannot prompt either
            deliver_cancel=_kill_group,
        )
    except FileNotFoundError:
        shown = spec.shown if spec is not None else "a repository"
        raise RepoUnavailable(
            f"git is not installed (not found on PATH): cannot {what} {shown}"
        ) from None
    except OSError as e:
        raise RepoUnavailable(f"git cannot be started ({e.strerror})") from None
    finally:
        await reaper.release_tree(tree)
    if done.returncode != 0:
        raise _GitFailed(spec, what, _detail(done.stderr, done.returncode, spec))
    return done.stdout.decode("utf-8", "replace")


async def _kill_group(proc: trio.Process) -> None:
    """End git and what it started (its session): SIGTERM, then SIGKILL after a grace."""
    _signal_group(proc.pid, signal.SIGTERM)
    with trio.move_on_after(_TERM_GRACE):
        await proc.wait()
    _signal_group(proc.pid, signal.SIGKILL)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _detail(stderr: bytes, code: int, spec: RepoSpec | None) -> str:
    """git's telling line of ``stderr`` (its first ``fatal:`` or ``error:`` line, else its last
    line), credentials redacted; its exit status if it said nothing."""
    lines = [line.strip() for line in stderr.decode("utf-8", "replace").splitlines()]
    lines = [line for line in lines if line]
    telling = [line for line in lines if line.startswith(("fatal:", "error:"))]
    # the first one says why; git's last lines repeat it in general terms
    line = (telling or lines[-1:] or [f"git exited with status {code}"])[0]
    return _scrub(" ".join(line.split())[:300], spec)


def _scrub(text: str, spec: RepoSpec | None) -> str:
    """``text`` with the URL's credentials redacted, wherever git repeated them."""
    if spec is None or spec.url is None:
        return text
    url = spec.url
    text = text.replace(url, redact(url))
    shown = redact(url)
    if shown != url:
        # the secret itself: what redact replaced, if git quoted it some other way
        secret = _secret(url)
        if secret:
            text = text.replace(secret, "***")
    return text


def _secret(url: str) -> str | None:
    """The password (or, in an http(s) URL, the lone user name) in ``url``."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return None
    authority = rest.split("/", 1)[0].split("?", 1)[0].split("#", 1)[0]
    if "@" not in authority:
        return None
    userinfo = authority.rpartition("@")[0]
    user, colon, password = userinfo.partition(":")
    if colon:
        return password or None
    return user if scheme.lower() in ("http", "https") and user else None
