"""The ACP-shaped values of agent scripts: locations, options, modes, capabilities ...

Part of the script format documented in :mod:`orchestrator.testing.script`, which
re-exports every public name here. Objects that ACP itself defines keep their ACP wire
names in JSON (``optionId``, ``currentValue``).
"""

from __future__ import annotations

from typing import Any, Literal

from attrs import field, frozen

from orchestrator.testing._script_json import WIRE, JsonMixin, JsonObject, wire_names

__all__ = [
    "ALLOW_REJECT",
    "AuthMethod",
    "Capabilities",
    "ConfigOption",
    "ConfigValue",
    "ErrorReply",
    "ExitAtStart",
    "Location",
    "Mode",
    "OptionKind",
    "PermissionOption",
    "PermissionToolCall",
    "PlanEntry",
    "Replace",
    "ToolKind",
    "ToolStatus",
    "diff_content",
    "terminal_content",
    "text_content",
]

ToolKind = Literal[
    "read", "edit", "delete", "move", "search", "execute", "think", "fetch", "switch_mode", "other"
]
ToolStatus = Literal["pending", "in_progress", "completed", "failed"]
OptionKind = Literal["allow_once", "allow_always", "reject_once", "reject_always"]


@frozen
class Location(JsonMixin):
    """A path (and 1-based line) a tool call touches."""

    path: str
    line: int | None = None


@frozen
class PlanEntry(JsonMixin):
    """One entry of a ``plan`` update."""

    content: str
    priority: Literal["high", "medium", "low"] = "medium"
    status: Literal["pending", "in_progress", "completed"] = "pending"


@wire_names
@frozen
class PermissionOption(JsonMixin):
    """One option offered by ``session/request_permission`` (JSON: ``optionId``)."""

    option_id: str = field(metadata={WIRE: "optionId"})
    name: str
    kind: OptionKind


ALLOW_REJECT: tuple[PermissionOption, ...] = (
    PermissionOption("allow", "allow", "allow_once"),
    PermissionOption("reject", "reject", "reject_once"),
)
"""The default permission options: ``allow`` (allow_once) and ``reject`` (reject_once)."""


@frozen
class AuthMethod(JsonMixin):
    """An entry of ``authMethods``: an agent method, or with ``type="terminal"`` a login
    the client runs in a terminal with ``args`` added to the agent's command."""

    id: str
    name: str
    description: str | None = None
    type: str | None = None
    args: tuple[str, ...] | None = None


@frozen
class Mode(JsonMixin):
    """A session mode returned by ``session/new``."""

    id: str
    name: str
    description: str | None = None


@frozen
class ConfigValue(JsonMixin):
    """A value of a ``select`` config option."""

    value: str
    name: str
    description: str | None = None


@wire_names
@frozen
class ConfigOption(JsonMixin):
    """A session config option (JSON: its ACP wire form, ``currentValue`` ...)."""

    id: str
    name: str
    current_value: str | bool = field(metadata={WIRE: "currentValue"})
    type: Literal["select", "boolean"] = "select"
    options: tuple[ConfigValue, ...] = ()
    category: str | None = None
    description: str | None = None


@frozen
class Capabilities(JsonMixin):
    """What the agent advertises in ``agentCapabilities`` (all off by default)."""

    load_session: bool = False
    image: bool = False
    audio: bool = False
    embedded_context: bool = False
    mcp_http: bool = False
    mcp_sse: bool = False
    session_list: bool = False
    session_resume: bool = False
    session_close: bool = False
    session_delete: bool = False
    logout: bool = False


@frozen
class ErrorReply(JsonMixin):
    """A JSON-RPC error object the agent answers with."""

    code: int
    message: str
    data: Any = None


@frozen
class ExitAtStart(JsonMixin):
    """Exit before answering ``initialize``."""

    exit_code: int = 1
    stderr: str = ""
    wait_for_initialize: bool = True


@frozen
class PermissionToolCall(JsonMixin):
    """The tool call a permission request is about."""

    id: str
    title: str | None = None
    kind: ToolKind | None = None
    status: ToolStatus | None = None
    locations: tuple[Location, ...] = ()
    raw_input: Any = None
    content: tuple[JsonObject, ...] = ()


@frozen
class Replace(JsonMixin):
    """Transform read content: replace ``old`` by ``new`` (``count`` -1: every one)."""

    old: str
    new: str
    count: int = -1

    def apply(self, text: str) -> str:
        """The transformed text."""
        return text.replace(self.old, self.new, self.count)


def text_content(text: str) -> JsonObject:
    """A ToolCallContent holding a text block."""
    return {"type": "content", "content": {"type": "text", "text": text}}


def diff_content(path: str, new_text: str, old_text: str | None = None) -> JsonObject:
    """A ToolCallContent diff (``old_text`` None: a new file)."""
    return {"type": "diff", "path": path, "oldText": old_text, "newText": new_text}


def terminal_content(terminal_id: str) -> JsonObject:
    """A ToolCallContent embedding a terminal."""
    return {"type": "terminal", "terminalId": terminal_id}
