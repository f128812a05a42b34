"""What a prompt turn produced: text, thoughts, tool calls, plan, usage and the rest.

:class:`TurnAccumulator` folds ``session/update`` values into a :class:`TurnResult` as they
arrive (pure code, no I/O). Tool calls are merged from the full ``tool_call`` and the
``tool_call_update`` patches, where only the fields present change.
"""

from __future__ import annotations

import json
from typing import Any

from attrs import define, field, frozen

from .._sizes import (
    DEFAULT_MAX_TURN_RECORD_BYTES,
    MAX_TOOL_ERROR_CHARS,
    bounded_text,
    first_within,
)
from ..protocol import types as t
from ..protocol.codec import unstructure
from .services import PermissionRecord

__all__ = [
    "DEFAULT_MAX_TURN_RECORD_BYTES",
    "MAX_TOOL_ERROR_CHARS",
    "ToolCallState",
    "TurnAccumulator",
    "TurnResult",
    "content_text",
]

#: a failed tool call's error text keeps at most this many characters in ``--json``


@define
class ToolCallState:
    """A tool call as known so far: the ``tool_call`` with every later patch applied."""

    tool_call_id: str
    title: str | None = None
    kind: str | None = None
    status: str | None = None
    content: list[t.ToolCallContent] = field(factory=list)
    locations: list[t.ToolCallLocation] = field(factory=list)
    raw_input: Any = None
    raw_output: Any = None
    #: how many patches were applied after the first sighting
    updates: int = 0

    def apply(self, update: t.ToolCall | t.ToolCallUpdate) -> None:
        """Merge a full call or a patch: fields the update leaves out keep their value."""
        if update.title is not None:
            self.title = update.title
        if update.kind is not None:
            self.kind = update.kind
        if update.status is not None:
            self.status = update.status
        if update.content is not None:
            self.content = list(update.content)
        if update.locations is not None:
            self.locations = list(update.locations)
        if update.raw_input is not None:
            self.raw_input = update.raw_input
        if update.raw_output is not None:
            self.raw_output = update.raw_output

    def diffs(self) -> list[t.Diff]:
        """The diffs in this call's content."""
        return [c for c in self.content if isinstance(c, t.Diff)]

    def terminal_ids(self) -> list[str]:
        """The terminals embedded in this call's content."""
        return [c.terminal_id for c in self.content if isinstance(c, t.Terminal)]

    def error_text(self) -> str | None:
        """What the agent sent with a failed call: its content's text, else its raw output,
        cut to :data:`MAX_TOOL_ERROR_CHARS`; None when the call did not fail or said nothing."""
        if self.status != "failed":
            return None
        texts = [content_text(c.content) for c in self.content if isinstance(c, t.Content)]
        text = "\n".join(x for x in texts if x)
        if not text and self.raw_output is not None:
            raw = self.raw_output
            text = raw if isinstance(raw, str) else json.dumps(raw, default=str, sort_keys=True)
        return bounded_text(text, MAX_TOOL_ERROR_CHARS) if text else None

    def to_json(self) -> dict[str, Any]:
        """The summary used in ``--json`` output (with ``error`` when a failed call said why)."""
        out: dict[str, Any] = {
            "toolCallId": self.tool_call_id,
            "title": self.title,
            "kind": self.kind,
            "status": self.status,
        }
        error = self.error_text()
        if error is not None:
            out["error"] = error
        return out


@frozen
class TurnResult:
    """Everything one prompt turn produced, in arrival order where order matters."""

    #: why the turn ended (end_turn, cancelled, ...); a value newer than the schema passes.
    #: None when the agent did not end it (the client gave up on it after session/cancel, or
    #: it failed after its caller left): the rest is then what the turn did until that moment
    stop_reason: str | None
    #: the agent's message text, chunks joined
    text: str
    #: the agent's thought text, chunks joined
    thoughts: str
    #: tool calls by id, in first-seen order
    tool_calls: dict[str, ToolCallState]
    #: the latest plan entries
    plan: list[t.PlanEntry] | None
    #: the latest usage report
    usage: t.UsageUpdate | None
    #: the usage the prompt response reported (tokens), when the agent sends it
    response_usage: t.Usage | None
    #: mode changes, in order
    mode_changes: list[str]
    #: the latest config options the agent reported during the turn
    config_options: list[t.SessionConfigOption] | None
    #: session info updates (title and the like), in order
    session_info: list[t.SessionInfoUpdate]
    #: the latest available commands
    available_commands: list[t.AvailableCommand] | None
    #: the notices the agent sent for the user (``notice`` updates), in order
    notices: list[t.Notice]
    #: updates of kinds this schema release does not know, kept whole
    unknown_updates: list[t.UnknownSessionUpdate]
    #: the updates in arrival order; message and thought chunks only when the accumulator
    #: was asked to keep them (their text is always in ``text`` and ``thoughts``)
    updates: list[t.SessionUpdate]
    #: the records of the permission requests that arrived during the turn, cancelled ones
    #: included
    permissions: list[PermissionRecord]
    #: True when the client sent session/cancel during the turn
    cancel_requested: bool

    def notices_json(
        self, limit: int | None = DEFAULT_MAX_TURN_RECORD_BYTES
    ) -> list[dict[str, Any]]:
        """The notices for ``--json`` output and the record: each as on the wire without its
        ``sessionUpdate`` tag, the first ones that fit in ``limit`` bytes (None: all)."""
        out = []
        for notice in self.notices:
            wire = unstructure(notice)
            wire.pop("sessionUpdate", None)
            out.append(wire)
        return first_within(out, limit)

    def usage_json(self) -> dict[str, Any] | None:
        """Usage for ``--json`` output: the latest usage update and the response's token counts."""
        if self.usage is None and self.response_usage is None:
            return None
        out: dict[str, Any] = {}
        if self.usage is not None:
            out.update(unstructure(self.usage))
            out.pop("sessionUpdate", None)
        if self.response_usage is not None:
            out["tokens"] = unstructure(self.response_usage)
        return out


def content_text(block: t.ContentBlock) -> str:
    """The text of a content block, or a short placeholder for non-text blocks."""
    if isinstance(block, t.TextContent):
        return block.text
    if isinstance(block, t.ResourceLink):
        return f"[{block.name}]({block.uri})"
    return ""


@define
class TurnAccumulator:
    """Folds updates into a turn's result; feed it with :meth:`add`."""

    text: list[str] = field(factory=list)
    thoughts: list[str] = field(factory=list)
    tool_calls: dict[str, ToolCallState] = field(factory=dict)
    plan: list[t.PlanEntry] | None = None
    usage: t.UsageUpdate | None = None
    mode_changes: list[str] = field(factory=list)
    config_options: list[t.SessionConfigOption] | None = None
    session_info: list[t.SessionInfoUpdate] = field(factory=list)
    available_commands: list[t.AvailableCommand] | None = None
    notices: list[t.Notice] = field(factory=list)
    unknown_updates: list[t.UnknownSessionUpdate] = field(factory=list)
    updates: list[t.SessionUpdate] = field(factory=list)
    permissions: list[PermissionRecord] = field(factory=list)
    cancel_requested: bool = False
    #: keep message and thought chunks in ``updates`` too. Off by default: a flood of chunks
    #: kept alive costs the garbage collector more than everything else a turn does
    keep_chunks: bool = False

    def add(self, update: t.SessionUpdate) -> None:
        """Fold one update in."""
        # Nearly every update of a turn is a chunk holding a text block: that case reads the
        # text directly, without a call to content_text.
        if isinstance(update, t.AgentMessageChunk):
            block = update.content
            self.text.append(
                block.text if block.__class__ is t.TextContent else content_text(block)
            )
            if self.keep_chunks:
                self.updates.append(update)
            return
        if isinstance(update, t.AgentThoughtChunk):
            block = update.content
            self.thoughts.append(
                block.text if block.__class__ is t.TextContent else content_text(block)
            )
            if self.keep_chunks:
                self.updates.append(update)
            return
        self.updates.append(update)
        if isinstance(update, t.ToolCall | t.ToolCallUpdateSessionUpdate):
            state = self.tool_calls.get(update.tool_call_id)
            if state is None:
                state = self.tool_calls[update.tool_call_id] = ToolCallState(update.tool_call_id)
            else:
                state.updates += 1
            state.apply(update)
        elif isinstance(update, t.Plan):
            self.plan = list(update.entries)
        elif isinstance(update, t.UsageUpdate):
            self.usage = update
        elif isinstance(update, t.CurrentModeUpdate):
            self.mode_changes.append(update.current_mode_id)
        elif isinstance(update, t.ConfigOptionUpdate):
            self.config_options = list(update.config_options)
        elif isinstance(update, t.SessionInfoUpdate):
            self.session_info.append(update)
        elif isinstance(update, t.AvailableCommandsUpdate):
            self.available_commands = list(update.available_commands)
        elif isinstance(update, t.Notice):
            self.notices.append(update)
        elif isinstance(update, t.UnknownSessionUpdate):
            self.unknown_updates.append(update)

    def result(self, stop_reason: str | None, response_usage: t.Usage | None = None) -> TurnResult:
        """The turn's result, once its response has arrived (None: it never came)."""
        return TurnResult(
            stop_reason=stop_reason,
            text="".join(self.text),
            thoughts="".join(self.thoughts),
            tool_calls=dict(self.tool_calls),
            plan=self.plan,
            usage=self.usage,
            response_usage=response_usage,
            mode_changes=list(self.mode_changes),
            config_options=self.config_options,
            session_info=list(self.session_info),
            available_commands=self.available_commands,
            notices=list(self.notices),
            unknown_updates=list(self.unknown_updates),
            updates=list(self.updates),
            permissions=list(self.permissions),
            cancel_requested=self.cancel_requested,
        )
