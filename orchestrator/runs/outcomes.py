"""Typed views of a run's ``--json`` object: its steps, their instances, a comparison's agents.

A run's ``--json`` object (:attr:`RunOutcome.result <orchestrator.runs.RunOutcome.result>`,
:func:`~orchestrator.runs.get_run_json`) stays the one source of truth. These values are read
from it and :meth:`to_json` gives it back exactly: the keys in their order, ``null`` where it
had ``null``, a key left out where it had none, and every key this version does not know (one a
newer version wrote) kept as it was, in :attr:`extra`. A value this version cannot read (a
string where a list belongs) is kept the same way, and its typed field keeps its default::

    run = run_pipeline_sync("pipeline.py", cwd="project")
    check = run.steps["check"]                  # a StepOutcome
    print(check.status, check.error, check.instances["check"].value)
    for entry in compare_sync(["a=demo", "b=demo"], task, cwd="project").agents:
        print(entry.name, entry.status, entry.changed_files, entry.verify_passed)

:class:`StepOutcome` is one entry of a pipeline's ``steps``; :class:`InstanceOutcome` one of a
step's ``instances`` (one per agent or item of a fanned-out step, else the step's own);
:class:`AgentOutcome` one entry of a comparison's ``agents``, or a prompt's whole object (a
comparison's entry carries a prompt's fields, so one reader serves both).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import attrs
from attrs import frozen

from .._names import name_from_json
from ..agent.services import Verdict as PermissionVerdict
from ..pipeline.results import ChangeKind, StepStatus
from .verdict import changed_lines

__all__ = [
    "AgentIdentity",
    "AgentOutcome",
    "BranchUsage",
    "CheckEntry",
    "FileChange",
    "InstanceOutcome",
    "PermissionEntry",
    "RoundEntry",
    "StepOutcome",
    "ToolCallEntry",
    "VerifyEntry",
]


_T = TypeVar("_T")


class _Unreadable(Exception):
    """A JSON value not of the shape its typed field takes (kept whole in ``extra``)."""


# --------------------------------------------------------------------------- JSON fields


def _plain(value: Any) -> Any:
    """A copy of a JSON value, so that what :meth:`to_json` gives can be changed freely."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _checked(*types: type) -> Callable[[Any], Any]:
    """A reader that takes a JSON scalar of one of ``types`` as it is."""

    def read(raw: Any) -> Any:
        # bool is an int in Python, not in JSON
        if isinstance(raw, bool) and bool not in types:
            raise _Unreadable
        if not isinstance(raw, types):
            raise _Unreadable
        return raw

    return read


_STR = _checked(str)
_OPT_STR = _checked(str, type(None))
_OPT_INT = _checked(int, type(None))
_OPT_NUMBER = _checked(int, float, type(None))
_BOOL = _checked(bool)
_INT = _checked(int)


def _any(raw: Any) -> Any:
    return raw


def _opt_mapping(raw: Any) -> Mapping[str, Any] | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise _Unreadable
    return raw


def _strings(raw: Any) -> tuple[str, ...]:
    if not isinstance(raw, list) or not all(isinstance(v, str) for v in raw):
        raise _Unreadable
    return tuple(raw)


def _list_of(read: Callable[[Mapping[str, Any]], _T]) -> Callable[[Any], tuple[_T, ...]]:
    def read_list(raw: Any) -> tuple[_T, ...]:
        if not isinstance(raw, list) or not all(isinstance(v, Mapping) for v in raw):
            raise _Unreadable
        return tuple(read(v) for v in raw)

    return read_list


def _json(
    key: str, read: Callable[[Any], Any], write: Callable[[Any], Any] = _plain
) -> dict[str, Any]:
    """The metadata of a field read from the JSON object's ``key`` and written back to it."""
    return {"json": key, "read": read, "write": write}


def _extra_field() -> Any:
    return attrs.field(factory=dict, repr=False)


def _keys_field() -> Any:
    return attrs.field(default=(), eq=False, repr=False)


def _json_fields(cls: type) -> dict[str, attrs.Attribute[Any]]:
    """The fields of ``cls`` read from JSON, by their JSON key."""
    return {f.metadata["json"]: f for f in attrs.fields(cls) if "json" in f.metadata}


def _default_of(f: attrs.Attribute[Any]) -> Any:
    default: Any = f.default
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        return default.factory()
    return default


def _read(cls: Callable[..., _T], data: Any, **given: Any) -> _T:
    """An instance of ``cls`` read from the JSON object ``data`` (see the module's docstring)."""
    if not isinstance(data, Mapping):
        name = getattr(cls, "__name__", "")
        raise TypeError(f"{name} is read from a JSON object, not {type(data).__name__}")
    fields = _json_fields(cls)  # type: ignore[arg-type]
    extra: dict[str, Any] = {}
    for key, raw in data.items():
        f = fields.get(key)
        if f is None:
            extra[key] = raw
            continue
        try:
            given[f.name] = f.metadata["read"](raw)
        except _Unreadable:
            extra[key] = raw
    return cls(**given, extra=extra, json_keys=tuple(data))


def _write(value: Any) -> dict[str, Any]:
    """The JSON object of ``value``: its source's keys in order, then any typed field that is
    not at its default (a value made in Python, or evolved), then extra keys added by hand."""
    fields = _json_fields(type(value))
    extra: Mapping[str, Any] = value.extra
    out: dict[str, Any] = {}
    for key in value.json_keys:
        if key in extra:
            out[key] = _plain(extra[key])
        elif key in fields:
            f = fields[key]
            out[key] = f.metadata["write"](getattr(value, f.name))
    for key, f in fields.items():
        if key not in out and key not in extra:
            current = getattr(value, f.name)
            if current != _default_of(f):
                out[key] = f.metadata["write"](current)
    for key, raw in extra.items():
        out.setdefault(key, _plain(raw))
    return out


def _write_all(values: tuple[Any, ...]) -> list[dict[str, Any]]:
    return [v.to_json() for v in values]


# --------------------------------------------------------------------------- small entries


@frozen(kw_only=True)
class FileChange:
    """One changed file: ``{path, change}``, with ``symlink`` when it is left a link."""

    #: the path relative to the workspace, as shown (see ``path_bytes`` for a name that is
    #: not plain UTF-8)
    path: str = attrs.field(default="", metadata=_json("path", _STR))
    #: added, modified or deleted
    change: ChangeKind = attrs.field(default="modified", metadata=_json("change", _checked(str)))
    #: the base64 of the path's bytes, when its name is not plain UTF-8
    path_bytes: str | None = attrs.field(default=None, metadata=_json("pathBytes", _OPT_STR))
    #: the link's target, when the change leaves a symbolic link
    symlink: str | None = attrs.field(default=None, metadata=_json("symlink", _OPT_STR))
    #: the base64 of the target's bytes, when it is not plain UTF-8
    symlink_bytes: str | None = attrs.field(default=None, metadata=_json("symlinkBytes", _OPT_STR))
    #: the keys this version does not read, as they were
    extra: Mapping[str, Any] = _extra_field()
    #: the keys of the object it was read from, in order
    json_keys: tuple[str, ...] = _keys_field()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FileChange:
        """The change a ``changes`` entry describes."""
        return _read(cls, data)

    @property
    def name(self) -> str:
        """The path as the filesystem names it: :attr:`path` is its display form, which
        differs for a name that is not plain UTF-8 (its bytes are kept in :attr:`path_bytes`)."""
        return name_from_json({"path": self.path, "pathBytes": self.path_bytes})

    def to_json(self) -> dict[str, Any]:
        """The entry it was read from."""
        return _write(self)


@frozen(kw_only=True)
class PermissionEntry:
    """One permission decision of a turn: what was asked, what was answered, by which rule."""

    tool_call_id: str | None = attrs.field(default=None, metadata=_json("toolCallId", _OPT_STR))
    #: the tool kind asked for (edit, execute, ...)
    kind: str | None = attrs.field(default=None, metadata=_json("kind", _OPT_STR))
    title: str | None = attrs.field(default=None, metadata=_json("title", _OPT_STR))
    #: allow, reject or cancelled
    verdict: PermissionVerdict | None = attrs.field(
        default=None, metadata=_json("verdict", _OPT_STR)
    )
    #: the option the client chose, None when none was
    option_id: str | None = attrs.field(default=None, metadata=_json("optionId", _OPT_STR))
    #: the rule that decided (``default`` when no policy was given)
    rule: str | None = attrs.field(default=None, metadata=_json("rule", _OPT_STR))
    #: the keys this version does not read, as they were
    extra: Mapping[str, Any] = _extra_field()
    #: the keys of the object it was read from, in order
    json_keys: tuple[str, ...] = _keys_field()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PermissionEntry:
        """The decision a ``permissions`` entry describes."""
        return _read(cls, data)

    def to_json(self) -> dict[str, Any]:
        """The entry it was read from."""
        return _write(self)


@frozen(kw_only=True)
class ToolCallEntry:
    """One tool call of a turn, summarised: its id, title, kind, status, and its error."""

    tool_call_id: str = attrs.field(default="", metadata=_json("toolCallId", _STR))
    title: str | None = attrs.field(default=None, metadata=_json("title", _OPT_STR))
    kind: str | None = attrs.field(default=None, metadata=_json("kind", _OPT_STR))
    #: pending, in_progress, completed or failed (a newer value passes)
    status: str | None = attrs.field(default=None, metadata=_json("status", _OPT_STR))
    #: on a failed call, what the agent said about it
    error: str | None = attrs.field(default=None, metadata=_json("error", _OPT_STR))
    #: the keys this version does not read, as they were
    extra: Mapping[str, Any] = _extra_field()
    #: the keys of the object it was read from, in order
    json_keys: tuple[str, ...] = _keys_field()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ToolCallEntry:
        """The call a ``toolCalls`` entry describes."""
        return _read(cls, data)

    def to_json(self) -> dict[str, Any]:
        """The entry it was read from."""
        return _write(self)


@frozen(kw_only=True)
class VerifyEntry:
    """The verify command run in an instance's branch after its turn."""

    command: str = attrs.field(default="", metadata=_json("command", _STR))
    exit_code: int | None = attrs.field(default=None, metadata=_json("exitCode", _OPT_INT))
    #: the last lines of its combined output
    output: str | None = attrs.field(default=None, metadata=_json("output", _OPT_STR))
    #: whether it was killed for taking too long
    timed_out: bool = attrs.field(default=False, metadata=_json("timedOut", _BOOL))
    #: the keys this version does not read, as they were
    extra: Mapping[str, Any] = _extra_field()
    #: the keys of the object it was read from, in order
    json_keys: tuple[str, ...] = _keys_field()

    @property
    def passed(self) -> bool:
        """Whether the command exited 0 in time."""
        return self.exit_code == 0 and not self.timed_out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> VerifyEntry:
        """The command a ``verify`` object describes."""
        return _read(cls, data)

    def to_json(self) -> dict[str, Any]:
        """The object it was read from."""
        return _write(self)


@frozen(kw_only=True)
class AgentIdentity:
    """An agent as a prompt or a comparison's entry names it."""

    #: its label (or configured name)
    name: str = attrs.field(default="", metadata=_json("name", _STR))
    #: the version it reported in ``initialize``
    version: str | None = attrs.field(default=None, metadata=_json("version", _OPT_STR))
    #: the name it reported in ``initialize``
    reported_name: str | None = attrs.field(default=None, metadata=_json("reportedName", _OPT_STR))
    #: the ids of the agent quirks its ``initialize`` matched
    quirks: tuple[str, ...] = attrs.field(factory=tuple, metadata=_json("quirks", _strings, list))
    #: the keys this version does not read, as they were
    extra: Mapping[str, Any] = _extra_field()
    #: the keys of the object it was read from, in order
    json_keys: tuple[str, ...] = _keys_field()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AgentIdentity:
        """The agent an ``agent`` object describes."""
        return _read(cls, data)

    def to_json(self) -> dict[str, Any]:
        """The object it was read from."""
        return _write(self)


def _opt_verify(raw: Any) -> VerifyEntry | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise _Unreadable
    return VerifyEntry.from_json(raw)


def _opt_identity(raw: Any) -> AgentIdentity | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise _Unreadable
    return AgentIdentity.from_json(raw)


def _write_opt(value: Any) -> Any:
    return None if value is None else value.to_json()


@frozen(kw_only=True)
class CheckEntry:
    """What a step's check said of one round (see :class:`RoundEntry`)."""

    passed: bool = attrs.field(default=False, metadata=_json("passed", _BOOL))
    #: a shell check's exit status (124: timed out); None for a Python check
    exit_code: int | None = attrs.field(default=None, metadata=_json("exitCode", _OPT_INT))
    #: the tail of a shell check's output, or a Python check's message
    output: str | None = attrs.field(default=None, metadata=_json("output", _OPT_STR))
    #: whether it was killed for taking too long
    timed_out: bool = attrs.field(default=False, metadata=_json("timedOut", _BOOL))
    #: the keys this version does not read, as they were
    extra: Mapping[str, Any] = _extra_field()
    #: the keys of the object it was read from, in order
    json_keys: tuple[str, ...] = _keys_field()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CheckEntry:
        """The check a ``check`` object describes."""
        return _read(cls, data)

    def to_json(self) -> dict[str, Any]:
        """The object it was read from."""
        return _write(self)


def _opt_check(raw: Any) -> CheckEntry | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise _Unreadable
    return CheckEntry.from_json(raw)


@frozen(kw_only=True)
class RoundEntry:
    """One round of an agent step with a check: its turn, then the check on its branch."""

    #: which round, from 1
    turn: int | None = attrs.field(default=None, metadata=_json("turn", _OPT_INT))
    #: how the round's turn ended
    stop_reason: str | None = attrs.field(default=None, metadata=_json("stopReason", _OPT_STR))
    #: what the check said; None when the round ended without one
    check: CheckEntry | None = attrs.field(
        default=None, metadata=_json("check", _opt_check, _write_opt)
    )
    #: the unified diff of what the agent changed in this round
    diff: str | None = attrs.field(default=None, metadata=_json("diff", _OPT_STR))
    #: the keys this version does not read, as they were
    extra: Mapping[str, Any] = _extra_field()
    #: the keys of the object it was read from, in order
    json_keys: tuple[str, ...] = _keys_field()

    @property
    def passed(self) -> bool:
        """Whether the round's check passed."""
        return self.check is not None and self.check.passed

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RoundEntry:
        """The round a ``rounds`` entry describes."""
        return _read(cls, data)

    def to_json(self) -> dict[str, Any]:
        """The entry it was read from."""
        return _write(self)


_CHANGES = _list_of(FileChange.from_json)
_PERMISSIONS = _list_of(PermissionEntry.from_json)
_TOOL_CALLS = _list_of(ToolCallEntry.from_json)


# --------------------------------------------------------------------------- turns


@frozen(kw_only=True)
class _TurnFields:
    """The fields of an agent's turn in a branch, shared by instances and comparison entries."""

    #: pending, running, succeeded, failed, skipped or interrupted
    status: StepStatus | None = attrs.field(default=None, metadata=_json("status", _OPT_STR))
    #: the step it belongs to
    step: str | None = attrs.field(default=None, metadata=_json("step", _OPT_STR))
    #: its instance key (an agent label or an item's key), None for a step's own instance
    key: str | None = attrs.field(default=None, metadata=_json("key", _OPT_STR))
    #: the item of a step that fans out over items
    item: Any = attrs.field(default=None, metadata=_json("item", _any))
    #: what the agent said about itself in ``initialize`` (``name``, ``version``, ...)
    agent_info: Mapping[str, Any] | None = attrs.field(
        default=None, metadata=_json("agentInfo", _opt_mapping)
    )
    #: the ids of the agent quirks its ``initialize`` matched (see the README's agent quirks)
    quirks: tuple[str, ...] = attrs.field(factory=tuple, metadata=_json("quirks", _strings, list))
    session_id: str | None = attrs.field(default=None, metadata=_json("sessionId", _OPT_STR))
    #: the model the session ran, None when the agent reports none
    model: str | None = attrs.field(default=None, metadata=_json("model", _OPT_STR))
    #: the session mode it ran in, None when the agent has no modes
    mode: str | None = attrs.field(default=None, metadata=_json("mode", _OPT_STR))
    #: why the turn ended (end_turn, cancelled, ...), None when it did not end
    stop_reason: str | None = attrs.field(default=None, metadata=_json("stopReason", _OPT_STR))
    #: the agent's message (as the run store keeps it: see :attr:`cut`)
    text: str | None = attrs.field(default=None, metadata=_json("text", _OPT_STR))
    tool_calls: tuple[ToolCallEntry, ...] = attrs.field(
        factory=tuple, metadata=_json("toolCalls", _TOOL_CALLS, _write_all)
    )
    #: what the run store left out of the text and tool calls, None when nothing
    cut: Mapping[str, Any] | None = attrs.field(default=None, metadata=_json("cut", _opt_mapping))
    permissions: tuple[PermissionEntry, ...] = attrs.field(
        factory=tuple, metadata=_json("permissions", _PERMISSIONS, _write_all)
    )
    #: the usage the agent reported: its last ``usage_update`` (``used``, ``size``,
    #: ``cost``) and the turn's token counts (``tokens``)
    usage: Mapping[str, Any] | None = attrs.field(
        default=None, metadata=_json("usage", _opt_mapping)
    )
    #: the files changed in its branch
    changes: tuple[FileChange, ...] = attrs.field(
        factory=tuple, metadata=_json("changes", _CHANGES, _write_all)
    )
    #: the unified diff of those changes
    diff: str | None = attrs.field(default=None, metadata=_json("diff", _OPT_STR))
    #: the verify command run after the turn, None when none was
    verify: VerifyEntry | None = attrs.field(
        default=None, metadata=_json("verify", _opt_verify, _write_opt)
    )
    #: why it failed, for people
    error: str | None = attrs.field(default=None, metadata=_json("error", _OPT_STR))
    #: what kind of failure it was (timeout, agent exited, ...), None when it did not fail
    error_kind: str | None = attrs.field(default=None, metadata=_json("errorKind", _OPT_STR))
    #: the Python traceback of a step that raised
    traceback: str | None = attrs.field(default=None, metadata=_json("traceback", _OPT_STR))
    #: wall-clock seconds it took
    wall_seconds: float | None = attrs.field(
        default=None, metadata=_json("wallSeconds", _OPT_NUMBER)
    )
    #: which attempt this was (retries count from 1)
    attempt: int | None = attrs.field(default=None, metadata=_json("attempt", _OPT_INT))

    @property
    def changed_files(self) -> tuple[str, ...]:
        """The paths it changed, as shown."""
        return tuple(c.path for c in self.changes)

    @property
    def changed_lines(self) -> int:
        """Added plus removed lines in its diff."""
        return changed_lines(self.diff or "")

    @property
    def tokens(self) -> Mapping[str, Any]:
        """The turn's token counts as the agent reported them (``inputTokens``,
        ``outputTokens``, ``totalTokens``, ...); empty when it reported none."""
        tokens = (self.usage or {}).get("tokens")
        return tokens if isinstance(tokens, Mapping) else {}

    @property
    def total_tokens(self) -> int | float | None:
        """The turn's total tokens: ``totalTokens``, else input plus output; None when unknown."""
        tokens = self.tokens
        total = _number(tokens.get("totalTokens"))
        if total is not None:
            return total
        known = [_number(tokens.get(k)) for k in ("inputTokens", "outputTokens")]
        numbers = [n for n in known if n is not None]
        return sum(numbers) if numbers else None

    @property
    def verify_passed(self) -> bool | None:
        """Whether the verify command passed; None when none ran."""
        return None if self.verify is None else self.verify.passed


def _number(value: Any) -> int | float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    return None


@frozen(kw_only=True)
class InstanceOutcome(_TurnFields):
    """One instance of a step: an agent's turn in its own branch, or a Python step's call.

    A step that fans out has one per agent or item; another has one, under the step's name.
    An agent step's instance has the turn's fields; a Python step's has :attr:`value`.
    """

    #: its key in its step's ``instances``: the step's name, an agent label or an item's key
    name: str = attrs.field(default="")
    #: the agent's label, None for a Python step
    agent: str | None = attrs.field(default=None, metadata=_json("agent", _OPT_STR))
    #: a Python step's return value (as JSON); None for an agent step
    value: Any = attrs.field(default=None, metadata=_json("value", _any))
    #: the rounds of an agent step with a check, in order; empty without one
    rounds: tuple[RoundEntry, ...] = attrs.field(
        factory=tuple, metadata=_json("rounds", _list_of(RoundEntry.from_json), _write_all)
    )
    #: the keys this version does not read, as they were
    extra: Mapping[str, Any] = _extra_field()
    #: the keys of the object it was read from, in order
    json_keys: tuple[str, ...] = _keys_field()

    @classmethod
    def from_json(cls, data: Mapping[str, Any], name: str = "") -> InstanceOutcome:
        """The instance an ``instances`` entry (keyed ``name``) describes."""
        return _read(cls, data, name=name)

    def to_json(self) -> dict[str, Any]:
        """The entry it was read from."""
        return _write(self)


def _instances(raw: Any) -> Mapping[str, InstanceOutcome]:
    if not isinstance(raw, Mapping) or not all(isinstance(v, Mapping) for v in raw.values()):
        raise _Unreadable
    return {str(k): InstanceOutcome.from_json(v, name=str(k)) for k, v in raw.items()}


def _write_instances(instances: Mapping[str, InstanceOutcome]) -> dict[str, Any]:
    return {k: v.to_json() for k, v in instances.items()}


@frozen(kw_only=True)
class StepOutcome:
    """One step of a pipeline run: its status, why it failed or was skipped, its instances."""

    #: the step's name (its key in the run's ``steps``)
    name: str = attrs.field(default="")
    #: pending, running, succeeded, failed, skipped or interrupted
    status: StepStatus | None = attrs.field(default=None, metadata=_json("status", _OPT_STR))
    #: why it failed, for people (a failed instance's error)
    error: str | None = attrs.field(default=None, metadata=_json("error", _OPT_STR))
    #: what kind of failure it was (timeout, agent exited, ...), None when it did not fail
    error_kind: str | None = attrs.field(default=None, metadata=_json("errorKind", _OPT_STR))
    #: why it was skipped or failed before it ran (its condition, a parent's failure)
    cause: str | None = attrs.field(default=None, metadata=_json("cause", _OPT_STR))
    #: the Python traceback of a step that raised
    traceback: str | None = attrs.field(default=None, metadata=_json("traceback", _OPT_STR))
    #: its instances by key: one per agent or item when it fans out, else one under its name
    instances: Mapping[str, InstanceOutcome] = attrs.field(
        factory=dict, metadata=_json("instances", _instances, _write_instances)
    )
    #: the keys this version does not read, as they were
    extra: Mapping[str, Any] = _extra_field()
    #: the keys of the object it was read from, in order
    json_keys: tuple[str, ...] = _keys_field()

    @property
    def value(self) -> Any:
        """The value of a step that does not fan out: its instance's :attr:`~InstanceOutcome.value`
        (a Python step's return value) or, for an agent step, its text; None before it ran."""
        own = self.instances.get(self.name)
        if own is None:
            return None
        return own.value if own.agent is None else own.text

    @classmethod
    def from_json(cls, data: Mapping[str, Any], name: str = "") -> StepOutcome:
        """The step a ``steps`` entry (keyed ``name``) describes."""
        return _read(cls, data, name=name)

    def to_json(self) -> dict[str, Any]:
        """The entry it was read from."""
        return _write(self)


@frozen(kw_only=True)
class AgentOutcome(_TurnFields):
    """One agent's turn as a run reports it: an entry of a comparison's ``agents``, or a
    prompt's whole object (a comparison's entry has a prompt's fields)."""

    #: its label in the comparison (None for a prompt's object)
    name: str | None = attrs.field(default=None, metadata=_json("name", _OPT_STR))
    run_id: str | None = attrs.field(default=None, metadata=_json("runId", _OPT_STR))
    #: the agent: its label, and what it reported about itself
    agent: AgentIdentity | None = attrs.field(
        default=None, metadata=_json("agent", _opt_identity, _write_opt)
    )
    #: whether its changes were written to the workspace
    applied: bool = attrs.field(default=False, metadata=_json("applied", _BOOL))
    #: asked to apply: the files it changed that changed in the workspace meanwhile, so
    #: nothing was written
    workspace_changed: tuple[str, ...] = attrs.field(
        factory=tuple, metadata=_json("workspaceChanged", _strings, list)
    )
    #: the keys this version does not read, as they were
    extra: Mapping[str, Any] = _extra_field()
    #: the keys of the object it was read from, in order
    json_keys: tuple[str, ...] = _keys_field()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AgentOutcome:
        """The agent an ``agents`` entry (or a prompt's object) describes."""
        return _read(cls, data)

    def to_json(self) -> dict[str, Any]:
        """The object it was read from."""
        return _write(self)


@frozen(kw_only=True)
class BranchUsage:
    """What a run's branch directories cost (its ``branches`` object): directories made and
    reused, bytes written into them and shared as reflinks, and the most bytes they held on
    disk at once (counted as they were made and deleted: the files they were made with or last
    harvested, ignored files left out)."""

    made: int = attrs.field(default=0, metadata=_json("made", _INT))
    reused: int = attrs.field(default=0, metadata=_json("reused", _INT))
    bytes_copied: int = attrs.field(default=0, metadata=_json("bytesCopied", _INT))
    bytes_reflinked: int = attrs.field(default=0, metadata=_json("bytesReflinked", _INT))
    peak_bytes: int = attrs.field(default=0, metadata=_json("peakBytes", _INT))
    #: the keys this version does not read, as they were
    extra: Mapping[str, Any] = _extra_field()
    #: the keys of the object it was read from, in order
    json_keys: tuple[str, ...] = _keys_field()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BranchUsage:
        """The figures a ``branches`` object gives."""
        return _read(cls, data)

    def to_json(self) -> dict[str, Any]:
        """The object it was read from."""
        return _write(self)


def read_branches(result: Mapping[str, Any]) -> BranchUsage | None:
    """The ``branches`` object of a run's ``--json`` object, typed; None when it has none (a
    run no process took to its end)."""
    raw = result.get("branches")
    return BranchUsage.from_json(raw) if isinstance(raw, Mapping) else None


def read_steps(result: Mapping[str, Any]) -> Mapping[str, StepOutcome]:
    """The steps of a run's ``--json`` object, typed; empty for a prompt or a comparison."""
    steps = result.get("steps")
    if not isinstance(steps, Mapping):
        return {}
    return {
        str(name): StepOutcome.from_json(entry, name=str(name))
        for name, entry in steps.items()
        if isinstance(entry, Mapping)
    }


def read_agents(result: Mapping[str, Any]) -> tuple[AgentOutcome, ...]:
    """The agents of a comparison's ``--json`` object, typed; empty for other runs."""
    agents = result.get("agents")
    if not isinstance(agents, list):
        return ()
    return tuple(AgentOutcome.from_json(a) for a in agents if isinstance(a, Mapping))
