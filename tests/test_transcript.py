"""Tests of the wire transcript writer."""

from __future__ import annotations

import errno
from pathlib import Path

import orjson
import trio
from log_capture import capture_logs

from orchestrator.agent.transcript import (
    FLUSH_AFTER,
    QUIET,
    TranscriptFile,
    TranscriptWriter,
    open_transcript_file,
)


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
    """Past max_turn_bytes a turn's updates are dropped but the session/prompt answer is kept,
    a ``cut`` line counts them where the turn's part ends, and the next session/prompt starts a
    new part with a fresh count."""
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
    assert sum(len(line) + 1 for line in data.splitlines()[: len(kept) - 1]) <= 1000
    assert kept[0]["msg"]["method"] == "session/prompt"
    assert [e["msg"]["params"]["n"] for e in kept[1:-1]] == list(range(len(kept) - 2))
    assert kept[-1]["msg"]["result"] == {"stopReason": "end_turn"}  # kept past the cut
    cut = first[-1]
    assert cut["frames"] == 20 - (len(kept) - 2)  # the chunks that did not fit
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


# --------------------------------------------------------------------------- written as they come
# Under trio's MockClock (autojump): virtual time moves only when every task waits, so the
# times below are exact.

LINE = b'{"dir":"recv","t":0.0,"msg":{}}\n'


async def test_a_line_is_written_once_the_frames_pause(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    """A lone line waits in the buffer only until ``quiet`` seconds pass without another."""
    path = tmp_path / "wire.ndjson"
    async with open_transcript_file(path) as out:
        out.write(LINE)
        await trio.sleep(QUIET * 0.9)
        assert not path.exists() or path.read_bytes() == b""
        await trio.sleep(QUIET * 0.2)
        assert path.read_bytes() == LINE
        assert out.writes == 1


async def test_a_steady_stream_is_written_within_the_flush_bound(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    """Lines closer together than ``quiet`` are written in one batch ``flush_after`` seconds
    after the first of them, then again ``flush_after`` later: no write per line."""
    path = tmp_path / "wire.ndjson"
    async with open_transcript_file(path) as out:
        start = trio.current_time()
        sizes: list[tuple[float, int]] = []
        for _ in range(50):  # one line every QUIET/2 for 0.25 s
            out.write(LINE)
            await trio.sleep(QUIET / 2)
            if path.exists() and (not sizes or sizes[-1][1] != path.stat().st_size):
                sizes.append((trio.current_time() - start, path.stat().st_size))
        await trio.sleep(QUIET * 2)  # the stream ends: the rest follows after a pause
        total = path.stat().st_size
    assert total == 50 * len(LINE)
    assert [round(t, 3) for t, _ in sizes] == [FLUSH_AFTER, 2 * FLUSH_AFTER]
    assert [n for _, n in sizes] == [20 * len(LINE), 40 * len(LINE)]
    assert out.writes == 3


async def test_a_flood_is_written_a_full_buffer_at_a_time(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    """Lines coming faster than any timer are written whenever the buffer passes its size,
    one write per full buffer; the task writes the rest."""
    path = tmp_path / "wire.ndjson"
    out = TranscriptFile(path, max_buffer=10 * len(LINE))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(out.run)
        for _ in range(95):
            out.write(LINE)
        assert out.writes == 9
        assert path.stat().st_size == 90 * len(LINE)
        await trio.sleep(QUIET * 1.1)
        assert path.stat().st_size == 95 * len(LINE)
        nursery.cancel_scope.cancel()
    out.close()
    assert out.writes == 10


async def test_cancelling_the_task_writes_what_it_holds(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    """A cancelled writing task (its producer's nursery ends) writes its buffer at once."""
    path = tmp_path / "wire.ndjson"
    out = TranscriptFile(path)
    with trio.move_on_after(QUIET / 2):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(out.run)
            out.write(LINE)
            out.write(LINE)
            await trio.sleep_forever()
    assert trio.current_time() < QUIET  # nothing timed out: the cancel wrote them
    assert path.read_bytes() == 2 * LINE
    out.close()


async def test_a_shared_file_is_written_on_time_while_its_block_ends_after_a_cancel(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    """Cancelled (Ctrl-C) while shielded work goes on: its lines still reach the file on time."""
    path = tmp_path / "wire.ndjson"
    with trio.CancelScope() as outer:
        async with open_transcript_file(path) as out:
            outer.cancel()
            with trio.CancelScope(shield=True):  # as turns end the ACP way after a cancel
                await trio.sleep(QUIET)
                out.write(LINE)
                await trio.sleep(QUIET * 2)
                assert path.read_bytes() == LINE


async def test_a_writer_of_a_connection_writes_as_frames_pass(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    """TranscriptWriter.run writes frames while they pass, to its file and to the shared one."""
    path, shared = tmp_path / "a.ndjson", tmp_path / "all.ndjson"
    async with open_transcript_file(shared, append=True) as copy, trio.open_nursery() as nursery:
        writer = TranscriptWriter(path, agent="a1", copy_to=copy)
        nursery.start_soon(writer.run)
        writer("send", b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}')
        await trio.sleep(QUIET * 2)
        lines = [orjson.loads(line) for line in path.read_bytes().splitlines()]
        assert [e["msg"]["method"] for e in lines] == ["initialize"]
        assert shared.read_bytes() == path.read_bytes()
        nursery.cancel_scope.cancel()
    writer.close()


async def test_a_file_that_cannot_be_written_is_reported_once(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    """A full disk: one warning, the writer's caller goes on, what follows is left out."""
    full = Path("/dev/full")  # every write fails with ENOSPC
    with capture_logs() as logs:
        async with open_transcript_file(full, append=True) as out:
            for _ in range(3):
                out.write(LINE)
                await trio.sleep(QUIET * 2)
            out.write(LINE)
    assert out.error is not None and out.error.errno == errno.ENOSPC
    assert out.writes == 1
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert [e["event"] for e in warnings] == [
        "cannot write the transcript; the rest of it is left out"
    ]
    assert warnings[0]["path"] == "/dev/full"


def test_transcript_buffer_allocated_at_first_line_and_let_go_at_close(tmp_path: Path) -> None:
    """No buffer before a line, one while lines come, none after close; what was written
    is in the file."""
    path = tmp_path / "t.ndjson"
    out = TranscriptFile(path, max_buffer=4096)
    assert len(out._buffer) == 0
    out.write(b'{"a":1}\n')
    assert len(out._buffer) == 4096
    out.close()
    assert len(out._buffer) == 0
    assert path.read_bytes() == b'{"a":1}\n'
