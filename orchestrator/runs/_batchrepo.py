"""One repository of a batch: what it came to (:class:`RepoOutcome`), and its git output.

A batch (:mod:`.batch`) runs its pipeline in each repository as a child run; this module holds
what each repository's entry records and the work after the run that only a batch does: the
commit on a new branch and its push. The entry is the batch object's ``repos[i]`` (see the
README's "Batches"), kept in the batch's record as one step row per repository, so that a batch
killed midway still says what each repository came to.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypeAlias

import attrs
import trio
from attrs import frozen

from ..errors import PushFailed
from ..store import StepRecord
from ._repos import RepoSpec, redact

__all__ = [
    "REPO_STATUSES",
    "RepoOutcome",
    "RepoStatus",
    "changed_lines",
    "child_figures",
    "push_branch",
    "redact_url_text",
]

RepoStatus: TypeAlias = Literal[
    "pending", "running", "succeeded", "failed", "skipped", "interrupted"
]
#: what a repository's entry can say it came to
REPO_STATUSES: tuple[RepoStatus, ...] = (
    "pending",
    "running",
    "succeeded",
    "failed",
    "skipped",
    "interrupted",
)
#: the step name of a repository's row in the batch's steps
REPO_STEP = "repo"


@frozen
class RepoOutcome:
    """What one repository of a batch came to (its entry in the batch object)."""

    #: the repository as the batch names it (unique in the batch)
    name: str
    #: as the user wrote it
    source: str
    url: str | None = None
    #: the directory its child run worked in (None if it was never reached)
    path: str | None = None
    ref: str | None = None
    #: the commit checked out (a clone), or the local repository's ``HEAD``
    head: str | None = None
    #: its child run, None when none started (the clone failed, or it was skipped)
    run_id: str | None = None
    status: RepoStatus = "pending"
    #: as ``orchestrator run`` would have exited for it; None when it did not run
    exit_code: int | None = None
    #: why it failed or was skipped, one line
    error: str | None = None
    #: ``budget`` when it was skipped because the batch's budget was spent
    skipped: str | None = None
    #: the child run's final change set: files, lines added and removed (None: no run)
    files: int | None = None
    added: int | None = None
    removed: int | None = None
    #: ``passed`` or ``failed`` when verify commands or checks ran; None when none did
    verify: str | None = None
    applied: bool = False
    branch: str | None = None
    branch_commit: str | None = None
    pushed: str | None = None
    tokens: int | None = None
    cost: float | None = None
    seconds: float | None = None
    #: what the caller should know although it did not fail (a run that did nothing, a
    #: repository with no changes to commit), one sentence each
    warnings: tuple[str, ...] = ()

    @classmethod
    def pending(cls, spec: RepoSpec) -> RepoOutcome:
        """The entry of a repository not begun."""
        return cls(
            name=spec.name,
            source=redact(spec.source),
            url=redact(spec.url) if spec.url is not None else None,
            path=str(spec.path) if spec.path is not None else None,
            ref=spec.ref,
        )

    @property
    def succeeded(self) -> bool:
        return self.status == "succeeded"

    def to_json(self) -> dict[str, Any]:
        """The camelCase entry of the batch object."""
        return {
            "name": self.name,
            "source": self.source,
            "url": self.url,
            "path": self.path,
            "ref": self.ref,
            "head": self.head,
            "runId": self.run_id,
            "status": self.status,
            "exitCode": self.exit_code,
            "error": self.error,
            "skipped": self.skipped,
            "files": self.files,
            "added": self.added,
            "removed": self.removed,
            "verify": self.verify,
            "applied": self.applied,
            "branch": self.branch,
            "branchCommit": self.branch_commit,
            "pushed": self.pushed,
            "tokens": self.tokens,
            "cost": self.cost,
            "seconds": self.seconds,
            "warnings": list(self.warnings),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RepoOutcome:
        """The entry ``to_json`` gave (unknown keys ignored, missing ones at their defaults)."""
        status = data.get("status")

        def text(key: str) -> str | None:
            value = data.get(key)
            return value if isinstance(value, str) else None

        def number(key: str) -> int | None:
            value = data.get(key)
            return value if isinstance(value, int) and not isinstance(value, bool) else None

        cost = data.get("cost")
        seconds = data.get("seconds")
        return cls(
            name=str(data.get("name") or ""),
            source=str(data.get("source") or ""),
            url=text("url"),
            path=text("path"),
            ref=text("ref"),
            head=text("head"),
            run_id=text("runId"),
            status=status if status in REPO_STATUSES else "pending",
            exit_code=number("exitCode"),
            error=text("error"),
            skipped=text("skipped"),
            files=number("files"),
            added=number("added"),
            removed=number("removed"),
            verify=text("verify"),
            applied=data.get("applied") is True,
            branch=text("branch"),
            branch_commit=text("branchCommit"),
            pushed=text("pushed"),
            tokens=number("tokens"),
            cost=float(cost) if isinstance(cost, int | float) and cost is not True else None,
            seconds=(
                float(seconds) if isinstance(seconds, int | float) and seconds is not True else None
            ),
            warnings=tuple(str(w) for w in data.get("warnings") or () if isinstance(w, str)),
        )

    def to_step(self, batch_id: str, started: float | None, finished: float | None) -> StepRecord:
        """This entry as the batch's step row for the repository."""
        status = {"skipped": "skipped", "pending": "pending"}.get(self.status, self.status)
        return StepRecord(
            run_id=batch_id,
            key=self.name,
            step=REPO_STEP,
            instance=self.name,
            status=status,
            started=started,
            finished=finished,
            result=self.to_json(),
            error=self.error,
            error_kind="budget" if self.skipped == "budget" else None,
        )

    def evolve(self, **changes: Any) -> RepoOutcome:
        return attrs.evolve(self, **changes)


def changed_lines(diff: str) -> tuple[int, int]:
    """Lines added and removed by a unified diff (its ``+++``/``---`` headers not counted)."""
    added = removed = 0
    for line in diff.splitlines():
        if line.startswith("+") and not line.startswith("+++"):
            added += 1
        elif line.startswith("-") and not line.startswith("---"):
            removed += 1
    return added, removed


def child_figures(result: Mapping[str, Any]) -> dict[str, Any]:
    """From a child run's ``--json`` object: files changed, lines added and removed, whether
    its verify commands and checks passed, and the tokens and cost its agents reported.

    Tokens are the sum over its sessions of the last ``used`` each reported (a session's usage
    is cumulative); cost the sum of their last ``cost.amount``.
    """
    changes = result.get("changes")
    files = len(changes) if isinstance(changes, list) else 0
    added, removed = changed_lines(str(result.get("diff") or ""))
    verdicts: list[bool] = []
    tokens: int | None = None
    cost: float | None = None
    steps = result.get("steps")
    for step in steps.values() if isinstance(steps, Mapping) else ():
        instances = step.get("instances") if isinstance(step, Mapping) else None
        for inst in instances.values() if isinstance(instances, Mapping) else ():
            if not isinstance(inst, Mapping):
                continue
            verify = inst.get("verify")
            if isinstance(verify, Mapping) and "exitCode" in verify:
                verdicts.append(verify.get("exitCode") == 0 and not verify.get("timedOut"))
            rounds = inst.get("rounds")
            if isinstance(rounds, list) and rounds:
                last = rounds[-1].get("check") if isinstance(rounds[-1], Mapping) else None
                if isinstance(last, Mapping):
                    verdicts.append(bool(last.get("passed")))
            usage = inst.get("usage")
            if isinstance(usage, Mapping):
                used = usage.get("used")
                if isinstance(used, int) and not isinstance(used, bool):
                    tokens = (tokens or 0) + used
                spent = usage.get("cost")
                amount = spent.get("amount") if isinstance(spent, Mapping) else None
                if isinstance(amount, int | float) and not isinstance(amount, bool):
                    cost = (cost or 0.0) + float(amount)
    verify_word = None if not verdicts else ("passed" if all(verdicts) else "failed")
    return {
        "files": files,
        "added": added,
        "removed": removed,
        "verify": verify_word,
        "tokens": tokens,
        "cost": cost,
    }


def budget_only_failures(result: Mapping[str, Any]) -> bool:
    """Whether every instance of a failed child run that failed or was skipped for a reason of
    its own failed for the budget (the run did not fail on its own account)."""
    kinds: list[str | None] = []
    steps = result.get("steps")
    for step in steps.values() if isinstance(steps, Mapping) else ():
        instances = step.get("instances") if isinstance(step, Mapping) else None
        for inst in instances.values() if isinstance(instances, Mapping) else ():
            if isinstance(inst, Mapping) and inst.get("status") in ("failed", "skipped"):
                if inst.get("status") == "skipped" and inst.get("errorKind") is None:
                    continue  # skipped because a step it depends on failed: said there
                kinds.append(inst.get("errorKind"))
    return bool(kinds) and all(kind == "budget" for kind in kinds)


_CREDENTIALS = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s]+@")


def redact_url_text(text: str) -> str:
    """``text`` with the credentials of URLs in it (``https://user:token@host``) hidden."""
    return _CREDENTIALS.sub(lambda m: f"{m.group('scheme')}***@", text)


async def push_branch(
    cwd: str | os.PathLike[str], remote: str, branch: str, *, timeout: float | None = 600
) -> None:
    """Push the local branch ``branch`` of the repository at ``cwd`` to ``remote`` (same name
    there), non-interactively; :class:`PushFailed` with git's last line when it fails."""
    env = {
        **os.environ,
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ASKPASS": "/bin/false",
        "SSH_ASKPASS": "/bin/false",
        "GCM_INTERACTIVE": "never",
        "LC_ALL": "C",
    }
    ref = f"refs/heads/{branch}"
    command: Sequence[str] = ["git", "push", "--quiet", "--", remote, f"{ref}:{ref}"]
    try:
        with trio.fail_after(timeout) if timeout is not None else contextlib.nullcontext():
            done = await trio.run_process(
                command,
                cwd=os.fspath(cwd),
                env=env,
                stdin=subprocess.DEVNULL,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
    except trio.TooSlowError:
        raise PushFailed(f"git push to {remote} took longer than {timeout:g} s") from None
    except FileNotFoundError:
        raise PushFailed("git push: git is not installed") from None
    if done.returncode != 0:
        lines = [
            line.strip()
            for line in done.stderr.decode("utf-8", "replace").splitlines()
            if line.strip()
        ]
        # git's own verdict (``! [rejected] ... (fetch first)``, ``fatal: ...``), not the hints
        # it prints after it
        said = [line for line in lines if line.startswith(("!", "error:", "fatal:"))]
        chosen = (said or lines)[0 if said else -1] if lines else f"exit {done.returncode}"
        last = redact_url_text(chosen)
        raise PushFailed(f"git push to {redact_url_text(remote)} failed: {last}")
