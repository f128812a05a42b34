"""Tests for orchestrator.protocol.codec: round trips over every generated type, the wire rules,
tolerance of newer peers, error paths, and golden frames (tests/golden/)."""

from __future__ import annotations

import functools
import json
import types as pytypes
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import attrs
import orjson
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator, ValidationError

from orchestrator.errors import InvalidParams
from orchestrator.protocol import codec
from orchestrator.protocol import types as t
from orchestrator.protocol.codec import (
    StructureError,
    converter,
    make_converter,
    structure,
    unstructure,
)

SCHEMA_DIR = Path(t.__file__).parent / "schema"
GOLDEN_DIR = Path(__file__).parent / "golden"
STABLE_SCHEMA: dict[str, Any] = json.loads((SCHEMA_DIR / "schema.json").read_text())
UNSTABLE_SCHEMA: dict[str, Any] = json.loads((SCHEMA_DIR / "schema.unstable.json").read_text())
STABLE_DEFS: dict[str, Any] = STABLE_SCHEMA["$defs"]
NONE_TYPE = type(None)

CLASSES: list[type] = sorted(
    (
        v
        for v in vars(t).values()
        if isinstance(v, type)
        and attrs.has(v)
        and v.__module__ == t.__name__
        and v not in (t.TaggedUnion, t.UntaggedUnion)
    ),
    key=lambda c: c.__name__,
)
for _cls in CLASSES:
    attrs.resolve_types(_cls)

UNKNOWN_OF: dict[type, t.TaggedUnion] = {spec.unknown: spec for spec in t.TAGGED_UNIONS.values()}
TAGGED_BY_MEMBERS: dict[frozenset[Any], t.TaggedUnion] = {
    frozenset(spec.members): spec for spec in t.TAGGED_UNIONS.values()
}
# Keys of `extra` and of unknown variants avoid every wire name of every class: untagged unions
# pick their member by which keys are present, so another member's key would (rightly) change
# the member that is read back.
ALL_WIRE_NAMES = frozenset(
    f.metadata["wire"] for c in CLASSES for f in attrs.fields(c) if "wire" in f.metadata
)
# derandomize: the same examples on every run (deterministic tests); no example database.
# 15 examples per type (10 for the schema checks) keep the whole file well under a minute;
# nested classes get many more, as parts of the classes that hold them.
HYPOTHESIS = settings(
    max_examples=15,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate, Phase.shrink],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
SCHEMA_HYPOTHESIS = settings(HYPOTHESIS, max_examples=10)


def tag_values(spec: t.TaggedUnion) -> set[str]:
    """The tag values of a tagged union's known members."""
    return {
        f.default
        for member in spec.members
        if member is not spec.unknown
        for f in attrs.fields(member)
        if f.metadata.get("tag")
    }


def stable_properties(cls: type) -> frozenset[str] | None:
    """Wire names the stable schema knows for ``cls`` (or its base def); None: no def."""
    for klass in cls.__mro__:
        schema = STABLE_DEFS.get(klass.__name__)
        if schema is not None and "properties" in schema:
            return frozenset(schema["properties"])
    return None


def min_length(cls: type, wire: str) -> int:
    """The ``minLength`` the stable schema gives a string property of ``cls`` (0: none)."""
    prop = STABLE_DEFS.get(cls.__name__, {}).get("properties", {}).get(wire, {})
    return int(prop.get("minLength", 0)) if prop.get("type") == "string" else 0


def scope_alternatives(cls: type) -> list[frozenset[str]]:
    """Required keys of each alternative a stable def mixes in (one of them must be present)."""
    schema = STABLE_DEFS.get(cls.__name__, {})
    out = []
    for variant in schema.get("anyOf", []) + schema.get("oneOf", []):
        ref = variant.get("$ref") or (variant.get("allOf") or [{}])[0].get("$ref")
        if "properties" in schema and isinstance(ref, str):
            out.append(frozenset(STABLE_DEFS[ref.rsplit("/", 1)[-1]].get("required", [])))
    return out


def strip_none(tp: Any) -> Any:
    """``X | None`` -> ``X``."""
    if get_origin(tp) in (Union, pytypes.UnionType) and NONE_TYPE in get_args(tp):
        rest = tuple(a for a in get_args(tp) if a is not NONE_TYPE)
        return rest[0] if len(rest) == 1 else Union[rest]  # noqa: UP007
    return tp


# --------------------------------------------------------------------------- strategies

KEYS = st.text(max_size=4)
JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=4)
)
# Opaque JSON (``Any``, ``_meta``, ``extra``) passes through the codec untouched, so one level
# of nesting is enough and keeps the examples cheap.
JSON = (
    JSON_SCALARS
    | st.lists(JSON_SCALARS, max_size=2)
    | st.dictionaries(KEYS, JSON_SCALARS | st.lists(JSON_SCALARS, max_size=2), max_size=2)
)
JSON_OBJECTS = st.dictionaries(KEYS, JSON, max_size=2)
FREE_KEYS = st.text(min_size=1, max_size=6).filter(lambda k: k not in ALL_WIRE_NAMES)
PRIMITIVES: dict[Any, st.SearchStrategy[Any]] = {
    str: st.text(max_size=5),
    # non-negative and small: many schema integers are uint with "minimum": 0
    int: st.integers(0, 10_000),
    float: st.floats(0, 1e9, allow_nan=False),
    bool: st.booleans(),
    NONE_TYPE: st.none(),
    Any: JSON,
}


@functools.cache
def strategy_for(tp: Any, valid: bool) -> st.SearchStrategy[Any]:
    """Values of ``tp``. ``valid``: stable types only, no extras, no unknowns (schema-valid)."""
    if tp in PRIMITIVES:
        return PRIMITIVES[tp]
    origin, args = get_origin(tp), get_args(tp)
    if origin is Literal:
        return st.sampled_from(args)
    if origin in (Union, pytypes.UnionType):
        return _union(args, valid)
    if origin is list:
        return st.lists(strategy_for(args[0], valid), max_size=2)
    if origin is dict:
        if args[1] is Any:
            return JSON_OBJECTS
        return st.dictionaries(KEYS, strategy_for(args[1], valid), max_size=2)
    if attrs.has(tp):
        return st.deferred(lambda: _class(tp, valid))
    raise TypeError(f"no strategy for {tp!r}")


def _union(args: tuple[Any, ...], valid: bool) -> st.SearchStrategy[Any]:
    members = [a for a in args if a is not NONE_TYPE]
    spec = TAGGED_BY_MEMBERS.get(frozenset(members))
    options = [
        m
        for m in members
        if not (
            valid
            and (getattr(m, "__name__", "") in t.UNSTABLE or m is getattr(spec, "unknown", None))
        )
    ]
    out = st.one_of([strategy_for(m, valid) for m in options])
    return st.none() | out if NONE_TYPE in args else out


def _unknown(cls: type) -> st.SearchStrategy[Any]:
    """An Unknown* value: a tag no member uses, and the raw object holding it."""
    spec = UNKNOWN_OF[cls]
    (tag_field,) = (f for f in attrs.fields(cls) if f.metadata.get("tag"))
    known = tag_values(spec)
    tags = st.text(min_size=1, max_size=8).filter(lambda s: s not in known)
    rest = st.dictionaries(FREE_KEYS, JSON, max_size=2)

    def build(tag: str, more: dict[str, Any]) -> Any:
        return cls(**{tag_field.alias: tag, "raw": {spec.tag: tag, **more}})

    return st.builds(build, tags, rest)


def _class(cls: type, valid: bool) -> st.SearchStrategy[Any]:
    if getattr(cls, "__acp_unknown__", False):
        return _unknown(cls)
    known = stable_properties(cls) if valid else None
    kwargs: dict[str, st.SearchStrategy[Any]] = {}
    wires: dict[str, attrs.Attribute[Any]] = {}
    for f in attrs.fields(cls):
        if f.metadata.get("extra"):
            kwargs[f.alias] = st.just({}) if valid else st.dictionaries(FREE_KEYS, JSON, max_size=2)
        elif not f.metadata.get("tag"):
            wires[f.metadata["wire"]] = f
            if (
                known is not None
                and f.default is not attrs.NOTHING
                and f.metadata["wire"] not in known
            ):
                kwargs[f.alias] = st.none()  # a field newer than the stable schema
            elif valid and min_length(cls, f.metadata["wire"]):
                # a schema string with a minLength (Notice.title must not be empty)
                size = min_length(cls, f.metadata["wire"])
                kwargs[f.alias] = st.text(min_size=size, max_size=size + 5)
            else:
                kwargs[f.alias] = strategy_for(f.type, valid)
    alternatives = scope_alternatives(cls) if valid else []
    if not alternatives:
        return st.builds(cls, **kwargs)

    def with_scope(required: frozenset[str]) -> st.SearchStrategy[Any]:
        forced: dict[str, st.SearchStrategy[Any]] = {
            str(wires[w].alias): strategy_for(strip_none(wires[w].type), valid) for w in required
        }
        return st.builds(cls, **{**kwargs, **forced})

    return st.sampled_from(alternatives).flatmap(with_scope)


@functools.cache
def stable_validator(name: str) -> Draft202012Validator:
    """A validator for one def of the stable schema."""
    return Draft202012Validator({"$defs": STABLE_DEFS, "$ref": f"#/$defs/{name}"})


@functools.cache
def unstable_validator(name: str) -> Draft202012Validator:
    """A validator for one def of the unstable schema (a superset of the stable one)."""
    return Draft202012Validator({"$defs": UNSTABLE_SCHEMA["$defs"], "$ref": f"#/$defs/{name}"})


def round_trip(obj: Any, tp: Any) -> None:
    """unstructure -> JSON bytes -> structure gives ``obj`` back, and the same wire value."""
    wire = unstructure(obj)
    text = orjson.dumps(wire)
    assert structure(wire, tp) == obj
    back = structure(orjson.loads(text), tp)
    assert back == obj
    assert unstructure(back) == wire


# --------------------------------------------------------------------------- every type

STABLE_CLASSES = [c for c in CLASSES if c.__name__ in STABLE_DEFS]
UNION_NAMES = sorted(
    name
    for name in UNSTABLE_SCHEMA["$defs"]
    if getattr(t, name, None) in t.TAGGED_UNIONS or getattr(t, name, None) in t.UNTAGGED_UNIONS
)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
@HYPOTHESIS
@given(data=st.data())
def test_round_trip_every_class(cls: type, data: st.DataObject) -> None:
    """Any instance of any generated class survives unstructure -> JSON -> structure."""
    round_trip(data.draw(strategy_for(cls, False)), cls)


@pytest.mark.parametrize("name", UNION_NAMES)
@HYPOTHESIS
@given(data=st.data())
def test_round_trip_every_union(name: str, data: st.DataObject) -> None:
    """Any member of a union alias (Unknown* ones too) is read back as the same member."""
    tp = getattr(t, name)
    round_trip(data.draw(strategy_for(tp, False)), tp)


@pytest.mark.parametrize("cls", STABLE_CLASSES, ids=lambda c: c.__name__)
@SCHEMA_HYPOTHESIS
@given(data=st.data())
def test_unstructure_validates_against_stable_schema(cls: type, data: st.DataObject) -> None:
    """Without extras and unknowns, a stable class writes what schema.json's def accepts."""
    stable_validator(cls.__name__).validate(unstructure(data.draw(strategy_for(cls, True))))


@pytest.mark.parametrize("name", [n for n in UNION_NAMES if n in STABLE_DEFS])
@SCHEMA_HYPOTHESIS
@given(data=st.data())
def test_union_members_validate_against_stable_schema(name: str, data: st.DataObject) -> None:
    """Every stable member of a stable union writes what the union's def accepts."""
    value = data.draw(strategy_for(getattr(t, name), True))
    stable_validator(name).validate(unstructure(value))


# --------------------------------------------------------------------------- wire rules


def test_wire_names_come_from_metadata() -> None:
    """`_meta` <-> meta and `sessionUpdate` <-> session_update, camelCase <-> snake_case."""
    chunk = t.AgentMessageChunk(content=t.TextContent(text="hi", meta={"k": 1}), message_id="m1")
    wire = {
        "sessionUpdate": "agent_message_chunk",
        "content": {"type": "text", "text": "hi", "_meta": {"k": 1}},
        "messageId": "m1",
    }
    assert unstructure(chunk) == wire
    back = structure(wire, t.SessionUpdate)
    assert isinstance(back, t.AgentMessageChunk)
    assert back.session_update == "agent_message_chunk"
    assert back.content == t.TextContent(text="hi", meta={"k": 1})


def test_none_is_omitted_but_tags_are_written() -> None:
    """Optional None fields are left out; tags are written even when all else is default."""
    assert unstructure(t.ToolCallUpdate(tool_call_id="c1")) == {"toolCallId": "c1"}
    assert unstructure(t.ToolCallUpdateSessionUpdate(tool_call_id="c1")) == {
        "sessionUpdate": "tool_call_update",
        "toolCallId": "c1",
    }
    assert unstructure(t.CancelledRequestPermissionOutcome()) == {"outcome": "cancelled"}
    # the tag leads the object, so a reader sees the kind before the fields
    assert list(unstructure(t.UsageUpdate(used=1, size=2))) == ["sessionUpdate", "used", "size"]


def test_required_nullable_field_keeps_null() -> None:
    """A required field whose type allows null is written as null and read back as None."""
    wire = unstructure(t.CancelRequestNotification(request_id=None))
    assert wire == {"requestId": None}
    assert structure(wire, t.CancelRequestNotification).request_id is None
    assert structure({"requestId": "r-7"}, t.CancelRequestNotification).request_id == "r-7"
    with pytest.raises(InvalidParams, match="requestId: missing required field"):
        structure({}, t.CancelRequestNotification)


def test_explicit_null_reads_as_absent() -> None:
    """An optional field sent as null reads as None (and is then omitted on the way out)."""
    back = structure({"path": "/a", "oldText": None, "newText": "b"}, t.Diff)
    assert back.old_text is None
    assert unstructure(back) == {"type": "diff", "path": "/a", "newText": "b"}


def test_unknown_fields_kept_in_extra() -> None:
    """Fields this schema release lacks land in `extra` and are written back out."""
    wire = {"sessionId": "s", "path": "/a", "encoding": "latin-1", "x": {"deep": [1, 2]}}
    request = structure(wire, t.ReadTextFileRequest)
    assert request.extra == {"encoding": "latin-1", "x": {"deep": [1, 2]}}
    assert unstructure(request) == wire


def test_extra_never_overrides_known_fields() -> None:
    """An `extra` key equal to a wire name does not replace the field's own value."""
    request = t.ReadTextFileRequest(session_id="s", path="/a", extra={"path": "/evil"})
    assert unstructure(request)["path"] == "/a"


# --------------------------------------------------------------------------- newer peers


NOTICE_V9 = (
    b'{"sessionId":"s1","update":{"sessionUpdate":"notice_v9","level":"info",'
    b'"text":"hello","links":[{"href":"https://example.com"}],"_meta":{"k":null}}}'
)


def test_unknown_session_update_kind_round_trips_byte_identical() -> None:
    """An unknown sessionUpdate kind becomes UnknownSessionUpdate and is written back as is."""
    raw = orjson.loads(NOTICE_V9)
    note = structure(raw, t.SessionNotification)
    assert isinstance(note.update, t.UnknownSessionUpdate)
    assert note.update.session_update == "notice_v9"
    assert note.update.raw == raw["update"]
    assert orjson.dumps(unstructure(note)) == NOTICE_V9


def test_unknown_content_blocks_inside_a_tool_call() -> None:
    """Unknown ContentBlock and ToolCallContent types in a tool_call are kept whole."""
    hologram = {"type": "hologram", "uri": "holo://1", "fps": 90}
    video = {"type": "video", "url": "https://example.com/v.mp4"}
    update = {
        "sessionUpdate": "tool_call",
        "toolCallId": "c1",
        "title": "Render",
        "content": [
            {"type": "content", "content": hologram},
            video,
            {"type": "content", "content": {"type": "text", "text": "done"}},
        ],
    }
    call = structure(update, t.SessionUpdate)
    assert isinstance(call, t.ToolCall)
    assert call.content is not None
    first, second, third = call.content
    assert isinstance(first, t.Content)
    assert first.content == t.UnknownContentBlock(type="hologram", raw=hologram)
    assert second == t.UnknownToolCallContent(type="video", raw=video)
    assert third == t.Content(content=t.TextContent(text="done"))
    assert unstructure(call) == update


def test_unknown_prompt_block_in_a_prompt_request() -> None:
    """A prompt with a content block type from a newer release still reads and writes."""
    block = {"type": "video", "uri": "file:///a.mp4"}
    wire = {"sessionId": "s", "prompt": [block]}
    request = structure(wire, t.PromptRequest)
    assert request.prompt == [t.UnknownContentBlock(type="video", raw=block)]
    assert unstructure(request) == wire


def test_enum_values_newer_than_the_schema_pass_through() -> None:
    """ToolKind "teleport", StopReason "paused": kept as plain strings, written back."""
    update = {"sessionUpdate": "tool_call", "toolCallId": "c1", "title": "t", "kind": "teleport"}
    call = structure(update, t.SessionUpdate)
    assert isinstance(call, t.ToolCall)
    assert str(call.kind) == "teleport"
    assert unstructure(call) == update
    response = structure({"stopReason": "paused"}, t.PromptResponse)
    assert str(response.stop_reason) == "paused"
    option = {"optionId": "o", "name": "n", "kind": "allow_for_session"}
    assert unstructure(structure(option, t.PermissionOption)) == option


def test_fields_no_longer_lenient_are_refused() -> None:
    """fs/read_text_file's ``line`` lost x-deserialize-default-on-error: a bad one is an error."""
    with pytest.raises(InvalidParams, match="line: expected an integer, got string"):
        structure({"sessionId": "s", "path": "/a", "line": "ten"}, t.ReadTextFileRequest)
    with pytest.raises(InvalidParams, match="outputByteLimit"):
        structure(
            {"sessionId": "s", "command": "ls", "outputByteLimit": "x"}, t.CreateTerminalRequest
        )


def test_enum_values_must_still_be_strings() -> None:
    """An enum field holding a number is an error, not an unknown value."""
    with pytest.raises(InvalidParams, match="stopReason: expected a string, got number"):
        structure({"stopReason": 3}, t.PromptResponse)


def test_lenient_fields_fall_back_to_none() -> None:
    """Fields marked x-deserialize-default-on-error become None when they do not fit."""
    bad = {"title": 42, "kind": ["read"], "status": False, "locations": "here", "_meta": "x"}
    assert structure({"toolCallId": "c1", **bad}, t.ToolCallUpdate) == t.ToolCallUpdate(
        tool_call_id="c1"
    )
    location = structure({"path": "/a", "line": "ten"}, t.ToolCallLocation)
    assert location == t.ToolCallLocation(path="/a")
    chunk = structure(
        {"content": {"type": "text", "text": "x", "annotations": 7}, "messageId": 5},
        t.ContentChunk,
    )
    assert chunk == t.ContentChunk(content=t.TextContent(text="x"))


def test_lenient_does_not_cover_required_fields() -> None:
    """A required field that does not fit is an error even where the schema is lenient."""
    with pytest.raises(InvalidParams, match="entries: expected an array, got string"):
        structure({"sessionUpdate": "plan", "entries": "none"}, t.SessionUpdate)


def test_lists_marked_skip_invalid_items_drop_bad_items() -> None:
    """Items that do not fit are dropped from x-deserialize-skip-invalid-items lists."""
    diff, terminal = {"type": "diff", "path": "/a", "newText": "x"}, {"type": "terminal"}
    content = [diff, {"type": "diff", "path": 5}, 7, {**terminal, "terminalId": "t1"}, terminal]
    locations = [{"path": "/a"}, {"line": 3}, {"path": "/b", "line": 2}]
    update = structure(
        {"toolCallId": "c1", "content": content, "locations": locations}, t.ToolCallUpdate
    )
    assert update.content == [t.Diff(path="/a", new_text="x"), t.Terminal(terminal_id="t1")]
    assert update.locations == [
        t.ToolCallLocation(path="/a"),
        t.ToolCallLocation(path="/b", line=2),
    ]
    entries = [{"content": "a", "priority": "high", "status": "pending"}, {"content": "b"}]
    plan = structure({"sessionUpdate": "plan", "entries": entries}, t.SessionUpdate)
    assert plan == t.Plan(entries=[t.PlanEntry(content="a", priority="high", status="pending")])
    annotations = structure({"audience": [1, "user", None]}, t.Annotations)
    assert annotations.audience == ["user"]


def test_lists_not_marked_skip_invalid_items_fail_on_bad_items() -> None:
    """In an ordinary list one bad item is an error naming its index."""
    prompt = [{"type": "text", "text": "a"}, {"type": "text", "text": 1}]
    with pytest.raises(InvalidParams, match=r"prompt\[1\]\.text: expected a string, got number"):
        structure({"sessionId": "s", "prompt": prompt}, t.PromptRequest)


# --------------------------------------------------------------------------- errors


def test_wrong_type_at_a_nested_path() -> None:
    """A misfit deep inside names its path in an InvalidParams (-32602) message and data."""
    wire = {
        "sessionId": "s",
        "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": 5}},
    }
    with pytest.raises(InvalidParams) as info:
        structure(wire, t.SessionNotification)
    assert info.value.code == -32602
    assert "update.content.text" in info.value.message
    assert "expected a string, got number" in info.value.message
    assert info.value.data == {"path": "update.content.text"}


def test_structure_error_carries_the_path() -> None:
    """The converter itself raises StructureError with the path as a tuple of wire keys."""
    wire = {"sessionId": "s", "prompt": [{"type": "text", "text": "a"}, {"type": "image"}]}
    with pytest.raises(StructureError) as info:
        converter.structure(wire, t.PromptRequest)
    assert info.value.path == ("prompt", 1, "data")
    assert str(info.value) == "prompt[1].data: missing required field"


def test_missing_required_field_is_named() -> None:
    """A missing required field is reported by its wire name."""
    with pytest.raises(InvalidParams, match="sessionId: missing required field"):
        structure({"prompt": []}, t.PromptRequest)
    with pytest.raises(InvalidParams, match=r"update\.toolCallId: missing required field"):
        structure(
            {"sessionId": "s", "update": {"sessionUpdate": "tool_call"}}, t.SessionNotification
        )


def test_bad_tags_and_non_objects() -> None:
    """A non-string tag, a missing tag without default, and a non-object are errors."""
    with pytest.raises(InvalidParams, match=r"update\.sessionUpdate: expected a string"):
        structure({"sessionId": "s", "update": {"sessionUpdate": 5}}, t.SessionNotification)
    with pytest.raises(InvalidParams, match=r"update\.sessionUpdate: missing required field"):
        structure({"sessionId": "s", "update": {}}, t.SessionNotification)
    with pytest.raises(InvalidParams, match="expected an object, got array"):
        structure([], t.PromptRequest)
    with pytest.raises(InvalidParams, match="protocolVersion: expected an integer, got boolean"):
        structure({"protocolVersion": True}, t.InitializeRequest)


def test_error_for_a_union_alias_names_the_alias() -> None:
    """An error while reading a union alias names the alias, e.g. "invalid SessionUpdate"."""
    with pytest.raises(InvalidParams, match=r"^invalid SessionUpdate: "):
        structure({"sessionUpdate": 5}, t.SessionUpdate)


# --------------------------------------------------------------------------- unions


def test_auth_method_without_type_is_agent() -> None:
    """AuthMethod: no type -> AuthMethodAgent; "terminal" -> terminal; others -> Unknown."""
    passkey = {"type": "passkey", "id": "pk", "name": "Passkey"}
    methods: list[dict[str, Any]] = [
        {"id": "login", "name": "Log in"},
        {"type": "terminal", "id": "cli", "name": "CLI", "args": ["--login"]},
        passkey,
    ]
    response = structure({"protocolVersion": 1, "authMethods": methods}, t.InitializeResponse)
    assert response.auth_methods == [
        t.AuthMethodAgent(id="login", name="Log in"),
        t.AuthMethodTerminal(id="cli", name="CLI", args=["--login"]),
        t.UnknownAuthMethod(type="passkey", raw=passkey),
    ]
    assert unstructure(response)["authMethods"] == methods


def test_mcp_server_without_type_is_stdio() -> None:
    """McpServer: no type -> McpServerStdio, written back without a type; http by its tag."""
    servers = [
        {"name": "fs", "command": "/bin/mcp-fs", "args": [], "env": []},
        {"type": "http", "name": "web", "url": "https://x", "headers": []},
    ]
    request = structure({"cwd": "/w", "mcpServers": servers}, t.NewSessionRequest)
    assert request.mcp_servers == [
        t.McpServerStdio(name="fs", command="/bin/mcp-fs", args=[], env=[]),
        t.McpServerHttp(name="web", url="https://x", headers=[]),
    ]
    assert unstructure(request) == {"cwd": "/w", "mcpServers": servers}


def test_embedded_resource_text_and_blob_told_apart() -> None:
    """EmbeddedResource.resource reads as text or blob contents by which key is present."""
    text = {"type": "resource", "resource": {"uri": "file:///a", "text": "hello"}}
    blob = {"type": "resource", "resource": {"uri": "file:///b", "blob": "AAEC", "mimeType": "x/y"}}
    assert structure(text, t.ContentBlock) == t.EmbeddedResource(
        resource=t.TextResourceContents(uri="file:///a", text="hello")
    )
    assert structure(blob, t.ContentBlock) == t.EmbeddedResource(
        resource=t.BlobResourceContents(uri="file:///b", blob="AAEC", mime_type="x/y")
    )
    with pytest.raises(InvalidParams, match="resource: matches none of the alternatives"):
        structure({"type": "resource", "resource": {"uri": "file:///c"}}, t.ContentBlock)


def test_session_config_select_grouped_and_ungrouped() -> None:
    """SessionConfigSelect options read as plain options or as groups of options."""
    flat = [{"value": "a", "name": "A"}, {"value": "b", "name": "B"}]
    grouped = [{"group": "g", "name": "G", "options": flat}]
    base = {"type": "select", "id": "model", "name": "Model", "currentValue": "a"}
    first = structure({**base, "options": flat}, t.SessionConfigOption)
    second = structure({**base, "options": grouped}, t.SessionConfigOption)
    options = [
        t.SessionConfigSelectOption(value="a", name="A"),
        t.SessionConfigSelectOption(value="b", name="B"),
    ]
    assert isinstance(first, t.SessionConfigSelect)
    assert isinstance(second, t.SessionConfigSelect)
    assert first.options == options
    assert second.options == [t.SessionConfigSelectGroup(group="g", name="G", options=options)]
    assert unstructure(second)["options"] == grouped
    empty = structure({**base, "options": []}, t.SessionConfigOption)
    assert isinstance(empty, t.SessionConfigSelect)
    assert empty.options == []


def test_request_permission_outcomes() -> None:
    """RequestPermissionOutcome: cancelled and selected, each in its wire shape."""
    cancelled = {"outcome": {"outcome": "cancelled"}}
    selected = {"outcome": {"outcome": "selected", "optionId": "allow"}}
    assert structure(cancelled, t.RequestPermissionResponse) == t.RequestPermissionResponse(
        outcome=t.CancelledRequestPermissionOutcome()
    )
    assert structure(selected, t.RequestPermissionResponse) == t.RequestPermissionResponse(
        outcome=t.SelectedPermissionOutcome(option_id="allow")
    )
    response = t.RequestPermissionResponse(outcome=t.SelectedPermissionOutcome(option_id="allow"))
    assert unstructure(response) == selected
    with pytest.raises(InvalidParams, match=r"outcome\.optionId: missing required field"):
        structure({"outcome": {"outcome": "selected"}}, t.RequestPermissionResponse)


def test_primitive_unions_check_their_members() -> None:
    """RequestId takes integers and strings (and null) but not booleans or floats."""
    for good in (7, "r-1", None):
        assert structure({"requestId": good}, t.CancelRequestNotification).request_id == good
    for bad in (True, 1.5, [1]):
        with pytest.raises(InvalidParams, match="requestId"):
            structure({"requestId": bad}, t.CancelRequestNotification)


def test_elicitation_string_array_items_are_checked() -> None:
    """ElicitationContentValue's string-array member rejects arrays of non-strings."""
    assert structure(
        {"action": "accept", "content": {"tags": ["a", "b"]}}, t.CreateElicitationResponse
    )
    with pytest.raises(InvalidParams, match=r"content\.tags"):
        structure({"action": "accept", "content": {"tags": [1, {}]}}, t.CreateElicitationResponse)


def test_schema_validators_are_not_vacuous() -> None:
    """The schema checks used above do reject a wrong wire value."""
    with pytest.raises(ValidationError, match="'text' is a required property"):
        stable_validator("TextContent").validate({"type": "text"})
    with pytest.raises(ValidationError, match="is not valid"):
        stable_validator("SessionUpdate").validate({"sessionUpdate": "notice_v9"})


# --------------------------------------------------------------------------- text chunk fast path

#: a converter without the fast path, the reference the fast path is checked against
GENERAL = make_converter(fast_paths=False)
CHUNK_TAGS = ("user_message_chunk", "agent_message_chunk", "agent_thought_chunk")
#: the union, typed loosely for Converter.structure (which types only classes)
SESSION_UPDATE: Any = t.SessionUpdate
TEXT = {"type": "text", "text": "hi"}


def outcome(conv: Any, value: Any) -> tuple[Any, ...]:
    """What ``conv`` makes of ``value`` as a SessionUpdate: the value, or the error and path."""
    try:
        result = conv.structure(value, SESSION_UPDATE)
    except StructureError as e:
        return ("error", str(e), e.path)
    return ("value", type(result), type(getattr(result, "content", None)), result)


def test_every_text_chunk_kind_has_a_fast_path() -> None:
    """The generated chunk classes keep the shape the fast path needs, for all three kinds."""
    factory = codec._HookFactory(converter)
    builders = factory._text_chunk_builders(t.TAGGED_UNIONS[t.SessionUpdate])
    assert set(builders) == set(CHUNK_TAGS)
    for tag, build in builders.items():
        wire = {"sessionUpdate": tag, "content": TEXT}
        assert build("hi") == GENERAL.structure(wire, SESSION_UPDATE)
    # no other union has content chunk members
    assert factory._text_chunk_builders(t.TAGGED_UNIONS[t.ContentBlock]) == {}


@HYPOTHESIS
@given(tag=st.sampled_from(CHUNK_TAGS), text=st.text())
def test_text_chunk_fast_path_equals_the_general_path(tag: str, text: str) -> None:
    """A text chunk read by the fast path equals what the general path reads, types included."""
    wire = {"sessionUpdate": tag, "content": {"type": "text", "text": text}}
    assert outcome(converter, wire) == outcome(GENERAL, wire)
    first = converter.structure(wire, SESSION_UPDATE)
    second = structure(wire, t.SessionUpdate)
    assert unstructure(first) == wire
    # each value has its own (empty) extra dicts
    assert first.extra == {} and first.extra is not second.extra
    assert first.content.extra == {} and first.content.extra is not second.content.extra


NEAR_TEXT_CHUNKS = {
    "message id": {"sessionUpdate": "agent_message_chunk", "content": TEXT, "messageId": "m1"},
    "meta": {"sessionUpdate": "agent_thought_chunk", "content": TEXT, "_meta": {"k": 1}},
    "unknown field": {"sessionUpdate": "agent_message_chunk", "content": TEXT, "x-new": [1]},
    "block unknown field": {
        "sessionUpdate": "agent_message_chunk",
        "content": {**TEXT, "x-new": 1},
    },
    "block annotations": {
        "sessionUpdate": "user_message_chunk",
        "content": {**TEXT, "annotations": {"priority": 0.5}},
    },
    "block bad annotations": {
        "sessionUpdate": "agent_message_chunk",
        "content": {**TEXT, "annotations": 7},
    },
    "image block": {
        "sessionUpdate": "agent_message_chunk",
        "content": {"type": "image", "data": "AAAA", "mimeType": "image/png"},
    },
    "resource link": {
        "sessionUpdate": "agent_thought_chunk",
        "content": {"type": "resource_link", "uri": "file:///a", "name": "a"},
    },
    "unknown block with text": {
        "sessionUpdate": "agent_message_chunk",
        "content": {"type": "hologram", "text": "hi"},
    },
    "block without type": {
        "sessionUpdate": "agent_message_chunk",
        "content": {"text": "hi", "x": 1},
    },
    "text number": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": 5}},
    "text null": {
        "sessionUpdate": "agent_message_chunk",
        "content": {"type": "text", "text": None},
    },
    "text list": {
        "sessionUpdate": "agent_thought_chunk",
        "content": {"type": "text", "text": ["a"]},
    },
    "type number": {"sessionUpdate": "agent_message_chunk", "content": {"type": 5, "text": "hi"}},
    "text missing": {
        "sessionUpdate": "agent_message_chunk",
        "content": {"type": "text", "x": "hi"},
    },
    "content string": {"sessionUpdate": "agent_message_chunk", "content": "hi"},
    "content null": {"sessionUpdate": "agent_message_chunk", "content": None},
    "content array": {"sessionUpdate": "agent_message_chunk", "content": [TEXT]},
    "content missing": {"sessionUpdate": "agent_message_chunk", "text": "hi"},
    "other kind": {"sessionUpdate": "tool_call", "content": TEXT},
    "unknown kind": {"sessionUpdate": "video_chunk", "content": TEXT},
    "kind number": {"sessionUpdate": 5, "content": TEXT},
    "kind array": {"sessionUpdate": ["agent_message_chunk"], "content": TEXT},
    "kind missing": {"content": TEXT, "x": 1},
    "not an object": ["agent_message_chunk", TEXT],
}


@pytest.mark.parametrize("wire", NEAR_TEXT_CHUNKS.values(), ids=NEAR_TEXT_CHUNKS.keys())
def test_values_off_the_fast_path_read_as_before(wire: Any) -> None:
    """Anything but a bare text chunk gives the general path's value or error, unchanged."""
    assert outcome(converter, wire) == outcome(GENERAL, wire)


def test_near_text_chunks_keep_fields_and_report_misfits() -> None:
    """Chunks off the fast path keep unknown fields, and a misfit is a -32602 naming its path."""
    chunks = NEAR_TEXT_CHUNKS
    assert structure(chunks["message id"], t.SessionUpdate) == t.AgentMessageChunk(
        content=t.TextContent(text="hi"), message_id="m1"
    )
    assert structure(chunks["unknown field"], t.SessionUpdate).extra == {"x-new": [1]}
    block = structure(chunks["block unknown field"], t.SessionUpdate).content
    assert block == t.TextContent(text="hi", extra={"x-new": 1})
    hologram = structure(chunks["unknown block with text"], t.SessionUpdate).content
    assert hologram == t.UnknownContentBlock(
        type="hologram", raw={"type": "hologram", "text": "hi"}
    )
    with pytest.raises(InvalidParams) as info:
        structure(chunks["text number"], t.SessionUpdate)
    assert info.value.code == -32602
    assert (
        info.value.message == "invalid SessionUpdate: content.text: expected a string, got number"
    )
    assert info.value.data == {"path": "content.text"}
    with pytest.raises(InvalidParams, match=r"^invalid SessionUpdate: content: missing required"):
        structure(chunks["content missing"], t.SessionUpdate)
    with pytest.raises(
        InvalidParams, match=r"^invalid SessionUpdate: sessionUpdate: expected a string, got array"
    ):
        structure(chunks["kind array"], t.SessionUpdate)


# --------------------------------------------------------------------------- golden frames


GOLDEN_FILES = sorted(GOLDEN_DIR.glob("*.json"))


def walk(value: Any) -> Iterator[Any]:
    """``value`` and every attrs value, list item and dict value inside it."""
    yield value
    if attrs.has(type(value)):
        for f in attrs.fields(type(value)):
            yield from walk(getattr(value, f.name))
    elif isinstance(value, list):
        for item in value:
            yield from walk(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from walk(item)


def test_golden_directory_is_populated() -> None:
    """The golden set exists and covers every known sessionUpdate kind and ContentBlock type."""
    assert len(GOLDEN_FILES) >= 12
    kinds = {
        p.name.split(".")[1] for p in GOLDEN_FILES if p.name.startswith("SessionNotification.")
    }
    assert kinds == tag_values(t.TAGGED_UNIONS[t.SessionUpdate])
    prompt = orjson.loads((GOLDEN_DIR / "PromptRequest.json").read_bytes())
    assert {block["type"] for block in prompt["prompt"]} == tag_values(
        t.TAGGED_UNIONS[t.ContentBlock]
    )


@pytest.mark.parametrize("path", GOLDEN_FILES, ids=lambda p: p.name)
def test_golden_frame_round_trips(path: Path) -> None:
    """A golden frame reads as its type, with nothing unknown or extra, and writes back equal."""
    assert hasattr(t, path.name.split(".", 1)[0]), f"{path.name} names no type"
    tp = getattr(t, path.name.split(".", 1)[0])
    wire = orjson.loads(path.read_bytes())
    value = structure(wire, tp)
    for part in walk(value):
        assert not getattr(type(part), "__acp_unknown__", False), part
        assert not getattr(part, "extra", None), part
    # compared as bytes: a dict comparison would let 1 == 1.0 == True through
    sort = orjson.OPT_SORT_KEYS
    assert orjson.dumps(unstructure(value), option=sort) == orjson.dumps(wire, option=sort)


@pytest.mark.parametrize("path", GOLDEN_FILES, ids=lambda p: p.name)
def test_golden_frame_validates_against_schema(path: Path) -> None:
    """A golden frame is valid for the schema def of its type's name."""
    unstable_validator(path.name.split(".", 1)[0]).validate(orjson.loads(path.read_bytes()))


def test_tagged_union_builds_a_member_hook_when_its_tag_first_arrives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A union's member hooks are built lazily, once per tag, and give the same values."""
    compiled: list[str] = []
    original = codec._compile

    def spy(src: list[str], ns: dict[str, Any], name: str) -> Any:
        compiled.append(name)
        return original(src, ns, name)

    monkeypatch.setattr(codec, "_compile", spy)
    hook = codec.make_converter().get_structure_hook(t.SessionUpdate)
    assert "structure_Plan" not in compiled and "structure_ToolCall" not in compiled
    plan = {"sessionUpdate": "plan", "entries": []}
    first = hook(plan, None)
    assert isinstance(first, t.Plan) and compiled.count("structure_Plan") == 1
    assert hook(plan, None) == first
    assert compiled.count("structure_Plan") == 1  # built once
    assert isinstance(hook({"sessionUpdate": "no_such_kind"}, None), t.UnknownSessionUpdate)
