"""The scripted model server, spoken to with a plain HTTP client (both APIs, stream or not)."""

from __future__ import annotations

import http.client
import json
import os
import selectors
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest
import trio

from orchestrator.errors import UsageError
from orchestrator.testing.model_server import (
    LOCALHOST,
    Edit,
    ModelRequest,
    ModelServer,
    Read,
    Reply,
    Rule,
    Scenario,
    Shell,
    Stall,
    UnsafeBind,
    Write,
    choose_tool,
    open_model_server,
    scenarios_from_json,
    serve_model_thread,
)

PROJECT = "/work/project"
SYSTEM = f"You are a coding agent.\nWorking directory: {PROJECT}\n"
SCENARIO = Scenario(
    "MARK-ALL",
    (
        Read("a.py"),
        Edit("a.py", "old", "new"),
        Write("b.md", "hello\n"),
        Shell("echo hi"),
        Reply("all done"),
    ),
    done="nothing left",
)


def openai_tool(name: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """An OpenAI function tool."""
    params = {"type": "object", "properties": properties, "required": required}
    return {"type": "function", "function": {"name": name, "parameters": params}}


def anthropic_tool(name: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """An Anthropic tool."""
    schema = {"type": "object", "properties": properties, "required": required}
    return {"name": name, "input_schema": schema}


STR = {"type": "string"}
QWEN_TOOLS = [
    openai_tool("read_file", {"file_path": STR, "offset": {"type": "integer"}}, ["file_path"]),
    openai_tool("edit", {"file_path": STR, "old_string": STR, "new_string": STR}, ["file_path"]),
    openai_tool("write_file", {"file_path": STR, "content": STR}, ["file_path", "content"]),
    openai_tool("run_shell_command", {"command": STR, "description": STR}, ["command"]),
]
CLAUDE_TOOLS = [
    anthropic_tool("Glob", {"pattern": STR}, ["pattern"]),
    anthropic_tool("mcp__acp__Read", {"file_path": STR}, ["file_path"]),
    anthropic_tool("mcp__acp__Edit", {"file_path": STR, "old_string": STR, "new_string": STR}, []),
    anthropic_tool("mcp__acp__Write", {"file_path": STR, "content": STR}, []),
    anthropic_tool("mcp__acp__Bash", {"command": STR, "timeout": {"type": "number"}}, ["command"]),
]


@pytest.fixture
def server() -> Iterator[ModelServer]:
    """A server with the read/edit/write/shell/reply scenario and a stalling one."""
    stall = Scenario("MARK-STALL", (Stall("Let me think"),))
    with serve_model_thread([SCENARIO, stall]) as srv:
        yield srv


def connect(server: ModelServer) -> http.client.HTTPConnection:
    """A client connection to the server (close it)."""
    return http.client.HTTPConnection(LOCALHOST, int(server.url.rsplit(":", 1)[1]), timeout=10)


def post(server: ModelServer, path: str, body: dict[str, Any] | bytes) -> tuple[int, bytes]:
    """POST a body; the status and the whole answer."""
    conn = connect(server)
    try:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        conn.request("POST", path, data, {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def post_json(server: ModelServer, path: str, body: dict[str, Any]) -> Any:
    """POST and decode a JSON answer (status 200 expected)."""
    status, data = post(server, path, body)
    assert status == 200
    return json.loads(data)


def sse_data(server: ModelServer, path: str, body: dict[str, Any]) -> list[Any]:
    """POST; the ``data:`` payloads of the SSE answer (``[DONE]`` kept as a string)."""
    status, data = post(server, path, body)
    assert status == 200
    out: list[Any] = []
    for line in data.decode().splitlines():
        if line.startswith("data: "):
            payload = line[len("data: ") :]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def sse_events(server: ModelServer, path: str, body: dict[str, Any]) -> list[tuple[str, Any]]:
    """POST; (event name, data) pairs of the SSE answer."""
    status, data = post(server, path, body)
    assert status == 200
    events: list[tuple[str, Any]] = []
    name = ""
    for line in data.decode().splitlines():
        if line.startswith("event: "):
            name = line[len("event: ") :]
        elif line.startswith("data: "):
            events.append((name, json.loads(line[len("data: ") :])))
    return events


def openai_body(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """A chat completion request with the Qwen-style tools."""
    return {
        "model": "m",
        "messages": [{"role": "system", "content": SYSTEM}, *messages],
        "tools": QWEN_TOOLS,
        **extra,
    }


def assistant_call(name: str, call_id: str) -> dict[str, Any]:
    """An OpenAI assistant message with one tool call."""
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}
        ],
    }


# --------------------------------------------------------------------------- OpenAI


def test_models_lists_the_scripted_model(server: ModelServer) -> None:
    """GET /v1/models answers a model list."""
    conn = connect(server)
    conn.request("GET", "/v1/models")
    body = json.loads(conn.getresponse().read())
    conn.close()
    assert body["object"] == "list"
    assert body["data"][0]["id"] == "scripted-model"


def test_openai_without_tools_gets_plain_text(server: ModelServer) -> None:
    """A request without tools (a title, a summary) gets the plain text, not the script."""
    body = {"model": "m", "messages": [{"role": "user", "content": "MARK-ALL title please"}]}
    answer = post_json(server, "/v1/chat/completions", body)
    assert answer["choices"][0]["message"] == {"role": "assistant", "content": "OK"}
    assert answer["choices"][0]["finish_reason"] == "stop"
    assert answer["usage"]["total_tokens"] > 0
    assert server.requests[0].action is None


def test_openai_non_stream_tool_call(server: ModelServer) -> None:
    """The first action of a marked conversation is a tool call with absolute paths."""
    body = openai_body([{"role": "user", "content": "please MARK-ALL"}])
    answer = post_json(server, "/chat/completions", body)
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    call = choice["message"]["tool_calls"][0]
    assert call["function"]["name"] == "read_file"
    assert json.loads(call["function"]["arguments"]) == {"file_path": f"{PROJECT}/a.py"}


def test_openai_stream_tool_call_in_pieces_with_usage(server: ModelServer) -> None:
    """A streamed tool call arrives as argument deltas, then finish, usage and [DONE]."""
    messages = [
        {"role": "user", "content": "please MARK-ALL"},
        assistant_call("read_file", "c1"),
        {"role": "tool", "tool_call_id": "c1", "content": "old text"},
    ]
    body = openai_body(messages, stream=True, stream_options={"include_usage": True})
    chunks = sse_data(server, "/v1/chat/completions", body)
    assert chunks[-1] == "[DONE]"
    usage = chunks[-2]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] > 0
    deltas = [c["choices"][0]["delta"] for c in chunks[:-2]]
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert calls[0]["function"]["name"] == "edit" and calls[0]["id"]
    assert len(calls) > 2, "the arguments should come in several pieces"
    arguments = "".join(c["function"]["arguments"] for c in calls)
    assert json.loads(arguments) == {
        "file_path": f"{PROJECT}/a.py",
        "old_string": "old",
        "new_string": "new",
    }
    assert chunks[-3]["choices"][0]["finish_reason"] == "tool_calls"
    assert server.requests[0].step == 1
    assert server.requests[0].tool_results() == ["old text"]


def test_openai_stream_text_without_usage_unless_asked(server: ModelServer) -> None:
    """After the last action the text streams in pieces; no usage chunk without the option."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "MARK-ALL"}]
    for i in range(5):
        messages += [assistant_call("x", f"c{i}"), {"role": "tool", "tool_call_id": f"c{i}"}]
    chunks = sse_data(server, "/v1/chat/completions", openai_body(messages, stream=True))
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks[:-1])
    assert text == "nothing left"
    assert all("usage" not in c for c in chunks[:-1])
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"


def test_actions_follow_the_conversation(server: ModelServer) -> None:
    """Each assistant message after the marked prompt advances the script by one action."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "MARK-ALL"}]
    names = []
    for i in range(5):
        answer = post_json(server, "/v1/chat/completions", openai_body(messages))
        message = answer["choices"][0]["message"]
        names.append(
            message["tool_calls"][0]["function"]["name"] if "tool_calls" in message else ""
        )
        messages += [assistant_call("x", f"c{i}"), {"role": "tool", "tool_call_id": f"c{i}"}]
    assert names == ["read_file", "edit", "write_file", "run_shell_command", ""]
    assert [r.step for r in server.requests] == [0, 1, 2, 3, 4]
    write = server.requests[2].tool_call
    assert write is not None
    assert write.arguments == {"file_path": f"{PROJECT}/b.md", "content": "hello\n"}


def test_side_request_after_the_script_gets_plain_text(server: ModelServer) -> None:
    """A trailing user message without a marker (a suggestion request) is not scripted."""
    messages = [
        {"role": "user", "content": "MARK-ALL"},
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": "Suggest what the user types next"},
    ]
    answer = post_json(server, "/v1/chat/completions", openai_body(messages))
    assert answer["choices"][0]["message"]["content"] == "OK"
    assert server.requests[0].scenario is None


def test_unmarked_conversation_gets_plain_text(server: ModelServer) -> None:
    """A conversation no scenario marks gets the plain text."""
    answer = post_json(
        server, "/v1/chat/completions", openai_body([{"role": "user", "content": "hello"}])
    )
    assert answer["choices"][0]["message"]["content"] == "OK"


def test_rules_come_before_scenarios() -> None:
    """A rule matching the last tool result decides before the scenario."""

    def after_read(request: ModelRequest) -> bool:
        results = request.tool_results()
        return bool(results) and "secret" in results[-1]

    rule = Rule(after_read, Reply("found the secret"), name="secret")
    with serve_model_thread([SCENARIO], rules=[rule]) as srv:
        messages = [
            {"role": "user", "content": "MARK-ALL"},
            assistant_call("read_file", "c1"),
            {"role": "tool", "tool_call_id": "c1", "content": "a secret"},
        ]
        answer = post_json(srv, "/v1/chat/completions", openai_body(messages))
    assert answer["choices"][0]["message"]["content"] == "found the secret"
    assert srv.requests[0].scenario == "secret"


# --------------------------------------------------------------------------- Anthropic


def anthropic_body(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """A Messages request with Claude-style tools and a block system prompt."""
    return {
        "model": "claude",
        "max_tokens": 100,
        "system": [{"type": "text", "text": SYSTEM}],
        "messages": messages,
        "tools": CLAUDE_TOOLS,
        **extra,
    }


def test_anthropic_stream_tool_use_events(server: ModelServer) -> None:
    """A streamed tool_use: message_start, block start, input_json deltas, stops, usage."""
    body = anthropic_body([{"role": "user", "content": "go MARK-ALL"}], stream=True)
    events = sse_events(server, "/v1/messages", body)
    names = [name for name, _ in events]
    assert names[0] == "message_start" and names[-1] == "message_stop"
    assert names[-2] == "message_delta"
    start = next(d for n, d in events if n == "content_block_start")
    assert start["content_block"]["type"] == "tool_use"
    assert start["content_block"]["name"] == "mcp__acp__Read"
    deltas = [d["delta"] for n, d in events if n == "content_block_delta"]
    assert all(d["type"] == "input_json_delta" for d in deltas) and len(deltas) > 1
    assert json.loads("".join(d["partial_json"] for d in deltas)) == {
        "file_path": f"{PROJECT}/a.py"
    }
    assert "content_block_stop" in names
    final = events[-2][1]
    assert final["delta"]["stop_reason"] == "tool_use"
    assert final["usage"]["output_tokens"] > 0


def test_anthropic_tool_results_advance_the_script(server: ModelServer) -> None:
    """Tool results in user messages count as turns; text beside them does not stop the script."""
    tool_use = {"type": "tool_use", "id": "t1", "name": "mcp__acp__Read", "input": {}}
    result = {
        "type": "tool_result",
        "tool_use_id": "t1",
        "content": [{"type": "text", "text": "x"}],
    }
    reminder = {"type": "text", "text": "<system-reminder>be careful</system-reminder>"}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "go MARK-ALL"}]},
        {"role": "assistant", "content": [tool_use]},
        {"role": "user", "content": [result, reminder]},
    ]
    answer = post_json(server, "/v1/messages", anthropic_body(messages))
    assert answer["stop_reason"] == "tool_use"
    block = answer["content"][0]
    assert block["type"] == "tool_use" and block["name"] == "mcp__acp__Edit"
    assert server.requests[0].tool_results() == ["x"]


def test_anthropic_stream_text_reply(server: ModelServer) -> None:
    """A streamed text answer: text deltas that add up, stop reason end_turn."""
    messages = [{"role": "user", "content": "hello"}]
    events = sse_events(server, "/v1/messages", anthropic_body(messages, stream=True))
    text = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta")
    assert text == "OK"
    assert events[-2][1]["delta"]["stop_reason"] == "end_turn"


def test_anthropic_non_stream_text(server: ModelServer) -> None:
    """A non-streamed Messages answer is one message object."""
    answer = post_json(
        server, "/v1/messages", {"model": "c", "messages": [{"role": "user", "content": "hi"}]}
    )
    assert answer["type"] == "message" and answer["role"] == "assistant"
    assert answer["content"] == [{"type": "text", "text": "OK"}]
    assert answer["stop_reason"] == "end_turn"
    assert answer["usage"]["input_tokens"] > 0


def test_count_tokens(server: ModelServer) -> None:
    """count_tokens answers an estimate (query strings such as ?beta=true are fine)."""
    body = {"model": "c", "messages": [{"role": "user", "content": "x" * 400}]}
    answer = post_json(server, "/v1/messages/count_tokens?beta=true", body)
    assert answer["input_tokens"] >= 100


def test_bad_requests(server: ModelServer) -> None:
    """Unknown routes are 404 and a body that is not JSON is 400."""
    assert post(server, "/v1/nowhere", {})[0] == 404
    assert post(server, "/v1/messages", b"{not json")[0] == 400


# --------------------------------------------------------------------------- tools


def request_with(api: str, tools: list[dict[str, Any]]) -> ModelRequest:
    """A bare request offering ``tools`` (with the working directory in its system prompt)."""
    if api == "openai":
        body: dict[str, Any] = {"messages": [{"role": "system", "content": SYSTEM}], "tools": tools}
        return ModelRequest("openai", "/v1/chat/completions", {}, body, 0.0)
    return ModelRequest("anthropic", "/v1/messages", {}, {"system": SYSTEM, "tools": tools}, 0.0)


def test_tool_names_differ_per_agent() -> None:
    """The same action maps to each agent's own tool, with the arguments its schema wants."""
    qwen = choose_tool(Shell("ls", "list"), request_with("openai", QWEN_TOOLS))
    claude = choose_tool(Shell("ls"), request_with("anthropic", CLAUDE_TOOLS))
    assert qwen is not None and claude is not None
    assert (qwen.name, qwen.arguments) == (
        "run_shell_command",
        {"command": "ls", "description": "list"},
    )
    assert claude.name == "mcp__acp__Bash"
    assert claude.arguments == {"command": "ls", "timeout": 60000}


def test_absolute_paths_are_kept() -> None:
    """An absolute path in an action is used as it is."""
    choice = choose_tool(Read("/etc/hosts"), request_with("openai", QWEN_TOOLS))
    assert choice is not None and choice.arguments == {"file_path": "/etc/hosts"}


def test_missing_tool_becomes_a_reply(server: ModelServer) -> None:
    """An action the offered tools cannot perform ends the turn with a sentence instead."""
    body = openai_body([{"role": "user", "content": "MARK-ALL"}])
    body["tools"] = [openai_tool("glob", {"pattern": STR}, ["pattern"])]
    answer = post_json(server, "/v1/chat/completions", body)
    assert answer["choices"][0]["message"]["content"] == "I have no tool to read."


# --------------------------------------------------------------------------- safety


def raw_request(server: ModelServer, data: bytes) -> bytes:
    """Send raw bytes and read the answer until the server closes."""
    port = int(server.url.rsplit(":", 1)[1])
    with socket.create_connection((LOCALHOST, port), timeout=10) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(4096):
            chunks.append(chunk)
    return b"".join(chunks)


def test_connect_is_refused_and_recorded(server: ModelServer) -> None:
    """CONNECT host:port (an HTTPS proxy tunnel) is answered 403 and recorded."""
    answer = raw_request(server, b"CONNECT api.example.com:443 HTTP/1.1\r\nHost: x\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 403")
    [refused] = server.refused
    assert (refused.method, refused.host, refused.target) == (
        "CONNECT",
        "api.example.com",
        "api.example.com:443",
    )
    assert server.requests == []


def test_absolute_uri_is_refused_and_recorded(server: ModelServer) -> None:
    """A plain-HTTP proxy request (absolute URI) is refused; nothing is fetched."""
    answer = raw_request(
        server,
        b"GET http://telemetry.example.org/v1/x HTTP/1.1\r\nHost: telemetry.example.org\r\n\r\n",
    )
    assert answer.startswith(b"HTTP/1.1 403")
    assert [r.host for r in server.refused] == ["telemetry.example.org"]
    post_answer = raw_request(
        server,
        b"POST http://evil.example/v1/messages HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}",
    )
    assert post_answer.startswith(b"HTTP/1.1 403")
    assert [r.method for r in server.refused] == ["GET", "POST"]


def test_binds_to_localhost_only() -> None:
    """Any other bind address is refused; the server listens on 127.0.0.1."""
    for host in ("0.0.0.0", "localhost", "::"):
        with pytest.raises(UnsafeBind), serve_model_thread(host=host):
            pass
    assert issubclass(UnsafeBind, UsageError)
    with serve_model_thread() as srv:
        assert srv.url.startswith("http://127.0.0.1:")


def test_url_needs_a_running_server() -> None:
    """Asking a stopped server for its URL is a usage error."""
    with pytest.raises(UsageError):
        _ = ModelServer().url


# --------------------------------------------------------------------------- stalls


def test_stall_ends_when_the_client_goes_away(server: ModelServer) -> None:
    """A stalling request streams its text, then holds until the client closes."""
    body = openai_body([{"role": "user", "content": "MARK-STALL"}], stream=True)
    conn = connect(server)
    conn.request("POST", "/v1/chat/completions", json.dumps(body))
    response = conn.getresponse()
    assert response.status == 200
    assert server.wait_stalled(10)
    assert response.fp.readline().strip()  # the chunk-size line of the first event
    conn.close()
    assert server.wait_stalls_ended(1, timeout=10)
    assert server.stalls_ended == ["client closed"]


def test_stall_ends_when_the_server_closes() -> None:
    """Closing the server releases a stalled Anthropic stream."""
    with serve_model_thread([Scenario("S", (Stall(),))]) as srv:
        body = anthropic_body([{"role": "user", "content": "S"}], stream=True)
        conn = connect(srv)
        conn.request("POST", "/v1/messages", json.dumps(body))
        assert srv.wait_stalled(10)
    assert srv.stalls_ended == ["server closed"]
    conn.close()


async def test_open_model_server_in_trio() -> None:
    """The async context manager serves while trio waits for a stall; closing ends it."""

    def post_until_cut(server: ModelServer, body: dict[str, Any]) -> None:
        with suppress(http.client.HTTPException, OSError):  # the server cuts the stream
            post(server, "/v1/chat/completions", body)

    with trio.fail_after(10):
        async with (
            trio.open_nursery() as nursery,
            open_model_server([Scenario("S", (Stall(),))]) as srv,
        ):
            body = openai_body([{"role": "user", "content": "S"}], stream=True)
            nursery.start_soon(trio.to_thread.run_sync, post_until_cut, srv, body)
            await srv.wait_for_stall()
    assert srv.stalls_ended == ["server closed"]
    assert srv.requests[0].action == Stall()


# --------------------------------------------------------------------------- loading


def test_scenarios_from_json() -> None:
    """Every action kind loads from JSON; unknown actions and bad shapes are usage errors."""
    data = {
        "scenarios": [
            {
                "marker": "M",
                "actions": [
                    {"read": "a"},
                    {"edit": {"path": "a", "old": "x", "new": "y"}},
                    {"write": {"path": "b", "content": "c"}},
                    {"shell": "ls"},
                    {"stall": "wait"},
                    {"reply": "ok"},
                ],
                "done": "fin",
            }
        ]
    }
    [scenario] = scenarios_from_json(data)
    assert scenario.actions == (
        Read("a"),
        Edit("a", "x", "y"),
        Write("b", "c"),
        Shell("ls"),
        Stall("wait"),
        Reply("ok"),
    )
    assert scenario.done == "fin"
    with pytest.raises(UsageError):
        scenarios_from_json({"scenarios": [{"marker": "M", "actions": [{"dance": 1}]}]})
    with pytest.raises(UsageError):
        scenarios_from_json({"nothing": []})


def read_url(process: subprocess.Popen[bytes], seconds: float) -> tuple[str, bytes]:
    """The URL line the server prints, waited for at most ``seconds``; and all output so far.

    Reads the pipe itself (no blocking ``readline``), so a slow or dead child is a failure
    with its output in the message, not a hang.
    """
    assert process.stdout is not None
    fd = process.stdout.fileno()
    seen = b""
    deadline = time.monotonic() + seconds
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while (left := deadline - time.monotonic()) > 0:
            if not selector.select(left):
                break
            chunk = os.read(fd, 65536)
            if not chunk:
                break  # the child exited
            seen += chunk
            for line in seen.splitlines(keepends=True):
                if line.startswith(b"http://") and line.endswith(b"\n"):
                    return line.decode().strip(), seen
    return "", seen


def test_command_line_serves(tmp_path: Path) -> None:
    """``python -m orchestrator.testing.model_server`` prints its URL and serves a scenario."""
    scenario_file = tmp_path / "s.json"
    scenario_file.write_text(
        json.dumps({"scenarios": [{"marker": "M", "actions": [{"reply": "hi"}]}]})
    )
    command = [sys.executable, "-m", "orchestrator.testing.model_server"]
    # the with block closes the pipe and reaps the child whatever fails inside: an unclosed
    # pipe is a ResourceWarning (an error here) that would hide the real failure
    with subprocess.Popen(
        [*command, "--scenarios", str(scenario_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    ) as process:
        try:
            # generous limits: a loaded machine may take many seconds to start Python
            url, seen = read_url(process, 120.0)
            assert url.startswith("http://127.0.0.1:"), seen.decode(errors="replace")
            conn = http.client.HTTPConnection(LOCALHOST, int(url.rsplit(":", 1)[1]), timeout=120)
            try:
                body = openai_body([{"role": "user", "content": "M"}])
                conn.request("POST", "/v1/chat/completions", json.dumps(body))
                answer = json.loads(conn.getresponse().read())
            finally:
                conn.close()
            assert answer["choices"][0]["message"]["content"] == "hi"
        finally:
            process.kill()
