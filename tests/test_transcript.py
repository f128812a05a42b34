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


PROMPT = b'{"jsonrpc":"2.0","id":%d,"method":"session/prompt","params":{"sessionId":"s"}}'
CHUNK = b'{"jsonrpc":"2.0","method":"session/update","params":{"n":%d}}'


def test_a_turn_keeps_the_head_of_its_transcript_and_says_what_it_left_out(
    tmp_path: Path,
) -> None:
    """Past max_turn_bytes a turn's frames are dropped, a ``cut`` line counts them where the
    turn's part ends, and the next session/prompt starts a new part with a fresh count."""
    path = tmp_path / "wire.ndjson"
    writer = TranscriptWriter(path, agent="a1", max_turn_bytes=1000)
    writer("send", PROMPT % 1)
    writer.recv_batch([CHUNK % n for n in range(20)], [True] * 20)  # about 120 bytes a line
    writer("recv", b'{"jsonrpc":"2.0","id":1,"result":{"stopReason":"end_turn"}}')
    writer("send", PROMPT % 2)
    writer.recv_batch([CHUNK % n for n in range(3)], [True] * 3)
    writer.close()
    data = path.read_bytes()
    lines = [orjson.loads(line) for line in data.splitlines()]
    first = lines[: lines.index(next(e for e in lines if e["dir"] == "cut")) + 1]
    kept = [e for e in first if e["dir"] != "cut"]
    assert sum(len(line) + 1 for line in data.splitlines()[: len(kept)]) <= 1000
    assert kept[0]["msg"]["method"] == "session/prompt"
    assert [e["msg"]["params"]["n"] for e in kept[1:]] == list(range(len(kept) - 1))
    cut = first[-1]
    assert cut["frames"] == 21 - (len(kept) - 1)  # the chunks that did not fit and the answer
    assert (cut["agent"], cut["limit"]) == ("a1", 1000)
    assert cut["bytes"] > 0
    second = lines[len(first) :]
    assert [e["dir"] for e in second] == ["send", "recv", "recv", "recv"]
    assert writer.frames == 26
    assert writer.dropped_frames == cut["frames"]


def test_without_a_turn_limit_every_frame_is_kept(tmp_path: Path) -> None:
    """No max_turn_bytes: nothing is dropped and no cut line is written."""
    path = tmp_path / "wire.ndjson"
    writer = TranscriptWriter(path)
    writer("send", PROMPT % 1)
    writer.recv_batch([CHUNK % n for n in range(500)], [True] * 500)
    writer.close()
    lines = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    assert len(lines) == 501
    assert writer.dropped_frames == 0
