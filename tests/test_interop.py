"""Interop: our ACP client against agents nobody here wrote.

- the official Python SDK (``tests/agents/sdk_agent.py``, an agent on ``agent-client-protocol``);
- the example agent of the official TypeScript SDK under node (marked ``node``; skipped with a
  reason when it is not installed).

Every frame our client sends is schema-checked by the autouse fixture in ``conftest.py``; every
test ends by checking that the agent process is gone.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import orjson
import pytest
import trio
from attrs import define, field
from conftest import pid_gone
from fakes import AllowOnce
from interop import sdk_agent_command, ts_example_agent_command, ts_example_agent_skip_reason

from orchestrator.agent.client import AcpSession, AgentConnection, ClientOptions, open_agent
from orchestrator.agent.content import (
    audio_from_file,
    embedded_resource_from_file,
    image_from_file,
    resource_link_from_file,
)
from orchestrator.agent.services import (
    ClientServices,
    PermissionDecision,
    SessionContext,
)
from orchestrator.agent.transcript import TranscriptWriter
from orchestrator.errors import (
    AuthenticationError,
    CapabilityNotSupported,
    ResourceNotFound,
    TurnTimeout,
    UsageError,
)
from orchestrator.protocol import types as t

# Every test is bounded; the TS example agent sleeps 1 s per step, so its turns take ~4 s.
LIMIT = 30.0
TS_SKIP = ts_example_agent_skip_reason()
needs_ts_agent = pytest.mark.skipif(TS_SKIP is not None, reason=TS_SKIP or "")


# --------------------------------------------------------------------------- services


@define
class NeverAnswers:
    """A permission service that waits forever (a human who never clicks)."""

    asked: trio.Event = field(factory=trio.Event)

    async def request_permission(
        self, request: t.RequestPermissionRequest, ctx: SessionContext
    ) -> PermissionDecision:
        """Signal the question, then wait until cancelled."""
        self.asked.set()
        await trio.sleep_forever()
        raise AssertionError("unreachable")


@define
class FakeFs:
    """An in-memory file system service: what the agent reads and writes never touches disk."""

    files: dict[str, str] = field(factory=dict)
    reads: list[t.ReadTextFileRequest] = field(factory=list)
    writes: list[t.WriteTextFileRequest] = field(factory=list)

    async def read_text_file(
        self, request: t.ReadTextFileRequest, ctx: SessionContext
    ) -> t.ReadTextFileResponse:
        """The stored content."""
        self.reads.append(request)
        return t.ReadTextFileResponse(content=self.files[request.path])

    async def write_text_file(
        self, request: t.WriteTextFileRequest, ctx: SessionContext
    ) -> t.WriteTextFileResponse:
        """Store the content."""
        self.writes.append(request)
        self.files[request.path] = request.content
        return t.WriteTextFileResponse()


@asynccontextmanager
async def sdk_agent(
    *,
    require_auth: bool = False,
    state_dir: Path | None = None,
    services: ClientServices | None = None,
    options: ClientOptions | None = None,
    transcript: TranscriptWriter | None = None,
) -> AsyncIterator[AgentConnection]:
    """The Python SDK agent as a subprocess; on exit its process must be gone."""
    command = sdk_agent_command(require_auth=require_auth)
    if state_dir is not None:
        command += ["--state-dir", str(state_dir)]
    pid = None
    async with open_agent(
        command,
        name="sdk",
        services=services,
        options=options,
        transcript=transcript,
        term_grace=1.0,
    ) as conn:
        pid = conn.pid
        yield conn
    assert pid is not None
    assert pid_gone(pid), f"agent process {pid} outlived its connection"


@asynccontextmanager
async def ts_agent(services: ClientServices | None = None) -> AsyncIterator[AgentConnection]:
    """The TypeScript SDK example agent under node; on exit its process must be gone."""
    options = ClientOptions(cancel_grace=5.0)
    pid = None
    async with open_agent(
        ts_example_agent_command(),
        name="ts-example",
        services=services,
        options=options,
        term_grace=1.0,
    ) as conn:
        pid = conn.pid
        yield conn
    assert pid is not None
    assert pid_gone(pid), f"agent process {pid} outlived its connection"


def sent_methods(path: Path) -> list[str]:
    """The methods of the requests and notifications we sent, from a transcript."""
    methods = []
    for line in path.read_bytes().splitlines():
        entry = orjson.loads(line)
        if entry["dir"] == "send" and "method" in entry["msg"]:
            methods.append(entry["msg"]["method"])
    return methods


def select_value(session: AcpSession, category: str) -> str:
    """The current value of the session's select option of ``category``."""
    option = session.option_by_category(category)
    assert isinstance(option, t.SessionConfigSelect)
    return option.current_value


# --------------------------------------------------------------------------- Python SDK agent


async def test_initialize_parses_agent_info_auth_and_capabilities() -> None:
    """initialize: the SDK agent's info, auth methods and capabilities are parsed."""
    with trio.fail_after(LIMIT):
        async with sdk_agent() as conn:
            assert conn.agent_info is not None
            assert (conn.agent_info.name, conn.agent_info.version) == ("sdk-agent", "1.0")
            assert conn.agent_info.title == "SDK test agent"
            (method,) = conn.auth_methods
            assert isinstance(method, t.AuthMethodAgent)
            assert (method.id, method.name) == ("sdk-login", "SDK login")
            caps = conn.agent_capabilities
            assert caps.load_session is True
            prompt_caps = caps.prompt_capabilities
            assert prompt_caps is not None
            assert (prompt_caps.image, prompt_caps.audio, prompt_caps.embedded_context) == (
                True,
                True,
                True,
            )


async def test_auth_required_authenticates_with_the_only_method(tmp_path: Path) -> None:
    """session/new answered -32000: the client authenticates with the only method and retries."""
    wire = tmp_path / "wire.ndjson"
    with trio.fail_after(LIMIT):
        async with sdk_agent(require_auth=True, transcript=TranscriptWriter(wire)) as conn:
            session = await conn.new_session(tmp_path)
            assert session.session_id
            result = await session.prompt("hello")
            assert result.stop_reason == "end_turn"
    assert sent_methods(wire)[:5] == [
        "initialize",
        "session/new",
        "authenticate",
        "session/new",
        "session/prompt",
    ]
    auth = [
        orjson.loads(line)["msg"]
        for line in wire.read_bytes().splitlines()
        if b'"authenticate"' in line
    ]
    assert auth[0]["params"] == {"methodId": "sdk-login"}


async def test_no_auth_needed_sends_no_authenticate(tmp_path: Path) -> None:
    """An agent that does not ask for authentication never gets authenticate."""
    wire = tmp_path / "wire.ndjson"
    with trio.fail_after(LIMIT):
        async with sdk_agent(transcript=TranscriptWriter(wire)) as conn:
            await conn.new_session(tmp_path)
    assert sent_methods(wire) == ["initialize", "session/new"]


async def test_wrong_auth_method_is_a_clear_error(tmp_path: Path) -> None:
    """A configured auth method the agent does not offer: AuthenticationError naming both."""
    options = ClientOptions(auth_method="wrong")
    with trio.fail_after(LIMIT):
        async with sdk_agent(require_auth=True, options=options) as conn:
            with pytest.raises(AuthenticationError) as info:
                await conn.new_session(tmp_path)
            assert "wrong" in str(info.value)
            assert "sdk-login" in str(info.value)
            assert info.value.agent == "sdk"
            assert conn.sessions == {}


async def test_new_session_reports_modes_and_config_options(tmp_path: Path) -> None:
    """session/new: modes and config options (model, thought level) come from the agent."""
    with trio.fail_after(LIMIT):
        async with sdk_agent() as conn:
            session = await conn.new_session(tmp_path)
            assert session.cwd == str(tmp_path.absolute())
            assert conn.sessions[session.session_id] is session
            assert session.current_mode == "ask"
            assert session.modes is not None
            assert [m.id for m in session.modes.available_modes] == ["ask", "code"]
            options = session.config_options
            assert all(isinstance(o, t.SessionConfigSelect) for o in options)
            assert [getattr(o, "id", None) for o in options] == ["model", "effort"]
            assert select_value(session, "model") == "sdk-small"
            assert select_value(session, "thought_level") == "low"


async def test_load_session_replays_history_in_order(tmp_path: Path) -> None:
    """session/load on a restarted agent replays the history into background_updates in order."""
    state = tmp_path / "state"
    with trio.fail_after(LIMIT):
        async with sdk_agent(state_dir=state) as conn:
            first = await conn.new_session(tmp_path)
            await first.set_mode("code")
            await first.prompt("hello there")
            await first.prompt(["second", "prompt"])
            session_id = first.session_id
        async with sdk_agent(state_dir=state) as conn:
            loaded = await conn.load_session(session_id, tmp_path)
            assert conn.sessions[session_id] is loaded
            assert loaded.current_mode == "code"
            assert select_value(loaded, "model") == "sdk-small"
            replay = [
                (type(u).__name__, u.content.text)
                for u in loaded.background_updates
                if isinstance(u, t.UserMessageChunk | t.AgentMessageChunk)
                and isinstance(u.content, t.TextContent)
            ]
            assert replay == [
                ("UserMessageChunk", "hello there"),
                ("AgentMessageChunk", "received: text"),
                ("UserMessageChunk", "second"),
                ("UserMessageChunk", "prompt"),
                ("AgentMessageChunk", "received: text, text"),
            ]
            # the loaded session takes new turns
            result = await loaded.prompt("third")
            assert result.text == "received: text"


async def test_load_unknown_session_is_resource_not_found(tmp_path: Path) -> None:
    """session/load of an id the agent does not know: -32002, and no session is kept."""
    with trio.fail_after(LIMIT):
        async with sdk_agent() as conn:
            with pytest.raises(ResourceNotFound):
                await conn.load_session("no-such-session", tmp_path)
            assert conn.sessions == {}


async def test_session_methods_the_agent_lacks_are_refused(tmp_path: Path) -> None:
    """session/list, resume, close and delete are not advertised: refused without a call."""
    wire = tmp_path / "wire.ndjson"
    with trio.fail_after(LIMIT):
        async with sdk_agent(transcript=TranscriptWriter(wire)) as conn:
            session = await conn.new_session(tmp_path)
            with pytest.raises(CapabilityNotSupported, match="session/list"):
                await conn.list_sessions()
            with pytest.raises(CapabilityNotSupported, match="session/resume"):
                await conn.resume_session(session.session_id, tmp_path)
            with pytest.raises(CapabilityNotSupported, match="session/close"):
                await conn.close_session(session.session_id)
            with pytest.raises(CapabilityNotSupported, match="session/delete"):
                await conn.delete_session(session.session_id)
            assert list(conn.sessions) == [session.session_id]
    assert sent_methods(wire) == ["initialize", "session/new"]


async def test_prompt_with_every_content_kind(tmp_path: Path) -> None:
    """Text, image, audio, resource link, embedded text and blob resources all reach the agent."""
    (tmp_path / "pic.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(32)))
    (tmp_path / "clip.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEfmt ")
    (tmp_path / "linked.py").write_text("print('linked')\n", "utf-8")
    (tmp_path / "notes.txt").write_text("embedded notes\n", "utf-8")
    (tmp_path / "data.bin").write_bytes(b"\xff\xfe\x00binary\x80")
    image = image_from_file(tmp_path / "pic.png")
    audio = audio_from_file(tmp_path / "clip.wav", "audio/wav")
    link = resource_link_from_file(tmp_path / "linked.py")
    text_res = embedded_resource_from_file(tmp_path / "notes.txt")
    blob_res = embedded_resource_from_file(tmp_path / "data.bin")
    assert isinstance(text_res.resource, t.TextResourceContents)
    assert isinstance(blob_res.resource, t.BlobResourceContents)
    with trio.fail_after(LIMIT):
        async with sdk_agent() as conn:
            session = await conn.new_session(tmp_path)
            result = await session.prompt(["Look at these", image, audio, link, text_res, blob_res])
    base = tmp_path.absolute().as_uri()
    assert result.text == (
        "received: text, image(image/png), audio(audio/wav), "
        f"resource_link({base}/linked.py), resource(text {base}/notes.txt), "
        f"resource(blob {base}/data.bin)"
    )
    assert result.stop_reason == "end_turn"
    assert result.usage is not None
    assert result.usage.size == 200_000


async def test_set_mode_updates_the_current_mode(tmp_path: Path) -> None:
    """set_mode: the current mode changes, and the agent's current_mode_update is recorded."""
    with trio.fail_after(LIMIT):
        async with sdk_agent() as conn:
            session = await conn.new_session(tmp_path)
            await session.set_mode("code")
            assert session.current_mode == "code"
            # the agent's update was sent before its response, outside any turn
            modes = [u for u in session.background_updates if isinstance(u, t.CurrentModeUpdate)]
            assert [u.current_mode_id for u in modes] == ["code"]
            with pytest.raises(UsageError, match="ask, code"):
                await session.set_mode("yolo")
            assert session.current_mode == "code"


async def test_set_config_option_and_model_by_category(tmp_path: Path) -> None:
    """set_config_option and set_model take the options list from the agent's response."""
    with trio.fail_after(LIMIT):
        async with sdk_agent() as conn:
            session = await conn.new_session(tmp_path)
            await session.set_config_option("effort", "high")
            assert select_value(session, "thought_level") == "high"
            assert select_value(session, "model") == "sdk-small"
            await session.set_model("sdk-large")
            assert select_value(session, "model") == "sdk-large"
            assert select_value(session, "thought_level") == "high"
            with pytest.raises(UsageError, match="sdk-small"):
                await session.set_model("gpt-17")
            assert select_value(session, "model") == "sdk-large"


async def test_permission_allowed_by_a_custom_service(tmp_path: Path) -> None:
    """A permission service that allows: the agent reports the allow option it received."""
    service = AllowOnce(rule="test-allow-once")
    with trio.fail_after(LIMIT):
        async with sdk_agent(services=ClientServices(permission=service)) as conn:
            session = await conn.new_session(tmp_path)
            result = await session.prompt("ask permission")
    assert "permission: selected sdk-allow-once" in result.text
    assert result.tool_calls["perm-1"].status == "completed"
    assert [(p.verdict, p.option_id, p.rule) for p in result.permissions] == [
        ("allow", "sdk-allow-once", "test-allow-once")
    ]
    assert session.permissions == result.permissions
    assert [o.option_id for o in service.asked[0].options] == [
        "sdk-allow-once",
        "sdk-allow-always",
        "sdk-reject-once",
        "sdk-reject-always",
    ]


async def test_permission_rejected_by_default(tmp_path: Path) -> None:
    """Without a permission service the request is rejected, never with an allow option."""
    with trio.fail_after(LIMIT):
        async with sdk_agent() as conn:
            session = await conn.new_session(tmp_path)
            result = await session.prompt("ask permission")
    assert "permission: selected sdk-reject-once" in result.text
    assert "sdk-allow" not in result.text
    assert result.tool_calls["perm-1"].status == "failed"
    (record,) = result.permissions
    assert (record.verdict, record.option_id, record.rule) == (
        "reject",
        "sdk-reject-once",
        "default",
    )
    assert (record.tool_call_id, record.kind, record.agent) == ("perm-1", "execute", "sdk")


async def test_fs_read_and_write_go_through_the_fs_service(tmp_path: Path) -> None:
    """fs/read_text_file and fs/write_text_file are served by the installed fs service."""
    path = str(tmp_path / "virtual.txt")  # never created on disk
    fs = FakeFs(files={path: "content from the fake fs"})
    with trio.fail_after(LIMIT):
        async with sdk_agent(services=ClientServices(fs=fs)) as conn:
            session = await conn.new_session(tmp_path)
            read = await session.prompt(f"read {path}")
            wrote = await session.prompt(f"write {path}\nnew content\nline two")
    assert read.text == "received: textcontent from the fake fs"
    assert [(r.path, r.session_id) for r in fs.reads] == [(path, session.session_id)]
    assert f"wrote {path}" in wrote.text
    assert fs.files[path] == "new content\nline two"
    assert not Path(path).exists()


async def test_fs_not_offered_without_a_service(tmp_path: Path) -> None:
    """Without an fs service the client advertises no fs capability, and the agent sees that."""
    with trio.fail_after(LIMIT):
        async with sdk_agent() as conn:
            session = await conn.new_session(tmp_path)
            result = await session.prompt(f"read {tmp_path}/x")
    assert "fs/read_text_file not advertised by the client" in result.text


async def test_cancel_ends_a_waiting_turn(tmp_path: Path) -> None:
    """session/cancel during "wait for cancel": the turn ends promptly with cancelled."""
    with trio.fail_after(LIMIT):
        async with sdk_agent() as conn:
            session = await conn.new_session(tmp_path)
            cancelled_at = None
            async with session.open_turn("wait for cancel") as turn:
                async for update in turn.updates():
                    if cancelled_at is None and isinstance(update, t.AgentMessageChunk):
                        cancelled_at = trio.current_time()
                        await session.cancel()
            assert cancelled_at is not None
            assert trio.current_time() - cancelled_at < 5  # the agent would wait 30 s
            assert turn.result is not None
            assert turn.result.stop_reason == "cancelled"
            assert turn.result.cancel_requested
            # the session takes a new turn afterwards
            after = await session.prompt("hello")
            assert (after.stop_reason, after.cancel_requested) == ("end_turn", False)


async def test_cancelled_caller_ends_the_turn_with_session_cancel(tmp_path: Path) -> None:
    """A caller cancelled during "wait for cancel": the agent ends the turn, cancelled, first."""

    def cancel_on_text(update: t.SessionUpdate) -> None:
        if isinstance(update, t.AgentMessageChunk):
            scope.cancel()

    with trio.fail_after(LIMIT):
        async with sdk_agent() as conn:
            session = await conn.new_session(tmp_path)
            with trio.CancelScope() as scope:
                await session.prompt("wait for cancel", on_update=cancel_on_text)
            assert scope.cancelled_caught
            result = session.last_result
            assert result is not None
            assert (result.stop_reason, result.cancel_requested) == ("cancelled", True)
            # the session takes a new turn afterwards: the agent ended this one itself
            after = await session.prompt("hello")
            assert after.stop_reason == "end_turn"


async def test_turn_timeout_cancels_the_turn(tmp_path: Path) -> None:
    """A turn past its timeout is cancelled; TurnTimeout is raised and the session goes on."""
    with trio.fail_after(LIMIT):
        async with sdk_agent() as conn:
            session = await conn.new_session(tmp_path)
            with pytest.raises(TurnTimeout, match="total timeout"):
                await session.prompt("wait for cancel", timeout=0.5)
            after = await session.prompt("hello")
            assert after.stop_reason == "end_turn"


# --------------------------------------------------------------------------- TypeScript SDK agent


@pytest.mark.node
@pytest.mark.slow
@needs_ts_agent
async def test_ts_permission_allowed(tmp_path: Path) -> None:
    """TS example agent: allowing the edit completes call_2 and the agent says so."""
    service = AllowOnce(rule="test-allow-once")
    with trio.fail_after(LIMIT):
        async with ts_agent(ClientServices(permission=service)) as conn:
            assert conn.agent_capabilities.load_session is False
            session = await conn.new_session(tmp_path)
            result = await session.prompt("Please improve the configuration")
    assert result.stop_reason == "end_turn"
    assert list(result.tool_calls) == ["call_1", "call_2"]
    assert result.tool_calls["call_1"].status == "completed"
    assert result.tool_calls["call_1"].kind == "read"
    assert result.tool_calls["call_2"].status == "completed"
    assert result.tool_calls["call_2"].kind == "edit"
    assert result.text.startswith("I'll help you with that.")
    assert result.text.endswith(
        " Perfect! I've successfully updated the configuration. The changes have been applied."
    )
    (record,) = result.permissions
    assert (record.tool_call_id, record.verdict, record.option_id) == ("call_2", "allow", "allow")


@pytest.mark.node
@pytest.mark.slow
@needs_ts_agent
async def test_ts_permission_rejected_by_default(tmp_path: Path) -> None:
    """TS example agent: the default service rejects; the agent skips the change."""
    with trio.fail_after(LIMIT):
        async with ts_agent() as conn:
            session = await conn.new_session(tmp_path)
            result = await session.prompt("Please improve the configuration")
    assert result.stop_reason == "end_turn"
    assert result.text.endswith(
        " I understand you prefer not to make that change. I'll skip the configuration update."
    )
    assert "Perfect!" not in result.text
    assert result.tool_calls["call_2"].status == "pending"
    (record,) = result.permissions
    assert (record.tool_call_id, record.verdict, record.option_id, record.rule) == (
        "call_2",
        "reject",
        "reject",
        "default",
    )


@pytest.mark.node
@pytest.mark.slow
@needs_ts_agent
async def test_ts_cancel_mid_turn(tmp_path: Path) -> None:
    """TS example agent: a cancel while call_1 is pending ends the turn cancelled, promptly."""
    with trio.fail_after(LIMIT):
        async with ts_agent() as conn:
            session = await conn.new_session(tmp_path)
            cancelled_at = None
            async with session.open_turn("Please improve the configuration") as turn:
                async for update in turn.updates():
                    if cancelled_at is None and isinstance(update, t.ToolCall):
                        assert update.tool_call_id == "call_1"
                        cancelled_at = trio.current_time()
                        await session.cancel()
                        await session.wait_turn_end()
            assert cancelled_at is not None
            assert trio.current_time() - cancelled_at < 3  # noticed at the next 1 s step
            result = turn.result
            assert result is not None
            assert result.stop_reason == "cancelled"
            assert result.cancel_requested
            assert list(result.tool_calls) == ["call_1"]
            assert result.permissions == []


@pytest.mark.node
@pytest.mark.slow
@needs_ts_agent
async def test_ts_cancel_while_permission_pending(tmp_path: Path) -> None:
    """TS example agent: cancelling answers the pending permission request cancelled."""
    service = NeverAnswers()
    with trio.fail_after(LIMIT):
        async with ts_agent(ClientServices(permission=service)) as conn:
            session = await conn.new_session(tmp_path)
            async with session.open_turn("Please improve the configuration") as turn:
                await service.asked.wait()
                await session.cancel()
                await session.wait_turn_end()
            result = turn.result
            assert result is not None
            # the example agent returns from its turn on a cancelled outcome: end_turn
            assert result.stop_reason in ("end_turn", "cancelled")
            assert "Perfect!" not in result.text
            assert "I understand you prefer" not in result.text
            (record,) = result.permissions
            assert (record.tool_call_id, record.verdict, record.option_id, record.rule) == (
                "call_2",
                "cancelled",
                None,
                "cancelled",
            )
            assert session.permissions == [record]
