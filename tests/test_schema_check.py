"""Tests of the frame validator (tests/schema_check.py) that checks what our client sends."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from schema_check import FrameValidator, validate_transcript

SID = "sess-1"
ALL_BLOCKS: list[dict[str, Any]] = [
    {"type": "text", "text": "hello"},
    {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"},
    {"type": "audio", "data": "UklGRg==", "mimeType": "audio/wav"},
    {"type": "resource_link", "name": "x", "uri": "file:///x"},
    {"type": "resource", "resource": {"uri": "file:///y", "text": "why", "mimeType": "text/plain"}},
    {"type": "resource", "resource": {"uri": "file:///z", "blob": "AAAA"}},
]


def request(msg_id: Any, method: str, params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params}


def notification(method: str, params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": method, "params": params}


def result(msg_id: Any, value: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": msg_id, "result": value}


def error(msg_id: Any, code: int = -32601, message: str = "Method not found") -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": msg_id, "error": {"code": code, "message": message}}


CLIENT_FRAMES: list[dict[str, Any]] = [
    request(
        0,
        "initialize",
        {
            "protocolVersion": 1,
            "clientCapabilities": {"fs": {"readTextFile": True, "writeTextFile": True}},
            "clientInfo": {"name": "orchestrator", "version": "0.1.0"},
        },
    ),
    request(1, "authenticate", {"methodId": "sdk-login"}),
    request(2, "session/new", {"cwd": "/work", "mcpServers": []}),
    request("3", "session/load", {"sessionId": SID, "cwd": "/work", "mcpServers": []}),
    request(4, "session/set_mode", {"sessionId": SID, "modeId": "code"}),
    request(
        5, "session/set_config_option", {"sessionId": SID, "configId": "model", "value": "big"}
    ),
    request(6, "session/prompt", {"sessionId": SID, "prompt": ALL_BLOCKS}),
    notification("session/cancel", {"sessionId": SID}),
    notification("$/cancel_request", {"requestId": 6}),
]


def test_valid_client_requests_and_notifications_pass() -> None:
    """Every kind of request and notification a client sends validates and is counted."""
    validator = FrameValidator()
    for frame in CLIENT_FRAMES:
        validator.feed("send", frame)
    assert validator.validated == len(CLIENT_FRAMES)


def test_frames_as_bytes_and_str_are_parsed() -> None:
    """A frame given as an ND-JSON line (bytes with newline, or str) is parsed, then checked."""
    validator = FrameValidator()
    validator.feed("send", json.dumps(CLIENT_FRAMES[0]).encode() + b"\n")
    validator.feed("send", json.dumps(CLIENT_FRAMES[2]))
    assert validator.validated == 2


def test_session_new_without_mcp_servers_fails() -> None:
    """session/new without the required mcpServers names the method, the path and the field."""
    frame = request(2, "session/new", {"cwd": "/work"})
    with pytest.raises(AssertionError) as info:
        FrameValidator().feed("send", frame)
    text = str(info.value)
    assert "'session/new'" in text
    assert "at $.params:" in text
    assert "'mcpServers' is a required property" in text
    assert '"cwd":"/work"' in text  # the offending frame is shown


def test_write_text_file_answered_null_fails() -> None:
    """Answering fs/write_text_file with null instead of {} is a violation."""
    validator = FrameValidator()
    validator.feed("recv", request(0, "fs/write_text_file", {"sessionId": SID, "path": "/a"}))
    with pytest.raises(AssertionError, match=r"'fs/write_text_file'.* at \$\.result: None is not"):
        validator.feed("send", result(0, None))


def test_write_text_file_answered_empty_object_passes() -> None:
    """Answering fs/write_text_file with {} is right."""
    validator = FrameValidator()
    validator.feed("recv", request(0, "fs/write_text_file", {"sessionId": SID, "path": "/a"}))
    validator.feed("send", result(0, {}))
    assert validator.validated == 1


def test_agent_request_results_are_checked_against_their_method() -> None:
    """Results of our answers to agent requests validate against that method's response def."""
    validator = FrameValidator()
    answers = {
        "fs/read_text_file": {"content": "text"},
        "session/request_permission": {"outcome": {"outcome": "selected", "optionId": "allow"}},
        "terminal/create": {"terminalId": "t1"},
        "terminal/output": {"output": "hi", "truncated": False},
        "terminal/wait_for_exit": {"exitCode": None, "signal": "SIGKILL"},
        "terminal/kill": {},
        "terminal/release": {},
    }
    for number, (method, answer) in enumerate(answers.items()):
        validator.feed("recv", request(f"agent-{number}", method, {"sessionId": SID}))
        validator.feed("send", result(f"agent-{number}", answer))
    assert validator.validated == len(answers)
    assert validator.pending_agent_requests == {}


def test_response_with_bool_id_fails() -> None:
    """A response whose id is a boolean is rejected even if 1 is pending (True == 1 in Python)."""
    validator = FrameValidator()
    validator.feed("recv", request(1, "fs/read_text_file", {"sessionId": SID, "path": "/a"}))
    with pytest.raises(
        AssertionError, match=r"at \$\.id: response id must be an integer or string"
    ):
        validator.feed("send", result(True, {"content": ""}))


@pytest.mark.parametrize("bad_id", [True, None, 1.5, [1], {"a": 1}])
def test_request_with_bad_id_fails(bad_id: Any) -> None:
    """Request ids must be integers or strings: not booleans, null, floats or containers."""
    with pytest.raises(AssertionError, match=r"at \$\.id: request id must be an integer or string"):
        FrameValidator().feed(
            "send", request(bad_id, "session/new", {"cwd": "/", "mcpServers": []})
        )


def test_error_response_with_null_id_passes() -> None:
    """An error answer with id null (for a line that could not be parsed) is allowed."""
    validator = FrameValidator()
    validator.feed("send", error(None, -32700, "Parse error"))
    assert validator.validated == 1


def test_result_response_with_null_id_fails() -> None:
    """A successful response cannot have id null."""
    with pytest.raises(AssertionError, match="response id must be an integer or string: None"):
        FrameValidator().feed("send", result(None, {}))


def test_error_object_is_checked() -> None:
    """Error responses validate against the Error def (integer code, string message)."""
    validator = FrameValidator()
    validator.feed("recv", request(3, "terminal/create", {"sessionId": SID, "command": "ls"}))
    bad = {"jsonrpc": "2.0", "id": 3, "error": {"code": "oops", "message": "x"}}
    with pytest.raises(AssertionError, match=r"at \$\.error\.code: .*not of type 'integer'"):
        validator.feed("send", bad)


def test_response_to_an_id_the_agent_never_sent_fails() -> None:
    """Answering an id that is not a pending agent request (or answering twice) fails."""
    validator = FrameValidator()
    with pytest.raises(AssertionError, match=r"answers no pending agent request \(id 7\)"):
        validator.feed("send", result(7, {}))
    validator.feed("recv", request(7, "fs/write_text_file", {"sessionId": SID}))
    validator.feed("send", result(7, {}))
    with pytest.raises(AssertionError, match="answers no pending agent request"):
        validator.feed("send", result(7, {}))


def test_ids_are_matched_by_type() -> None:
    """Agent request "1" (a string) is not answered by a response with id 1 (an integer)."""
    validator = FrameValidator()
    validator.feed("recv", request("1", "fs/write_text_file", {"sessionId": SID}))
    with pytest.raises(AssertionError, match="answers no pending agent request"):
        validator.feed("send", result(1, {}))
    validator.feed("send", result("1", {}))


def test_reusing_a_pending_request_id_fails() -> None:
    """Our request ids must not repeat while pending; after the agent answers, reuse is fine."""
    validator = FrameValidator()
    frame = request(6, "session/prompt", {"sessionId": SID, "prompt": []})
    validator.feed("send", frame)
    with pytest.raises(AssertionError, match=r"id 6 is still pending \(session/prompt\)"):
        validator.feed("send", frame)
    validator.feed("recv", result(6, {"stopReason": "end_turn"}))
    validator.feed("send", frame)


def test_undeclared_agent_request_must_be_answered_with_an_error() -> None:
    """An agent request the schema does not know gets an error; a result is a violation."""
    validator = FrameValidator()
    validator.feed("recv", request("q", "craft/drainMidTurnQueue", {}))
    with pytest.raises(AssertionError, match="undeclared agent request must be an error"):
        validator.feed("send", result("q", {}))
    validator.feed("recv", request("q", "craft/drainMidTurnQueue", {}))
    validator.feed("send", error("q"))


def test_extension_methods_are_checked_for_the_envelope_only() -> None:
    """Methods starting with '_' are free-form, in both directions, but the envelope is checked."""
    validator = FrameValidator()
    validator.feed("send", request(1, "_orchestrator/ping", {"anything": [1, 2]}))
    validator.feed("send", notification("_orchestrator/note", {}))
    validator.feed("recv", request(9, "_agent/ext", {}))
    validator.feed("send", result(9, {"free": "form"}))
    with pytest.raises(AssertionError, match=r'must be "2\.0"'):
        validator.feed("send", {"jsonrpc": "1.0", "method": "_x", "params": {}})


def test_extra_methods_are_allowed_without_schema() -> None:
    """Methods listed in extra_methods (e.g. unstable ones) pass with a valid envelope."""
    validator = FrameValidator(extra_methods={"session/fork"})
    validator.feed("send", request(1, "session/fork", {"sessionId": SID}))
    with pytest.raises(AssertionError, match="unknown request method 'session/fork'"):
        FrameValidator().feed("send", request(1, "session/fork", {"sessionId": SID}))


@pytest.mark.parametrize(
    ("frame", "problem"),
    [
        (request(1, "session/set_model", {"sessionId": SID}), "unknown request method"),
        (notification("session/update", {"sessionId": SID}), "agent->client method"),
        (request(1, "fs/read_text_file", {"sessionId": SID}), "agent->client method"),
        (notification("session/cancelled", {"sessionId": SID}), "unknown notification method"),
        (notification("elicitation/complete", {"elicitationId": "e"}), "agent->client method"),
    ],
)
def test_methods_a_client_must_not_send_fail(frame: dict[str, Any], problem: str) -> None:
    """Unknown methods and agent->client methods are not for our client to send."""
    with pytest.raises(AssertionError, match=problem):
        FrameValidator().feed("send", frame)


@pytest.mark.parametrize(
    ("frame", "problem"),
    [
        ({"id": 1, "method": "initialize", "params": {"protocolVersion": 1}}, 'must be "2.0"'),
        ({"jsonrpc": "2.0", "id": 1, "result": {}, "error": {}}, "exactly one of result and error"),
        ({"jsonrpc": "2.0", "id": 1}, "exactly one of result and error"),
        ({"jsonrpc": "2.0", "params": {}}, "neither a request, a notification nor a response"),
        ({**notification("session/cancel", {"sessionId": SID}), "extra": 1}, "unexpected member"),
        (notification("session/cancel", [SID]), "params must be an object"),
        ({"jsonrpc": "2.0", "id": 1, "method": "initialize"}, "params is missing"),
        ({"jsonrpc": "2.0", "id": 1, "method": 5, "params": {}}, "must be a string"),
        (b'{"jsonrpc": "2.0",\n"method": "_x"}\n', "one line"),
        (b"{not json}\n", "not valid UTF-8 JSON"),
        (b'{"jsonrpc": "2.0", "method": "_\xff"}', "not valid UTF-8 JSON"),
        (b"[]\n", "got a batch"),
    ],
)
def test_envelope_violations_fail(frame: Any, problem: str) -> None:
    """Broken JSON-RPC envelopes are caught before any schema lookup."""
    with pytest.raises(AssertionError, match=re.escape(problem)):
        FrameValidator().feed("send", frame)


def test_tagged_union_failure_points_into_the_matching_variant() -> None:
    """A bad field in one variant of a tagged union is reported at that field, not the union."""
    blocks = [{"type": "text", "text": "x"}, {"type": "image", "data": "AA==", "mimeType": 3}]
    frame = request(1, "session/prompt", {"sessionId": SID, "prompt": blocks})
    with pytest.raises(AssertionError, match=r"at \$\.params\.prompt\[1\]\.mimeType: 3 is not"):
        FrameValidator().feed("send", frame)


def test_unknown_tag_lists_the_known_tags() -> None:
    """An unknown tag value is reported with the values the union accepts."""
    validator = FrameValidator()
    validator.feed("recv", request(0, "session/request_permission", {"sessionId": SID}))
    answer = result(0, {"outcome": {"outcome": "allow", "optionId": "a"}})
    expected = r"at \$\.result\.outcome: outcome 'allow' is none of 'cancelled', 'selected'"
    with pytest.raises(AssertionError, match=expected):
        validator.feed("send", answer)


def test_selected_outcome_without_option_id_names_the_field() -> None:
    """A 'selected' permission outcome without optionId says optionId is missing."""
    validator = FrameValidator()
    validator.feed("recv", request(0, "session/request_permission", {"sessionId": SID}))
    with pytest.raises(AssertionError, match="'optionId' is a required property"):
        validator.feed("send", result(0, {"outcome": {"outcome": "selected"}}))


def test_long_frames_are_truncated_in_the_message() -> None:
    """The frame shown in a failure message is cut to a readable length."""
    frame = request(1, "session/new", {"cwd": "/" + "x" * 5000})
    with pytest.raises(AssertionError) as info:
        FrameValidator().feed("send", frame)
    assert len(str(info.value)) < 1000
    assert "chars)" in str(info.value)


def test_received_junk_is_ignored() -> None:
    """Malformed frames from the agent are not judged (the agent is not under test)."""
    validator = FrameValidator()
    junk: list[bytes | dict[str, Any]] = [b"not json\n", b"[1, 2]\n"]
    junk.append({"jsonrpc": "2.0", "id": True, "method": "x"})
    for frame in junk:
        validator.feed("recv", frame)
    assert validator.validated == 0
    assert validator.pending_agent_requests == {}


def test_received_frames_are_read_as_the_client_reads_them() -> None:
    """An agent request with a lone surrogate escape (which orjson refuses, the client reads)
    is remembered, so the client's answer to it is not taken for an unsolicited response."""
    validator = FrameValidator()
    frame = b'{"jsonrpc":"2.0","id":9,"method":"fs/read_text_file","params":{"path":"\\ud800"}}\n'
    validator.feed("recv", frame)
    assert validator.pending_agent_requests == {9: "fs/read_text_file"}
    validator.feed("send", {"jsonrpc": "2.0", "id": 9, "error": {"code": -32602, "message": "x"}})
    assert validator.pending_agent_requests == {}


def test_bad_direction_is_a_value_error() -> None:
    """Only 'send' and 'recv' are directions."""
    with pytest.raises(ValueError, match="direction must be"):
        FrameValidator().feed("out", {})  # type: ignore[arg-type]


def test_assert_all_answered_reports_pending_agent_requests() -> None:
    """assert_all_answered names agent requests that never got an answer."""
    validator = FrameValidator()
    validator.feed("recv", request(4, "session/request_permission", {"sessionId": SID}))
    with pytest.raises(AssertionError, match=r"session/request_permission \(id 4\)"):
        validator.assert_all_answered()
    validator.feed("send", result(4, {"outcome": {"outcome": "cancelled"}}))
    validator.assert_all_answered()


def write_transcript(path: Path, entries: list[tuple[str, Any]]) -> Path:
    lines = [json.dumps({"dir": d, "t": i * 0.01, "msg": m}) for i, (d, m) in enumerate(entries)]
    path.write_text("\n".join(lines) + "\n\n", "utf-8")
    return path


def test_validate_transcript_checks_every_sent_frame(tmp_path: Path) -> None:
    """A clean transcript passes and the returned validator counts the sent frames."""
    entries: list[tuple[str, Any]] = [("send", frame) for frame in CLIENT_FRAMES[:3]]
    entries += [
        ("recv", result(0, {"protocolVersion": 1})),
        ("recv", request(0, "fs/write_text_file", {"sessionId": SID, "path": "/a"})),
        ("send", result(0, {})),
    ]
    validator = validate_transcript(write_transcript(tmp_path / "t.ndjson", entries))
    assert validator.validated == 4


def test_validate_transcript_names_the_failing_line(tmp_path: Path) -> None:
    """A violation in a transcript names the file and line number."""
    entries: list[tuple[str, Any]] = [
        ("recv", request(0, "fs/write_text_file", {"sessionId": SID, "path": "/a"})),
        ("send", result(0, None)),
    ]
    path = write_transcript(tmp_path / "t.ndjson", entries)
    with pytest.raises(AssertionError, match=r"t\.ndjson:2: ACP schema violation"):
        validate_transcript(path)


def test_validate_transcript_rejects_malformed_entries(tmp_path: Path) -> None:
    """A line that is not a transcript entry is reported with its line number."""
    path = tmp_path / "t.ndjson"
    path.write_text('{"dir": "send", "t": 0}\n', "utf-8")
    with pytest.raises(AssertionError, match=r"t\.ndjson:1: not a transcript entry"):
        validate_transcript(path)
