"""Tests of orchestrator.agent.client over memory streams, against the scripted agent."""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from attrs import define, field
from log_capture import capture_logs

from orchestrator._util import end_grace_periods
from orchestrator.agent.client import AgentConnection, ClientOptions, Turn, open_agent_on_stream
from orchestrator.agent.permissions import Escalation, PolicyPermissionService
from orchestrator.agent.services import (
    ClientServices,
    NowaitFileSystemService,
    PermissionDecision,
    PermissionRecord,
    SessionContext,
)
from orchestrator.agent.turn import TurnResult
from orchestrator.errors import (
    AgentHung,
    AuthenticationError,
    CapabilityNotSupported,
    InvalidParams,
    NotOffered,
    ProtocolVersionMismatch,
    ResourceNotFound,
    TurnTimeout,
    UsageError,
)
from orchestrator.policy import Answer, Policy, PolicySet, Rule
from orchestrator.protocol import types as t
from orchestrator.testing import (
    AgentRecord,
    AgentScript,
    AskPermission,
    AuthMethod,
    Capabilities,
    ConfigOption,
    ConfigValue,
    Flood,
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
    Stall,
    Step,
    Terminal,
    Think,
    ToolCall,
    ToolUpdate,
    Update,
    Usage,
    UserMessage,
    WriteFile,
    diff_content,
    serve_scripted_agent,
    terminal_content,
    text_content,
)
from orchestrator.testing import Turn as ScriptTurn

AGENT = "scripted"
#: seconds (virtual ones under autojump_clock) before a stuck test fails instead of hanging
LIMIT = 30.0
Extensions = Mapping[str, Callable[[Any], Any]]


# --------------------------------------------------------------------------- fixtures and helpers


@pytest.fixture(autouse=True)
def schema_violations_fail() -> Iterator[None]:
    """Capture logs; fail the test if a sent frame failed conftest's schema check.

    The JSON-RPC layer logs and swallows exceptions of its frame observer, so without this a
    schema violation would only show up as a log line.
    """
    with capture_logs() as events:
        yield
    failed = [e.get("exception", e) for e in events if e["event"] == "frame observer failed"]
    assert not failed, f"a frame our client sent failed the schema check: {failed[0]}"


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


@contextmanager
def _unwrapped() -> Iterator[None]:
    """Let a lone exception out of the helper's nursery as itself."""
    try:
        yield
    except BaseExceptionGroup as group:
        leaves = _leaves(group)
        if len(leaves) != 1:
            raise
        raise leaves[0] from leaves[0].__cause__


@asynccontextmanager
async def connect(
    script: AgentScript,
    *,
    services: ClientServices | None = None,
    options: ClientOptions | None = None,
    extensions: Extensions | None = None,
    agent_side: Callable[[trio.abc.Stream], trio.abc.Stream] | None = None,
) -> AsyncIterator[tuple[AgentConnection, AgentRecord]]:
    """An initialized client connection to a scripted agent served in memory, and its record."""
    client_end, agent_end = trio.testing.memory_stream_pair()
    served = agent_side(agent_end) if agent_side is not None else agent_end
    record = AgentRecord()
    with trio.fail_after(LIMIT), _unwrapped():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                functools.partial(serve_scripted_agent, served, script, record=record)
            )
            async with open_agent_on_stream(
                client_end, name=AGENT, services=services, options=options, extensions=extensions
            ) as conn:
                yield conn, record


def turns(*steps: Step, **kwargs: Any) -> AgentScript:
    """A script whose every prompt runs ``steps`` (``kwargs`` go to the agent script)."""
    return AgentScript(turns=(ScriptTurn(steps=steps),), **kwargs)


def received(record: AgentRecord) -> list[str]:
    """The methods of every request and notification the agent received, in order."""
    return [
        e["message"]["method"]
        for e in record.of("recv")
        if isinstance(e["message"], dict) and "method" in e["message"]
    ]


def chunk_text(update: t.SessionUpdate) -> str | None:
    """The text of a message chunk, None for any other update."""
    if isinstance(update, t.AgentMessageChunk) and isinstance(update.content, t.TextContent):
        return update.content.text
    return None


def result_of(turn: Turn) -> TurnResult:
    """The result of a turn that has ended."""
    assert turn.result is not None
    return turn.result


class Batching(trio.abc.Stream):
    """The agent's end of the wire, sending what it writes from ``start`` through ``end`` as
    one write, once, the way a pipe read often delivers several lines together."""

    def __init__(self, inner: trio.abc.Stream, start: bytes, end: bytes) -> None:
        self.inner, self.start, self.end = inner, start, end
        self.held: bytearray | None = None
        self.flushed = False

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        chunk = bytes(data)
        if not self.flushed and self.held is None and self.start in chunk:
            self.held = bytearray()
        if self.held is not None:
            self.held += chunk
            if self.end not in chunk:
                await trio.lowlevel.checkpoint()
                return
            chunk, self.held, self.flushed = bytes(self.held), None, True
        await self.inner.send_all(chunk)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()


def _decision(
    request: t.RequestPermissionRequest, ctx: SessionContext, option_id: str, rule: str
) -> PermissionDecision:
    call = request.tool_call
    record = PermissionRecord(
        time=0.0,
        agent=ctx.agent,
        session_id=ctx.session_id,
        tool_call_id=call.tool_call_id,
        kind=call.kind,
        title=call.title,
        verdict="allow",
        option_id=option_id,
        rule=rule,
        step=ctx.step,
    )
    return PermissionDecision(t.SelectedPermissionOutcome(option_id=option_id), record)


@define
class AllowAll:
    """A permission service that allows everything with the agent's first allow option."""

    rule: str = "test-allow"

    async def request_permission(
        self, request: t.RequestPermissionRequest, ctx: SessionContext
    ) -> PermissionDecision:
        """Pick the first allow option."""
        await trio.lowlevel.checkpoint()
        option = next(o for o in request.options if o.kind.startswith("allow"))
        return _decision(request, ctx, option.option_id, self.rule)


@define
class Undecided:
    """A permission service that never decides (a human who walked away)."""

    asked: trio.Event = field(factory=trio.Event)

    async def request_permission(
        self, request: t.RequestPermissionRequest, ctx: SessionContext
    ) -> PermissionDecision:
        """Wait forever."""
        self.asked.set()
        await trio.sleep_forever()


@define
class MemoryFs:
    """A file system service over a dict of absolute path -> text."""

    files: dict[str, str] = field(factory=dict)

    async def read_text_file(
        self, request: t.ReadTextFileRequest, ctx: SessionContext
    ) -> t.ReadTextFileResponse:
        """Serve a file's text."""
        await trio.lowlevel.checkpoint()
        if request.path not in self.files:
            raise ResourceNotFound(f"no such file: {request.path}")
        return t.ReadTextFileResponse(content=self.files[request.path])

    async def write_text_file(
        self, request: t.WriteTextFileRequest, ctx: SessionContext
    ) -> t.WriteTextFileResponse:
        """Store a file's text."""
        await trio.lowlevel.checkpoint()
        self.files[request.path] = request.content
        return t.WriteTextFileResponse()


@define
class FakeTerminals:
    """A terminal service that runs nothing: every command exits 0 printing ``ok``."""

    commands: list[str] = field(factory=list)

    async def create(
        self, request: t.CreateTerminalRequest, ctx: SessionContext
    ) -> t.CreateTerminalResponse:
        """Pretend to start the command."""
        await trio.lowlevel.checkpoint()
        self.commands.append(request.command)
        return t.CreateTerminalResponse(terminal_id=f"term-{len(self.commands)}")

    async def output(
        self, request: t.TerminalOutputRequest, ctx: SessionContext
    ) -> t.TerminalOutputResponse:
        """The fixed output."""
        await trio.lowlevel.checkpoint()
        status = t.TerminalExitStatus(exit_code=0)
        return t.TerminalOutputResponse(output="ok\n", truncated=False, exit_status=status)

    async def wait_for_exit(
        self, request: t.WaitForTerminalExitRequest, ctx: SessionContext
    ) -> t.WaitForTerminalExitResponse:
        """Exited with 0."""
        await trio.lowlevel.checkpoint()
        return t.WaitForTerminalExitResponse(exit_code=0)

    async def kill(
        self, request: t.KillTerminalRequest, ctx: SessionContext
    ) -> t.KillTerminalResponse:
        """Nothing to kill."""
        await trio.lowlevel.checkpoint()
        return t.KillTerminalResponse()

    async def release(
        self, request: t.ReleaseTerminalRequest, ctx: SessionContext
    ) -> t.ReleaseTerminalResponse:
        """Nothing to release."""
        await trio.lowlevel.checkpoint()
        return t.ReleaseTerminalResponse()


class Awaited:
    """An awaitable that remembers whether it was awaited (and never warns if it was not)."""

    def __init__(self) -> None:
        self.done = False

    def __await__(self) -> Generator[Any, None, None]:
        self.done = True
        return
        yield  # a generator, so that awaiting it yields nothing


# --------------------------------------------------------------------------- initialize


async def test_initialize_advertises_no_fs_or_terminal_by_default() -> None:
    """With no services installed, initialize advertises no fs, no terminal, no elicitation;
    only that notices are shown (every turn keeps them)."""
    async with connect(AgentScript()) as (conn, record):
        init = record.first("initialize")
    assert init["protocolVersion"] == 1
    assert init["clientCapabilities"] == {
        "fs": {"readTextFile": False, "writeTextFile": False},
        "terminal": False,
        "session": {"notices": {}},
    }
    assert init["clientInfo"]["name"] == "acp-orchestrator"
    assert conn.agent_info is not None
    assert conn.agent_info.name == "scripted-agent"


async def test_initialize_advertises_installed_fs() -> None:
    """An fs service is advertised as readTextFile and writeTextFile, and nothing more."""
    async with connect(AgentScript(), services=ClientServices(fs=MemoryFs())) as (_, record):
        caps = record.first("initialize")["clientCapabilities"]
    assert caps == {
        "fs": {"readTextFile": True, "writeTextFile": True},
        "terminal": False,
        "session": {"notices": {}},
    }


async def test_initialize_advertises_installed_terminal() -> None:
    """A terminal service is advertised as terminal: true."""
    services = ClientServices(terminal=FakeTerminals())
    async with connect(AgentScript(), services=services) as (_, record):
        caps = record.first("initialize")["clientCapabilities"]
    assert caps == {
        "fs": {"readTextFile": False, "writeTextFile": False},
        "terminal": True,
        "session": {"notices": {}},
    }


async def test_protocol_version_mismatch_is_refused() -> None:
    """An agent answering another protocol version is refused with ProtocolVersionMismatch."""
    with pytest.raises(ProtocolVersionMismatch, match="version 2") as info:
        async with connect(AgentScript(protocol_version=2)):
            pytest.fail("connected to an agent that speaks protocol version 2")
    assert info.value.agent == AGENT


# --------------------------------------------------------------------------- session/new _meta


def new_session_params(record: AgentRecord) -> list[Any]:
    """The params of every session/new the agent received, in order."""
    return [
        e["message"].get("params")
        for e in record.of("recv")
        if isinstance(e["message"], dict) and e["message"].get("method") == "session/new"
    ]


async def test_step_meta_names_the_step_in_session_new(tmp_path: Path) -> None:
    """With step_meta, session/new carries the step key under _meta["acp-orchestrator"]."""
    async with connect(turns(), options=ClientOptions(step_meta=True)) as (conn, record):
        session = await conn.new_session(tmp_path, step="review[alice]")
        await conn.new_session(tmp_path)  # no step: no _meta
    assert session.step == "review[alice]"
    first, second = new_session_params(record)
    assert first["_meta"] == {"acp-orchestrator": {"step": "review[alice]"}}
    assert "_meta" not in second


async def test_step_meta_names_the_instance_when_given(tmp_path: Path) -> None:
    """An instance given names the session/new's step in _meta; the session's own step (what
    policies scope by) stays the step's name."""
    async with connect(turns(), options=ClientOptions(step_meta=True)) as (conn, record):
        session = await conn.new_session(tmp_path, step="review", instance="review[alice]")
    assert session.step == "review"
    (params,) = new_session_params(record)
    assert params["_meta"] == {"acp-orchestrator": {"step": "review[alice]"}}


async def test_step_meta_is_off_by_default(tmp_path: Path) -> None:
    """Without step_meta, session/new sends no _meta even for a session of a step."""
    async with connect(turns()) as (conn, record):
        await conn.new_session(tmp_path, step="review")
    (params,) = new_session_params(record)
    assert "_meta" not in params


# --------------------------------------------------------------------------- authentication


async def test_only_auth_method_is_used_automatically(tmp_path: Path) -> None:
    """On -32000 the client authenticates with the only method offered and retries."""
    script = AgentScript(require_auth=True, auth_methods=(AuthMethod("oauth", "OAuth"),))
    async with connect(script) as (conn, record):
        session = await conn.new_session(tmp_path)
    assert session.session_id == "sess-1"
    assert received(record) == ["initialize", "session/new", "authenticate", "session/new"]
    assert record.first("authenticate") == {
        "event": "authenticate",
        "methodId": "oauth",
        "ok": True,
    }


async def test_configured_auth_method_is_chosen(tmp_path: Path) -> None:
    """With several methods offered, ClientOptions(auth_method=...) picks one."""
    methods = (AuthMethod("oauth", "OAuth"), AuthMethod("api-key", "API key"))
    script = AgentScript(require_auth=True, auth_methods=methods)
    options = ClientOptions(auth_method="api-key")
    async with connect(script, options=options) as (conn, record):
        await conn.new_session(tmp_path)
    assert [e["methodId"] for e in record.of("authenticate")] == ["api-key"]


async def test_several_auth_methods_and_none_configured_is_an_error(tmp_path: Path) -> None:
    """Several methods and none configured: AuthenticationError listing them, nothing sent."""
    methods = (AuthMethod("oauth", "OAuth"), AuthMethod("api-key", "API key"))
    script = AgentScript(require_auth=True, auth_methods=methods)
    async with connect(script) as (conn, record):
        with pytest.raises(AuthenticationError, match="oauth, api-key") as info:
            await conn.new_session(tmp_path)
    assert info.value.agent == AGENT
    assert "authenticate" not in received(record)
    assert conn.sessions == {}


# --------------------------------------------------------------------------- sessions

GATED: dict[str, Callable[[AgentConnection, Path], Awaitable[object]]] = {
    "session/load": lambda conn, cwd: conn.load_session("old-1", cwd),
    "session/resume": lambda conn, cwd: conn.resume_session("old-1", cwd),
    "session/list": lambda conn, cwd: conn.list_sessions(cwd),
    "session/close": lambda conn, cwd: conn.close_session("sess-1"),
    "session/delete": lambda conn, cwd: conn.delete_session("sess-1"),
}


@pytest.mark.parametrize("method", sorted(GATED))
async def test_unadvertised_session_methods_are_refused_locally(
    method: str, tmp_path: Path
) -> None:
    """A session method the agent did not advertise raises CapabilityNotSupported, unsent."""
    async with connect(AgentScript()) as (conn, record):
        await conn.new_session(tmp_path)
        with pytest.raises(CapabilityNotSupported, match=method) as info:
            await GATED[method](conn, tmp_path)
        assert info.value.agent == AGENT
        assert method not in received(record)
        assert list(conn.sessions) == ["sess-1"]


async def test_load_session_replays_history_into_background_updates(tmp_path: Path) -> None:
    """session/load works when advertised; the replayed history lands in background_updates."""
    history = (UserMessage("fix the bug"), Say("Fixed it."), ToolCall("t0", "Edit", kind="edit"))
    script = turns(Say("again"), capabilities=Capabilities(load_session=True), load_history=history)
    async with connect(script) as (conn, record):
        session = await conn.load_session("old-7", tmp_path)
        assert conn.sessions["old-7"] is session
        replayed = list(session.background_updates)
        result = await session.prompt("more")
    assert [type(u) for u in replayed] == [t.UserMessageChunk, t.AgentMessageChunk, t.ToolCall]
    assert record.first("session_load") == {
        "event": "session_load",
        "sessionId": "old-7",
        "cwd": str(tmp_path),
        "mcpServers": [],
    }
    assert result.text == "again"
    assert session.background_updates == replayed


async def test_resume_session_when_advertised(tmp_path: Path) -> None:
    """session/resume works when advertised, without replaying anything."""
    script = AgentScript(capabilities=Capabilities(session_resume=True))
    async with connect(script) as (conn, record):
        session = await conn.resume_session("old-3", tmp_path)
    assert conn.sessions["old-3"] is session
    assert session.background_updates == []
    assert record.first("session_resume")["sessionId"] == "old-3"


async def test_list_sessions_when_advertised(tmp_path: Path) -> None:
    """session/list works when advertised and filters by cwd."""
    script = AgentScript(capabilities=Capabilities(session_list=True))
    async with connect(script) as (conn, _):
        await conn.new_session(tmp_path / "a")
        await conn.new_session(tmp_path / "b")
        only_a = await conn.list_sessions(tmp_path / "a")
        every = await conn.list_sessions()
    assert [(s.session_id, s.cwd) for s in only_a.sessions] == [("sess-1", str(tmp_path / "a"))]
    assert sorted(s.session_id for s in every.sessions) == ["sess-1", "sess-2"]


@pytest.mark.parametrize("method", ["close", "delete"])
async def test_close_and_delete_session_when_advertised(method: str, tmp_path: Path) -> None:
    """session/close and session/delete work when advertised and forget the session."""
    caps = Capabilities(session_close=True, session_delete=True)
    async with connect(AgentScript(capabilities=caps)) as (conn, record):
        kept = await conn.new_session(tmp_path)
        gone = await conn.new_session(tmp_path)
        if method == "close":
            await conn.close_session(gone.session_id)
        else:
            await conn.delete_session(gone.session_id)
    assert list(conn.sessions) == [kept.session_id]
    assert record.first(f"session_{method}")["sessionId"] == gone.session_id


# --------------------------------------------------------------------------- modes and options

MODES = (Mode("ask", "Ask"), Mode("code", "Code"))
MODEL = ConfigOption(
    "model",
    "Model",
    current_value="small",
    options=(ConfigValue("small", "Small"), ConfigValue("big", "Big Model")),
    category="model",
)
FAST = ConfigOption("fast", "Fast mode", current_value=False, type="boolean")


async def test_set_mode(tmp_path: Path) -> None:
    """set_mode switches the mode; the agent's current_mode_update arrives outside any turn."""
    async with connect(AgentScript(modes=MODES)) as (conn, record):
        session = await conn.new_session(tmp_path)
        assert session.current_mode == "ask"
        await session.set_mode("code")
        assert session.current_mode == "code"
        [update] = session.background_updates
    assert isinstance(update, t.CurrentModeUpdate)
    assert update.current_mode_id == "code"
    assert record.first("set_mode") == {
        "event": "set_mode",
        "sessionId": "sess-1",
        "modeId": "code",
    }


async def test_set_unknown_mode_is_a_usage_error_listing_modes(tmp_path: Path) -> None:
    """An unknown mode raises UsageError naming the modes offered, and nothing is sent."""
    async with connect(AgentScript(modes=MODES)) as (conn, record):
        session = await conn.new_session(tmp_path)
        with pytest.raises(UsageError, match="ask, code"):
            await session.set_mode("yolo")
    assert "session/set_mode" not in received(record)
    assert session.current_mode == "ask"


async def test_set_mode_prefers_the_mode_config_option(tmp_path: Path) -> None:
    """With a config option of category mode as well as modes, set_mode sets the option (by
    value or name) and sends no session/set_mode; a mode it lacks is NotOffered, unsent."""
    mode = ConfigOption(
        "mode",
        "Mode",
        current_value="ask",
        options=(ConfigValue("ask", "Ask"), ConfigValue("code", "Code")),
        category="mode",
    )
    async with connect(AgentScript(modes=MODES, config_options=(mode,))) as (conn, record):
        session = await conn.new_session(tmp_path)
        await session.set_mode("Code")
        with pytest.raises(NotOffered, match=r"offers no mode 'yolo'; it offers: ask, code"):
            await session.set_mode("yolo")
        assert session.current_choice("mode") == "code"
    assert record.first("set_config_option")["value"] == "code"
    assert "session/set_mode" not in received(record)


async def test_set_mode_without_modes_is_unsupported(tmp_path: Path) -> None:
    """An agent that reports neither modes nor a mode option cannot switch modes: nothing sent."""
    async with connect(AgentScript()) as (conn, record):
        session = await conn.new_session(tmp_path)
        with pytest.raises(CapabilityNotSupported, match="no modes"):
            await session.set_mode("code")
    assert "session/set_mode" not in received(record)


async def test_set_config_option(tmp_path: Path) -> None:
    """set_config_option sends the value and takes the agent's updated list."""
    async with connect(AgentScript(config_options=(MODEL, FAST))) as (conn, record):
        session = await conn.new_session(tmp_path)
        await session.set_config_option("fast", True)
    fast = next(o for o in session.config_options if isinstance(o, t.SessionConfigBoolean))
    assert fast.current_value is True
    assert record.first("set_config_option") == {
        "event": "set_config_option",
        "sessionId": "sess-1",
        "configId": "fast",
        "value": True,
    }


@pytest.mark.parametrize("choice", ["Big Model", "big"])
async def test_set_model_by_category(choice: str, tmp_path: Path) -> None:
    """set_model finds the option of category model and sets it by value or by name."""
    async with connect(AgentScript(config_options=(FAST, MODEL))) as (conn, record):
        session = await conn.new_session(tmp_path)
        await session.set_model(choice)
        model = session.option_by_category("model")
    assert isinstance(model, t.SessionConfigSelect)
    assert model.current_value == "big"
    assert record.first("set_config_option")["configId"] == "model"
    assert record.first("set_config_option")["value"] == "big"


async def test_set_model_refusals(tmp_path: Path) -> None:
    """An unknown model is a UsageError listing the models; no model option is unsupported."""
    async with connect(AgentScript(config_options=(MODEL,))) as (conn, record):
        session = await conn.new_session(tmp_path)
        with pytest.raises(UsageError, match="small, big"):
            await session.set_model("huge")
    assert "session/set_config_option" not in received(record)
    async with connect(AgentScript(config_options=(FAST,))) as (conn, _):
        session = await conn.new_session(tmp_path)
        with pytest.raises(CapabilityNotSupported, match="model"):
            await session.set_model("big")


# --------------------------------------------------------------------------- prompt capabilities

BLOCKS: dict[str, tuple[t.ContentBlock, Capabilities, str]] = {
    "image": (
        t.ImageContent(data="iVBORw0KGgo=", mime_type="image/png"),
        Capabilities(image=True),
        "image",
    ),
    "audio": (
        t.AudioContent(data="UklGRg==", mime_type="audio/wav"),
        Capabilities(audio=True),
        "audio",
    ),
    "embeddedContext": (
        t.EmbeddedResource(resource=t.TextResourceContents(uri="file:///p/a.txt", text="hi")),
        Capabilities(embedded_context=True),
        "resource",
    ),
}


@pytest.mark.parametrize("capability", sorted(BLOCKS))
async def test_prompt_blocks_refused_without_capability(capability: str, tmp_path: Path) -> None:
    """A block the agent did not advertise raises CapabilityNotSupported before anything is sent."""
    block, _, _ = BLOCKS[capability]
    async with connect(turns(Say("ok"))) as (conn, record):
        session = await conn.new_session(tmp_path)
        with pytest.raises(CapabilityNotSupported, match=capability):
            await session.prompt(["look at this", block])
        assert "session/prompt" not in received(record)
        assert session.turns == 0
        result = await session.prompt("text is fine")
    assert result.text == "ok"


@pytest.mark.parametrize("capability", sorted(BLOCKS))
async def test_prompt_blocks_sent_with_capability(capability: str, tmp_path: Path) -> None:
    """A block the agent advertised goes out as is."""
    block, caps, wire_type = BLOCKS[capability]
    async with connect(turns(Say("ok"), capabilities=caps)) as (conn, record):
        session = await conn.new_session(tmp_path)
        result = await session.prompt(["look at this", block])
    assert result.text == "ok"
    sent = record.first("prompt")["prompt"]
    assert [b["type"] for b in sent] == ["text", wire_type]


# --------------------------------------------------------------------------- a full turn

CONFIG_UPDATE = {
    "sessionUpdate": "config_option_update",
    "configOptions": [
        {
            "type": "select",
            "id": "model",
            "name": "Model",
            "category": "model",
            "currentValue": "big",
            "options": [{"value": "small", "name": "Small"}, {"value": "big", "name": "Big"}],
        }
    ],
}
EVERY_KIND: tuple[Step, ...] = (
    Think("Let me look", chunks=2),
    Say("Hello, ", chunks=1),
    Plan((PlanEntry("read main.py"), PlanEntry("fix it"))),
    ToolCall(
        "t1",
        "Edit main.py",
        kind="edit",
        locations=(Location("/p/main.py", 3),),
        raw_input={"path": "/p/main.py"},
        content=(text_content("about to edit"),),
    ),
    ToolUpdate(
        "t1",
        status="in_progress",
        content=(diff_content("/p/main.py", "new\n", "old\n"), terminal_content("term-7")),
    ),
    ToolUpdate("t1", status="completed", locations=(Location("/p/main.py", 10),)),
    ToolUpdate("t1", raw_output={"ok": True}),
    ToolCall("t2", "Read notes", kind="read"),
    Say("world", chunks=2),
    Plan(
        (PlanEntry("read main.py", status="completed"), PlanEntry("fix it", status="in_progress"))
    ),
    Usage(used=1200, size=200_000, cost=0.25),
    Update({"sessionUpdate": "current_mode_update", "currentModeId": "code"}),
    Update(CONFIG_UPDATE),
    Update({"sessionUpdate": "session_info_update", "title": "Fixing main"}),
    Update(
        {
            "sessionUpdate": "available_commands_update",
            "availableCommands": [{"name": "web", "description": "Search the web"}],
        }
    ),
    Update({"sessionUpdate": "notice_v9", "level": "info", "message": "from the future"}),
    Update(
        {
            "sessionUpdate": "notice",
            "severity": "warning",
            "title": "Context almost full",
            "description": "Older messages will be summarized.",
        }
    ),
    Usage(used=1500, size=200_000),
)
#: how many session/update notifications EVERY_KIND sends
EVERY_KIND_UPDATES = 20
#: of those, message and thought chunks (folded into text and thoughts, not kept by default)
EVERY_KIND_CHUNKS = 5


async def test_chunks_are_kept_when_asked(tmp_path: Path) -> None:
    """ClientOptions(keep_chunks=True) keeps message and thought chunks in result.updates."""
    script = AgentScript(
        modes=MODES, turns=(ScriptTurn(steps=EVERY_KIND, stop_reason="max_tokens"),)
    )
    async with connect(script, options=ClientOptions(keep_chunks=True)) as (conn, _):
        session = await conn.new_session(tmp_path)
        result = await session.prompt("fix main.py")
    assert len(result.updates) == EVERY_KIND_UPDATES


async def test_turn_accumulates_every_update_kind(tmp_path: Path) -> None:
    """A turn with every update kind folds into text, thoughts, tool calls, plan, usage ..."""
    script = AgentScript(
        modes=MODES, turns=(ScriptTurn(steps=EVERY_KIND, stop_reason="max_tokens"),)
    )
    async with connect(script) as (conn, _):
        session = await conn.new_session(tmp_path)
        result = await session.prompt("fix main.py")
    assert result.stop_reason == "max_tokens"
    assert (result.text, result.thoughts) == ("Hello, world", "Let me look")
    assert len(result.updates) == EVERY_KIND_UPDATES - EVERY_KIND_CHUNKS
    assert not any(isinstance(u, t.AgentMessageChunk | t.AgentThoughtChunk) for u in result.updates)
    assert list(result.tool_calls) == ["t1", "t2"]
    edit = result.tool_calls["t1"]
    assert (edit.title, edit.kind, edit.status, edit.updates) == (
        "Edit main.py",
        "edit",
        "completed",
        3,
    )
    assert [(d.path, d.old_text, d.new_text) for d in edit.diffs()] == [
        ("/p/main.py", "old\n", "new\n")
    ]
    assert edit.terminal_ids() == ["term-7"]
    assert [(loc.path, loc.line) for loc in edit.locations] == [("/p/main.py", 10)]
    assert (edit.raw_input, edit.raw_output) == ({"path": "/p/main.py"}, {"ok": True})
    read = result.tool_calls["t2"]
    assert (read.kind, read.status, read.updates) == ("read", "pending", 0)
    assert result.plan is not None
    assert [(e.content, e.status) for e in result.plan] == [
        ("read main.py", "completed"),
        ("fix it", "in_progress"),
    ]
    assert result.usage is not None
    assert (result.usage.used, result.usage.cost) == (1500, None)
    assert result.mode_changes == ["code"]
    assert session.current_mode == "code"
    assert result.config_options is not None
    assert session.config_options == result.config_options
    model = session.option_by_category("model")
    assert isinstance(model, t.SessionConfigSelect)
    assert model.current_value == "big"
    assert [i.title for i in result.session_info] == ["Fixing main"]
    assert result.available_commands is not None
    assert [c.name for c in result.available_commands] == ["web"]
    [unknown] = result.unknown_updates
    assert unknown.session_update == "notice_v9"
    assert unknown.raw["message"] == "from the future"
    assert result.notices == [
        t.Notice(
            severity="warning",
            title="Context almost full",
            description="Older messages will be summarized.",
        )
    ]
    assert result.notices_json() == [
        {
            "severity": "warning",
            "title": "Context almost full",
            "description": "Older messages will be summarized.",
        }
    ]
    assert not result.cancel_requested
    assert session.background_updates == []


async def test_mode_update_without_modes_changes_no_session_state(tmp_path: Path) -> None:
    """A current_mode_update from an agent that offered no modes is only part of the turn."""
    mode_update = {"sessionUpdate": "current_mode_update", "currentModeId": "code"}
    async with connect(turns(Update(mode_update), Say("ok"))) as (conn, _):
        session = await conn.new_session(tmp_path)
        result = await session.prompt("go")
    assert (session.modes, session.current_mode) == (None, None)
    assert (result.mode_changes, result.text) == (["code"], "ok")
    assert session.config_options == []


async def test_live_updates_are_the_results_updates_in_order(tmp_path: Path) -> None:
    """Iterating turn.updates() inside open_turn yields the turn's updates, in order."""
    seen: list[t.SessionUpdate] = []
    async with connect(turns(*EVERY_KIND)) as (conn, _):
        session = await conn.new_session(tmp_path)
        async with session.open_turn("fix main.py") as turn:
            async for update in turn.updates():
                seen.append(update)
    result = result_of(turn)
    assert len(seen) == EVERY_KIND_UPDATES  # chunks included: open_turn streams everything
    assert [u for u in seen if not isinstance(u, t.AgentMessageChunk | t.AgentThoughtChunk)] == (
        result.updates
    )


async def test_late_subscriber_gets_earlier_updates_first(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    """Subscribing mid-turn yields what already arrived, then the rest live."""
    two_seen = trio.Event()
    calls: list[t.SessionUpdate] = []

    def on_update(update: t.SessionUpdate) -> None:
        calls.append(update)
        if len(calls) == 2:
            two_seen.set()

    script = turns(Say("a"), Say("b"), Sleep(1), Say("c"), Say("d"))
    async with connect(script) as (conn, _):
        session = await conn.new_session(tmp_path)
        async with session.open_turn("go", on_update=on_update) as turn:
            await two_seen.wait()
            texts = [chunk_text(u) async for u in turn.updates()]
    assert texts == ["a", "b", "c", "d"]
    assert [chunk_text(u) for u in calls] == texts
    assert result_of(turn).text == "abcd"


async def test_result_comes_after_every_update_that_preceded_it(tmp_path: Path) -> None:
    """Updates and the response read in one batch: the result still holds every update."""

    def batch(stream: trio.abc.Stream) -> trio.abc.Stream:
        return Batching(stream, start=b'"agent_message_chunk"', end=b'"stopReason"')

    async with connect(turns(Flood(3000), Say("!")), agent_side=batch) as (conn, _):
        session = await conn.new_session(tmp_path)
        result = await session.prompt("go")
    assert result.text == "x" * 3000 + "!"
    assert result.updates == []  # chunks are folded into the text, not kept


async def test_updates_after_the_response_land_in_background_updates(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    """An update the agent sends after the prompt response goes to background_updates."""
    done = trio.Event()
    script = AgentScript(
        turns=(
            ScriptTurn(
                steps=(Say("in turn"),),
                updates_after_response=(Sleep(1), Say("late"), Notify("_test/done")),
            ),
        )
    )
    extensions = {"_test/done": lambda params: done.set()}
    async with connect(script, extensions=extensions) as (conn, _):
        session = await conn.new_session(tmp_path)
        result = await session.prompt("go")
        await done.wait()
    assert result.text == "in turn"
    [late] = session.background_updates
    assert isinstance(late, t.AgentMessageChunk)
    assert isinstance(late.content, t.TextContent)
    assert late.content.text == "late"


async def test_updates_right_behind_the_response_stay_out_of_the_turn(tmp_path: Path) -> None:
    """An update read together with the prompt response still goes to background_updates."""
    done = trio.Event()
    script = AgentScript(
        turns=(
            ScriptTurn(
                steps=(Say("in turn"),),
                updates_after_response=(Say("late"), Notify("_test/done")),
            ),
        )
    )

    def batch(stream: trio.abc.Stream) -> trio.abc.Stream:
        return Batching(stream, start=b'"stopReason"', end=b'"_test/done"')

    extensions = {"_test/done": lambda params: done.set()}
    async with connect(script, extensions=extensions, agent_side=batch) as (conn, _):
        session = await conn.new_session(tmp_path)
        result = await session.prompt("go")
        await done.wait()
    assert result.text == "in turn"
    assert len(session.background_updates) == 1


# --------------------------------------------------------------------------- permissions

ASK = AskPermission(PermissionToolCall("t9", title="rm -rf build", kind="execute"))


async def test_default_service_rejects_and_records(tmp_path: Path) -> None:
    """With no permission service the reject option is chosen and an audit record kept."""
    async with connect(turns(Say("asking"), ASK, Say(" went ahead"))) as (conn, record):
        session = await conn.new_session(tmp_path, step="cleanup")
        result = await session.prompt("clean up")
    permission = record.first("permission")
    assert (permission["decision"], permission["optionId"]) == ("reject", "reject")
    assert (result.stop_reason, result.text) == ("end_turn", "asking")
    [audit] = session.permissions
    assert (audit.agent, audit.session_id, audit.step, audit.rule) == (
        AGENT,
        "sess-1",
        "cleanup",
        "default",
    )
    assert (audit.tool_call_id, audit.kind, audit.title) == ("t9", "execute", "rm -rf build")
    assert (audit.verdict, audit.option_id) == ("reject", "reject")
    assert result.permissions == [audit]


async def test_default_service_never_picks_an_allow_option(tmp_path: Path) -> None:
    """Offered only allow options, the default service answers cancelled."""
    options = (
        PermissionOption("approved", "Approve", "allow_once"),
        PermissionOption("always", "Always", "allow_always"),
    )
    ask = AskPermission(PermissionToolCall("t1", title="deploy"), options=options)
    async with connect(turns(ask, Say("deployed"))) as (conn, record):
        session = await conn.new_session(tmp_path)
        result = await session.prompt("deploy")
    assert record.first("permission")["answer"] == {"result": {"outcome": {"outcome": "cancelled"}}}
    assert (result.stop_reason, result.text) == ("cancelled", "")
    assert [(a.verdict, a.option_id) for a in session.permissions] == [("reject", None)]


async def test_session_services_override_the_connections(tmp_path: Path) -> None:
    """Permission requests are answered by the session's services, else the connection's."""
    services = ClientServices(permission=AllowAll())
    async with connect(turns(ASK, Say("done")), services=services) as (conn, record):
        trusted = await conn.new_session(tmp_path)
        strict = await conn.new_session(tmp_path, services=ClientServices())
        allowed = await trusted.prompt("go")
        rejected = await strict.prompt("go")
    decisions = {e["sessionId"]: e["decision"] for e in record.of("permission")}
    assert decisions == {"sess-1": "allow", "sess-2": "reject"}
    assert (allowed.text, rejected.text) == ("done", "")
    assert [a.rule for a in trusted.permissions] == ["test-allow"]
    assert [a.rule for a in strict.permissions] == ["default"]


# --------------------------------------------------------------------------- cancel


async def test_cancel_answers_a_pending_permission_request_cancelled(tmp_path: Path) -> None:
    """cancel() sends session/cancel, answers the pending permission cancelled, ends the turn."""
    undecided = Undecided()
    script = turns(Say("about to run"), ASK, Say(" ran it"))
    services = ClientServices(permission=undecided)
    async with connect(script, services=services) as (conn, record):
        session = await conn.new_session(tmp_path)
        async with session.open_turn("run it") as turn:
            await undecided.asked.wait()
            await session.cancel()
        answer = await record.wait_for("response")
    result = result_of(turn)
    assert (result.stop_reason, result.text, result.cancel_requested) == (
        "cancelled",
        "about to run",
        True,
    )
    assert record.first("cancel") == {"event": "cancel", "sessionId": "sess-1", "running": True}
    assert answer["method"] == "session/request_permission"
    assert answer["result"] == {"outcome": {"outcome": "cancelled"}}
    [audit] = session.permissions
    assert (audit.verdict, audit.option_id, audit.tool_call_id) == ("cancelled", None, "t9")
    assert result.permissions == [audit]


@define
class SlowToWithdraw:
    """An escalation nobody answers, slow to let go when withdrawn (as a question asked from
    a worker thread is): it returns only once every other task waits, so the agent's answer
    to the cancel has been read before the service records the cancellation."""

    asked: trio.Event = field(factory=trio.Event)

    async def __call__(self, escalation: Escalation) -> Answer | None:
        """Wait forever; when cancelled, first wait for everything else to settle."""
        self.asked.set()
        try:
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await trio.testing.wait_all_tasks_blocked()


async def test_request_recorded_after_the_cancelled_response_is_in_the_turn(
    tmp_path: Path,
) -> None:
    """A request pending at cancel, recorded after the prompt response was read, is the turn's."""
    escalation = SlowToWithdraw()
    policy = PolicySet(run=Policy([Rule("ask", name="ask to run", kinds="execute")]))
    service = PolicyPermissionService(policy, escalate=escalation)
    script = turns(Say("about to run"), ASK, Say(" ran it"))
    async with connect(script, services=ClientServices(permission=service)) as (conn, record):
        session = await conn.new_session(tmp_path)
        async with session.open_turn("run it") as turn:
            await escalation.asked.wait()
            await session.cancel()
        answer = await record.wait_for("response")
    result = result_of(turn)
    assert (result.stop_reason, result.cancel_requested) == ("cancelled", True)
    assert [(r.tool_call_id, r.verdict, r.rule) for r in result.permissions] == [
        ("t9", "cancelled", "cancelled")
    ]
    assert result.permissions == session.permissions == service.records
    assert answer["result"] == {"outcome": {"outcome": "cancelled"}}


async def test_request_read_with_the_cancelled_response_is_in_the_turn(tmp_path: Path) -> None:
    """A request sent before the cancel but read together with the prompt response is the turn's,
    though its handler only runs after the turn's end was read."""

    def batch(stream: trio.abc.Stream) -> trio.abc.Stream:
        return Batching(stream, start=b'"session/request_permission"', end=b'"stopReason"')

    script = turns(Say("about to run"), ASK, Say(" ran it"))
    services = ClientServices(permission=Undecided())
    async with connect(script, services=services, agent_side=batch) as (conn, record):
        session = await conn.new_session(tmp_path)
        async with session.open_turn("run it") as turn:
            await record.wait_for("prompt")
            await trio.testing.wait_all_tasks_blocked()  # the agent waits for its answer
            await session.cancel()
        answer = await record.wait_for("response")
    result = result_of(turn)
    assert (result.stop_reason, result.text) == ("cancelled", "about to run")
    [audit] = session.permissions
    assert (audit.tool_call_id, audit.verdict, audit.option_id) == ("t9", "cancelled", None)
    assert result.permissions == [audit]
    assert answer["result"] == {"outcome": {"outcome": "cancelled"}}


async def test_request_still_pending_at_the_turns_end_is_withdrawn(tmp_path: Path) -> None:
    """A request the agent left unanswered when it ended its turn is answered cancelled, and
    its record is in the turn's result."""
    abandoned = {
        "jsonrpc": "2.0",
        "id": "abandoned",
        "method": "session/request_permission",
        "params": {
            "sessionId": "sess-1",
            "toolCall": {"toolCallId": "t7", "title": "rm -rf build", "kind": "execute"},
            "options": [{"optionId": "allow", "name": "Allow", "kind": "allow_once"}],
        },
    }
    script = turns(Raw(json.dumps(abandoned)), Say("done"))
    undecided = Undecided()
    async with connect(script, services=ClientServices(permission=undecided)) as (conn, record):
        session = await conn.new_session(tmp_path)
        result = await session.prompt("go")
        late = await record.wait_for("unexpected_response")
    assert (result.stop_reason, result.cancel_requested) == ("end_turn", False)
    assert undecided.asked.is_set()
    [audit] = session.permissions
    assert (audit.tool_call_id, audit.verdict, audit.option_id) == ("t7", "cancelled", None)
    assert result.permissions == [audit]
    assert late["message"]["id"] == "abandoned"
    assert late["message"]["result"] == {"outcome": {"outcome": "cancelled"}}


async def test_end_turn_after_cancel_is_accepted(tmp_path: Path) -> None:
    """An agent that answers end_turn to a cancel ends the turn normally, cancel_requested."""
    script = AgentScript(
        turns=(ScriptTurn(steps=(Say("working"), Stall()), cancel_stop_reason="end_turn"),)
    )
    async with connect(script) as (conn, record):
        session = await conn.new_session(tmp_path)
        async with session.open_turn("go") as turn:
            await record.wait_for("prompt")
            await session.cancel()
            await session.wait_turn_end()
    result = result_of(turn)
    assert (result.stop_reason, result.text, result.cancel_requested) == (
        "end_turn",
        "working",
        True,
    )


async def test_turn_that_never_ends_after_cancel_is_hung(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    """A turn still running cancel_grace after session/cancel raises AgentHung."""
    script = AgentScript(turns=(ScriptTurn(steps=(Stall(),), ignore_cancel=True),))
    async with connect(script, options=ClientOptions(cancel_grace=7)) as (conn, record):
        session = await conn.new_session(tmp_path)
        start = trio.current_time()

        async def cancel_and_wait() -> None:
            nonlocal start
            async with session.open_turn("go"):
                await record.wait_for("prompt")
                start = trio.current_time()
                await session.cancel()
                await session.wait_turn_end()

        with pytest.raises(AgentHung, match="7s after session/cancel") as info:
            await cancel_and_wait()
        assert trio.current_time() - start == pytest.approx(7)
        assert info.value.agent == AGENT
        assert record.first("cancel")["running"] is True
    # the abandoned session/prompt is not withdrawn with $/cancel_request: a turn ends with
    # session/cancel, and the client just stops waiting
    assert received(record).count("session/cancel") == 1
    assert "$/cancel_request" not in received(record)


async def test_cancelled_caller_ends_the_turn_with_session_cancel(tmp_path: Path) -> None:
    """A caller cancelled mid-turn: session/cancel, the turn's end awaited, no $/cancel_request."""
    undecided = Undecided()
    script = turns(Say("about to run"), ASK, Say(" ran it"))
    async with connect(script, services=ClientServices(permission=undecided)) as (conn, record):
        session = await conn.new_session(tmp_path)
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(session.prompt, "run it")
                await undecided.asked.wait()
                scope.cancel()
        assert scope.cancelled_caught
        # the turn ended before Cancelled went on: the agent answered it
        assert record.first("turn_end")["stopReason"] == "cancelled"
    assert received(record) == ["initialize", "session/new", "session/prompt", "session/cancel"]
    answer = record.first("response")
    assert answer["method"] == "session/request_permission"
    assert answer["result"] == {"outcome": {"outcome": "cancelled"}}
    result = session.last_result
    assert result is not None
    assert (result.stop_reason, result.text, result.cancel_requested) == (
        "cancelled",
        "about to run",
        True,
    )
    assert [(p.verdict, p.tool_call_id) for p in result.permissions] == [("cancelled", "t9")]


async def test_cancelled_caller_gives_up_after_the_interrupt_grace(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    """An agent ignoring session/cancel gets interrupt_grace; then Cancelled goes on."""
    script = AgentScript(turns=(ScriptTurn(steps=(Say("working"), Stall()), ignore_cancel=True),))
    options = ClientOptions(cancel_grace=10, interrupt_grace=3)
    async with connect(script, options=options) as (conn, record):
        session = await conn.new_session(tmp_path)
        start = trio.current_time()
        with trio.CancelScope() as scope:
            await session.prompt("go", on_update=lambda update: scope.cancel())
        assert scope.cancelled_caught
        assert trio.current_time() - start == pytest.approx(3)
        assert record.first("cancel")["running"] is True
    assert "$/cancel_request" not in received(record)
    result = session.last_result
    assert result is not None
    assert (result.stop_reason, result.text, result.cancel_requested) == (None, "working", True)


async def test_ending_grace_periods_cuts_the_wait_for_an_interrupted_turn_short(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    """end_grace_periods() (a second Ctrl-C) stops waiting for the agent at once."""
    script = AgentScript(turns=(ScriptTurn(steps=(Say("working"), Stall()), ignore_cancel=True),))
    options = ClientOptions(cancel_grace=60, interrupt_grace=60)
    async with connect(script, options=options) as (conn, record):
        session = await conn.new_session(tmp_path)
        start = trio.current_time()

        async def interrupt_again() -> None:
            await record.wait_for("cancel")
            end_grace_periods()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(interrupt_again)
            with trio.CancelScope() as scope:
                await session.prompt("go", on_update=lambda update: scope.cancel())
        assert scope.cancelled_caught
        assert trio.current_time() - start == 0
    assert session.last_result is not None
    assert session.last_result.stop_reason is None


async def test_prompt_timeout_cancels_then_raises(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    """prompt(timeout=...) cancels the turn when it runs too long, then raises TurnTimeout."""
    async with connect(turns(Say("slow"), Stall())) as (conn, record):
        session = await conn.new_session(tmp_path)
        start = trio.current_time()
        with pytest.raises(TurnTimeout, match="total timeout") as info:
            await session.prompt("go", timeout=5)
        assert trio.current_time() - start == pytest.approx(5)
    assert info.value.agent == AGENT
    assert record.first("cancel")["running"] is True
    assert record.first("turn_end")["cancelled"] is True


async def test_prompt_idle_timeout_cancels_then_raises(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    """prompt(idle_timeout=...) allows gaps shorter than it and cancels after a longer one."""
    script = turns(Say("a"), Sleep(3), Say("b"), Sleep(3), Say("c"), Stall())
    async with connect(script) as (conn, record):
        session = await conn.new_session(tmp_path)
        start = trio.current_time()
        with pytest.raises(TurnTimeout, match="idle timeout"):
            await session.prompt("go", idle_timeout=4)
        assert trio.current_time() - start == pytest.approx(3 + 3 + 4)
    assert record.first("turn_end")["cancelled"] is True


async def test_prompt_timeout_on_an_agent_ignoring_cancel_is_hung(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    """Past the timeout and then the cancel grace, prompt raises AgentHung."""
    script = AgentScript(turns=(ScriptTurn(steps=(Stall(),), ignore_cancel=True),))
    async with connect(script, options=ClientOptions(cancel_grace=7)) as (conn, record):
        session = await conn.new_session(tmp_path)
        start = trio.current_time()
        with pytest.raises(AgentHung, match="total timeout; no response 7s"):
            await session.prompt("go", timeout=5)
        assert trio.current_time() - start == pytest.approx(5 + 7)
    assert record.first("cancel")["running"] is True


async def test_second_concurrent_prompt_is_a_usage_error(tmp_path: Path) -> None:
    """A second prompt while the session's turn runs raises UsageError and is not sent."""
    async with connect(turns(Stall())) as (conn, record):
        session = await conn.new_session(tmp_path)
        async with session.open_turn("first") as turn:
            await record.wait_for("prompt")
            with pytest.raises(UsageError, match="already has a turn running"):
                await session.prompt("second")
            await session.cancel()
    assert result_of(turn).stop_reason == "cancelled"
    assert [e["text"] for e in record.of("prompt")] == ["first"]


async def test_two_sessions_run_turns_concurrently(tmp_path: Path) -> None:
    """Turns of different sessions on one connection run at the same time."""
    results: dict[str, TurnResult] = {}
    async with connect(turns(Say("started "), Sleep(0.01), Say("done"))) as (conn, _):
        sessions = [await conn.new_session(tmp_path) for _ in range(2)]

        async def run(index: int) -> None:
            results[sessions[index].session_id] = await sessions[index].prompt(f"task {index}")

        async with trio.open_nursery() as nursery:
            for index in range(2):
                nursery.start_soon(run, index)
    assert {k: r.text for k, r in results.items()} == {
        "sess-1": "started done",
        "sess-2": "started done",
    }


# --------------------------------------------------------------------------- the agent's requests


async def test_undeclared_agent_request_mid_turn_is_method_not_found(tmp_path: Path) -> None:
    """An agent request the client does not serve is answered -32601 and the turn goes on."""
    request = Request("craft/drainMidTurnQueue", {"sessionId": "sess-1"})
    async with connect(turns(Say("before "), request, Say("after"))) as (conn, record):
        session = await conn.new_session(tmp_path)
        result = await session.prompt("go")
    assert (result.stop_reason, result.text) == ("end_turn", "before after")
    [answer] = record.of("request")
    assert answer["method"] == "craft/drainMidTurnQueue"
    assert answer["error"]["code"] == -32601


async def test_extension_requests_go_to_their_handlers(tmp_path: Path) -> None:
    """Extension requests reach the extensions handlers: sync, async, refusing, or missing."""

    async def double(params: Any) -> Any:
        await trio.lowlevel.checkpoint()
        return {"answer": params["q"] * 2}

    def refuse(params: Any) -> Any:
        raise InvalidParams("q is required")

    extensions = {"_x/double": double, "_x/info": lambda params: {"sync": True}, "_x/no": refuse}
    steps = (
        Request("_x/double", {"q": 21}),
        Request("_x/info"),
        Request("_x/no", {}),
        Request("_x/missing"),
        Say("done"),
    )
    async with connect(turns(*steps), extensions=extensions) as (conn, record):
        session = await conn.new_session(tmp_path)
        result = await session.prompt("go")
    assert result.text == "done"
    answers = {e["method"]: e for e in record.of("request")}
    assert answers["_x/double"]["result"] == {"answer": 42}
    assert answers["_x/info"]["result"] == {"sync": True}
    assert answers["_x/no"]["error"]["code"] == -32602
    assert answers["_x/missing"]["error"]["code"] == -32601


async def test_notifications_extension_and_unknown(tmp_path: Path) -> None:
    """Extension notifications reach their handler; unknown ones are ignored mid-turn."""
    notes: list[Any] = []
    steps = (
        Notify("_x/note", {"n": 1}),
        Notify("qwen/notify/session/prompt-suggestion", {"text": "try this"}),
        Notify("_auth/status_update", {"ok": True}),
        Say("still here"),
    )
    async with connect(turns(*steps), extensions={"_x/note": notes.append}) as (conn, _):
        session = await conn.new_session(tmp_path)
        result = await session.prompt("go")
    assert notes == [{"n": 1}]
    assert (result.stop_reason, result.text) == ("end_turn", "still here")


async def test_async_extension_notification_handler_is_awaited(tmp_path: Path) -> None:
    """An extension notification handler returning an awaitable has it awaited."""
    awaited = Awaited()
    extensions = {"_x/note": lambda params: awaited}
    async with connect(turns(Notify("_x/note", {}), Say("ok")), extensions=extensions) as (conn, _):
        session = await conn.new_session(tmp_path)
        await session.prompt("go")
    assert awaited.done


async def test_elicitation_is_declined_by_default(tmp_path: Path) -> None:
    """elicitation/create without an elicitation service is answered decline."""
    params = {
        "sessionId": "sess-1",
        "mode": "form",
        "message": "Your name?",
        "requestedSchema": {"type": "object", "properties": {"name": {"type": "string"}}},
    }
    async with connect(turns(Request("elicitation/create", params), Say("ok"))) as (conn, record):
        session = await conn.new_session(tmp_path)
        result = await session.prompt("go")
    assert result.text == "ok"
    assert record.first("request")["result"] == {"action": "decline"}


async def test_fs_and_terminal_requests_without_services_are_method_not_found(
    tmp_path: Path,
) -> None:
    """fs/* and terminal/* requests are answered -32601 when no such service is installed."""
    steps = (ReadFile("notes.txt"), WriteFile("out.txt", "hi"), Terminal("make test"), Say("ok"))
    async with connect(turns(*steps)) as (conn, record):
        session = await conn.new_session(tmp_path)
        result = await session.prompt("go")
    assert result.text == "ok"
    assert record.first("fs_read")["error"]["code"] == -32601
    assert record.first("fs_write")["error"]["code"] == -32601
    terminal = record.first("terminal")
    assert (terminal["stage"], terminal["error"]["code"]) == ("create", -32601)


async def test_fs_and_terminal_requests_are_served_by_the_services(tmp_path: Path) -> None:
    """With fs and terminal services installed, the agent's requests reach them."""
    notes = str(tmp_path / "notes.txt")
    fs = MemoryFs({notes: "old text"})
    terminals = FakeTerminals()
    steps = (
        ReadFile("notes.txt", then_write=Replace("old", "new")),
        Terminal("make test", tool_call_id="run-1"),
    )
    services = ClientServices(fs=fs, terminal=terminals)
    async with connect(turns(*steps), services=services) as (conn, record):
        session = await conn.new_session(tmp_path)
        result = await session.prompt("go")
    assert record.first("fs_read")["content"] == "old text"
    assert record.first("fs_write")["result"] == {}
    assert fs.files[notes] == "new text"
    assert terminals.commands == ["make test"]
    assert record.first("terminal")["output"] == "ok\n"
    run = result.tool_calls["run-1"]
    assert (run.status, run.terminal_ids()) == ("completed", ["term-1"])


async def test_string_request_ids_are_echoed_exactly(tmp_path: Path) -> None:
    """Answers to an agent that numbers its requests with strings carry the same strings."""
    notes = str(tmp_path / "a.txt")
    steps = (
        AskPermission(PermissionToolCall("t1"), on_reject="continue"),
        Request("craft/drainMidTurnQueue"),
        ReadFile("a.txt"),
        Say("ok"),
    )
    script = turns(*steps, id_style="string")
    services = ClientServices(fs=MemoryFs({notes: "x"}))
    async with connect(script, services=services) as (conn, record):
        session = await conn.new_session(tmp_path)
        result = await session.prompt("go")
    assert result.text == "ok"
    responses = record.of("response")
    assert [r["method"] for r in responses] == [
        "session/request_permission",
        "craft/drainMidTurnQueue",
        "fs/read_text_file",
    ]
    ids = [r["id"] for r in responses]
    assert all(isinstance(i, str) and uuid.UUID(i) for i in ids)
    assert len(set(ids)) == 3
    assert record.of("unexpected_response") == []


# --------------------------------------------------------------------------- fs answered at once


@define
class CountingFs(MemoryFs):
    """A MemoryFs that records which of its methods served each request."""

    calls: list[str] = field(factory=list)

    async def read_text_file(
        self, request: t.ReadTextFileRequest, ctx: SessionContext
    ) -> t.ReadTextFileResponse:
        """Count, then serve as MemoryFs does."""
        self.calls.append("read_text_file")
        return await MemoryFs.read_text_file(self, request, ctx)

    async def write_text_file(
        self, request: t.WriteTextFileRequest, ctx: SessionContext
    ) -> t.WriteTextFileResponse:
        """Count, then store as MemoryFs does."""
        self.calls.append("write_text_file")
        return await MemoryFs.write_text_file(self, request, ctx)


@define
class NowaitFs(CountingFs):
    """A CountingFs that also answers at once; requests for ``blocked`` paths would block."""

    blocked: set[str] = field(factory=set)

    def read_text_file_nowait(
        self, request: t.ReadTextFileRequest, ctx: SessionContext
    ) -> t.ReadTextFileResponse:
        """Serve a file's text at once."""
        self.calls.append("read_text_file_nowait")
        if request.path in self.blocked:
            raise trio.WouldBlock
        if request.path not in self.files:
            raise ResourceNotFound(f"no such file: {request.path}")
        return t.ReadTextFileResponse(content=self.files[request.path])

    def write_text_file_nowait(
        self, request: t.WriteTextFileRequest, ctx: SessionContext
    ) -> t.WriteTextFileResponse:
        """Store a file's text at once."""
        self.calls.append("write_text_file_nowait")
        if request.path in self.blocked:
            raise trio.WouldBlock
        self.files[request.path] = request.content
        return t.WriteTextFileResponse()


async def test_fs_requests_are_answered_at_once_by_a_nowait_service(tmp_path: Path) -> None:
    """A service with *_nowait methods serves the agent's fs requests with them alone."""
    notes, out = str(tmp_path / "notes.txt"), str(tmp_path / "out.txt")
    fs = NowaitFs({notes: "old text"})
    service: NowaitFileSystemService = fs  # NowaitFs has the protocol's shape (mypy checks)
    steps = (
        ReadFile("notes.txt", then_write=Replace("old", "new")),
        WriteFile("out.txt", "hi"),
        ReadFile("missing.txt"),
        Say("ok"),
    )
    async with connect(turns(*steps), services=ClientServices(fs=service)) as (conn, record):
        session = await conn.new_session(tmp_path)
        result = await session.prompt("go")
    assert result.text == "ok"
    assert fs.calls == [
        "read_text_file_nowait",
        "write_text_file_nowait",
        "write_text_file_nowait",
        "read_text_file_nowait",
    ]
    reads, writes = record.of("fs_read"), record.of("fs_write")
    assert reads[0]["content"] == "old text"
    assert reads[1]["error"]["code"] == -32002
    assert [w["result"] for w in writes] == [{}, {}]
    assert fs.files == {notes: "new text", out: "hi"}


async def test_fs_requests_that_would_block_are_served_by_the_async_methods(
    tmp_path: Path,
) -> None:
    """A request the nowait method leaves (WouldBlock) is served by the async method."""
    notes = str(tmp_path / "notes.txt")
    fs = NowaitFs({notes: "old text"}, blocked={notes})
    steps = (ReadFile("notes.txt", then_write=Replace("old", "new")), Say("ok"))
    async with connect(turns(*steps), services=ClientServices(fs=fs)) as (conn, record):
        session = await conn.new_session(tmp_path)
        await session.prompt("go")
    assert fs.calls == [
        "read_text_file_nowait",
        "read_text_file",
        "write_text_file_nowait",
        "write_text_file",
    ]
    assert record.first("fs_read")["content"] == "old text"
    assert record.first("fs_write")["result"] == {}
    assert fs.files[notes] == "new text"


async def test_fs_service_without_nowait_methods_is_served_by_its_async_methods(
    tmp_path: Path,
) -> None:
    """A service without *_nowait methods gets every fs request through its async methods."""
    notes = str(tmp_path / "notes.txt")
    fs = CountingFs({notes: "old text"})
    steps = (ReadFile("notes.txt", then_write=Replace("old", "new")), Say("ok"))
    async with connect(turns(*steps), services=ClientServices(fs=fs)) as (conn, record):
        session = await conn.new_session(tmp_path)
        await session.prompt("go")
    assert fs.calls == ["read_text_file", "write_text_file"]
    assert record.first("fs_read")["content"] == "old text"
    assert fs.files[notes] == "new text"


@pytest.mark.parametrize("kind", ["nowait", "async", "none"])
async def test_fs_requests_for_an_unknown_session_are_invalid_params(
    kind: str, tmp_path: Path
) -> None:
    """fs requests naming no session of ours are answered -32602, whatever the service."""
    fs = {"nowait": NowaitFs(), "async": CountingFs(), "none": None}[kind]
    path = str(tmp_path / "a.txt")
    steps = (
        Request("fs/read_text_file", {"sessionId": "nope", "path": path}),
        Request("fs/write_text_file", {"sessionId": "nope", "path": path, "content": "x"}),
        Say("ok"),
    )
    async with connect(turns(*steps), services=ClientServices(fs=fs)) as (conn, record):
        session = await conn.new_session(tmp_path)
        result = await session.prompt("go")
    assert result.text == "ok"
    answers = record.of("request")
    assert [(a["method"], a["error"]["code"]) for a in answers] == [
        ("fs/read_text_file", -32602),
        ("fs/write_text_file", -32602),
    ]
    assert "nope" in answers[0]["error"]["message"]
    assert fs is None or fs.calls == []


LAZY_MIX: tuple[Step, ...] = (
    Say("plain ", chunks=1),
    Think("thinking", chunks=2),
    Update(
        {
            "sessionUpdate": "agent_message_chunk",
            "messageId": "m1",
            "content": {"type": "text", "text": "with an id "},
        }
    ),
    Update(
        {
            "sessionUpdate": "agent_message_chunk",
            "content": {"type": "text", "text": "annotated ", "annotations": {"priority": 1}},
        }
    ),
    Update(
        {
            "sessionUpdate": "agent_message_chunk",
            "content": {"type": "resource_link", "uri": "file:///a.py", "name": "a.py"},
        }
    ),
    Update({"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": "hi"}}),
    Update({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": 7}}),
    Say(" end", chunks=1),
)


async def test_text_chunks_nobody_watches_fold_into_the_same_result(tmp_path: Path) -> None:
    """A turn without a callback folds plain text chunks untyped, to the same result."""
    script = AgentScript(turns=(ScriptTurn(steps=LAZY_MIX), ScriptTurn(steps=LAZY_MIX)))
    seen: list[t.SessionUpdate] = []
    async with connect(script) as (conn, _):
        session = await conn.new_session(tmp_path)
        lazy = await session.prompt("unwatched")
        watched = await session.prompt("watched", on_update=seen.append)
    assert lazy.text == watched.text == "plain with an id annotated [a.py](file:///a.py) end"
    assert lazy.thoughts == watched.thoughts == "thinking"
    assert lazy.updates == watched.updates  # the user chunk; the malformed one is dropped
    assert [type(u) for u in lazy.updates] == [t.UserMessageChunk]
    assert sum(isinstance(u, t.AgentMessageChunk) for u in seen) == 5
