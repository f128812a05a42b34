"""Tests of the wire transcript writer."""

from __future__ import annotations

from pathlib import Path

import orjson

from orchestrator.agent.transcript import TranscriptWriter


def test_frames_are_written_with_direction_time_and_message(tmp_path: Path) -> None:
    """Each frame becomes one line: dir, t (non-decreasing), msg; a frame not JSON is raw."""
    path = tmp_path / "wire.ndjson"
    writer = TranscriptWriter(path, agent="a1")
    writer("send", b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}')
    writer("recv", b'{"jsonrpc":"2.0","id":0,"result":{}}')
    writer("recv", b"{not json", False)  # the connection found it is not JSON
    writer.close()
    lines = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    assert [line["dir"] for line in lines] == ["send", "recv", "recv"]
    assert lines[0]["msg"]["method"] == "initialize"
    assert lines[1]["msg"] == {"jsonrpc": "2.0", "id": 0, "result": {}}
    assert lines[2]["raw"] == "{not json"
    assert all(line["agent"] == "a1" for line in lines)
    times = [line["t"] for line in lines]
    assert times == sorted(times)
    assert writer.frames == 3


def test_a_received_batch_is_written_frame_by_frame(tmp_path: Path) -> None:
    """recv_batch writes one line per frame with the batch's time; a bad frame stays raw."""
    path = tmp_path / "wire.ndjson"
    writer = TranscriptWriter(path, agent="a1")
    writer.recv_batch([b'{"n":1}', b'{"n":2}'], [True, True])
    writer.recv_batch([b'{"n":3}', b"{broken"], [True, False])
    writer.close()
    lines = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    assert [line.get("msg") for line in lines] == [{"n": 1}, {"n": 2}, {"n": 3}, None]
    assert lines[3]["raw"] == "{broken"
    assert {line["dir"] for line in lines} == {"recv"}
    assert lines[0]["t"] == lines[1]["t"]
    assert writer.frames == 4
