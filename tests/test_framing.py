"""Tests of orchestrator.jsonrpc.framing: line splitting and frame encoding."""

from __future__ import annotations

import itertools
import time
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.errors import ParseError
from orchestrator.jsonrpc.framing import (
    DEFAULT_MAX_MESSAGE_SIZE,
    LineSplitter,
    OversizedLine,
    decode_message,
    encode_message,
    scrubbed_keys,
)


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


def feed_all(splitter: LineSplitter, chunks: list[bytes]) -> list[bytes | OversizedLine]:
    out: list[bytes | OversizedLine] = []
    for chunk in chunks:
        out.extend(splitter.feed(chunk))
    tail = splitter.eof()
    if tail is not None:
        out.append(tail)
    return out


def test_complete_lines_in_one_chunk() -> None:
    """Every complete line in a chunk comes out, in order, without its newline."""
    splitter = LineSplitter()
    assert splitter.feed(b'{"a":1}\n{"b":2}\n') == [b'{"a":1}', b'{"b":2}']
    assert splitter.eof() is None


def test_partial_line_waits_for_its_newline() -> None:
    """A line is emitted only once its newline arrives."""
    splitter = LineSplitter()
    assert splitter.feed(b'{"a":') == []
    assert splitter.feed(b"1}") == []
    assert splitter.feed(b"\n{") == [b'{"a":1}']
    assert splitter.feed(b"}\n") == [b"{}"]


def test_byte_by_byte_feeding() -> None:
    """Chunk boundaries anywhere, even one byte at a time, give the same lines."""
    data = b'{"x": "one"}\r\n\n{"y": 2}\n  \n{"z": []}'
    chunks = [data[i : i + 1] for i in range(len(data))]
    assert feed_all(LineSplitter(), chunks) == [b'{"x": "one"}', b'{"y": 2}', b'{"z": []}']


def test_crlf_line_endings() -> None:
    """A carriage return before the newline is removed, also across chunks."""
    splitter = LineSplitter()
    assert splitter.feed(b"a\r\nb\r") == [b"a"]
    assert splitter.feed(b"\nc\r\n") == [b"b", b"c"]


def test_blank_and_whitespace_lines_are_skipped() -> None:
    """Empty lines and lines of only whitespace produce nothing."""
    splitter = LineSplitter()
    assert splitter.feed(b"\n\n \t\n\r\na\n\n") == [b"a"]
    assert splitter.feed(b"   ") == []
    assert splitter.eof() is None


def test_bytearray_input_gives_bytes() -> None:
    """Chunks may be bytearrays (trio memory streams); lines are always bytes."""
    lines = LineSplitter().feed(bytearray(b"a\nb\n"))
    assert lines == [b"a", b"b"]
    assert all(type(line) is bytes for line in lines)


def test_ten_megabyte_line_in_small_chunks() -> None:
    """A 10 MB line arriving in 4 KiB chunks comes out whole, in linear time."""
    payload = b'{"data":"' + b"x" * (10 * 2**20) + b'"}'
    data = payload + b"\nnext\n"
    splitter = LineSplitter()
    out: list[bytes | OversizedLine] = []
    start = time.perf_counter()
    for i in range(0, len(data), 4096):
        out.extend(splitter.feed(data[i : i + 4096]))
    elapsed = time.perf_counter() - start
    assert out == [payload, b"next"]
    assert elapsed < 5  # quadratic re-joining would copy terabytes


def test_line_at_the_limit_is_accepted() -> None:
    """A line of exactly max_message_size bytes is kept."""
    splitter = LineSplitter(max_message_size=10)
    assert splitter.feed(b"0123456789\n") == [b"0123456789"]
    assert splitter.feed(b"01234") == []
    assert splitter.feed(b"56789\n") == [b"0123456789"]


def test_oversized_line_in_one_chunk() -> None:
    """A complete line over the limit becomes an OversizedLine; the lines around it survive."""
    splitter = LineSplitter(max_message_size=10)
    assert splitter.feed(b"ok\n" + b"y" * 50 + b"\nfine\n") == [
        b"ok",
        OversizedLine(50),
        b"fine",
    ]


def test_oversized_line_across_chunks_then_normal_lines() -> None:
    """A long line is discarded as it arrives, reported once, and the stream goes on."""
    splitter = LineSplitter(max_message_size=100)
    out = []
    out += splitter.feed(b"start\n" + b"z" * 60)
    out += splitter.feed(b"z" * 60)  # passes the limit here: buffer dropped
    assert splitter._pieces == []
    out += splitter.feed(b"z" * 1000)
    out += splitter.feed(b"z" * 30 + b'\n{"after":1}\n')
    assert out == [b"start", OversizedLine(1150), b'{"after":1}']


def test_oversized_first_line_joining_the_buffer() -> None:
    """A buffered start plus the rest of its line over the limit is reported with its size."""
    splitter = LineSplitter(max_message_size=10)
    assert splitter.feed(b"12345678") == []
    assert splitter.feed(b"90abc\nx\n") == [OversizedLine(13), b"x"]


def test_big_chunk_with_small_limit() -> None:
    """A chunk larger than the limit still checks every line in it."""
    splitter = LineSplitter(max_message_size=5)
    assert splitter.feed(b"a\nbbbbbbbbbb\nc\nddddddd") == [b"a", OversizedLine(10), b"c"]
    assert splitter.eof() == OversizedLine(7)


def test_eof_returns_unterminated_line() -> None:
    """At EOF a last line without a newline is returned, then the splitter is empty."""
    splitter = LineSplitter()
    splitter.feed(b'{"a":1}\n{"b":')
    splitter.feed(b"2}\r")
    assert splitter.eof() == b'{"b":2}'
    assert splitter.eof() is None


def test_eof_while_discarding() -> None:
    """EOF in the middle of an oversized line reports it."""
    splitter = LineSplitter(max_message_size=4)
    assert splitter.feed(b"abcdefgh") == []
    assert splitter.eof() == OversizedLine(8)
    assert splitter.eof() is None


def test_default_limit() -> None:
    """The default limit is 64 MiB."""
    assert LineSplitter().max_message_size == DEFAULT_MAX_MESSAGE_SIZE == 64 * 2**20


_line = st.binary(min_size=1, max_size=40).filter(
    lambda b: b"\n" not in b and not b.endswith(b"\r") and not b.isspace()
)


@given(
    lines=st.lists(_line, max_size=20),
    crlf=st.booleans(),
    final_newline=st.booleans(),
    cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=30),
)
def test_any_split_yields_the_same_lines(
    lines: list[bytes], crlf: bool, final_newline: bool, cuts: list[int]
) -> None:
    """However the stream is cut into chunks, the same lines come out."""
    sep = b"\r\n" if crlf else b"\n"
    data = sep.join(lines) + (sep if final_newline and lines else b"")
    chunks = split_at(data, cuts)
    assert feed_all(LineSplitter(), chunks) == lines


@given(
    lines=st.lists(st.binary(max_size=30).filter(lambda b: b"\n" not in b), max_size=15),
    cuts=st.lists(st.integers(min_value=0, max_value=1000), max_size=20),
    limit=st.integers(min_value=1, max_value=20),
)
def test_any_split_with_limit_reports_the_same_oversized_lines(
    lines: list[bytes], cuts: list[int], limit: int
) -> None:
    """Oversized lines are reported with their size wherever the chunks are cut."""
    data = b"".join(line + b"\n" for line in lines)
    chunks = split_at(data, cuts)
    expected: list[bytes | OversizedLine] = []
    for line in lines:
        if len(line) > limit:
            expected.append(OversizedLine(len(line)))
        else:
            stripped = line.removesuffix(b"\r")
            if stripped and not stripped.isspace():
                expected.append(stripped)
    assert feed_all(LineSplitter(max_message_size=limit), chunks) == expected


def test_encode_message_is_compact_with_newline() -> None:
    """A frame is compact UTF-8 JSON ending in one newline."""
    frame = encode_message({"jsonrpc": "2.0", "method": "m", "params": {"t": "é"}})
    assert frame == '{"jsonrpc":"2.0","method":"m","params":{"t":"é"}}\n'.encode()


def test_encode_message_rejects_non_json() -> None:
    """A value that is not JSON-able raises TypeError."""
    with pytest.raises(TypeError):
        encode_message({"x": object()})


def test_decode_message_round_trip() -> None:
    """decode_message reads what encode_message wrote."""
    value = {"id": 3, "list": [1, 2.5, None, True], "s": "ü"}
    assert decode_message(encode_message(value).rstrip(b"\n")) == value


@pytest.mark.parametrize(
    "line",
    [b'{"a":', b"not json", b'{"a": NaN}', b"\xff\xfe{}", b'{"s": "\xc3"}', b"[1,]"],
)
def test_decode_message_bad_input_raises_parse_error(line: bytes) -> None:
    """Bad JSON and bad UTF-8 raise ParseError (code -32700)."""
    with pytest.raises(ParseError) as info:
        decode_message(line)
    assert info.value.code == -32700


def test_decode_message_tolerates_lone_surrogates() -> None:
    """A lone surrogate escape (cut by a JavaScript peer) becomes U+FFFD instead of failing."""
    value = decode_message(b'{"text": "ab\\ud83d", "pair": "\\ud83d\\ude00"}')
    assert value == {"text": "ab\ufffd", "pair": "\U0001f600"}
    encode_message(value)  # and it can be sent on again


def test_scrubbed_keys_name_the_strings_that_held_lone_surrogates() -> None:
    """The objects whose string values held lone surrogates name those keys; others none."""
    value = decode_message(
        b'{"params": {"path": "/w/\\ud800.txt", "n": 1}, "ok": "\\ud83d\\ude00"}'
    )
    assert value == {"params": {"path": "/w/\ufffd.txt", "n": 1}, "ok": "\U0001f600"}
    assert scrubbed_keys(value["params"]) == {"path"}
    assert scrubbed_keys(value) == frozenset()
    assert scrubbed_keys(decode_message(b'{"path": "/w/\xef\xbf\xbd.txt"}')) == frozenset()
    encode_message(value)


@pytest.mark.parametrize(
    ("line", "value"),
    [
        (b'["\\ud800", 18446744073709551615]', ["\ufffd", 2**64 - 1]),
        (b'["\\ud800", 18446744073709551616]', ["\ufffd", float(2**64)]),
        (b'["\\ud800", -9223372036854775809]', ["\ufffd", float(-(2**63) - 1)]),
        (b'["\\ud800", 1.5e3, -0]', ["\ufffd", 1500.0, 0]),
    ],
)
def test_the_slow_path_reads_numbers_as_orjson_does(line: bytes, value: list[Any]) -> None:
    """A line with a lone surrogate reads its numbers as orjson would: an integer outside 64 bits
    is a float, so the value can be written again (a huge int once crashed the run's record)."""
    assert orjson.loads(line.replace(b"\\ud800", b"x"))[1:] == value[1:]
    decoded = decode_message(line)
    assert decoded == value
    assert [type(v) for v in decoded] == [type(v) for v in value]
    encode_message(decoded)


@pytest.mark.parametrize("number", [b"1e400", b"-1e400", b"1" + b"0" * 400])
def test_the_slow_path_refuses_numbers_orjson_refuses(number: bytes) -> None:
    """A number that overflows a double is a ParseError on either path, never infinity."""
    with pytest.raises(ParseError):
        decode_message(b"[" + number + b"]")
    with pytest.raises(ParseError):
        decode_message(b'["\\ud800", ' + number + b"]")


def test_decode_message_tolerates_bom() -> None:
    """A UTF-8 byte order mark before the JSON is ignored."""
    assert decode_message(b"\xef\xbb\xbf{}") == {}
