"""Tests of turn accumulation: text, thoughts, merged tool calls, plan, usage, unknown kinds."""

from __future__ import annotations

from typing import Any

from orchestrator.agent.turn import MAX_TOOL_ERROR_CHARS, TurnAccumulator
from orchestrator.protocol import codec
from orchestrator.protocol import types as t


def update(raw: dict[str, Any]) -> t.SessionUpdate:
    """An update structured from its wire form."""
    result: t.SessionUpdate = codec.structure(raw, t.SessionUpdate)
    return result


def chunk(kind: str, text: str) -> t.SessionUpdate:
    """A message or thought chunk."""
    return update({"sessionUpdate": kind, "content": {"type": "text", "text": text}})


def test_text_and_thoughts_are_joined_in_order() -> None:
    """Message and thought chunks accumulate separately, in arrival order."""
    acc = TurnAccumulator()
    for u in [
        chunk("agent_message_chunk", "Hel"),
        chunk("agent_thought_chunk", "hmm"),
        chunk("agent_message_chunk", "lo"),
    ]:
        acc.add(u)
    result = acc.result("end_turn")
    assert (result.text, result.thoughts, result.stop_reason) == ("Hello", "hmm", "end_turn")
    assert result.updates == []  # chunks are folded into the text, not kept by default
    keeping = TurnAccumulator(keep_chunks=True)
    for u in [chunk("agent_message_chunk", "a"), chunk("agent_thought_chunk", "b")]:
        keeping.add(u)
    assert len(keeping.result("end_turn").updates) == 2


def test_chunks_of_other_content_kinds_add_their_placeholder() -> None:
    """Chunks holding other blocks add what content_text gives: a link, or nothing for media."""
    link = {"type": "resource_link", "uri": "file:///a.py", "name": "a.py"}
    image = {"type": "image", "data": "AAAA", "mimeType": "image/png"}
    acc = TurnAccumulator()
    for kind in ("agent_message_chunk", "agent_thought_chunk"):
        acc.add(chunk(kind, "see "))
        acc.add(update({"sessionUpdate": kind, "content": link}))
        acc.add(update({"sessionUpdate": kind, "content": image}))
        acc.add(update({"sessionUpdate": kind, "content": {"type": "hologram", "text": "x"}}))
        acc.add(chunk(kind, "."))
    result = acc.result("end_turn")
    assert result.text == result.thoughts == "see [a.py](file:///a.py)."


def test_tool_call_patches_merge_into_the_call() -> None:
    """A tool_call_update changes only the fields it carries."""
    acc = TurnAccumulator()
    acc.add(
        update(
            {
                "sessionUpdate": "tool_call",
                "toolCallId": "c1",
                "title": "Edit a",
                "kind": "edit",
                "status": "pending",
                "rawInput": {"path": "/a"},
                "locations": [{"path": "/a"}],
            }
        )
    )
    acc.add(
        update({"sessionUpdate": "tool_call_update", "toolCallId": "c1", "status": "in_progress"})
    )
    acc.add(
        update(
            {
                "sessionUpdate": "tool_call_update",
                "toolCallId": "c1",
                "status": "completed",
                "content": [
                    {"type": "diff", "path": "/a", "oldText": "x", "newText": "y"},
                    {"type": "terminal", "terminalId": "t1"},
                ],
                "rawOutput": {"ok": True},
            }
        )
    )
    call = acc.result("end_turn").tool_calls["c1"]
    assert (call.title, call.kind, call.status, call.updates) == ("Edit a", "edit", "completed", 2)
    assert call.raw_input == {"path": "/a"} and call.raw_output == {"ok": True}
    assert [d.new_text for d in call.diffs()] == ["y"]
    assert call.terminal_ids() == ["t1"]
    assert call.to_json() == {
        "toolCallId": "c1",
        "title": "Edit a",
        "kind": "edit",
        "status": "completed",
    }


def test_update_before_the_call_creates_it() -> None:
    """A patch for an unseen id still makes a tool call (agents do send these)."""
    acc = TurnAccumulator()
    acc.add(update({"sessionUpdate": "tool_call_update", "toolCallId": "late", "title": "T"}))
    assert acc.result("end_turn").tool_calls["late"].title == "T"


def test_latest_plan_usage_and_session_state_are_kept() -> None:
    """Plan and usage keep the latest value; mode changes and session info keep every one."""
    acc = TurnAccumulator()
    acc.add(
        update(
            {
                "sessionUpdate": "plan",
                "entries": [{"content": "a", "priority": "high", "status": "pending"}],
            }
        )
    )
    acc.add(
        update(
            {
                "sessionUpdate": "plan",
                "entries": [
                    {"content": "a", "priority": "high", "status": "completed"},
                    {"content": "b", "priority": "low", "status": "pending"},
                ],
            }
        )
    )
    acc.add(update({"sessionUpdate": "usage_update", "used": 10, "size": 100}))
    acc.add(
        update(
            {
                "sessionUpdate": "usage_update",
                "used": 20,
                "size": 100,
                "cost": {"amount": 0.5, "currency": "USD"},
            }
        )
    )
    acc.add(update({"sessionUpdate": "current_mode_update", "currentModeId": "code"}))
    acc.add(update({"sessionUpdate": "session_info_update", "title": "Renaming"}))
    acc.add(
        update(
            {
                "sessionUpdate": "available_commands_update",
                "availableCommands": [{"name": "plan", "description": "make a plan"}],
            }
        )
    )
    result = acc.result("end_turn", t.Usage(total_tokens=30, input_tokens=20, output_tokens=10))
    assert result.plan is not None and [e.status for e in result.plan] == ["completed", "pending"]
    assert result.usage is not None and result.usage.used == 20
    assert result.mode_changes == ["code"]
    assert [i.title for i in result.session_info] == ["Renaming"]
    assert result.available_commands is not None
    assert result.usage_json() == {
        "used": 20,
        "size": 100,
        "cost": {"amount": 0.5, "currency": "USD"},
        "tokens": {"totalTokens": 30, "inputTokens": 20, "outputTokens": 10},
    }


def test_unknown_update_kinds_are_kept_whole() -> None:
    """An update kind newer than the schema is kept, not fatal."""
    acc = TurnAccumulator()
    acc.add(update({"sessionUpdate": "hologram_update", "beam": 3}))
    [unknown] = acc.result("end_turn").unknown_updates
    assert unknown.raw == {"sessionUpdate": "hologram_update", "beam": 3}


def test_notices_are_kept_in_order() -> None:
    """``notice`` updates (stable since the schema of SDK 2.4.0) land in ``notices``, in order;
    a severity newer than the schema passes."""
    acc = TurnAccumulator()
    acc.add(update({"sessionUpdate": "notice", "severity": "info", "title": "Indexing"}))
    acc.add(update({"sessionUpdate": "notice", "severity": "_quota", "title": "Slow down"}))
    result = acc.result("end_turn")
    assert [(n.severity, n.title) for n in result.notices] == [
        ("info", "Indexing"),
        ("_quota", "Slow down"),
    ]
    assert result.unknown_updates == []
    assert result.notices_json() == [
        {"severity": "info", "title": "Indexing"},
        {"severity": "_quota", "title": "Slow down"},
    ]


def test_notices_json_keeps_the_first_that_fit() -> None:
    """What the record keeps of a flood of notices is bounded by bytes, first ones first."""
    acc = TurnAccumulator()
    for i in range(100):
        acc.add(update({"sessionUpdate": "notice", "severity": "info", "title": f"n{i:03}"}))
    one = len(b'{"severity":"info","title":"n000"}')
    kept = acc.result("end_turn").notices_json(limit=10 * one)
    assert [n["title"] for n in kept] == [f"n{i:03}" for i in range(10)]
    assert len(acc.result("end_turn").notices_json(limit=None)) == 100


def test_usage_json_is_none_without_usage() -> None:
    """No usage reported means no usage object."""
    assert TurnAccumulator().result("end_turn").usage_json() is None


def test_a_failed_calls_error_text_is_kept_bounded() -> None:
    """A failed call's JSON has the text it was sent with (content, else raw output), cut."""
    acc = TurnAccumulator()
    acc.add(update({"sessionUpdate": "tool_call", "toolCallId": "a", "title": "npm test"}))
    long = "E" * (MAX_TOOL_ERROR_CHARS + 5)
    text = {"type": "content", "content": {"type": "text", "text": long}}
    acc.add(
        update(
            {
                "sessionUpdate": "tool_call_update",
                "toolCallId": "a",
                "status": "failed",
                "content": [text],
                "rawOutput": "ignored: the content says it",
            }
        )
    )
    acc.add(update({"sessionUpdate": "tool_call", "toolCallId": "b", "title": "cat"}))
    acc.add(
        update(
            {
                "sessionUpdate": "tool_call_update",
                "toolCallId": "b",
                "status": "failed",
                "rawOutput": {"exit": 1},
            }
        )
    )
    acc.add(
        update(
            {"sessionUpdate": "tool_call", "toolCallId": "c", "title": "ls", "status": "completed"}
        )
    )
    calls = acc.result("end_turn").tool_calls
    cut = "E" * MAX_TOOL_ERROR_CHARS + "\u2026 (5 more characters)"
    assert calls["a"].to_json()["error"] == cut
    assert calls["b"].to_json()["error"] == '{"exit": 1}'
    assert "error" not in calls["c"].to_json()
