"""Tests of orchestrator.testing.script: the script model, its JSON form and its checks."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.errors import UsageError
from orchestrator.testing import script as script_module
from orchestrator.testing.script import (
    ALLOW_REJECT,
    AgentScript,
    AskPermission,
    AuthMethod,
    Capabilities,
    ConfigOption,
    ConfigValue,
    Crash,
    DeleteDisk,
    ErrorReply,
    ExitAtStart,
    Flood,
    FloodRequests,
    HugeLine,
    Location,
    Mode,
    Notify,
    PermissionOption,
    PermissionToolCall,
    Plan,
    PlanEntry,
    Raw,
    ReadFile,
    Replace,
    Request,
    Say,
    Sleep,
    Spawn,
    Stall,
    Step,
    Terminal,
    Think,
    ToolCall,
    ToolUpdate,
    Turn,
    Update,
    Usage,
    UserMessage,
    WriteDisk,
    WriteFile,
    diff_content,
    terminal_content,
    text_content,
)


def _through_json(value: Any) -> Any:
    return orjson.loads(orjson.dumps(value))


def _full_script() -> AgentScript:
    steps: tuple[Step, ...] = (
        Say("hello", chunks=2),
        Think("hmm"),
        UserMessage("earlier"),
        Plan((PlanEntry("a"), PlanEntry("b", priority="high", status="completed"))),
        ToolCall(
            "t1",
            "Edit a.py",
            kind="edit",
            status="in_progress",
            locations=(Location("a.py", 3),),
            raw_input={"path": "a.py"},
            content=(diff_content("a.py", "new", "old"), text_content("note")),
        ),
        ToolUpdate("t1", status="completed", content=(terminal_content("term-1"),), raw_output=[1]),
        Usage(10, 100, cost=0.5, currency="EUR"),
        Update({"sessionUpdate": "notice", "message": "hi"}),
        AskPermission(
            PermissionToolCall("t2", title="rm", kind="delete", raw_input={"x": 1}),
            options=(PermissionOption("ok", "Approve", "allow_always"),),
            on_reject="cancelled",
        ),
        ReadFile("a.py", line=2, limit=5, then_write=Replace("old", "new", count=1)),
        WriteFile("b.py", "x"),
        WriteDisk("c.py", "y"),
        DeleteDisk("d.py"),
        Terminal(
            "ls -l",
            args=("-a",),
            cwd="sub",
            env={"A": "1"},
            output_byte_limit=10,
            tool_call_id="t3",
            timeout=2.5,
        ),
        Request("craft/drainMidTurnQueue", {"q": 1}),
        Notify("_auth/status_update"),
        HugeLine(1000),
        Raw("{not json"),
        Sleep(0.5),
        Stall(),
        Crash(3, "boom"),
        Flood(5, "z"),
        FloodRequests(7, "fs/write_text_file", {"path": "a", "content": "b"}, read_answers=True),
    )
    return AgentScript(
        name="a",
        title=None,
        version="9",
        protocol_version=2,
        capabilities=Capabilities(load_session=True, image=True, session_list=True, logout=True),
        auth_methods=(AuthMethod("key", "API key", "use a key"),),
        require_auth=True,
        modes=(Mode("ask", "Ask"), Mode("code", "Code", "writes code")),
        current_mode="code",
        config_options=(
            ConfigOption(
                "model", "Model", "m1", options=(ConfigValue("m1", "M1"),), category="model"
            ),
            ConfigOption("fast", "Fast", False, type="boolean"),
        ),
        id_style="string",
        session_id_prefix="s",
        exit_at_start=ExitAtStart(4, "no", wait_for_initialize=False),
        initialize_delay=1,
        turns=(
            Turn(
                steps,
                stop_reason="refusal",
                when_prompt_contains="x",
                when_prompt_matches=r"^x\d+",
                ignore_cancel=True,
                cancel_stop_reason="end_turn",
                updates_after_response=(Say("late"),),
                error=ErrorReply(-32000, "auth", {"d": 1}),
            ),
            Turn(),
        ),
        load_history=(UserMessage("q"), Say("a")),
        record_path="/tmp/record.jsonl",
    )


def test_full_script_round_trips_through_json() -> None:
    """Every field and every step kind survives to_json -> JSON text -> from_json."""
    script = _full_script()
    assert AgentScript.from_json(_through_json(script.to_json())) == script


def test_defaults_are_left_out_of_json() -> None:
    """A default script is an empty object and steps carry only their op and set fields."""
    assert AgentScript().to_json() == {}
    assert AgentScript.from_json({}) == AgentScript()
    assert Say("hi").to_json() == {"op": "say", "text": "hi"}
    assert Stall().to_json() == {"op": "stall"}
    assert Turn(steps=(Sleep(1),)).to_json() == {"steps": [{"op": "sleep", "seconds": 1.0}]}


def test_sequence_fields_take_lists_and_keep_tuples() -> None:
    """Steps, turns and other script values may be given as lists (mypy accepts them too):
    the script holds tuples, stays hashable, and its JSON is that of the tuple form."""
    listed = AgentScript(
        modes=[Mode("ask", "Ask")],
        turns=[Turn(steps=[Say("hi"), Plan([PlanEntry("x")])], updates_after_response=[Stall()])],
        load_history=[UserMessage("q")],
    )
    tupled = AgentScript(
        modes=(Mode("ask", "Ask"),),
        turns=(
            Turn(steps=(Say("hi"), Plan((PlanEntry("x"),))), updates_after_response=(Stall(),)),
        ),
        load_history=(UserMessage("q"),),
    )
    assert listed == tupled and hash(listed) == hash(tupled)
    assert isinstance(listed.turns, tuple) and isinstance(listed.turns[0].steps, tuple)
    assert listed.to_json() == tupled.to_json()
    assert AgentScript.from_json(_through_json(listed.to_json())) == tupled


def test_ask_permission_has_a_default_tool_call() -> None:
    """``AskPermission()`` asks about tool call ``call-1``; the default is left out of its JSON
    and read back, and a script's own tool call is kept as before."""
    ask = AskPermission()
    assert ask.tool_call == PermissionToolCall("call-1", title="scripted tool call")
    assert ask.to_json() == {"op": "ask_permission"}
    assert AskPermission.from_json({"op": "ask_permission"}) == ask
    own = AskPermission(PermissionToolCall("t1", title="rm"))
    assert own.to_json() == {"op": "ask_permission", "tool_call": {"id": "t1", "title": "rm"}}


def test_acp_objects_use_their_wire_names() -> None:
    """Permission options and config options are written in ACP's camelCase wire form."""
    assert [o.to_json() for o in ALLOW_REJECT] == [
        {"optionId": "allow", "name": "allow", "kind": "allow_once"},
        {"optionId": "reject", "name": "reject", "kind": "reject_once"},
    ]
    option = ConfigOption("model", "Model", "m1", options=(ConfigValue("m1", "M1"),))
    assert option.to_json() == {
        "id": "model",
        "name": "Model",
        "currentValue": "m1",
        "options": [{"value": "m1", "name": "M1"}],
    }
    assert ConfigOption.from_json(option.to_json()) == option


def test_step_from_json_dispatches_on_op() -> None:
    """A step class parses its own JSON form, op included."""
    assert Say.from_json({"op": "say", "text": "x", "chunks": 2}) == Say("x", 2)
    assert Flood.from_json({"op": "flood", "count": 3}) == Flood(3)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"turns": [{"steps": [{"op": "dance"}]}]}, "unknown step op 'dance'"),
        ({"turns": [{"steps": [{"op": "say", "text": 5}]}]}, "expected str, got int"),
        ({"turns": [{"steps": [{"op": "say"}]}]}, "required field missing"),
        ({"turns": [{"steps": [{"op": "say", "text": "a", "chunks": 0}]}]}, "must be >= 1"),
        ({"turns": [{"steps": ["say"]}]}, "a step must be an object"),
        ({"turns": [{"stop_reason": "bored"}]}, "bored not in literal"),
        ({"capabilities": {"image": "false"}}, "expected bool, got str"),
        ({"protocol_version": True}, "expected int, got a boolean"),
        ({"colour": "red"}, "extra fields found (colour)"),
        ([], "must be a JSON object"),
    ],
)
def test_invalid_scripts_are_usage_errors_with_a_path(data: Any, message: str) -> None:
    """A bad script raises UsageError saying what is wrong and where."""
    with pytest.raises(UsageError, match="invalid agent script") as info:
        AgentScript.from_json(data)
    assert message in str(info.value)
    if isinstance(data, dict) and "turns" in data:
        assert "AgentScript.turns[0]" in str(info.value)


def test_replace_transforms_text() -> None:
    """Replace swaps every occurrence, or only the first ``count`` ones."""
    assert Replace("a", "b").apply("aXa") == "bXb"
    assert Replace("a", "b", count=1).apply("aXa") == "bXa"


def test_content_helpers_build_acp_tool_call_content() -> None:
    """The content helpers produce ACP ToolCallContent objects."""
    assert text_content("t") == {"type": "content", "content": {"type": "text", "text": "t"}}
    assert diff_content("p", "n") == {"type": "diff", "path": "p", "oldText": None, "newText": "n"}
    assert terminal_content("x") == {"type": "terminal", "terminalId": "x"}


def test_module_docs_name_every_step_op() -> None:
    """The user-facing reference in the module docstring lists every step op."""
    doc = script_module.__doc__ or ""
    for op in script_module._STEP_CLASSES:
        assert f"``{op}``" in doc, op


def test_public_names_resolve() -> None:
    """Every name in orchestrator.testing.__all__ resolves, the lazy agent names included."""
    import orchestrator.testing as testing

    for name in testing.__all__:
        assert getattr(testing, name) is not None, name
    with pytest.raises(AttributeError):
        testing.no_such_name  # noqa: B018


_text = st.text(max_size=20)
_steps = st.one_of(
    st.builds(Say, _text, st.integers(1, 5)),
    st.builds(Think, _text),
    st.builds(Sleep, st.floats(0, 1e6, allow_nan=False)),
    st.builds(Flood, st.integers(0, 10**6), _text),
    st.builds(FloodRequests, st.integers(0, 10**6), _text, read_answers=st.booleans()),
    st.builds(
        ToolCall,
        _text,
        _text,
        kind=st.sampled_from(["read", "edit", "execute", "other"]),
        locations=st.lists(st.builds(Location, _text, st.none() | st.integers(0, 99))).map(tuple),
        raw_input=st.none()
        | st.dictionaries(_text, st.integers(-(2**53), 2**53) | _text, max_size=3),
    ),
    st.builds(
        AskPermission,
        st.builds(PermissionToolCall, _text, title=st.none() | _text),
        options=st.lists(
            st.builds(
                PermissionOption,
                _text,
                _text,
                st.sampled_from(["allow_once", "allow_always", "reject_once", "reject_always"]),
            ),
            max_size=3,
        ).map(tuple),
        on_reject=st.sampled_from(["end_turn", "continue", "cancelled"]),
    ),
    st.builds(ReadFile, _text, then_write=st.none() | st.builds(Replace, _text, _text)),
    st.builds(Terminal, _text, args=st.none() | st.lists(_text).map(tuple)),
    st.builds(Spawn, st.lists(_text, min_size=1, max_size=3).map(tuple), st.booleans()),
)


@settings(derandomize=True, database=None)
@given(st.lists(_steps, max_size=6), st.sampled_from(["end_turn", "refusal", "max_tokens"]))
def test_generated_turns_round_trip(steps: list[Step], stop_reason: Any) -> None:
    """Generated turns come back equal after a trip through JSON text."""
    script = AgentScript(turns=(Turn(tuple(steps), stop_reason=stop_reason),))
    assert AgentScript.from_json(_through_json(script.to_json())) == script


def test_a_turns_regex_is_checked_when_the_script_is_made() -> None:
    """A regex that does not compile is refused, in Python and in JSON, naming the field."""
    with pytest.raises(ValueError, match=r"when_prompt_matches: '\(' is not a regular"):
        Turn(when_prompt_matches="(")
    with pytest.raises(UsageError, match=r"when_prompt_matches: '\[a' is not a regular"):
        AgentScript.from_json({"turns": [{"when_prompt_matches": "[a"}]})


def test_a_turns_conditions_all_hold_for_it_to_match() -> None:
    """Turn.matches: a turn without conditions never matches; with several, all must hold."""

    def has_digit(text: str) -> bool:
        return any(c.isdigit() for c in text)

    assert not Turn().conditional
    assert not Turn().matches("anything")
    turn = Turn(when_prompt_contains="fix", when_prompt_matches=r"#\d+$", when=has_digit)
    assert turn.conditional
    assert turn.matches("fix #12")
    assert not turn.matches("fix #12 now")  # the regex fails
    assert not turn.matches("mend #12")  # the substring fails
    assert Turn(when=has_digit).matches("a1")
    assert not Turn(when=has_digit).matches("a")


def test_a_predicate_turn_has_no_json_form() -> None:
    """A script with a Python predicate cannot be written as JSON (nor a predicate read from
    it): the error says to use a regex for a subprocess agent."""
    script = AgentScript(turns=(Turn(when=lambda text: "x" in text),))
    with pytest.raises(UsageError, match="when_prompt_matches"):
        script.to_json()
    with pytest.raises(UsageError, match=r"extra fields found \(when\)"):
        AgentScript.from_json({"turns": [{"when": "x"}]})
