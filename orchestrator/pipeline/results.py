"""What pipeline steps produce and what the runner reports while it runs.

An agent step's instance yields a :class:`StepResult`; a plain Python step yields its return
value. A step that depends on a fanned-out step receives a :class:`Results` mapping keyed by
agent name or item. :class:`StepContext` is what a step may ask for with a ``ctx`` parameter.
The runner reports progress as :class:`RunEvent` values.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import attrs
import orjson
from attrs import field, frozen

from .._names import name_from_json, name_json
from .._sizes import first_within
from .._words import count
from ..errors import ErrorKind

if TYPE_CHECKING:
    from ..agent.turn import TurnResult

__all__ = [
    "ChangeKind",
    "CheckResult",
    "Results",
    "RoundResult",
    "RunEvent",
    "StepContext",
    "StepResult",
    "StepStatus",
    "VerifyResult",
    "agent_failure",
    "bounded_output",
    "changes_from_json",
    "changes_json",
    "check_failure",
    "cut_turn",
]

ChangeKind = Literal["added", "modified", "deleted"]
StepStatus = Literal["pending", "running", "succeeded", "failed", "skipped", "interrupted"]


def changes_json(
    changes: tuple[tuple[str, ChangeKind], ...], symlinks: tuple[tuple[str, str], ...] = ()
) -> list[dict[str, Any]]:
    """Changed files as ``--json`` output shows them: ``{path, change}``, and ``symlink`` (its
    target) for a path the change leaves a symbolic link; a name that is not plain UTF-8 comes
    with ``pathBytes`` (``symlinkBytes``), see :mod:`orchestrator._names`."""
    targets = dict(symlinks)
    out: list[dict[str, Any]] = []
    for path, change in changes:
        entry: dict[str, Any] = {**name_json(path), "change": change}
        if path in targets:
            entry.update(name_json(targets[path], "symlink"))
        out.append(entry)
    return out


def changes_from_json(
    entries: Any,
) -> tuple[tuple[tuple[str, ChangeKind], ...], tuple[tuple[str, str], ...]]:
    """The changes and symlink targets of :func:`changes_json`'s entries, read back."""
    entries = list(entries or ())
    changes = tuple((name_from_json(c), c["change"]) for c in entries)
    symlinks = tuple(
        (name_from_json(c), name_from_json(c, "symlink")) for c in entries if "symlink" in c
    )
    return changes, symlinks


@frozen
class VerifyResult:
    """A verify command run in a branch's directory after its turn."""

    command: str
    exit_code: int
    #: the last lines of its combined output
    output: str = ""
    #: whether it was killed for taking too long (its exit code is then 124)
    timed_out: bool = False

    @property
    def passed(self) -> bool:
        """Whether the command exited 0 in time."""
        return self.exit_code == 0 and not self.timed_out

    def to_json(self) -> dict[str, Any]:
        return {
            "command": self.command,
            "exitCode": self.exit_code,
            "output": self.output,
            "timedOut": self.timed_out,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> VerifyResult:
        return cls(
            str(data["command"]),
            int(data["exitCode"]),
            str(data.get("output") or ""),
            bool(data.get("timedOut")),
        )


#: what a check's output keeps: its last lines, at most this many characters
MAX_CHECK_OUTPUT_CHARS = 16_000
MAX_CHECK_OUTPUT_LINES = 40


def bounded_output(text: str) -> str:
    """The tail of a check's output that is kept: its last lines, within a size."""
    lines = text.splitlines()
    tail = "\n".join(lines[-MAX_CHECK_OUTPUT_LINES:])
    if len(tail) > MAX_CHECK_OUTPUT_CHARS:
        tail = tail[-MAX_CHECK_OUTPUT_CHARS:]
    return tail


@frozen
class CheckResult:
    """What a step's check said of one round: passed or not, and why.

    A shell command's passes when it exits 0 in time (``exit_code`` is its status, ``output``
    the tail of what it printed); a Python check's has no exit code and its message as output.
    """

    passed: bool
    #: the tail of its output, or the message a Python check returned
    output: str = ""
    #: a shell command's exit status (124 when it timed out); None for a Python check
    exit_code: int | None = None
    #: whether it was killed for taking too long
    timed_out: bool = False

    @classmethod
    def from_verify(cls, verify: VerifyResult) -> CheckResult:
        """A shell command's result as a check's."""
        return cls(verify.passed, verify.output, verify.exit_code, verify.timed_out)

    @classmethod
    def from_value(cls, value: object) -> CheckResult:
        """What a Python check returned, as a result: a :class:`CheckResult`, a bool, or a
        ``(passed, message)`` pair; TypeError for anything else."""
        if isinstance(value, CheckResult):
            return attrs.evolve(value, output=bounded_output(value.output))
        if isinstance(value, bool):
            return cls(value)
        if (
            isinstance(value, tuple)
            and len(value) == 2
            and isinstance(value[0], bool)
            and isinstance(value[1], str)
        ):
            return cls(value[0], bounded_output(value[1]))
        raise TypeError(
            "a check returns a bool, a (passed, message) pair or a CheckResult, "
            f"not {type(value).__name__}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "exitCode": self.exit_code,
            "output": self.output,
            "timedOut": self.timed_out,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CheckResult:
        code = data.get("exitCode")
        return cls(
            bool(data.get("passed")),
            str(data.get("output") or ""),
            int(code) if code is not None else None,
            bool(data.get("timedOut")),
        )


@frozen
class RoundResult:
    """One round of an agent step with a check: the agent's turn, then the check on its branch."""

    #: which round (from 1)
    turn: int
    #: why the agent ended the round's turn
    stop_reason: str | None
    #: what the check said; None when the round ended without one (its turn did not end
    #: ``end_turn``, or went over the budget)
    check: CheckResult | None = None
    #: the unified diff of what the agent changed in this round
    diff: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "turn": self.turn,
            "stopReason": self.stop_reason,
            "check": self.check.to_json() if self.check is not None else None,
            "diff": self.diff,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RoundResult:
        check = data.get("check")
        return cls(
            int(data.get("turn") or 1),
            data.get("stopReason"),
            CheckResult.from_json(check) if check else None,
            str(data.get("diff") or ""),
        )


def cut_turn(
    text: str, tool_calls: Sequence[Mapping[str, Any]], limit: int | None
) -> tuple[str, list[Mapping[str, Any]], dict[str, Any] | None]:
    """A turn's text and tool-call summaries as the run store keeps them, and what was cut.

    Each keeps its head within ``limit`` bytes (None: no limit): the text its first ``limit``
    bytes of UTF-8 (whole characters), the tool calls the first ones whose JSON fits. The third
    value is None when nothing was cut, else ``{limit, textBytes, droppedTextBytes, toolCalls,
    droppedToolCalls}``: the limit, the whole text's size and what was dropped of it, the number
    of tool calls and how many were dropped.
    """
    calls = list(tool_calls)
    if limit is None:
        return text, calls, None
    # a character is at most 4 bytes: a short text needs no encoding to be measured
    raw = text.encode("utf-8", "surrogatepass") if len(text) > limit // 4 else None
    text_bytes = len(raw) if raw is not None else -1
    kept_text = text
    if raw is not None and text_bytes > limit:
        kept_text = raw[:limit].decode("utf-8", "ignore")
    kept_calls: list[Mapping[str, Any]] = []
    used = 0
    for call in calls:
        used += len(orjson.dumps(dict(call)))
        if used > limit:
            break
        kept_calls.append(call)
    if kept_text is text and len(kept_calls) == len(calls):
        return text, calls, None
    if raw is None:
        text_bytes = len(text.encode("utf-8", "surrogatepass"))
    cut = {
        "limit": limit,
        "textBytes": text_bytes,
        "droppedTextBytes": text_bytes - len(kept_text.encode("utf-8", "surrogatepass")),
        "toolCalls": len(calls),
        "droppedToolCalls": len(calls) - len(kept_calls),
    }
    return kept_text, kept_calls, cut


def agent_failure(stop_reason: str | None, verify: VerifyResult | None) -> str | None:
    """Why an agent instance did not succeed, or None when it did.

    An agent succeeds only when its turn ended ``end_turn`` (``cancelled``, ``refusal``,
    ``max_tokens`` and ``max_turn_requests`` leave the work unfinished) and its verify command,
    if it has one, passed. The one rule for every agent step, a comparison's agents included.
    """
    reasons = []
    if stop_reason != "end_turn":
        reasons.append(f"turn ended {stop_reason}")
    if verify is not None and not verify.passed:
        how = verify.output if verify.timed_out else f"exit {verify.exit_code}"
        reasons.append(f"verify failed: {how}")
    return "; ".join(reasons) or None


def check_failure(check: CheckResult, rounds: int) -> str:
    """Why an instance whose check never passed failed, in one line (as every error is): after
    how many rounds, and the last non-empty line of the last check's output (the whole output
    stays in the round's check)."""
    how = "timed out" if check.timed_out else "failed"
    if check.exit_code is not None and not check.timed_out:
        how += f" (exit {check.exit_code})"
    said = _last_line(check.output)
    return f"check {how} after {count(rounds, 'round')}" + (f": {said}" if said else "")


#: the most characters of a check's output line an error quotes
MAX_ERROR_LINE_CHARS = 200


def _last_line(text: str) -> str:
    """The last line of ``text`` with printable characters, control characters (a terminal's
    escapes, NULs) dropped, cut to :data:`MAX_ERROR_LINE_CHARS` with an ellipsis."""
    for line in reversed(text.splitlines()):
        line = "".join(c for c in line if c.isprintable()).strip()
        if line:
            if len(line) > MAX_ERROR_LINE_CHARS:
                return line[: MAX_ERROR_LINE_CHARS - 1] + "\u2026"
            return line
    return ""


@frozen
class StepResult:
    """The result of one agent step instance (one agent, one item)."""

    #: the step's name
    step: str
    #: the instance key (agent name or item) of a fanned-out step, else None
    key: str | None
    #: the agent that ran it
    agent: str
    #: succeeded or failed
    status: StepStatus = "succeeded"
    #: the agent's final message
    text: str = ""
    #: why the turn ended
    stop_reason: str | None = None
    #: the item this instance worked on (fan-out over items)
    item: Any = None
    #: the agent's name and version as it reported them
    agent_info: Mapping[str, Any] | None = None
    #: the ids of the agent quirks its ``initialize`` matched (:mod:`orchestrator.agent.quirks`)
    quirks: tuple[str, ...] = ()
    session_id: str | None = None
    #: the model the session ran (the value of the agent's ``model`` config option), if known
    model: str | None = None
    #: the session mode it ran in, if the agent has modes
    mode: str | None = None
    #: tool calls: ``{toolCallId, title, kind, status}``
    tool_calls: tuple[Mapping[str, Any], ...] = ()
    #: permission audit records (``PermissionRecord.to_json``)
    permissions: tuple[Mapping[str, Any], ...] = ()
    #: the notices the agent sent for the user: ``{severity, title, description?}``
    notices: tuple[Mapping[str, Any], ...] = ()
    #: usage as the agent reported it
    usage: Mapping[str, Any] | None = None
    #: files changed by this instance, relative to where its branch forked
    changes: tuple[tuple[str, ChangeKind], ...] = ()
    #: (path, target) of the changed paths that are symbolic links after the change
    symlinks: tuple[tuple[str, str], ...] = ()
    #: the unified diff of those changes
    diff: str = ""
    verify: VerifyResult | None = None
    error: str | None = None
    #: why it failed, as a kind (see :data:`~orchestrator.errors.ErrorKind`); None if it did not
    error_kind: ErrorKind | None = None
    wall_seconds: float = 0.0
    attempt: int = 1
    #: the rounds of a step with a check, in order (empty without a check)
    rounds: tuple[RoundResult, ...] = ()
    #: the turn as the client saw it (typed), for callers in this process; not recorded
    turn: TurnResult | None = field(default=None, eq=False, repr=False)
    #: what the run store left out of this turn's text and tool calls (see :func:`cut_turn`),
    #: when read back from the store; None when it kept them whole
    cut: Mapping[str, Any] | None = None

    @property
    def ok(self) -> bool:
        """Whether the instance succeeded."""
        return self.status == "succeeded"

    def __str__(self) -> str:
        return self.text

    def to_json(self, *, max_turn_bytes: int | None = None) -> dict[str, Any]:
        """The instance as it appears in ``--json`` output, reports and the run store.

        With ``max_turn_bytes`` the text and the tool calls keep their heads within that many
        bytes each, and ``cut`` says what was left out (:func:`cut_turn`); the run store keeps
        a turn that way.
        """
        text, calls, cut = cut_turn(self.text, [dict(c) for c in self.tool_calls], max_turn_bytes)
        return {
            "step": self.step,
            "key": self.key,
            "status": self.status,
            "agent": self.agent,
            "agentInfo": dict(self.agent_info) if self.agent_info else None,
            "quirks": list(self.quirks),
            "sessionId": self.session_id,
            "model": self.model,
            "mode": self.mode,
            "item": self.item,
            "stopReason": self.stop_reason,
            "text": text,
            "toolCalls": calls,
            "cut": cut if cut is not None else (dict(self.cut) if self.cut else None),
            "permissions": [dict(p) for p in self.permissions],
            "notices": first_within(self.notices, max_turn_bytes),
            "usage": dict(self.usage) if self.usage is not None else None,
            "changes": changes_json(self.changes, self.symlinks),
            "diff": self.diff,
            "verify": self.verify.to_json() if self.verify else None,
            "error": self.error,
            "errorKind": self.error_kind,
            "wallSeconds": round(self.wall_seconds, 3),
            "attempt": self.attempt,
            "rounds": [r.to_json() for r in self.rounds],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StepResult:
        """A result read back from the run store."""
        verify = data.get("verify")
        changes, symlinks = changes_from_json(data.get("changes"))
        return cls(
            step=str(data["step"]),
            key=data.get("key"),
            agent=str(data.get("agent") or ""),
            status=data.get("status", "succeeded"),
            text=str(data.get("text") or ""),
            stop_reason=data.get("stopReason"),
            item=data.get("item"),
            agent_info=data.get("agentInfo"),
            quirks=tuple(str(q) for q in data.get("quirks") or ()),
            session_id=data.get("sessionId"),
            model=data.get("model"),
            mode=data.get("mode"),
            tool_calls=tuple(data.get("toolCalls") or ()),
            permissions=tuple(data.get("permissions") or ()),
            notices=tuple(data.get("notices") or ()),
            usage=data.get("usage"),
            changes=changes,
            symlinks=symlinks,
            diff=str(data.get("diff") or ""),
            verify=VerifyResult.from_json(verify) if verify else None,
            error=data.get("error"),
            error_kind=data.get("errorKind"),
            wall_seconds=float(data.get("wallSeconds") or 0.0),
            attempt=int(data.get("attempt") or 1),
            rounds=tuple(RoundResult.from_json(r) for r in data.get("rounds") or ()),
            cut=data.get("cut"),
        )


class Results(Mapping[str, Any]):
    """The results of a fanned-out step, keyed by agent name or item, in fan-out order.

    Values are :class:`StepResult` for agent steps and plain values for Python steps. Only
    instances that succeeded are present (a failed instance fails the whole step).
    """

    def __init__(self, step: str, items: Mapping[str, Any]):
        self.step = step
        self._items = dict(items)

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Results({self.step!r}, keys={list(self._items)!r})"

    @property
    def texts(self) -> dict[str, str]:
        """Each agent instance's final message."""
        return {k: str(v) for k, v in self._items.items()}


@frozen
class StepContext:
    """What a step function gets for a parameter named ``ctx``."""

    run_id: str
    step: str
    #: the instance key of a fanned-out step, else None
    key: str | None
    #: the agent of an agent step, else None
    agent: str | None
    #: the workspace the run started from (never write there: use ``workdir``)
    workspace: Path
    #: the run inputs
    inputs: Mapping[str, Any]
    attempt: int = 1


EventType = Literal[
    "run_started",
    "step_started",
    "update",
    "permission",
    "conflict",
    "step_finished",
    "step_failed",
    "step_skipped",
    "step_retry",
    "step_reused",
    "step_round",
    "run_finished",
    # a batch's own (see orchestrator.runs.batch); its child runs' events carry ``repo``
    "batch_started",
    "repo_started",
    "repo_finished",
    "batch_finished",
]


@frozen
class RunEvent:
    """One thing that happened during a run (shown live, and kept in the run store)."""

    type: EventType
    run_id: str
    #: the step, for step events
    step: str | None = None
    #: the instance key of a fanned-out step
    key: str | None = None
    agent: str | None = None
    #: the event's details (JSON values), by type: ``status``, ``error``, ``cause``,
    #: ``title``, ``kind``, ``tokens``, ``path``, ``verdict`` ...
    data: Mapping[str, Any] = field(factory=dict)
    time: float = field(factory=time.time)

    @property
    def instance(self) -> str | None:
        """``step[key]`` for a fanned-out instance, ``step`` otherwise."""
        if self.step is None:
            return None
        return f"{self.step}[{self.key}]" if self.key is not None else self.step

    def to_json(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "runId": self.run_id,
            "step": self.step,
            "key": self.key,
            "agent": self.agent,
            "time": self.time,
            **dict(self.data),
        }
