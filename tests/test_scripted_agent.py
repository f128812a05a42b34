"""Tests of orchestrator.testing.scripted_agent, driven by a minimal raw-JSON client."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
import trio.testing
from attrs import define, field
from jsonschema import Draft202012Validator

import orchestrator
from orchestrator.testing import (
    AgentRecord,
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
    scripted_agent_command,
    serve_scripted_agent,
    terminal_content,
)

Json = dict[str, Any]
Answer = Callable[[Json], Json | None]
CWD = "/work/project"

_SCHEMA = orjson.loads(
    (Path(orchestrator.__file__).parent / "protocol" / "schema" / "schema.json").read_bytes()
)


@functools.cache
def _validator(name: str) -> Draft202012Validator:
    return Draft202012Validator({"$defs": _SCHEMA["$defs"], "$ref": f"#/$defs/{name}"})


def assert_valid(name: str, value: Any) -> None:
    """Check a value against one definition of the official ACP schema."""
    errors = list(_validator(name).iter_errors(value))
    assert not errors, f"{name}: {errors[0].message}"


_KNOWN_KINDS = {
    "user_message_chunk",
    "agent_message_chunk",
    "agent_thought_chunk",
    "tool_call",
    "tool_call_update",
    "plan",
    "available_commands_update",
    "current_mode_update",
    "config_option_update",
    "session_info_update",
    "usage_update",
}
_REQUEST_DEFS = {
    "session/request_permission": "RequestPermissionRequest",
    "fs/read_text_file": "ReadTextFileRequest",
    "fs/write_text_file": "WriteTextFileRequest",
    "terminal/create": "CreateTerminalRequest",
    "terminal/output": "TerminalOutputRequest",
    "terminal/wait_for_exit": "WaitForTerminalExitRequest",
    "terminal/kill": "KillTerminalRequest",
    "terminal/release": "ReleaseTerminalRequest",
}


@define
class RawClient:
    """A minimal ACP client speaking raw JSON lines, with schema checks of the agent's frames."""

    stream: trio.abc.Stream
    buffer: bytearray = field(factory=bytearray)
    next_id: int = 0
    seen: list[Json] = field(factory=list)
    validate: bool = True

    async def send(self, message: Json) -> None:
        await self.send_raw(orjson.dumps(message) + b"\n")

    async def send_raw(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def recv_line(self) -> bytes | None:
        """The next line without its newline, or None at EOF."""
        while (end := self.buffer.find(b"\n")) < 0:
            data = await self.stream.receive_some(1 << 20)
            if not data:
                return None
            self.buffer += data
        line = bytes(self.buffer[:end])
        del self.buffer[: end + 1]
        return line

    async def recv(self) -> Json | None:
        line = await self.recv_line()
        if line is None:
            return None
        message: Json = orjson.loads(line)
        method = message.get("method")
        if not self.validate:
            pass
        elif method == "session/update" and message["params"]["update"]["sessionUpdate"] in (
            _KNOWN_KINDS
        ):
            assert_valid("SessionNotification", message["params"])
        elif method in _REQUEST_DEFS:
            assert_valid(_REQUEST_DEFS[method], message["params"])
        return message

    async def call(self, method: str, params: Any = None) -> Json:
        """Send a request; return its response (other messages land in ``seen``)."""
        req_id = self.next_id
        self.next_id += 1
        request: Json = {"jsonrpc": "2.0", "id": req_id, "method": method}
        if params is not None:
            request["params"] = params
        await self.send(request)
        while True:
            message = await self.recv()
            assert message is not None, f"EOF while waiting for the answer to {method}"
            if message.get("id") == req_id and "method" not in message:
                return message
            self.seen.append(message)

    async def notify(self, method: str, params: Json) -> None:
        await self.send({"jsonrpc": "2.0", "method": method, "params": params})

    async def start_prompt(self, session_id: str, text: str = "go") -> int:
        """Send session/prompt without waiting; its request id."""
        req_id = self.next_id
        self.next_id += 1
        params = {"sessionId": session_id, "prompt": [{"type": "text", "text": text}]}
        request = {"jsonrpc": "2.0", "id": req_id, "method": "session/prompt", "params": params}
        await self.send(request)
        return req_id

    async def prompt(
        self, session_id: str, text: str, answer: Answer | None = None
    ) -> tuple[Json, list[Json]]:
        """Prompt and serve the agent's requests with ``answer`` until the prompt is answered."""
        return await self.serve_until(await self.start_prompt(session_id, text), answer)

    async def serve_until(
        self, req_id: int, answer: Answer | None = None
    ) -> tuple[Json, list[Json]]:
        seen: list[Json] = []
        while True:
            message = await self.recv()
            assert message is not None, "EOF during the turn"
            if message.get("id") == req_id and "method" not in message:
                return message, seen
            seen.append(message)
            if "id" in message and "method" in message:
                reply = (answer or _not_found)(message)
                if reply is not None:
                    await self.send({"jsonrpc": "2.0", "id": message["id"], **reply})


def _not_found(message: Json) -> Json:
    return {"error": {"code": -32601, "message": f"no {message['method']}"}}


def updates(messages: list[Json]) -> list[Json]:
    """The ``update`` objects of the session/update notifications among ``messages``."""
    return [m["params"]["update"] for m in messages if m.get("method") == "session/update"]


def texts(messages: list[Json], kind: str = "agent_message_chunk") -> str:
    return "".join(u["content"]["text"] for u in updates(messages) if u["sessionUpdate"] == kind)


@asynccontextmanager
async def connected(script: AgentScript) -> AsyncIterator[tuple[RawClient, AgentRecord]]:
    """An in-memory scripted agent and a raw client; closes the client side on exit."""
    agent_side, client_side = trio.testing.memory_stream_pair()
    record = AgentRecord()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                functools.partial(serve_scripted_agent, record=record), agent_side, script
            )
            yield RawClient(client_side), record
            await client_side.aclose()


async def open_session(client: RawClient, cwd: str = CWD, **init: Any) -> str:
    """initialize + session/new; the new session id."""
    reply = await client.call("initialize", {"protocolVersion": 1, **init})
    assert_valid("InitializeResponse", reply["result"])
    reply = await client.call("session/new", {"cwd": cwd, "mcpServers": []})
    assert_valid("NewSessionResponse", reply["result"])
    session_id: str = reply["result"]["sessionId"]
    return session_id


def select(option_id: str) -> Answer:
    return lambda _: {"result": {"outcome": {"outcome": "selected", "optionId": option_id}}}


# --------------------------------------------------------------------------- handshake and auth


async def test_handshake_advertises_the_script_and_records_the_client() -> None:
    """initialize answers the scripted info and capabilities and records what the client sent."""
    script = AgentScript(
        name="fake",
        title="Fake",
        version="2.0",
        capabilities=Capabilities(load_session=True, image=True, session_list=True, logout=True),
        auth_methods=(AuthMethod("key", "API key"),),
    )
    async with connected(script) as (client, record):
        caps = {"fs": {"readTextFile": True, "writeTextFile": True}, "terminal": True}
        info = {"name": "test-client", "version": "1"}
        reply = await client.call(
            "initialize", {"protocolVersion": 7, "clientCapabilities": caps, "clientInfo": info}
        )
        bad = await client.call("initialize", {"protocolVersion": "1"})
    result = reply["result"]
    assert_valid("InitializeResponse", result)
    assert result["protocolVersion"] == 1
    assert result["agentInfo"] == {"name": "fake", "title": "Fake", "version": "2.0"}
    assert result["authMethods"] == [{"id": "key", "name": "API key"}]
    agent_caps = result["agentCapabilities"]
    assert agent_caps["loadSession"] is True
    assert agent_caps["promptCapabilities"]["image"] is True
    assert agent_caps["sessionCapabilities"] == {"list": {}}
    assert agent_caps["auth"] == {"logout": {}}
    assert bad["error"]["code"] == -32602
    assert record.first("initialize") == {
        "event": "initialize",
        "protocolVersion": 7,
        "clientCapabilities": caps,
        "clientInfo": info,
    }
    assert record.exit_code == 0
    assert record.events[-1] == {"event": "eof"}


async def test_session_new_needs_authentication_when_required() -> None:
    """session/new answers -32000 until authenticate names a listed method."""
    script = AgentScript(
        auth_methods=(AuthMethod("key", "API key"),),
        require_auth=True,
        capabilities=Capabilities(logout=True),
    )
    async with connected(script) as (client, record):
        await client.call("initialize", {"protocolVersion": 1})
        new = {"cwd": CWD, "mcpServers": []}
        refused = await client.call("session/new", new)
        unknown = await client.call("authenticate", {"methodId": "oauth"})
        ok = await client.call("authenticate", {"methodId": "key"})
        accepted = await client.call("session/new", new)
        logout = await client.call("logout", {})
        refused_again = await client.call("session/new", new)
    assert refused_again["error"]["code"] == -32000
    assert refused["error"]["code"] == -32000
    assert unknown["error"]["code"] == -32602
    assert ok["result"] == {}
    assert accepted["result"]["sessionId"] == "sess-1"
    assert logout["result"] == {}
    assert [(e["methodId"], e["ok"]) for e in record.of("authenticate")] == [
        ("oauth", False),
        ("key", True),
    ]


async def test_session_new_checks_and_records_its_params() -> None:
    """session/new wants an absolute cwd and an mcpServers array, and records both."""
    async with connected(AgentScript()) as (client, record):
        await client.call("initialize", {"protocolVersion": 1})
        relative = await client.call("session/new", {"cwd": "rel", "mcpServers": []})
        missing = await client.call("session/new", {"cwd": CWD})
        ok = await client.call("session/new", {"cwd": CWD, "mcpServers": [{"name": "x"}]})
    assert relative["error"]["code"] == -32602
    assert "mcpServers" in missing["error"]["message"]
    assert ok["result"] == {"sessionId": "sess-1"}
    assert record.first("session_new") == {
        "event": "session_new",
        "sessionId": "sess-1",
        "cwd": CWD,
        "mcpServers": [{"name": "x"}],
    }


# --------------------------------------------------------------------------- turns


async def test_a_turn_with_every_update_step_kind() -> None:
    """Update steps come out as schema-valid session/update notifications, in order."""
    turn = Turn(
        steps=(
            Say("Hello there", chunks=3),
            Think("pondering"),
            Plan((PlanEntry("read"), PlanEntry("write", priority="high", status="in_progress"))),
            ToolCall(
                "t1",
                "Edit a.py",
                kind="edit",
                locations=(Location("a.py", 2),),
                raw_input={"path": "a.py"},
                content=(diff_content("a.py", "new", "old"),),
            ),
            ToolUpdate(
                "t1",
                status="completed",
                content=(terminal_content("term"),),
                raw_output={"ok": True},
            ),
            Usage(120, 1000, cost=0.25),
            Update({"sessionUpdate": "notice", "level": "info", "message": "hi"}),
            Notify("_auth/status_update", {"state": "ok"}),
            Request("craft/drainMidTurnQueue", {"n": 1}),
            UserMessage("echo"),
        ),
        stop_reason="max_tokens",
    )
    async with connected(AgentScript(turns=(turn,))) as (client, record):
        session_id = await open_session(client)
        reply, seen = await client.prompt(session_id, "go")
    assert reply["result"] == {"stopReason": "max_tokens"}
    assert_valid("PromptResponse", reply["result"])
    kinds = [u["sessionUpdate"] for u in updates(seen)]
    assert kinds == ["agent_message_chunk"] * 3 + [
        "agent_thought_chunk",
        "plan",
        "tool_call",
        "tool_call_update",
        "usage_update",
        "notice",
        "user_message_chunk",
    ]
    assert texts(seen) == "Hello there"
    tool = updates(seen)[5]
    assert tool["locations"] == [{"path": "a.py", "line": 2}]
    assert tool["content"][0]["oldText"] == "old"
    assert updates(seen)[7]["cost"] == {"amount": 0.25, "currency": "USD"}
    assert {"jsonrpc": "2.0", "method": "_auth/status_update", "params": {"state": "ok"}} in seen
    assert record.first("request") == {
        "event": "request",
        "method": "craft/drainMidTurnQueue",
        "error": {"code": -32601, "message": "no craft/drainMidTurnQueue"},
    }
    assert record.first("prompt")["text"] == "go"
    assert record.first("turn_end")["stopReason"] == "max_tokens"


async def test_turns_are_taken_in_order_per_session_and_the_last_repeats() -> None:
    """Ordered turns count per session, repeat the last one, and a prompt match wins."""
    script = AgentScript(
        turns=(
            Turn((Say("one"),)),
            Turn((Say("special"),), when_prompt_contains="magic"),
            Turn((Say("two"),), stop_reason="refusal"),
        )
    )
    async with connected(script) as (client, _):
        first = await open_session(client)
        said = [texts((await client.prompt(first, p))[1]) for p in ("a", "b", "c", "a magic b")]
        reply = await client.call("session/new", {"cwd": CWD, "mcpServers": []})
        second = reply["result"]["sessionId"]
        again = texts((await client.prompt(second, "x"))[1])
    assert said == ["one", "two", "two", "special"]
    assert again == "one"
    assert second == "sess-2"


async def test_turns_are_picked_by_regex_or_predicate_before_the_ordered_ones() -> None:
    """A turn's regex (searched, flags inline) or predicate picks it; a turn with several
    conditions needs them all; turns without one are taken in order, untouched by the others."""
    seen_by_predicate: list[str] = []

    def long_prompt(text: str) -> bool:
        seen_by_predicate.append(text)
        return len(text) > 20

    script = AgentScript(
        turns=(
            Turn((Say("ordered"),)),
            Turn((Say("fix"),), when_prompt_matches=r"(?i)^fix issue #\d+$"),
            Turn((Say("both"),), when_prompt_contains="urgent", when_prompt_matches=r"\bdocs?\b"),
            Turn((Say("long"),), when=long_prompt),
        )
    )
    prompts = (
        "FIX issue #12",
        "please fix issue #12",
        "urgent: the docs",
        "urgent: the code",
        "a prompt longer than twenty characters",
        "short",
    )
    async with connected(script) as (client, record):
        session_id = await open_session(client)
        said = [texts((await client.prompt(session_id, p))[1]) for p in prompts]
    assert said == ["fix", "ordered", "both", "ordered", "long", "ordered"]
    assert [e["turn"] for e in record.of("prompt")] == [1, 0, 2, 0, 3, 0]
    # the predicate is asked only once the turns before it did not match
    assert seen_by_predicate == [
        "please fix issue #12",
        "urgent: the code",
        "a prompt longer than twenty characters",
        "short",
    ]


async def test_no_turns_means_end_turn_at_once() -> None:
    """A script without turns answers every prompt with end_turn."""
    async with connected(AgentScript()) as (client, record):
        session_id = await open_session(client)
        reply, seen = await client.prompt(session_id, "hi")
    assert reply["result"] == {"stopReason": "end_turn"}
    assert seen == []
    assert record.first("prompt")["turn"] == -1


async def test_a_turn_can_answer_with_an_error() -> None:
    """A turn with ``error`` answers the prompt with that JSON-RPC error."""
    script = AgentScript(turns=(Turn((Say("x"),), error=ErrorReply(-32000, "login again")),))
    async with connected(script) as (client, _):
        session_id = await open_session(client)
        reply, _ = await client.prompt(session_id, "hi")
    assert reply["error"] == {"code": -32000, "message": "login again"}


async def test_updates_after_response_follow_the_prompt_response() -> None:
    """updates_after_response steps are sent after the prompt's answer."""
    script = AgentScript(turns=(Turn((Say("before"),), updates_after_response=(Say("after"),)),))
    async with connected(script) as (client, _):
        session_id = await open_session(client)
        reply, seen = await client.prompt(session_id, "hi")
        late = await client.recv()
    assert reply["result"]["stopReason"] == "end_turn"
    assert texts(seen) == "before"
    assert late is not None
    assert texts([late]) == "after"


async def test_prompt_content_is_gated_by_prompt_capabilities() -> None:
    """An image block is refused unless the agent advertised image prompts."""
    image = {"type": "image", "data": "AA==", "mimeType": "image/png"}
    for allowed in (False, True):
        script = AgentScript(capabilities=Capabilities(image=allowed))
        async with connected(script) as (client, _):
            session_id = await open_session(client)
            reply = await client.call(
                "session/prompt", {"sessionId": session_id, "prompt": [image]}
            )
        assert ("result" in reply) is allowed


async def test_a_second_prompt_while_one_runs_is_refused() -> None:
    """A prompt in a session whose turn still runs answers -32600."""
    script = AgentScript(turns=(Turn((Stall(),)),))
    async with connected(script) as (client, _):
        session_id = await open_session(client)
        req_id = await client.start_prompt(session_id)
        params = {"sessionId": session_id, "prompt": [{"type": "text", "text": "again"}]}
        second = await client.call("session/prompt", params)
        await client.notify("session/cancel", {"sessionId": session_id})
        first, _ = await client.serve_until(req_id)
    assert second["error"]["code"] == -32600
    assert first["result"]["stopReason"] == "cancelled"


# --------------------------------------------------------------------------- fs, disk, terminals


async def test_fs_requests_resolve_paths_and_record_the_answers() -> None:
    """read_file/write_file use absolute paths, record answers, and then_write transforms."""
    turn = Turn(
        (
            ReadFile("src/a.py", line=2, limit=3, then_write=Replace("old", "new")),
            ReadFile("/elsewhere/missing.txt"),
            WriteFile("b.txt", "bee"),
        )
    )
    files = {f"{CWD}/src/a.py": "old = 1\n"}
    requests: list[Json] = []

    def answer(message: Json) -> Json:
        requests.append(message)
        params = message["params"]
        if message["method"] == "fs/read_text_file":
            if params["path"] not in files:
                return {"error": {"code": -32002, "message": "not found"}}
            return {"result": {"content": files[params["path"]]}}
        files[params["path"]] = params["content"]
        return {"result": {}}

    async with connected(AgentScript(turns=(turn,))) as (client, record):
        session_id = await open_session(client)
        reply, _ = await client.prompt(session_id, "edit", answer)
    assert reply["result"]["stopReason"] == "end_turn"
    assert requests[0]["params"] == {
        "sessionId": session_id,
        "path": f"{CWD}/src/a.py",
        "line": 2,
        "limit": 3,
    }
    assert files == {f"{CWD}/src/a.py": "new = 1\n", f"{CWD}/b.txt": "bee"}
    reads = record.of("fs_read")
    assert reads[0]["content"] == "old = 1\n"
    assert reads[1]["error"]["code"] == -32002
    assert [(w["path"], w["content"], w["result"]) for w in record.of("fs_write")] == [
        (f"{CWD}/src/a.py", "new = 1\n", {}),
        (f"{CWD}/b.txt", "bee", {}),
    ]


async def test_disk_steps_write_and_delete_behind_the_clients_back(tmp_path: Path) -> None:
    """write_disk and delete_disk change files under the session cwd directly."""
    (tmp_path / "old.txt").write_text("bye")
    turn = Turn((WriteDisk("deep/new.txt", "hello"), DeleteDisk("old.txt"), DeleteDisk("nope")))
    async with connected(AgentScript(turns=(turn,))) as (client, record):
        session_id = await open_session(client, cwd=str(tmp_path))
        await client.prompt(session_id, "go")
    assert (tmp_path / "deep" / "new.txt").read_text() == "hello"
    assert not (tmp_path / "old.txt").exists()
    assert record.first("disk_write") == {"event": "disk_write", "path": f"{tmp_path}/deep/new.txt"}
    assert [e["existed"] for e in record.of("disk_delete")] == [True, False]


async def test_spawn_runs_a_program_in_the_session_cwd(tmp_path: Path) -> None:
    """spawn runs a program itself in the session cwd and records its exit code."""
    made = [sys.executable, "-c", "open('made.txt', 'w').write('x'); print('noise')"]
    turn = Turn((Spawn(tuple(made)), Spawn(("sh", "-c", "exit 3")), Spawn(("/no/such",))))
    async with connected(AgentScript(turns=(turn,))) as (client, record):
        session_id = await open_session(client, cwd=str(tmp_path))
        reply, seen = await client.prompt(session_id, "go")
    assert (tmp_path / "made.txt").read_text() == "x"
    spawned = record.of("spawn")
    assert [e.get("exitCode") for e in spawned[:2]] == [0, 3]
    assert "error" in spawned[2]
    assert seen == []  # the program's stdout went to /dev/null, not to the client
    assert reply["result"]["stopReason"] == "end_turn"


async def test_spawn_to_client_sends_what_the_program_prints_as_is(tmp_path: Path) -> None:
    """spawn with to_client sends the program's output verbatim, bytes that are not UTF-8 too."""
    printf = Spawn(("printf", "\\377not json\\n"), to_client=True)
    async with connected(AgentScript(turns=(Turn((printf, Say("ok"))),))) as (client, _):
        session_id = await open_session(client, cwd=str(tmp_path))
        req_id = await client.start_prompt(session_id)
        line = await client.recv_line()
        reply, seen = await client.serve_until(req_id)
    assert line == b"\xffnot json"
    assert texts(seen) == "ok"
    assert "result" in reply


async def test_spawn_detach_leaves_a_daemon_in_a_session_of_its_own(tmp_path: Path) -> None:
    """spawn with detach records the daemon's pid; it runs in a new session, not the agent's."""
    sleeper = Spawn((sys.executable, "-c", "import time; time.sleep(60)"), detach=True)
    async with connected(AgentScript(turns=(Turn((sleeper,)),))) as (client, record):
        session_id = await open_session(client, cwd=str(tmp_path))
        await client.prompt(session_id, "go")
    pid = record.first("spawn")["pid"]
    try:
        assert os.getsid(pid) not in (pid, os.getsid(0))  # a new session, and not its leader
        assert os.readlink(f"/proc/{pid}/cwd") == str(tmp_path)
    finally:
        os.kill(pid, 9)


def _terminal_client(output: str, exit_code: int, log: list[Json]) -> Answer:
    def answer(message: Json) -> Json:
        log.append(message)
        method = message["method"]
        if method == "terminal/create":
            return {"result": {"terminalId": "term-1"}}
        if method == "terminal/wait_for_exit":
            return {"result": {"exitCode": exit_code}}
        if method == "terminal/output":
            status = {"exitCode": exit_code}
            return {"result": {"output": output, "truncated": False, "exitStatus": status}}
        return {"result": {}}

    return answer


async def test_terminal_step_runs_the_terminal_lifecycle() -> None:
    """terminal: create, wait_for_exit, output, release; the output and status are recorded."""
    step = Terminal(
        "npm test",
        args=("--ci",),
        cwd="pkg",
        env={"CI": "1"},
        output_byte_limit=32000,
        tool_call_id="run-1",
    )
    log: list[Json] = []
    async with connected(AgentScript(turns=(Turn((step,)),))) as (client, record):
        session_id = await open_session(client)
        _, seen = await client.prompt(session_id, "test", _terminal_client("ok\n", 0, log))
    assert [m["method"] for m in log] == [
        "terminal/create",
        "terminal/wait_for_exit",
        "terminal/output",
        "terminal/release",
    ]
    assert log[0]["params"] == {
        "sessionId": session_id,
        "command": "npm test",
        "args": ["--ci"],
        "cwd": f"{CWD}/pkg",
        "env": [{"name": "CI", "value": "1"}],
        "outputByteLimit": 32000,
    }
    assert all(m["params"]["terminalId"] == "term-1" for m in log[1:])
    tool, done = updates(seen)
    assert tool["content"] == [{"type": "terminal", "terminalId": "term-1"}]
    assert done["status"] == "completed"
    event = record.first("terminal")
    assert (event["output"], event["exitStatus"], event["killed"]) == (
        "ok\n",
        {"exitCode": 0},
        False,
    )


async def test_terminal_timeout_kills_the_terminal(autojump_clock: trio.abc.Clock) -> None:
    """A terminal that outlives its timeout gets terminal/kill before output and release."""
    step = Terminal("sleep 100", timeout=5)
    methods: list[str] = []
    answer_exit = _terminal_client("", 0, [])

    def answer(message: Json) -> Json | None:
        methods.append(message["method"])
        if message["method"] == "terminal/wait_for_exit":
            return None  # never exits by itself
        return answer_exit(message)

    async with connected(AgentScript(turns=(Turn((step,)),))) as (client, record):
        session_id = await open_session(client)
        await client.prompt(session_id, "go", answer)
    assert methods == [
        "terminal/create",
        "terminal/wait_for_exit",
        "terminal/kill",
        "terminal/output",
        "terminal/release",
    ]
    assert record.first("terminal")["killed"] is True


async def test_cancel_during_a_terminal_kills_and_releases_it() -> None:
    """A cancel while waiting for a terminal sends terminal/kill and terminal/release."""
    methods: list[str] = []
    answer_rest = _terminal_client("", 0, [])

    def answer(message: Json) -> Json | None:
        methods.append(message["method"])
        if message["method"] == "terminal/wait_for_exit":
            return None
        return answer_rest(message)

    script = AgentScript(turns=(Turn((Terminal("sleep 100"), Say("never"))),))
    async with connected(script) as (client, record):
        session_id = await open_session(client)
        req_id = await client.start_prompt(session_id)
        for _ in range(2):  # terminal/create, then terminal/wait_for_exit
            message = await client.recv()
            assert message is not None
            reply = answer(message)
            if reply is not None:
                await client.send({"jsonrpc": "2.0", "id": message["id"], **reply})
        await client.notify("session/cancel", {"sessionId": session_id})
        response, _ = await client.serve_until(req_id, answer)
    assert methods == [
        "terminal/create",
        "terminal/wait_for_exit",
        "terminal/kill",
        "terminal/release",
    ]
    assert response["result"]["stopReason"] == "cancelled"
    assert record.first("terminal")["cancelled"] is True


# --------------------------------------------------------------------------- permissions and cancel


@pytest.mark.parametrize(
    ("on_reject", "option", "stop_reason", "said"),
    [
        ("end_turn", "allow", "end_turn", "before after"),
        ("end_turn", "reject", "end_turn", "before "),
        ("continue", "reject", "end_turn", "before after"),
        ("cancelled", "reject", "cancelled", "before "),
    ],
)
async def test_permission_answers_steer_the_turn(
    on_reject: Any, option: str, stop_reason: str, said: str
) -> None:
    """An allow goes on; a reject ends the turn, goes on, or cancels, as on_reject says."""
    ask = AskPermission(
        PermissionToolCall("t1", title="rm -rf", kind="delete"), on_reject=on_reject
    )
    script = AgentScript(turns=(Turn((Say("before "), ask, Say("after"))),))
    async with connected(script) as (client, record):
        session_id = await open_session(client)
        reply, seen = await client.prompt(session_id, "go", select(option))
    assert reply["result"]["stopReason"] == stop_reason
    assert texts(seen) == said
    request = next(m for m in seen if m.get("method") == "session/request_permission")
    assert request["params"]["toolCall"] == {
        "toolCallId": "t1",
        "title": "rm -rf",
        "kind": "delete",
    }
    event = record.first("permission")
    assert (event["optionId"], event["decision"]) == (option, option)


async def test_custom_permission_options_and_a_cancelled_answer() -> None:
    """Scripted options are offered as is; an answer ``cancelled`` ends the turn cancelled."""
    options = (
        PermissionOption("approved", "Approve", "allow_once"),
        PermissionOption("abort", "Abort", "reject_always"),
    )
    ask = AskPermission(PermissionToolCall("t1"), options=options)
    script = AgentScript(turns=(Turn((ask, Say("never"))),))

    def cancelled(_: Json) -> Json:
        return {"result": {"outcome": {"outcome": "cancelled"}}}

    async with connected(script) as (client, record):
        session_id = await open_session(client)
        reply, seen = await client.prompt(session_id, "go", cancelled)
    request = next(m for m in seen if m.get("method") == "session/request_permission")
    assert request["params"]["options"][1] == {
        "optionId": "abort",
        "name": "Abort",
        "kind": "reject_always",
    }
    assert reply["result"]["stopReason"] == "cancelled"
    assert record.first("permission")["decision"] == "cancelled"


async def test_cancel_while_waiting_for_a_permission_answer() -> None:
    """session/cancel ends a turn waiting for permission; the late answer is still recorded."""
    ask = AskPermission(PermissionToolCall("t1", title="edit"))
    script = AgentScript(turns=(Turn((ask, Say("never"))),))
    async with connected(script) as (client, record):
        session_id = await open_session(client)
        req_id = await client.start_prompt(session_id)
        request = await client.recv()
        assert request is not None
        assert request["method"] == "session/request_permission"
        await client.notify("session/cancel", {"sessionId": session_id})
        reply, seen = await client.serve_until(req_id)
        outcome = {"outcome": {"outcome": "cancelled"}}
        await client.send({"jsonrpc": "2.0", "id": request["id"], "result": outcome})
        late = await record.wait_for("response")
    assert reply["result"]["stopReason"] == "cancelled"
    assert seen == []
    assert record.first("cancel") == {"event": "cancel", "sessionId": session_id, "running": True}
    assert (late["late"], late["result"]) == (True, outcome)
    assert record.of("permission") == []


async def test_cancel_mid_sleep(autojump_clock: trio.abc.Clock) -> None:
    """A cancel stops a sleeping turn at once with stopReason cancelled."""
    script = AgentScript(turns=(Turn((Say("start"), Sleep(1000), Say("never"))),))
    async with connected(script) as (client, record):
        session_id = await open_session(client)
        req_id = await client.start_prompt(session_id)
        first = await client.recv()
        await client.notify("session/cancel", {"sessionId": session_id})
        start = trio.current_time()
        reply, seen = await client.serve_until(req_id)
    assert first is not None
    assert texts([first]) == "start"
    assert trio.current_time() - start < 1
    assert reply["result"]["stopReason"] == "cancelled"
    assert seen == []
    assert record.first("turn_end")["cancelled"] is True


async def test_cancel_stop_reason_can_be_end_turn(autojump_clock: trio.abc.Clock) -> None:
    """cancel_stop_reason lets a cancelled turn answer end_turn, as some agents do."""
    script = AgentScript(turns=(Turn((Stall(),), cancel_stop_reason="end_turn"),))
    async with connected(script) as (client, _):
        session_id = await open_session(client)
        req_id = await client.start_prompt(session_id)
        await trio.sleep(1)
        await client.notify("session/cancel", {"sessionId": session_id})
        reply, _ = await client.serve_until(req_id)
    assert reply["result"]["stopReason"] == "end_turn"


async def test_ignore_cancel_finishes_the_turn(autojump_clock: trio.abc.Clock) -> None:
    """With ignore_cancel the turn runs to its end and answers its own stop reason."""
    script = AgentScript(turns=(Turn((Sleep(10), Say("done")), ignore_cancel=True),))
    async with connected(script) as (client, record):
        session_id = await open_session(client)
        req_id = await client.start_prompt(session_id)
        await client.notify("session/cancel", {"sessionId": session_id})
        reply, seen = await client.serve_until(req_id)
    assert reply["result"]["stopReason"] == "end_turn"
    assert texts(seen) == "done"
    assert record.first("cancel")["running"] is True


async def test_stall_with_ignore_cancel_never_answers(autojump_clock: trio.abc.Clock) -> None:
    """A stalled turn that ignores cancel never answers, even after session/cancel."""
    script = AgentScript(turns=(Turn((Stall(),), ignore_cancel=True),))
    async with connected(script) as (client, record):
        session_id = await open_session(client)
        await client.start_prompt(session_id)
        await client.notify("session/cancel", {"sessionId": session_id})
        with trio.move_on_after(20) as timer:
            await client.recv()
    assert timer.cancelled_caught
    assert record.of("turn_end") == []


async def test_stall_answers_cancel(autojump_clock: trio.abc.Clock) -> None:
    """A stalled turn still answers cancelled to session/cancel."""
    script = AgentScript(turns=(Turn((Stall(),)),))
    async with connected(script) as (client, _):
        session_id = await open_session(client)
        req_id = await client.start_prompt(session_id)
        await trio.sleep(5)
        await client.notify("session/cancel", {"sessionId": session_id})
        reply, _ = await client.serve_until(req_id)
    assert reply["result"]["stopReason"] == "cancelled"


# --------------------------------------------------------------------------- faults on the wire


async def test_crash_closes_the_stream_with_an_exit_code() -> None:
    """A crash step ends the connection abruptly and sets the record's exit code."""
    script = AgentScript(turns=(Turn((Say("partial"), Crash(7, "segfault"), Say("never"))),))
    async with connected(script) as (client, record):
        session_id = await open_session(client)
        await client.start_prompt(session_id)
        first = await client.recv()
        end = await client.recv()
    assert first is not None
    assert texts([first]) == "partial"
    assert end is None
    assert record.exit_code == 7
    assert record.of("stderr") == [{"event": "stderr", "text": "segfault"}]
    assert record.events[-1] == {"event": "crash", "exit_code": 7}


@pytest.mark.parametrize("wait", [True, False])
async def test_exit_at_start_never_answers_initialize(wait: bool) -> None:
    """exit_at_start closes the stream before answering initialize."""
    script = AgentScript(exit_at_start=ExitAtStart(3, "missing API key", wait_for_initialize=wait))
    async with connected(script) as (client, record):
        if wait:
            await client.send(
                {
                    "jsonrpc": "2.0",
                    "id": 0,
                    "method": "initialize",
                    "params": {"protocolVersion": 1},
                }
            )
        assert await client.recv() is None
    assert record.exit_code == 3
    assert record.events[-1] == {"event": "exit", "exit_code": 3}
    assert len(record.of("recv")) == int(wait)


async def test_huge_line_has_the_exact_size() -> None:
    """huge_line writes one agent_message_chunk line of exactly size_bytes bytes."""
    size = 10 * 1024 * 1024
    script = AgentScript(turns=(Turn((HugeLine(size), Say("small"))),))
    async with connected(script) as (client, _):
        session_id = await open_session(client)
        req_id = await client.start_prompt(session_id)
        line = await client.recv_line()
        reply, seen = await client.serve_until(req_id)
    assert line is not None
    assert len(line) + 1 == size
    assert orjson.loads(line)["params"]["update"]["sessionUpdate"] == "agent_message_chunk"
    assert texts(seen) == "small"
    assert reply["result"]["stopReason"] == "end_turn"


async def test_raw_writes_a_malformed_line_verbatim() -> None:
    """raw writes its text as is, and the turn goes on."""
    script = AgentScript(turns=(Turn((Raw('{"jsonrpc": "2.0", "method": '), Say("ok"))),))
    async with connected(script) as (client, _):
        session_id = await open_session(client)
        req_id = await client.start_prompt(session_id)
        line = await client.recv_line()
        reply, seen = await client.serve_until(req_id)
    assert line == b'{"jsonrpc": "2.0", "method": '
    assert texts(seen) == "ok"
    assert "result" in reply


async def test_flood_sends_count_chunks() -> None:
    """flood sends exactly ``count`` identical chunks before the prompt is answered."""
    script = AgentScript(turns=(Turn((Flood(20_000, "ab"),)),))
    async with connected(script) as (client, _):
        session_id = await open_session(client)
        client.validate = False  # the schema check costs ~1 ms a message
        reply, seen = await client.prompt(session_id, "go")
    assert len(seen) == 20_000
    assert texts(seen) == "ab" * 20_000
    assert "result" in reply


async def test_flood_requests_reading_the_answers_counts_them() -> None:
    """flood_requests with read_answers sends ``count`` requests with the session and the path
    resolved, waits for every answer and records how many came and how many were errors."""
    flood = FloodRequests(300, params={"path": "a.txt"}, read_answers=True)
    script = AgentScript(turns=(Turn((flood,)),))
    requests: list[Json] = []

    def answer(message: Json) -> Json:
        requests.append(message)
        if len(requests) % 3 == 0:
            return {"error": {"code": -32002, "message": "not found"}}
        return {"result": {"content": "x"}}

    async with connected(script) as (client, record):
        session_id = await open_session(client)
        client.validate = False
        reply, _ = await client.prompt(session_id, "go", answer)
    assert reply["result"] == {"stopReason": "end_turn"}
    assert [m["id"] for m in requests] == [f"flood-{i}" for i in range(300)]
    assert {orjson.dumps(m["params"]) for m in requests} == {
        orjson.dumps({"path": f"{CWD}/a.txt", "sessionId": session_id})
    }
    assert record.of("flood_requests") == [
        {
            "event": "flood_requests",
            "method": "fs/read_text_file",
            "count": 300,
            "answered": 300,
            "errors": 100,
        }
    ]
    assert record.of("response") == []  # counted, not recorded one by one


async def test_flood_requests_without_reading_stops_reading_first() -> None:
    """flood_requests without read_answers stops reading the client, sends every request, and
    then hears nothing: not even session/cancel ends its turn."""
    script = AgentScript(turns=(Turn((FloodRequests(50, params={"path": "a.txt"}),)),))
    agent_side, client_side = trio.testing.memory_stream_pair()
    client, record = RawClient(client_side), AgentRecord()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            # a deaf agent cannot hear its stream end either: it is cancelled
            nursery.start_soon(
                functools.partial(serve_scripted_agent, record=record), agent_side, script
            )
            session_id = await open_session(client)
            await client.start_prompt(session_id)
            ids = []
            for _ in range(50):
                message = await client.recv()
                assert message is not None
                ids.append(message["id"])
            await record.wait_for("flood_requests")
            await client.notify("session/cancel", {"sessionId": session_id})
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
    assert ids == [f"flood-{i}" for i in range(50)]
    assert record.of("flood_requests") == [
        {"event": "flood_requests", "method": "fs/read_text_file", "count": 50}
    ]
    assert record.of("cancel") == []


async def test_string_ids_for_the_agents_own_requests() -> None:
    """id_style "string" makes the agent's request ids UUID-like strings."""
    script = AgentScript(
        id_style="string", turns=(Turn((Request("x/one"), Request("x/two"), WriteFile("a", "b"))),)
    )
    async with connected(script) as (client, record):
        session_id = await open_session(client)
        _, seen = await client.prompt(session_id, "go")
    ids = [m["id"] for m in seen]
    assert len(set(ids)) == 3
    for req_id in ids:
        assert isinstance(req_id, str)
        uuid.UUID(req_id)
    assert [e["id"] for e in record.of("response")] == ids


async def test_client_misbehaviour_gets_json_rpc_errors() -> None:
    """Bad JSON, unknown methods and bad params get errors; notifications are ignored."""
    async with connected(AgentScript()) as (client, record):
        await client.send_raw(b"{oops\n")
        parse = await client.recv()
        await client.send_raw(b"[1, 2]\n")
        not_object = await client.recv()
        await client.notify("_vendor/ping", {})
        await client.notify("$/cancel_request", {"requestId": 3})
        unknown = await client.call("session/fork", {})
        bad_params = await client.call("initialize", [1])
        not_advertised = await client.call("session/list", {})
        await client.send({"jsonrpc": "2.0", "id": 77, "result": {}})
        ok = await client.call("initialize", {"protocolVersion": 1})
    assert parse == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": -32700, "message": "Parse error"},
    }
    assert not_object is not None
    assert not_object["error"]["code"] == -32600
    assert unknown["error"]["code"] == -32601
    assert bad_params["error"]["code"] == -32602
    assert not_advertised["error"]["code"] == -32601
    assert "result" in ok
    assert record.first("parse_error")["line"] == "{oops"
    assert record.first("notification_ignored")["method"] == "_vendor/ping"
    assert record.first("cancel_request")["requestId"] == 3
    assert record.first("unexpected_response")["message"]["id"] == 77


# --------------------------------------------------------------------------- session methods


async def test_modes_and_config_options() -> None:
    """session/new returns modes and config options; set_mode and set_config_option update them."""
    script = AgentScript(
        modes=(Mode("ask", "Ask"), Mode("code", "Code")),
        config_options=(
            ConfigOption(
                "model",
                "Model",
                "m1",
                options=(ConfigValue("m1", "M1"), ConfigValue("m2", "M2")),
                category="model",
            ),
            ConfigOption("fast", "Fast", False, type="boolean"),
        ),
    )
    async with connected(script) as (client, record):
        await client.call("initialize", {"protocolVersion": 1})
        new = (await client.call("session/new", {"cwd": CWD, "mcpServers": []}))["result"]
        sid = new["sessionId"]
        mode = await client.call("session/set_mode", {"sessionId": sid, "modeId": "code"})
        bad_mode = await client.call("session/set_mode", {"sessionId": sid, "modeId": "yolo"})
        model = await client.call(
            "session/set_config_option", {"sessionId": sid, "configId": "model", "value": "m2"}
        )
        fast = await client.call(
            "session/set_config_option",
            {"sessionId": sid, "configId": "fast", "type": "boolean", "value": True},
        )
        bad = await client.call(
            "session/set_config_option", {"sessionId": sid, "configId": "model", "value": "m9"}
        )
    assert new["modes"] == {
        "currentModeId": "ask",
        "availableModes": [{"id": "ask", "name": "Ask"}, {"id": "code", "name": "Code"}],
    }
    assert new["configOptions"][0]["currentValue"] == "m1"
    assert mode["result"] == {}
    assert_valid("SetSessionModeResponse", mode["result"])
    assert_valid("NewSessionResponse", new)
    assert updates(client.seen) == [
        {"sessionUpdate": "current_mode_update", "currentModeId": "code"}
    ]
    assert bad_mode["error"]["code"] == -32602
    assert_valid("SetSessionConfigOptionResponse", model["result"])
    assert [o["currentValue"] for o in model["result"]["configOptions"]] == ["m2", False]
    assert [o["currentValue"] for o in fast["result"]["configOptions"]] == ["m2", True]
    assert bad["error"]["code"] == -32602
    assert record.first("set_mode")["modeId"] == "code"


async def test_session_load_replays_history_before_answering() -> None:
    """session/load sends the scripted history as updates, then its response."""
    script = AgentScript(
        capabilities=Capabilities(load_session=True),
        load_history=(UserMessage("question"), Say("answer")),
    )
    async with connected(script) as (client, record):
        await client.call("initialize", {"protocolVersion": 1})
        reply = await client.call(
            "session/load", {"sessionId": "old-1", "cwd": CWD, "mcpServers": []}
        )
        prompt, _ = await client.prompt("old-1", "more")
    assert_valid("LoadSessionResponse", reply["result"])
    assert reply["result"] == {}
    assert [u["sessionUpdate"] for u in updates(client.seen)] == [
        "user_message_chunk",
        "agent_message_chunk",
    ]
    assert all(m["params"]["sessionId"] == "old-1" for m in client.seen)
    assert "result" in prompt
    assert record.first("session_load")["sessionId"] == "old-1"


async def test_session_list_resume_close_delete_when_advertised() -> None:
    """The optional session methods work when advertised and answer -32601 otherwise."""
    caps = Capabilities(
        session_list=True, session_resume=True, session_close=True, session_delete=True
    )
    async with connected(AgentScript(capabilities=caps)) as (client, record):
        sid = await open_session(client)
        listed = await client.call("session/list", {})
        resumed = await client.call("session/resume", {"sessionId": "prev", "cwd": "/other"})
        filtered = await client.call("session/list", {"cwd": "/other"})
        closed = await client.call("session/close", {"sessionId": sid})
        deleted = await client.call("session/delete", {"sessionId": "prev"})
        after = await client.call("session/list", {})
    assert_valid("ListSessionsResponse", listed["result"])
    assert_valid("ResumeSessionResponse", resumed["result"])
    assert_valid("CloseSessionResponse", closed["result"])
    assert_valid("DeleteSessionResponse", deleted["result"])
    assert listed["result"] == {"sessions": [{"sessionId": sid, "cwd": CWD}]}
    assert resumed["result"] == {}
    assert filtered["result"] == {"sessions": [{"sessionId": "prev", "cwd": "/other"}]}
    assert closed["result"] == {}
    assert deleted["result"] == {}
    assert after["result"] == {"sessions": []}
    assert record.first("session_close")["sessionId"] == sid
    async with connected(AgentScript()) as (client, _):
        await open_session(client)
        for method in ("session/resume", "session/close", "session/delete", "session/load"):
            reply = await client.call(method, {"sessionId": "x", "cwd": CWD, "mcpServers": []})
            assert reply["error"]["code"] == -32601, method


# --------------------------------------------------------------------------- subprocess


@asynccontextmanager
async def spawned(
    script: AgentScript, directory: Path
) -> AsyncIterator[tuple[RawClient, trio.Process, bytearray]]:
    """The scripted agent as a subprocess, its stdio wrapped in a raw client."""
    command = scripted_agent_command(script, directory)
    stderr = bytearray()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            process: trio.Process = await nursery.start(
                functools.partial(
                    trio.run_process,
                    command,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    check=False,
                )
            )

            async def drain() -> None:
                assert process.stderr is not None
                while data := await process.stderr.receive_some():
                    stderr.extend(data)

            nursery.start_soon(drain)
            assert process.stdio is not None
            yield RawClient(process.stdio), process, stderr
            await process.stdio.send_stream.aclose()
            await process.wait()


async def test_subprocess_agent_serves_a_turn_and_writes_its_record(tmp_path: Path) -> None:
    """The subprocess entry point speaks ACP on stdio and writes the record file."""
    record_path = tmp_path / "record.jsonl"
    turn = Turn((Say("hi"), AskPermission(PermissionToolCall("t1")), ReadFile("a.txt")))
    script = AgentScript(turns=(turn,), record_path=str(record_path), id_style="string")

    def answer(message: Json) -> Json:
        if message["method"] == "fs/read_text_file":
            return {"result": {"content": "A"}}
        return {"result": {"outcome": {"outcome": "selected", "optionId": "allow"}}}

    async with spawned(script, tmp_path) as (client, process, stderr):
        session_id = await open_session(client, cwd=str(tmp_path))
        reply, seen = await client.prompt(session_id, "go", answer)
    assert process.returncode == 0
    assert reply["result"]["stopReason"] == "end_turn"
    assert texts(seen) == "hi"
    record = AgentRecord.from_jsonl(record_path)
    assert record.first("permission")["decision"] == "allow"
    assert record.first("fs_read") == {
        "event": "fs_read",
        "sessionId": session_id,
        "path": f"{tmp_path}/a.txt",
        "content": "A",
    }
    assert record.events[-1] == {"event": "eof"}
    assert b"scripted agent" in stderr


async def test_subprocess_agent_picks_its_turn_by_regex(tmp_path: Path) -> None:
    """A subprocess agent's script carries its regex in JSON and picks the turn by it."""
    script = AgentScript(
        turns=(
            Turn((Say("ordered"),)),
            Turn((Say("reviewed"),), when_prompt_matches=r"^Review \S+\.md:\n"),
        )
    )
    async with spawned(script, tmp_path) as (client, process, _):
        session_id = await open_session(client, cwd=str(tmp_path))
        said = [
            texts((await client.prompt(session_id, p))[1])
            for p in ("Review README.md:\n+color", "Review main.py:\n+x", "Please Review a.md:\n")
        ]
    assert process.returncode == 0
    assert said == ["reviewed", "ordered", "ordered"]


async def test_subprocess_crash_exits_with_the_scripted_code(tmp_path: Path) -> None:
    """A crash step makes the process exit with its code and stderr text."""
    script = AgentScript(turns=(Turn((Say("partial"), Crash(13, "fatal: out of tokens"))),))
    async with spawned(script, tmp_path) as (client, process, stderr):
        session_id = await open_session(client)
        await client.start_prompt(session_id)
        first = await client.recv()
        assert await client.recv() is None
        await process.wait()
    assert first is not None
    assert texts([first]) == "partial"
    assert process.returncode == 13
    assert b"fatal: out of tokens" in stderr


async def test_subprocess_exit_at_start(tmp_path: Path) -> None:
    """exit_at_start makes the process exit before answering initialize."""
    script = AgentScript(exit_at_start=ExitAtStart(5, "error: not logged in"))
    async with spawned(script, tmp_path) as (client, process, stderr):
        await client.send(
            {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}}
        )
        assert await client.recv() is None
        await process.wait()
    assert process.returncode == 5
    assert b"error: not logged in" in stderr


async def test_subprocess_rejects_a_bad_script_file(tmp_path: Path) -> None:
    """A script file that does not parse makes the agent exit 2 with a message."""
    bad = tmp_path / "bad.json"
    bad.write_text('{"turns": [{"steps": [{"op": "dance"}]}]}')
    command = [sys.executable, "-m", "orchestrator.testing.scripted_agent", str(bad)]
    with trio.fail_after(30):
        done = await trio.run_process(
            command, capture_stderr=True, check=False, env={**os.environ, "PYTHONWARNINGS": "error"}
        )
    assert done.returncode == 2
    assert b"unknown step op 'dance'" in done.stderr
    assert b"Warning" not in done.stderr


def test_scripted_agent_command_writes_the_script(tmp_path: Path) -> None:
    """scripted_agent_command writes the script JSON and returns a python -m command."""
    script = AgentScript(name="x", turns=(Turn((Say("a"),)),))
    command = scripted_agent_command(script, tmp_path)
    assert command[:3] == [sys.executable, "-m", "orchestrator.testing.scripted_agent"]
    assert AgentScript.from_json(orjson.loads(Path(command[3]).read_bytes())) == script
    assert scripted_agent_command(script, tmp_path) == command
