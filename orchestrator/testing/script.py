"""The script of a scripted ACP agent: what it advertises and what it does on each prompt.

A script is plain data. Build it in Python with this module's frozen classes (a field that
holds steps, turns or other script values takes a list or any iterable and keeps a tuple), or
write it as JSON (``AgentScript.to_json()`` / ``AgentScript.from_json()``; the subprocess
agent reads a JSON file). Field names are the Python names (snake_case); objects that ACP itself
defines are written in their ACP wire form (``optionId``, ``currentValue``, ...). Fields
left at their default may be omitted.

Agent (``AgentScript``)
-----------------------
``name`` ("scripted-agent"), ``title`` ("Scripted Agent"), ``version`` ("0.1.0")
    sent as ``agentInfo``.
``protocol_version`` (1)
    answered to ``initialize`` whatever the client asked for.
``capabilities`` (all false)
    ``{"load_session", "image", "audio", "embedded_context", "mcp_http", "mcp_sse",
    "session_list", "session_resume", "session_close", "session_delete", "logout"}``.
    Methods behind a false gate answer -32601; prompts with image, audio or embedded
    resource blocks the agent did not advertise answer -32602.
``auth_methods`` ([]), ``require_auth`` (false)
    ``[{"id", "name", "description"?, "type"?, "args"?}]`` (``type: "terminal"`` with
    ``args``: a terminal login); with ``require_auth`` every ``session/new``,
    ``session/load`` and ``session/resume`` answers -32000 until ``authenticate`` names a
    listed method id (an unlisted one answers -32602).
``modes`` ([]), ``current_mode`` (the first mode)
    ``[{"id", "name", "description"?}]``, returned by ``session/new`` as ``modes``;
    ``session/set_mode`` emits ``current_mode_update``.
``config_options`` ([])
    ``[{"type": "select"|"boolean", "id", "name", "currentValue", "options"?,
    "category"?, "description"?}]`` with select options ``{"value", "name"}``; returned by
    ``session/new``; ``session/set_config_option`` answers the updated list.
``id_style`` ("int")
    ids of the agent's own requests: "int" counts from 0, "string" gives UUID-like text.
``session_id_prefix`` ("sess-")
    session ids are the prefix and a counter from 1.
``exit_at_start`` (null)
    ``{"exit_code": 1, "stderr": "", "wait_for_initialize": true}``: write ``stderr`` and
    exit (in memory: close the stream) before answering ``initialize``; with
    ``wait_for_initialize`` false, without reading anything.
``initialize_delay`` (0)
    seconds to wait before answering ``initialize`` (a slow or hung start).
``turns`` ([])
    see below; with no turn at all every prompt ends at once with ``end_turn``.
``load_history`` ([])
    steps replayed by ``session/load`` before its response (usually ``user``, ``say``,
    ``tool_call`` ...).
``record_path`` (null)
    file that receives the agent's record as JSON lines (see ``AgentRecord``).
``ignore_stdin_close`` (false)
    when stdin closes, record ``eof`` and keep running until a signal ends the process (in
    memory: until its task is cancelled).

Turns (``Turn``)
----------------
``{"steps": [...], "stop_reason": "end_turn", "when_prompt_contains": null,
"when_prompt_matches": null, "cancel_stop_reason": "cancelled", "ignore_cancel": false,
"updates_after_response": [], "error": null, "response_meta": null}``.

Each ``session/prompt`` takes a turn: the first turn whose conditions all hold for the
prompt's text wins; otherwise the turns without any condition are taken in order, counted
per session, and the last one repeats once they are used up. The conditions are
``when_prompt_contains`` (a substring of the text), ``when_prompt_matches`` (a Python regular
expression found anywhere in the text, as :func:`re.search` finds it: anchor it with ``^``
and ``$``, give flags inline such as ``(?i)``; one that does not compile is refused with the
script) and, for agents served in memory only, ``when`` (a Python callable given the text,
true to take the turn): a script with one cannot be written as JSON.
``session/cancel`` stops the running turn at once (between steps, or while it sleeps,
stalls or waits for any answer of the client) and the prompt answers
``cancel_stop_reason``; with ``ignore_cancel`` the turn goes on as if nothing happened (a
stalled one never answers). ``error`` (``{"code", "message", "data"?}``) answers the
prompt with that JSON-RPC error instead of a stop reason. ``response_meta`` is sent as
the prompt response's ``_meta``. ``updates_after_response`` are steps run after the response
went out.

Steps (``{"op": ..., fields}``)
-------------------------------
``say``  ``text``, ``chunks`` (1): ``agent_message_chunk`` updates, the text cut in pieces.
``think``  ``text``, ``chunks`` (1): ``agent_thought_chunk`` updates.
``user``  ``text``: a ``user_message_chunk`` (for history replay).
``plan``  ``entries``: ``[{"content", "priority": "medium", "status": "pending"}]``.
``tool_call``  ``id``, ``title``, ``kind`` ("other"), ``status`` ("pending"),
    ``locations`` ([{"path", "line"?}]), ``raw_input`` (null), ``content`` ([]: raw
    ToolCallContent, see ``text_content``, ``diff_content``, ``terminal_content``).
``tool_update``  ``id``, ``status``, ``title``, ``kind``, ``locations``, ``content``,
    ``raw_output`` (each null = not sent): a ``tool_call_update``.
``usage``  ``used``, ``size``, ``cost`` (null), ``currency`` ("USD"): ``usage_update``.
``update``  ``update``: any raw ``sessionUpdate`` object, unknown kinds included.
``ask_permission``  ``tool_call`` (``{"id": "call-1", "title": "scripted tool call"}``;
    ``{"id", "title"?, "kind"?, "status"?, "locations"?, "raw_input"?, "content"?}``),
    ``options`` (allow_once "allow" / reject_once "reject";
    ``[{"optionId", "name", "kind"}]``), ``on_reject`` ("end_turn" | "continue" |
    "cancelled"): sends ``session/request_permission``; a reject_* option (or an error
    answer) then ends the turn with ``end_turn``, goes on, or ends it with ``cancelled``;
    an answer ``cancelled`` ends the turn with ``cancelled``.
``read_file``  ``path``, ``line``, ``limit``, ``then_write`` (null or ``{"old", "new",
    "count": -1}``): ``fs/read_text_file``, then optionally ``fs/write_text_file`` of the
    content with ``old`` replaced by ``new``. Relative paths are joined to the session cwd.
``write_file``  ``path``, ``content``: ``fs/write_text_file``.
``write_disk``  ``path``, ``content``: writes the file itself under the session cwd.
``delete_disk``  ``path``: deletes the file itself.
    Their ``path`` is a name in the display form of :mod:`orchestrator._names`: ``\\xHH`` is
    a byte that is not UTF-8 (``caf\\xe9.txt``), so a script can make such names.
``spawn``  ``argv``, ``detach`` (false), ``to_client`` (false): runs a program itself, in the
    session cwd, behind the client's back (as agents run their own tools), and records
    ``spawn`` {argv, exitCode}. Its stdin is ``/dev/null``, its stderr the agent's, its stdout
    ``/dev/null`` too unless ``to_client``: then what it prints is sent to the client as is,
    once it exited (raw bytes, frames that are not JSON or not UTF-8). With ``detach`` the
    program double-forks and starts a session of its own (``setsid``), as a daemon does,
    with stdin, stdout and stderr on ``/dev/null``; the agent does not wait for it and
    records ``spawn`` {argv, pid} (the daemon's pid). One that cannot start records {argv,
    error}.
``terminal``  ``command``, ``args`` (null: not sent), ``cwd`` (null), ``env`` ({}),
    ``output_byte_limit`` (null), ``tool_call_id`` (null: when set, a ``tool_call``
    embedding the terminal is sent, then completed), ``timeout`` (null: seconds before
    ``terminal/kill``): ``terminal/create``, ``wait_for_exit``, ``output``, ``release``.
``request``  ``method``, ``params`` (null): any request (e.g. "craft/drainMidTurnQueue");
    its result or error is recorded and the turn goes on.
``notify``  ``method``, ``params`` (null): any notification.
``huge_line``  ``size_bytes``: one ``agent_message_chunk`` line of exactly that many
    bytes, newline included.
``raw``  ``text``: written verbatim (a newline is added when missing).
``sleep``  ``seconds``.
``stall``  never finishes (a cancel still ends it unless ``ignore_cancel``).
``crash``  ``exit_code`` (1), ``stderr`` (""): exit at once (in memory: close the stream).
``flood``  ``count``, ``text`` ("x"): that many ``agent_message_chunk`` lines, pre-encoded.
``flood_requests``  ``count``, ``method`` ("fs/read_text_file"), ``params`` ({}: the
    session's ``sessionId`` is added to an object without one, and a relative ``path`` is
    joined to the session cwd), ``read_answers`` (false): that many requests (ids
    ``"flood-0"``, ``"flood-1"``, ...), pre-encoded and written as fast as possible. Without
    ``read_answers`` the agent first stops reading what the client sends (the answers pile
    up on the client's side, as with a hostile or wedged agent), records ``flood_requests``
    {method, count} once they are written, and the turn then never ends (nothing it could
    hear would end it). With ``read_answers`` it goes on reading, waits for every answer and
    records ``flood_requests`` {method, count, answered, errors} (answers are counted, not
    recorded one by one).

The agent does not check the client's capabilities before its own requests, so a script
can also test how a client refuses what it did not advertise.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, Literal, TypeAlias, get_args

import attrs
from attrs import field, frozen
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override

from orchestrator.errors import UsageError
from orchestrator.testing._script_json import JsonMixin, JsonObject, converter
from orchestrator.testing._script_pieces import (
    ALLOW_REJECT,
    AuthMethod,
    Capabilities,
    ConfigOption,
    ConfigValue,
    ErrorReply,
    ExitAtStart,
    Location,
    Mode,
    PermissionOption,
    PermissionToolCall,
    PlanEntry,
    Replace,
    ToolKind,
    ToolStatus,
    diff_content,
    terminal_content,
    text_content,
)

__all__ = [
    "ALLOW_REJECT",
    "AgentScript",
    "AskPermission",
    "AuthMethod",
    "Capabilities",
    "ConfigOption",
    "ConfigValue",
    "Crash",
    "DeleteDisk",
    "ErrorReply",
    "ExitAtStart",
    "Flood",
    "FloodRequests",
    "HugeLine",
    "JsonObject",
    "Location",
    "Mode",
    "Notify",
    "PermissionOption",
    "PermissionToolCall",
    "Plan",
    "PlanEntry",
    "PromptPredicate",
    "Raw",
    "ReadFile",
    "Replace",
    "Request",
    "Say",
    "Sleep",
    "Spawn",
    "Stall",
    "Step",
    "Terminal",
    "Think",
    "ToolCall",
    "ToolUpdate",
    "Turn",
    "Update",
    "Usage",
    "UserMessage",
    "WriteDisk",
    "WriteFile",
    "diff_content",
    "terminal_content",
    "text_content",
]

# the tool call of an ``AskPermission`` that names none
_DEFAULT_TOOL_CALL = PermissionToolCall("call-1", title="scripted tool call")

StopReason = Literal["end_turn", "max_tokens", "max_turn_requests", "refusal", "cancelled"]


class _StepJson(JsonMixin):
    """A step's JSON form carries its ``op``: steps go through the ``Step`` union's hooks."""

    __slots__ = ()

    @classmethod
    def _json_type(cls) -> Any:
        return Step


# --------------------------------------------------------------------------- steps

_ge0 = attrs.validators.ge(0)
_ge0_float = attrs.validators.ge(0.0)


# Sequence fields take any iterable (a list reads best in a script) and keep a tuple, so a
# script stays frozen and hashable. One named converter per element type: mypy's attrs plugin
# types ``__init__`` from the converter's parameter, and reads no generic one.
def _plan_entries(value: Iterable[PlanEntry]) -> tuple[PlanEntry, ...]:
    return tuple(value)


def _locations(value: Iterable[Location]) -> tuple[Location, ...]:
    return tuple(value)


def _options(value: Iterable[PermissionOption]) -> tuple[PermissionOption, ...]:
    return tuple(value)


def _steps(value: Iterable[Step]) -> tuple[Step, ...]:
    return tuple(value)


def _turns(value: Iterable[Turn]) -> tuple[Turn, ...]:
    return tuple(value)


def _auth_methods(value: Iterable[AuthMethod]) -> tuple[AuthMethod, ...]:
    return tuple(value)


def _modes(value: Iterable[Mode]) -> tuple[Mode, ...]:
    return tuple(value)


def _config_options(value: Iterable[ConfigOption]) -> tuple[ConfigOption, ...]:
    return tuple(value)


@frozen
class Say(_StepJson):
    """``agent_message_chunk`` updates carrying ``text`` in ``chunks`` pieces."""

    op: ClassVar[str] = "say"
    text: str
    chunks: int = field(default=1, validator=attrs.validators.ge(1))


@frozen
class Think(_StepJson):
    """``agent_thought_chunk`` updates carrying ``text`` in ``chunks`` pieces."""

    op: ClassVar[str] = "think"
    text: str
    chunks: int = field(default=1, validator=attrs.validators.ge(1))


@frozen
class UserMessage(_StepJson):
    """A ``user_message_chunk`` update (history replay)."""

    op: ClassVar[str] = "user"
    text: str


@frozen
class Plan(_StepJson):
    """A ``plan`` update."""

    op: ClassVar[str] = "plan"
    entries: tuple[PlanEntry, ...] = field(default=(), converter=_plan_entries)


@frozen
class ToolCall(_StepJson):
    """A ``tool_call`` update."""

    op: ClassVar[str] = "tool_call"
    id: str
    title: str
    kind: ToolKind = "other"
    status: ToolStatus = "pending"
    locations: tuple[Location, ...] = field(default=(), converter=_locations)
    raw_input: Any = None
    content: tuple[JsonObject, ...] = ()


@frozen
class ToolUpdate(_StepJson):
    """A ``tool_call_update`` patch; fields left None are not sent."""

    op: ClassVar[str] = "tool_update"
    id: str
    status: ToolStatus | None = None
    title: str | None = None
    kind: ToolKind | None = None
    locations: tuple[Location, ...] | None = None
    content: tuple[JsonObject, ...] | None = None
    raw_output: Any = None


@frozen
class Usage(_StepJson):
    """A ``usage_update``."""

    op: ClassVar[str] = "usage"
    used: int = field(validator=_ge0)
    size: int = field(validator=_ge0)
    cost: float | None = None
    currency: str = "USD"


@frozen
class Update(_StepJson):
    """Any raw ``sessionUpdate`` object, sent as is."""

    op: ClassVar[str] = "update"
    update: JsonObject


@frozen
class AskPermission(_StepJson):
    """``session/request_permission``; see the module docs for ``on_reject``."""

    op: ClassVar[str] = "ask_permission"
    tool_call: PermissionToolCall = _DEFAULT_TOOL_CALL  # frozen: safe to share
    options: tuple[PermissionOption, ...] = field(default=ALLOW_REJECT, converter=_options)
    on_reject: Literal["end_turn", "continue", "cancelled"] = "end_turn"


@frozen
class ReadFile(_StepJson):
    """``fs/read_text_file``, optionally followed by a transformed ``fs/write_text_file``."""

    op: ClassVar[str] = "read_file"
    path: str
    line: int | None = None
    limit: int | None = None
    then_write: Replace | None = None


@frozen
class WriteFile(_StepJson):
    """``fs/write_text_file``."""

    op: ClassVar[str] = "write_file"
    path: str
    content: str


@frozen
class WriteDisk(_StepJson):
    """Write a file directly under the session cwd, behind the client's back."""

    op: ClassVar[str] = "write_disk"
    path: str
    content: str


@frozen
class DeleteDisk(_StepJson):
    """Delete a file directly under the session cwd."""

    op: ClassVar[str] = "delete_disk"
    path: str


@frozen
class Spawn(_StepJson):
    """Run a program as the agent itself, not through the client (see the module docs)."""

    op: ClassVar[str] = "spawn"
    argv: tuple[str, ...] = field(validator=attrs.validators.min_len(1))
    detach: bool = False
    to_client: bool = False


@frozen
class Terminal(_StepJson):
    """Run a command through the client's ``terminal/*`` methods."""

    op: ClassVar[str] = "terminal"
    command: str
    args: tuple[str, ...] | None = None
    cwd: str | None = None
    env: dict[str, str] = field(factory=dict)
    output_byte_limit: int | None = None
    tool_call_id: str | None = None
    timeout: float | None = None


@frozen
class Request(_StepJson):
    """Any agent->client request; the answer is recorded and the turn goes on."""

    op: ClassVar[str] = "request"
    method: str
    params: Any = None


@frozen
class Notify(_StepJson):
    """Any agent->client notification."""

    op: ClassVar[str] = "notify"
    method: str
    params: Any = None


@frozen
class HugeLine(_StepJson):
    """One ``agent_message_chunk`` line of exactly ``size_bytes`` bytes (newline included)."""

    op: ClassVar[str] = "huge_line"
    size_bytes: int = field(validator=_ge0)


@frozen
class Raw(_StepJson):
    """Text written verbatim to the client (a malformed line, say)."""

    op: ClassVar[str] = "raw"
    text: str


@frozen
class Sleep(_StepJson):
    """Wait (a cancel ends the wait)."""

    op: ClassVar[str] = "sleep"
    seconds: float = field(validator=_ge0_float)


@frozen
class Stall(_StepJson):
    """Never finish this turn."""

    op: ClassVar[str] = "stall"


@frozen
class Crash(_StepJson):
    """Exit at once mid-turn (in memory: close the stream)."""

    op: ClassVar[str] = "crash"
    exit_code: int = 1
    stderr: str = ""


@frozen
class Flood(_StepJson):
    """``count`` identical ``agent_message_chunk`` lines, as fast as possible."""

    op: ClassVar[str] = "flood"
    count: int = field(validator=_ge0)
    text: str = "x"


@frozen
class FloodRequests(_StepJson):
    """``count`` requests of ``method`` as fast as possible, answers read or left unread."""

    op: ClassVar[str] = "flood_requests"
    count: int = field(validator=_ge0)
    method: str = "fs/read_text_file"
    params: JsonObject = field(factory=dict)
    read_answers: bool = False


Step: TypeAlias = (
    Say
    | Think
    | UserMessage
    | Plan
    | ToolCall
    | ToolUpdate
    | Usage
    | Update
    | AskPermission
    | ReadFile
    | WriteFile
    | WriteDisk
    | DeleteDisk
    | Spawn
    | Terminal
    | Request
    | Notify
    | HugeLine
    | Raw
    | Sleep
    | Stall
    | Crash
    | Flood
    | FloodRequests
)
_STEP_CLASSES: dict[str, type[Any]] = {cls.op: cls for cls in get_args(Step)}


# --------------------------------------------------------------------------- turns and agent


def _check_pattern(_: Any, attribute: attrs.Attribute[Any], value: str | None) -> None:
    if value is None:
        return
    try:
        re.compile(value)
    except re.error as e:
        raise ValueError(f"{attribute.name}: {value!r} is not a regular expression: {e}") from e


#: a condition on the prompt's text, for a turn of an agent served in memory
PromptPredicate: TypeAlias = Callable[[str], bool]


@frozen
class Turn(JsonMixin):
    """What the agent does for one ``session/prompt``; see the module docs for its conditions."""

    steps: tuple[Step, ...] = field(default=(), converter=_steps)
    stop_reason: StopReason = "end_turn"
    when_prompt_contains: str | None = None
    cancel_stop_reason: StopReason = "cancelled"
    ignore_cancel: bool = False
    updates_after_response: tuple[Step, ...] = field(default=(), converter=_steps)
    error: ErrorReply | None = None
    when_prompt_matches: str | None = field(default=None, validator=_check_pattern)
    #: sent as the prompt response's ``_meta`` (as some agents send token counts)
    response_meta: JsonObject | None = None
    #: in memory only: a script with it has no JSON form
    when: PromptPredicate | None = field(default=None, kw_only=True)

    @property
    def conditional(self) -> bool:
        """Whether the turn is taken by a condition on the prompt, not in order."""
        return (
            self.when_prompt_contains is not None
            or self.when_prompt_matches is not None
            or self.when is not None
        )

    def matches(self, text: str) -> bool:
        """Whether the turn has conditions and they all hold for the prompt's ``text``."""
        if not self.conditional:
            return False
        if self.when_prompt_contains is not None and self.when_prompt_contains not in text:
            return False
        if self.when_prompt_matches is not None and not re.search(self.when_prompt_matches, text):
            return False
        return self.when is None or bool(self.when(text))


@frozen
class AgentScript(JsonMixin):
    """Everything a scripted agent advertises and does; see the module docs."""

    name: str = "scripted-agent"
    title: str | None = "Scripted Agent"
    version: str = "0.1.0"
    protocol_version: int = 1
    # A frozen value, safe to share (ruff cannot see that through the import).
    capabilities: Capabilities = Capabilities()  # noqa: RUF009
    auth_methods: tuple[AuthMethod, ...] = field(default=(), converter=_auth_methods)
    require_auth: bool = False
    modes: tuple[Mode, ...] = field(default=(), converter=_modes)
    current_mode: str | None = None
    config_options: tuple[ConfigOption, ...] = field(default=(), converter=_config_options)
    id_style: Literal["int", "string"] = "int"
    session_id_prefix: str = "sess-"
    exit_at_start: ExitAtStart | None = None
    initialize_delay: float = field(default=0.0, validator=_ge0_float)
    turns: tuple[Turn, ...] = field(default=(), converter=_turns)
    load_history: tuple[Step, ...] = field(default=(), converter=_steps)
    record_path: str | None = None
    #: keep running once stdin closes (until a signal ends it), as some agents do
    ignore_stdin_close: bool = False


# --------------------------------------------------------------------------- converter


def _structure_step(value: Any, _: Any) -> Any:
    if not isinstance(value, dict):
        raise TypeError(f"a step must be an object, got {type(value).__name__}")
    op = value.get("op")
    cls = _STEP_CLASSES.get(op) if isinstance(op, str) else None
    if cls is None:
        raise ValueError(f"unknown step op {op!r}; known: {', '.join(sorted(_STEP_CLASSES))}")
    rest = {k: v for k, v in value.items() if k != "op"}
    return converter.structure(rest, cls)


def _unstructure_step(step: Any) -> JsonObject:
    return {"op": step.op, **converter.unstructure(step, type(step))}


converter.register_structure_hook(Step, _structure_step)
converter.register_unstructure_hook(Step, _unstructure_step)


# A turn's predicate is Python code: it has no JSON form, and JSON cannot give one.
_structure_turn = make_dict_structure_fn(
    Turn, converter, _cattrs_forbid_extra_keys=True, when=override(omit=True)
)
_unstructure_turn_fields = make_dict_unstructure_fn(
    Turn, converter, _cattrs_omit_if_default=True, when=override(omit=True)
)


def _unstructure_turn(turn: Turn) -> JsonObject:
    if turn.when is not None:
        raise UsageError(
            "a turn matched by a Python predicate (when=...) has no JSON form: it works only in "
            "an agent served in memory; match a subprocess agent's prompt with "
            "when_prompt_matches (a regular expression) or when_prompt_contains"
        )
    data: JsonObject = _unstructure_turn_fields(turn)
    return data


converter.register_structure_hook(Turn, _structure_turn)
converter.register_unstructure_hook(Turn, _unstructure_turn)
