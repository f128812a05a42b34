"""The scripts of the model server: actions, scenarios, what a request says, tool choice.

Part of :mod:`orchestrator.testing.model_server` (import from there).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from typing import Any, Literal

from attrs import field, frozen

from orchestrator.errors import UsageError
from orchestrator.testing import _model_gemini as gemini

Api = Literal["openai", "anthropic", "gemini"]


# --------------------------------------------------------------------------- actions


@frozen
class Read:
    """Read a file (a path relative to the session's directory, or absolute)."""

    path: str


@frozen
class Edit:
    """Replace ``old`` by ``new`` in a file."""

    path: str
    old: str
    new: str


@frozen
class Write:
    """Write a whole file."""

    path: str
    content: str


@frozen
class Shell:
    """Run a shell command line."""

    command: str
    #: a short description, for tools that require one
    description: str = "run a command"


@frozen
class Reply:
    """Answer with text and end the turn."""

    text: str


@frozen
class Stall:
    """Start a streamed answer with ``text``, then send nothing until the client goes away.

    For cancellation tests: :meth:`ModelServer.wait_for_stall` returns once a request stalls.
    """

    text: str = "Thinking"


@frozen
class Tool:
    """Call any tool the request offers by name (an MCP server's, say) with ``arguments``.

    ``name`` is the tool's name, or several names the agent may give it (the first offered is
    called): agents name an MCP server's tools after the server, each its own way
    (``mcp__SERVER__TOOL`` for Claude Code, ``TOOL`` or ``SERVER__TOOL`` for Qwen Code).
    """

    name: str | tuple[str, ...]
    arguments: Mapping[str, Any] = field(factory=dict)

    @property
    def names(self) -> tuple[str, ...]:
        """The names it may be offered under, most preferred first."""
        return (self.name,) if isinstance(self.name, str) else tuple(self.name)


Action = Read | Edit | Write | Shell | Reply | Stall | Tool


@frozen
class Scenario:
    """A script of actions, chosen by ``marker`` appearing in a user message."""

    #: the word that selects this scenario (searched in user messages, newest first)
    marker: str
    #: one action per model request; after the last one the server replies ``done``
    actions: tuple[Action, ...]
    #: the reply once the actions are exhausted
    done: str = "Done."


@frozen
class Rule:
    """A scenario-independent answer: when ``when(request)`` holds, play ``action``.

    Rules are tried before scenarios, e.g. "if the last message is a tool result for X ...".
    """

    when: Callable[[ModelRequest], bool]
    action: Action
    name: str = "rule"


@frozen
class ToolChoice:
    """A tool call chosen for an action: the tool's name and its arguments."""

    name: str
    arguments: dict[str, Any]


# --------------------------------------------------------------------------- requests


@frozen
class Refused:
    """A request in proxy form, refused with 403."""

    #: ``CONNECT`` or the method of an absolute-URI request
    method: str
    #: the request target as sent (``host:port`` or an absolute URI)
    target: str
    #: the host the client wanted to reach
    host: str
    t: float


@frozen
class ModelRequest:
    """One model request as the server saw it, and what it answered."""

    api: Api
    path: str
    headers: Mapping[str, str]
    body: Mapping[str, Any]
    t: float
    #: the marker of the scenario that answered, or a rule's name, or None
    scenario: str | None = None
    #: the index of the action played
    step: int | None = None
    #: the action played (None: plain text for a request without tools)
    action: Action | None = None
    #: the tool call sent, if any
    tool_call: ToolChoice | None = None

    @property
    def stream(self) -> bool:
        """Whether the client asked for a streamed answer."""
        if self.api == "gemini":
            return self.path.endswith(gemini.STREAM)
        return bool(self.body.get("stream"))

    @property
    def tool_names(self) -> list[str]:
        """Names of the tools the request offered."""
        return [name for name, _ in _tools(self.api, self.body)]

    def system_text(self) -> str:
        """The system prompt as text."""
        if self.api == "anthropic":
            return _blocks_text(self.body.get("system"))
        if self.api == "gemini":
            return gemini.system_text(self.body)
        return "\n".join(
            _blocks_text(m.get("content"))
            for m in _messages(self.body)
            if m.get("role") in ("system", "developer")
        )

    def user_texts(self) -> list[str]:
        """The text of every user message, oldest first (tool results excluded)."""
        return [text for role, text in _conversation(self.api, self.body) if role == "user"]

    def tool_results(self) -> list[str]:
        """The text of every tool result in the conversation, oldest first."""
        return [text for role, text in _conversation(self.api, self.body) if role == "tool"]

    def all_text(self) -> str:
        """System prompt and every message as one text (for searching)."""
        parts = [self.system_text()]
        parts += [text for _, text in _conversation(self.api, self.body)]
        return "\n".join(parts)


def _messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    return [m for m in messages if isinstance(m, dict)] if isinstance(messages, list) else []


def _blocks_text(content: Any) -> str:
    """Text of a content value: a string or a list of blocks (text, tool results...)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    parts: list[str] = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, dict):
            if isinstance(block.get("text"), str):
                parts.append(block["text"])
            elif block.get("type") == "tool_result":
                parts.append(_blocks_text(block.get("content")))
    return "\n".join(parts)


def _conversation(api: Api, body: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The messages as (role, text): roles ``user``, ``assistant``, ``tool``.

    Anthropic tool results travel in user messages; they are split out as ``tool`` entries.
    """
    if api == "gemini":
        return gemini.conversation(body)
    out: list[tuple[str, str]] = []
    for message in _messages(body):
        role, content = message.get("role"), message.get("content")
        if api == "openai":
            if role in ("user", "assistant", "tool"):
                out.append((str(role), _blocks_text(content)))
            continue
        if role == "assistant":
            out.append(("assistant", _blocks_text(content)))
        elif role == "user":
            blocks = content if isinstance(content, list) else [content]
            results = [b for b in blocks if isinstance(b, dict) and b.get("type") == "tool_result"]
            others = [b for b in blocks if b not in results]
            # text riding along with tool results (reminders) goes first, so a conversation
            # that ends with tool results still ends with a "tool" entry
            if others:
                out.append(("user", _blocks_text(others)))
            out.extend(("tool", _blocks_text([r])) for r in results)
    return out


def _tools(api: Api, body: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The offered tools as (name, JSON schema of the parameters)."""
    if api == "gemini":
        return gemini.tools(body)
    tools = body.get("tools")
    out: list[tuple[str, dict[str, Any]]] = []
    for tool in tools if isinstance(tools, list) else []:
        if not isinstance(tool, dict):
            continue
        spec = tool.get("function", tool) if api == "openai" else tool
        name = spec.get("name")
        schema = spec.get("parameters" if api == "openai" else "input_schema") or {}
        if isinstance(name, str):
            out.append((name, schema if isinstance(schema, dict) else {}))
    return out


# --------------------------------------------------------------------------- choosing tools

#: tool names per action, most preferred first: the ACP adapter's own tools (they go through
#: the client's fs/terminal), then Claude Code's, then Qwen Code's / Gemini CLI's
TOOL_NAMES: dict[type, tuple[str, ...]] = {
    Read: ("mcp__acp__Read", "Read", "read_file", "ReadFile", "read"),
    Edit: ("mcp__acp__Edit", "Edit", "edit", "replace", "edit_file"),
    Write: ("mcp__acp__Write", "Write", "write_file", "WriteFile", "write"),
    Shell: ("mcp__acp__Bash", "Bash", "run_shell_command", "shell", "bash"),
}

_PATH_KEYS = ("file_path", "absolute_path", "path", "filePath", "filename")

#: how agents tell the model their working directory
CWD_PATTERNS = (
    re.compile(r"Working directory:\s*(/[^\s`'\"<>]+)"),
    re.compile(r"working in the directory:?\s*[`'\"]?(/[^\s`'\"<>]+)", re.IGNORECASE),
    re.compile(r"current working directory(?: is)?:?\s*[`'\"]?(/[^\s`'\"<>]+)", re.IGNORECASE),
    re.compile(r"<cwd>\s*(/[^\s<]+)\s*</cwd>"),
)


def find_cwd(request: ModelRequest) -> str | None:
    """The session directory the agent told the model about, or None."""
    text = request.all_text()
    for pattern in CWD_PATTERNS:
        match = pattern.search(text)
        if match:
            return match.group(1).rstrip(".,;:")
    return None


def choose_tool(action: Action, request: ModelRequest) -> ToolChoice | None:
    """The tool call that performs ``action`` with the tools ``request`` offers, or None."""
    if isinstance(action, Tool):
        offered_names = request.tool_names
        found = next((n for n in action.names if n in offered_names), None)
        return None if found is None else ToolChoice(found, dict(action.arguments))
    names = TOOL_NAMES.get(type(action))
    if names is None:
        return None
    offered = dict(_tools(request.api, request.body))
    name = next((n for n in names if n in offered), None)
    if name is None:
        return None
    props = offered[name].get("properties") or {}
    required = offered[name].get("required") or []
    args: dict[str, Any] = {}
    if isinstance(action, Read | Edit | Write):
        path = action.path
        if not os.path.isabs(path):
            cwd = find_cwd(request)
            path = os.path.join(cwd, path) if cwd else path
        key = next((k for k in _PATH_KEYS if k in props), "file_path")
        args[key] = path
    if isinstance(action, Edit):
        args["old_string"] = action.old
        args["new_string"] = action.new
        if "instruction" in props:
            # Gemini CLI's replace requires one
            args["instruction"] = f"Replace {action.old!r} with {action.new!r}."
    elif isinstance(action, Write):
        args["content"] = action.content
    elif isinstance(action, Shell):
        args["command"] = action.command
        if "description" in props or "description" in required:
            args["description"] = action.description
        if "is_background" in required:
            args["is_background"] = False
        if "timeout" in props:
            # Claude Code's ACP Bash wants it although its schema calls it optional (ms)
            args["timeout"] = 60000
    return ToolChoice(name, args)


def _action_from_json(obj: Mapping[str, Any]) -> Action:
    if "read" in obj:
        return Read(str(obj["read"]))
    if "edit" in obj:
        e = obj["edit"]
        return Edit(str(e["path"]), str(e["old"]), str(e["new"]))
    if "write" in obj:
        w = obj["write"]
        return Write(str(w["path"]), str(w["content"]))
    if "shell" in obj:
        return Shell(str(obj["shell"]))
    if "reply" in obj:
        return Reply(str(obj["reply"]))
    if "stall" in obj:
        return Stall(str(obj["stall"] or "Thinking"))
    if "tool" in obj:
        t = obj["tool"]
        name = t["name"]
        return Tool(name if isinstance(name, str) else tuple(name), dict(t.get("arguments") or {}))
    raise UsageError(
        f"unknown action {dict(obj)!r}: expected read, edit, write, shell, reply, stall, tool"
    )


def scenarios_from_json(data: Any) -> list[Scenario]:
    """Scenarios from JSON: ``{"scenarios": [{"marker": M, "actions": [...], "done": T}]}``.

    Actions: ``{"read": PATH}``, ``{"edit": {"path", "old", "new"}}``,
    ``{"write": {"path", "content"}}``, ``{"shell": COMMAND}``, ``{"reply": TEXT}``,
    ``{"stall": TEXT}``, ``{"tool": {"name": NAME or [NAMES], "arguments": {...}}}``.
    """
    try:
        return [
            Scenario(
                str(s["marker"]),
                tuple(_action_from_json(a) for a in s["actions"]),
                done=str(s.get("done", "Done.")),
            )
            for s in data["scenarios"]
        ]
    except (KeyError, TypeError) as e:
        raise UsageError(f"bad scenario file: {e!r}") from e
