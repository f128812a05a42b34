"""The scripted model server's Gemini API, spoken to with a plain HTTP client."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import pytest

from orchestrator.testing.model_server import (
    LOCALHOST,
    Edit,
    ModelServer,
    Read,
    Reply,
    Scenario,
    Shell,
    Stall,
    Write,
    serve_model_thread,
)

PROJECT = "/work/project"
#: how Gemini CLI tells the model its directory (in its first user turn)
CONTEXT = f"I'm currently working in the directory: {PROJECT}\n"
SCENARIO = Scenario(
    "MARK-GEM",
    (
        Read("a.py"),
        Edit("a.py", "old", "new"),
        Write("b.md", "hello\n"),
        Shell("echo hi"),
        Reply("all done, with a longer text"),
    ),
    done="nothing left",
)
STREAM = "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
GENERATE = "/v1beta/models/gemini-2.5-flash:generateContent"

STR = {"type": "string"}


def declaration(name: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """A function declaration as Gemini CLI sends it (``parametersJsonSchema``)."""
    schema = {"type": "object", "properties": properties, "required": required}
    return {"name": name, "description": name, "parametersJsonSchema": schema}


#: Gemini CLI 0.61's tools, with the parameters the scenarios use
GEMINI_TOOLS = [
    {
        "functionDeclarations": [
            declaration("read_file", {"file_path": STR}, ["file_path"]),
            declaration(
                "replace",
                {"file_path": STR, "instruction": STR, "old_string": STR, "new_string": STR},
                ["file_path", "instruction", "old_string", "new_string"],
            ),
            declaration("write_file", {"file_path": STR, "content": STR}, ["file_path", "content"]),
            declaration(
                "run_shell_command",
                {"command": STR, "description": STR, "is_background": {"type": "boolean"}},
                ["command", "is_background"],
            ),
        ]
    }
]


@pytest.fixture
def server() -> Iterator[ModelServer]:
    """A server with the read/edit/write/shell/reply scenario and a stalling one."""
    stall = Scenario("MARK-STALL", (Stall("Let me think"),))
    with serve_model_thread([SCENARIO, stall]) as srv:
        yield srv


def post(server: ModelServer, path: str, body: dict[str, Any]) -> bytes:
    """POST a JSON body; the whole answer (status 200 expected)."""
    conn = http.client.HTTPConnection(LOCALHOST, int(server.url.rsplit(":", 1)[1]), timeout=10)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        data = response.read()
        assert response.status == 200, data
        return data
    finally:
        conn.close()


def sse(server: ModelServer, body: dict[str, Any]) -> list[dict[str, Any]]:
    """POST to ``:streamGenerateContent?alt=sse``; the responses of its events."""
    events = post(server, STREAM, body).decode().split("\r\n\r\n")
    assert events[-1] == ""
    assert all(e.startswith("data: ") for e in events[:-1])
    return [json.loads(e[len("data: ") :]) for e in events[:-1]]


def body(contents: list[dict[str, Any]], *, tools: bool = True) -> dict[str, Any]:
    """A request as Gemini CLI sends it."""
    out: dict[str, Any] = {
        "contents": contents,
        "systemInstruction": {"role": "user", "parts": [{"text": "You are Gemini CLI."}]},
        "generationConfig": {"temperature": 0},
    }
    if tools:
        out["tools"] = GEMINI_TOOLS
    return out


def user(text: str) -> dict[str, Any]:
    """A user turn."""
    return {"role": "user", "parts": [{"text": text}]}


def model_call(name: str, call_id: str) -> dict[str, Any]:
    """A model turn with one function call."""
    return {"role": "model", "parts": [{"functionCall": {"id": call_id, "name": name, "args": {}}}]}


def result(name: str, call_id: str, output: str) -> dict[str, Any]:
    """A user turn carrying a function response."""
    part = {"functionResponse": {"id": call_id, "name": name, "response": {"output": output}}}
    return {"role": "user", "parts": [part]}


def parts(response: dict[str, Any]) -> list[dict[str, Any]]:
    """The parts of a response's first candidate."""
    found: list[dict[str, Any]] = response["candidates"][0]["content"]["parts"]
    return found


def test_stream_function_call_with_usage(server: ModelServer) -> None:
    """The first step is a read_file call with the absolute path, usage in the last event."""
    events = sse(server, body([user(CONTEXT + "Do MARK-GEM.")]))
    (last,) = events
    call = parts(last)[0]["functionCall"]
    assert call["name"] == "read_file"
    assert call["args"] == {"file_path": f"{PROJECT}/a.py"}
    assert call["id"]
    assert last["candidates"][0]["finishReason"] == "STOP"
    usage = last["usageMetadata"]
    assert usage["totalTokenCount"] == usage["promptTokenCount"] + usage["candidatesTokenCount"]
    assert usage["promptTokenCount"] > 0 and usage["candidatesTokenCount"] == 20
    assert last["modelVersion"] == "gemini-2.5-flash"
    (request,) = server.requests
    assert request.api == "gemini" and request.stream
    assert request.tool_names == ["read_file", "replace", "write_file", "run_shell_command"]
    assert request.system_text() == "You are Gemini CLI."


def test_steps_follow_the_model_turns(server: ModelServer) -> None:
    """Each model turn advances the script; the calls carry Gemini CLI's parameters."""
    history = [user(CONTEXT + "Do MARK-GEM.")]
    names = ["read_file", "replace", "write_file", "run_shell_command"]
    calls = []
    for step, name in enumerate(names):
        (last,) = sse(server, body(history))
        call = parts(last)[0]["functionCall"]
        calls.append((call["name"], call["args"]))
        history += [model_call(name, f"c{step}"), result(name, f"c{step}", f"output {step}")]
    assert calls == [
        ("read_file", {"file_path": f"{PROJECT}/a.py"}),
        (
            "replace",
            {
                "file_path": f"{PROJECT}/a.py",
                "old_string": "old",
                "new_string": "new",
                "instruction": "Replace 'old' with 'new'.",
            },
        ),
        ("write_file", {"file_path": f"{PROJECT}/b.md", "content": "hello\n"}),
        (
            "run_shell_command",
            {"command": "echo hi", "description": "run a command", "is_background": False},
        ),
    ]
    assert server.requests[-1].tool_results() == ["output 0", "output 1", "output 2"]
    events = sse(server, body(history))
    text = "".join(p["text"] for e in events for p in parts(e))
    assert text == "all done, with a longer text"
    assert len(events) > 1, "the text comes in pieces"
    assert all(
        "usageMetadata" not in e and "finishReason" not in e["candidates"][0] for e in events[:-1]
    )
    assert events[-1]["candidates"][0]["finishReason"] == "STOP"
    assert "usageMetadata" in events[-1]
    assert [r.step for r in server.requests] == [0, 1, 2, 3, 4]


def test_generate_content_whole_answer(server: ModelServer) -> None:
    """``:generateContent`` answers in one JSON object, with usage."""
    answer = json.loads(post(server, GENERATE, body([user(CONTEXT + "Do MARK-GEM.")])))
    assert parts(answer)[0]["functionCall"]["name"] == "read_file"
    assert answer["usageMetadata"]["candidatesTokenCount"] == 20
    assert not server.requests[0].stream


def test_request_without_tools_gets_plain_text(server: ModelServer) -> None:
    """A side request (no tools: a title, a check) gets the plain text."""
    answer = json.loads(post(server, GENERATE, body([user("MARK-GEM")], tools=False)))
    assert parts(answer) == [{"text": "OK"}]
    assert answer["candidates"][0]["finishReason"] == "STOP"
    assert server.requests[0].action is None


def test_count_tokens(server: ModelServer) -> None:
    """``:countTokens`` estimates the contents' tokens."""
    answer = json.loads(
        post(server, "/v1beta/models/gemini-2.5-flash:countTokens", body([user("x" * 400)]))
    )
    assert answer["totalTokens"] >= 100
    assert server.requests == []


def test_stall_streams_text_then_holds(server: ModelServer) -> None:
    """A stalled Gemini stream sends its text and holds until the client goes away."""
    conn = http.client.HTTPConnection(LOCALHOST, int(server.url.rsplit(":", 1)[1]), timeout=10)
    conn.request("POST", STREAM, json.dumps(body([user("MARK-STALL")])))
    response = conn.getresponse()
    assert response.status == 200
    assert server.wait_stalled(10)
    assert response.fp.readline().strip()  # the chunk-size line of the first event
    conn.close()
    assert server.wait_stalls_ended(1, timeout=10)
    assert server.stalls_ended == ["client closed"]
