"""A batch's input: its repository list, its options and budget checked before anything runs, and
what its record keeps of its repositories (no credentials)."""

from __future__ import annotations

import os
import stat
import string
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from ..errors import (
    UsageError,
)
from ..pipeline._budget import RunBudget
from ..policy import PolicySet
from ._clones import CLONES
from ._repos import RepoSpec, cache_key, label_repos, parse_repos, redact, repo_spec

#: the fields a commit message template may name
MESSAGE_FIELDS = frozenset({"batch_id", "run_id", "pipeline", "repo"})


def check_message(template: str | None) -> None:
    """A commit message template names only :data:`MESSAGE_FIELDS`, plainly (no conversion,
    format spec or index: those fail or grow without bound once filled); UsageError otherwise."""
    if template is None:
        return
    if not template.strip():
        raise UsageError("the commit message template is empty")
    if len(template) > MAX_MESSAGE:
        raise UsageError(f"the commit message template is longer than {MAX_MESSAGE} characters")
    allowed = ", ".join("{" + f + "}" for f in sorted(MESSAGE_FIELDS))
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as e:
        raise UsageError(f"the commit message template {template!r}: {e}") from None
    for _, name, spec, conversion in parts:
        if name is None:
            continue
        if name not in MESSAGE_FIELDS:
            raise UsageError(f"the commit message template names {{{name}}}: it may name {allowed}")
        if spec or conversion:
            raise UsageError(
                f"the commit message template formats {{{name}}}: it may only name {allowed}, "
                "as they are"
            )


#: the longest commit message template taken
MAX_MESSAGE = 10_000
#: the commit message of a repository's branch when none is given
DEFAULT_MESSAGE = (
    "{pipeline}: changes of batch {batch_id}\n\n"
    "Run {run_id} of orchestrator batch {batch_id}, repository {repo}.\n"
)
#: the largest repository list read
MAX_REPOS_FILE = 8 * 1024 * 1024


def read_list_text(path: Path, shown: str) -> str:
    """The repository list's text: a regular file of at most :data:`MAX_REPOS_FILE` bytes
    (a FIFO or a device would block or never end), UTF-8 (blocking)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise UsageError(f"the repository list {shown}: {e.strerror or e}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"the repository list {shown} is not a regular file")
        data = f.read(MAX_REPOS_FILE + 1)
    if len(data) > MAX_REPOS_FILE:
        raise UsageError(
            f"the repository list {shown} is larger than {MAX_REPOS_FILE // (1024 * 1024)} MiB"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"the repository list {shown}: not UTF-8 text (byte {e.start})") from None


def check_branch(name: str) -> None:
    """``name`` is a valid git branch name (``git check-ref-format``); UsageError otherwise,
    before any repository runs (blocking)."""
    import subprocess

    if not name or name.startswith("-"):
        raise UsageError(f"{name!r} is not a valid git branch name")
    try:
        done = subprocess.run(
            ["git", "check-ref-format", f"refs/heads/{name}"],
            capture_output=True,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except FileNotFoundError:
        raise UsageError("git is not installed: a git branch cannot be made") from None
    if done.returncode != 0:
        raise UsageError(f"{name!r} is not a valid git branch name")


def read_repos(
    repos: Sequence[str | RepoSpec], repos_file: str | os.PathLike[str] | None, cwd: Path
) -> tuple[RepoSpec, ...]:
    """The batch's repositories: the file's, then the ones given, labelled (blocking)."""
    specs: list[RepoSpec] = []
    if repos_file is not None:
        path = Path(repos_file).expanduser()
        if not path.is_absolute():
            path = cwd / path
        text = read_list_text(path, os.fspath(repos_file))
        specs += parse_repos(text, base=path.parent, origin=os.fspath(repos_file))
    if isinstance(repos, str | bytes | os.PathLike):
        raise UsageError(
            "the repositories are a list of them (one string is one repository: put it in a list)"
        )
    for item in repos:
        if isinstance(item, RepoSpec):
            specs.append(item)
        elif isinstance(item, str | os.PathLike):
            specs.append(repo_spec(os.fspath(item), base=cwd))
        else:
            raise UsageError(
                f"a repository is a path, a URL or a RepoSpec, not {type(item).__name__}"
            )
    if not specs:
        raise UsageError("no repositories: give a list of them, or one at least")
    return label_repos(specs)


def make_budget(
    max_tokens: int | None, max_cost: float | None, max_seconds: float | None, on_budget: str
) -> RunBudget:
    for name, value in (
        ("max_tokens", max_tokens),
        ("max_cost", max_cost),
        ("max_seconds", max_seconds),
    ):
        if value is not None and (isinstance(value, bool) or not value > 0):
            raise UsageError(f"{name} must be above 0, not {value!r}")
    if on_budget not in ("finish", "cancel"):
        raise UsageError(f"on_budget is finish or cancel, not {on_budget!r}")
    return RunBudget(
        max_tokens=max_tokens,
        max_cost=max_cost,
        max_seconds=max_seconds,
        on_spent=on_budget,  # type: ignore[arg-type]
    )


def check_positive(name: str, value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise UsageError(f"{name} must be a whole number of 1 or more, not {value!r}")


#: what stands for credentials in a recorded URL (see :func:`~._repos.redact`)
REDACTED = "***@"


def recorded_spec(spec: RepoSpec) -> dict[str, Any]:
    """``spec`` as the batch's record keeps it: credentials in its URL hidden (the clone's own
    git config keeps the URL, as ``git clone`` does), with the clone's cache key, by which a
    resume finds the URL again."""
    data = spec.to_json()
    if spec.url is not None:
        data.update(url=redact(spec.url), source=redact(spec.source), cacheKey=cache_key(spec.url))
    return data


def restored_specs(recorded: Sequence[Any], state: Path) -> tuple[RepoSpec, ...]:
    """The recorded repositories, each URL whose credentials were hidden read again from its
    clone's git config (left hidden when the clone is gone: that repository then fails)."""
    specs = []
    for data in recorded:
        spec = RepoSpec.from_json(data)
        key = data.get("cacheKey") if isinstance(data, Mapping) else None
        if spec.url is not None and REDACTED in spec.url and isinstance(key, str):
            real = origin_url(state / CLONES / key)
            if real is not None and redact(real) == spec.url:
                spec = attrs.evolve(spec, url=real)
        specs.append(spec)
    return tuple(specs)


def origin_url(clone: Path) -> str | None:
    """The ``origin`` URL a clone's git config holds (blocking); None when it has none."""
    import subprocess

    config = clone / ".git" / "config"
    if not config.is_file() or config.is_symlink():
        return None
    done = subprocess.run(
        ["git", "config", "--file", str(config), "--get", "remote.origin.url"],
        capture_output=True,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    url = done.stdout.decode("utf-8", "surrogateescape").strip()
    return url if done.returncode == 0 and url else None


def policy_source(policy: str | os.PathLike[str] | PolicySet | None) -> str | None:
    """The policy as the batch's record keeps it: a name or a file, or a mark for one given in
    code (a resume then needs it given again)."""
    if policy is None or isinstance(policy, str):
        return policy
    if isinstance(policy, os.PathLike):
        return os.fspath(policy)
    return GIVEN_IN_CODE


#: how the record names a policy given as a :class:`PolicySet`
GIVEN_IN_CODE = "(given in code)"
