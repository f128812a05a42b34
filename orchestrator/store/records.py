"""The values the run store keeps: runs, steps and stored changes.

Records are immutable; the store returns fresh ones on every read. Their ``to_json()`` gives the
camelCase objects used in ``--json`` output and reports.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Literal, TypeAlias

from attrs import field, frozen

from .._names import name_json

__all__ = [
    "BASE_UNKNOWN",
    "CHANGE_KINDS",
    "RUN_KINDS",
    "RUN_STATUSES",
    "STEP_STATUSES",
    "ApplyRecord",
    "ChangeEntry",
    "ChangeKind",
    "RunKind",
    "RunRecord",
    "SessionRecord",
    "StepRecord",
    "StoredChange",
]

RunKind: TypeAlias = Literal["prompt", "compare", "pipeline", "batch"]
ChangeKind: TypeAlias = Literal["write", "delete", "mode"]

#: what started a run: ``orchestrator prompt``, ``compare``, ``run`` or ``batch``
RUN_KINDS: frozenset[str] = frozenset({"prompt", "compare", "pipeline", "batch"})
#: the statuses a run can have
RUN_STATUSES: frozenset[str] = frozenset(
    {"running", "succeeded", "failed", "conflicts", "interrupted"}
)
#: the statuses a step can have
STEP_STATUSES: frozenset[str] = frozenset(
    {"pending", "running", "succeeded", "failed", "skipped", "interrupted"}
)
#: what a stored change does to its path
CHANGE_KINDS: frozenset[str] = frozenset({"write", "delete", "mode"})
#: the ``base_digest`` of a change to a file that changed in the workspace before the run ever
#: copied or read it: its base content is unknown, so no workspace content matches it
BASE_UNKNOWN = "unknown"


def _one_of(allowed: frozenset[str], what: str) -> Any:
    """An attrs validator with a message naming the allowed values."""

    def check(_instance: Any, _attribute: Any, value: Any) -> None:
        if value not in allowed:
            raise ValueError(f"unknown {what} {value!r}; one of: {', '.join(sorted(allowed))}")

    return check


@frozen
class RunRecord:
    """One run of ``orchestrator prompt``, ``compare``, ``run`` or ``batch``."""

    #: the run's id (the CLI accepts any unique prefix of it)
    run_id: str
    #: what started it
    kind: RunKind = field(validator=_one_of(RUN_KINDS, "run kind"))
    #: running, succeeded, failed, conflicts or interrupted
    status: str = field(validator=_one_of(RUN_STATUSES, "run status"))
    #: wall-clock start (seconds since the epoch)
    created: float
    #: the workspace the run worked on
    cwd: str
    #: wall-clock end, None while running
    finished: float | None = None
    #: the pipeline file, for pipeline runs
    pipeline: str | None = None
    #: SHA-256 of the pipeline file's text when the run started (resume checks it)
    pipeline_digest: str | None = None
    #: the run's inputs (``--set KEY=VALUE``, the prompt text, ...)
    inputs: Mapping[str, Any] = field(factory=dict)
    #: the options it ran with (agents, policy, strategies, ...)
    options: Mapping[str, Any] = field(factory=dict)
    #: the final result object, once there is one
    result: Mapping[str, Any] | None = None
    #: why it failed, if it did
    error: str | None = None
    #: when its changes were written to the workspace, if they were
    applied: float | None = None
    #: the batch run it is a child of (one per repository), None for a run of its own
    parent: str | None = None
    #: not stored: why ``status`` reads as it does where the record alone cannot say (a run
    #: recorded ``running`` read ``interrupted`` because its process is gone; one whose process
    #: cannot be checked from here), set by the readers of :mod:`orchestrator.runs`
    status_reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The camelCase JSON object."""
        return {
            "runId": self.run_id,
            "kind": self.kind,
            "status": self.status,
            "statusReason": self.status_reason,
            "created": self.created,
            "finished": self.finished,
            "cwd": self.cwd,
            "pipeline": self.pipeline,
            "pipelineDigest": self.pipeline_digest,
            "inputs": dict(self.inputs),
            "options": dict(self.options),
            "parent": self.parent,
            "result": None if self.result is None else dict(self.result),
            "error": self.error,
            "applied": self.applied,
        }


@frozen
class StepRecord:
    """One step of a run (a pipeline step instance, or the single turn of a prompt).

    ``key`` identifies the step within its run (e.g. ``implement[codex]``); ``step`` is the
    declared step's name and ``instance`` the fan-out instance, if any.
    """

    run_id: str
    key: str
    step: str
    #: the fan-out instance (agent name, item), None when the step does not fan out
    instance: str | None = None
    #: the agent that ran it, None for a Python step
    agent: str | None = None
    #: pending, running, succeeded, failed, skipped or interrupted
    status: str = field(default="pending", validator=_one_of(STEP_STATUSES, "step status"))
    #: 1 for the first try, 2 for the first retry, ...
    attempt: int = 1
    started: float | None = None
    finished: float | None = None
    #: the ACP session the step's turn ran in
    session_id: str | None = None
    #: the JSON of the agent turn's result
    result: Mapping[str, Any] | None = None
    #: the JSON value a Python step returned (meaningful when ``value_stored``)
    value: Any = None
    #: whether ``value`` was stored (a value that is not JSON is not, and the step reruns)
    value_stored: bool = False
    #: why the step failed
    error: str | None = None
    #: why it failed, as a kind (see :data:`~orchestrator.errors.ErrorKind`); None if it did not
    #: (and for records written before the store kept it)
    error_kind: str | None = None
    #: the failure's class or origin (timeout, agent exit, conflict, ...)
    cause: str | None = None
    #: token and cost figures the agent reported
    usage: Mapping[str, Any] | None = None
    #: the formatted Python traceback of the exception that failed the step, when the pipeline's
    #: own code raised it (a step function, a condition, a fan-out source); None otherwise
    traceback: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The camelCase JSON object."""
        return {
            "runId": self.run_id,
            "key": self.key,
            "step": self.step,
            "instance": self.instance,
            "agent": self.agent,
            "status": self.status,
            "attempt": self.attempt,
            "started": self.started,
            "finished": self.finished,
            "sessionId": self.session_id,
            "result": None if self.result is None else dict(self.result),
            "value": self.value,
            "valueStored": self.value_stored,
            "error": self.error,
            "errorKind": self.error_kind,
            "cause": self.cause,
            "usage": None if self.usage is None else dict(self.usage),
            "traceback": self.traceback,
        }


@frozen
class SessionRecord:
    """The agent session that served one attempt of a step instance (a replay plays it again).

    ``steps`` keeps only an instance's last attempt; this is kept for every attempt.
    """

    run_id: str
    #: the step instance's key (``implement[codex]``)
    key: str
    #: 1 for the first try, 2 for the first retry, ...
    attempt: int
    #: the agent's label in the run (``claude``)
    agent: str
    #: the agent process whose wire transcript holds the session (``claude``, ``claude#2``)
    source: str
    #: the ACP session id
    session_id: str

    def to_json(self) -> dict[str, Any]:
        """The camelCase JSON object."""
        return {
            "runId": self.run_id,
            "key": self.key,
            "attempt": self.attempt,
            "agent": self.agent,
            "source": self.source,
            "sessionId": self.session_id,
        }


@frozen
class StoredChange:
    """One path's change in a step's change set, as the store keeps it.

    ``write`` carries ``data`` and the new ``mode``: None when the write leaves the mode alone
    (an existing file keeps the mode it has when applied; a new file is a regular 0o644 one);
    ``mode`` carries only the new ``mode``; ``delete`` carries neither. ``base_digest`` is the
    SHA-256 (hex) of the file in the run's base snapshot, None if it did not exist there, or
    :data:`BASE_UNKNOWN` if it changed in the workspace before the run copied or read it: apply
    checks it against the workspace. ``path`` is the name as the ``os`` module gives it (a name
    that is not UTF-8 holds lone surrogates, see :mod:`orchestrator._names`); the store keeps
    its exact bytes, and :meth:`to_json` gives it as ``path`` + ``pathBytes``.
    """

    path: str
    kind: ChangeKind = field(validator=_one_of(CHANGE_KINDS, "change kind"))
    data: bytes | None = field(
        default=None, repr=lambda d: "None" if d is None else f"<{len(d)} bytes>"
    )
    mode: int | None = None
    base_digest: str | None = None

    def __attrs_post_init__(self) -> None:
        if not self.path:
            raise ValueError("a stored change needs a path")
        if self.kind == "write" and self.data is None:
            raise ValueError(f"write of {self.path!r} without data")
        if self.kind != "write" and self.data is not None:
            raise ValueError(f"{self.kind} of {self.path!r} must not carry data")
        if self.kind == "mode" and self.mode is None:
            raise ValueError(f"mode change of {self.path!r} without a mode")

    @property
    def digest(self) -> str | None:
        """SHA-256 (hex) of ``data``, None when there is none."""
        return None if self.data is None else hashlib.sha256(self.data).hexdigest()

    def to_json(self) -> dict[str, Any]:
        """The camelCase JSON object (the content as its size and digest, not the bytes)."""
        return {
            **name_json(self.path),
            "kind": self.kind,
            "mode": self.mode,
            "baseDigest": self.base_digest,
            "size": None if self.data is None else len(self.data),
            "digest": self.digest,
        }


@frozen
class ChangeEntry:
    """A stored change as a listing shows it: what it does to its path, not its content."""

    path: str
    kind: ChangeKind
    mode: int | None = None
    base_digest: str | None = None
    #: the size of the new content (a ``write``), None otherwise
    size: int | None = None
    #: a symlink's target: the content of a ``write`` that leaves a symlink, None otherwise
    target: bytes | None = None


@frozen
class ApplyRecord:
    """One apply of a run's changes: to its workspace, or as a commit on a new git branch."""

    run_id: str
    #: the change sets applied (``(final)`` for the whole run, else step keys); None for an
    #: apply recorded before the store kept them
    keys: tuple[str, ...] | None
    #: when (seconds since the epoch)
    at: float
    #: the git branch made, None when the workspace itself was written
    git_branch: str | None = None
    #: the commit on that branch
    git_commit: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The camelCase JSON object."""
        return {
            "runId": self.run_id,
            "keys": None if self.keys is None else list(self.keys),
            "at": self.at,
            "gitBranch": self.git_branch,
            "gitCommit": self.git_commit,
        }
