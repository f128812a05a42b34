"""Tests of orchestrator._names: file names between bytes and text, in every form they take."""

from __future__ import annotations

import base64
import os
import subprocess
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator._names import (
    decode_text,
    display_name,
    git_quote,
    git_unquote,
    is_plain,
    name_bytes,
    name_column,
    name_from_column,
    name_from_json,
    name_json,
    name_of,
    one_line,
    parse_name,
)

#: any name as bytes, weighted towards the characters the codec treats specially
NAMES = st.lists(
    st.one_of(
        st.binary(min_size=1, max_size=4),
        st.sampled_from([b"\\", b"x", b"e9", b"\\x", b"\\\\", b"\xe9", b"\xc3\xa9", b"\xff", b'"']),
        st.text(max_size=3).map(str.encode),
    ),
    min_size=1,
    max_size=8,
).map(b"".join)

THOROUGH = settings(max_examples=1000, deadline=None)


@THOROUGH
@given(NAMES)
def test_the_display_reads_back_to_the_exact_bytes(raw: bytes) -> None:
    """Every name's display is valid text (JSON can hold it) that reads back to its exact bytes."""
    name = name_of(raw)
    shown = display_name(name)
    shown.encode("utf-8")  # no lone surrogate left
    assert orjson.loads(orjson.dumps(shown)) == shown
    assert name_bytes(parse_name(shown)) == raw
    assert display_name(raw) == shown


@THOROUGH
@given(NAMES, NAMES)
def test_different_names_never_display_alike(a: bytes, b: bytes) -> None:
    """The display is one-to-one: two names never share one."""
    if a != b:
        assert display_name(name_of(a)) != display_name(name_of(b))


@THOROUGH
@given(NAMES)
def test_json_objects_carry_the_exact_bytes_whenever_the_text_is_not_plain(raw: bytes) -> None:
    """``pathBytes`` is there exactly when ``path`` is not the name's own UTF-8 text."""
    name = name_of(raw)
    obj = orjson.loads(orjson.dumps(name_json(name)))
    assert name_bytes(name_from_json(obj)) == raw
    assert obj["path"] == display_name(name)
    if is_plain(name):
        assert obj == {"path": raw.decode("utf-8")}
    else:
        assert base64.b64decode(obj["pathBytes"]) == raw


@THOROUGH
@given(NAMES)
def test_git_quoting_round_trips_and_is_ascii(raw: bytes) -> None:
    """A name quoted as git quotes it in patches is ASCII and unquotes to the same bytes."""
    quoted = git_quote(name_of(raw))
    assert quoted.isascii()
    assert name_bytes(git_unquote(quoted)) == raw


@THOROUGH
@given(NAMES)
def test_the_run_store_keeps_names_exactly(raw: bytes) -> None:
    """A store column holds UTF-8 names as text, others as bytes, and gives back the same name."""
    column = name_column(name_of(raw))
    assert isinstance(column, bytes) != _is_utf8(raw)
    assert name_bytes(name_from_column(column)) == raw


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_a_latin1_name_and_its_escaped_lookalike_stay_apart() -> None:
    """The byte 0xe9 shows as ``\\xe9``; a name holding those four characters doubles its
    backslash, so each text names its own file."""
    latin1 = name_of(b"caf\xe9.txt")
    literal = "caf\\xe9.txt"
    assert display_name(latin1) == "caf\\xe9.txt"
    assert display_name(literal) == "caf\\\\xe9.txt"
    assert parse_name("caf\\xe9.txt") == latin1
    assert parse_name("caf\\\\xe9.txt") == literal
    assert name_json(latin1) == {"path": "caf\\xe9.txt", "pathBytes": "Y2Fm6S50eHQ="}
    assert name_json(literal) == {"path": "caf\\\\xe9.txt", "pathBytes": "Y2FmXHhlOS50eHQ="}


def test_plain_names_are_their_own_text() -> None:
    """UTF-8 names without an escape-like backslash display as they are, with no pathBytes."""
    for name in ("src/app.py", "café/naïve.md", "a\\b", "trailing\\", "\\x4"):
        assert display_name(name) == name
        assert parse_name(name) == name
        assert name_json(name) == {"path": name}


def test_escapes_name_only_bytes_that_are_not_utf8() -> None:
    """``\\xHH`` below 0x80 is text, never a byte (no way to smuggle ``/`` or NUL); escapes
    that spell UTF-8 read as those characters."""
    assert parse_name("a\\x2fb") == "a\\x2fb"
    assert parse_name("a\\x00") == "a\\x00"
    assert parse_name("caf\\xc3\\xa9") == "café"
    assert parse_name("caf\\xE9") == name_of(b"caf\xe9")


def test_text_that_is_not_unicode_is_refused() -> None:
    """A lone surrogate is not text an agent or a JSON document can hold."""
    with pytest.raises(ValueError, match="not valid Unicode"):
        parse_name("caf\udce9")


def test_name_from_json_refuses_bad_fields() -> None:
    """A pathBytes that is not base64, or a path that is not a string, is an error."""
    with pytest.raises(ValueError, match="base64"):
        name_from_json({"path": "x", "pathBytes": "@@"})
    with pytest.raises(TypeError):
        name_from_json({"path": 3})


def test_free_text_shows_undecodable_bytes_as_escapes() -> None:
    """A command's output shows a byte that is not UTF-8 as the display form shows it."""
    assert decode_text(b"a.txt\ncaf\xe9.txt\n\xc3\xa9\n") == "a.txt\ncaf\\xe9.txt\né\n"


def test_git_quotes_names_as_we_do(tmp_path: Path) -> None:
    """git itself (core.quotePath) writes every one of these names as git_quote does."""
    raws = [b"caf\xe9.txt", b"caf\\xe9.txt", b"caf\xc3\xa9.txt", b'q"uote', b"tab\there", b"plain"]
    repo = tmp_path / "repo"
    repo.mkdir()
    for raw in raws:
        with open(os.path.join(os.fsencode(repo), raw), "wb") as f:
            f.write(b"x\n")
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(tmp_path)}
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True, env=env)
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True, env=env)
    listed = subprocess.run(
        ["git", "-c", "core.quotePath=true", "ls-files"],
        cwd=repo,
        check=True,
        env=env,
        capture_output=True,
    ).stdout.decode("ascii")
    assert sorted(listed.splitlines()) == sorted(git_quote(name_of(raw)) for raw in raws)


def test_one_line_escapes_line_breaks_and_tabs_only() -> None:
    """A name on a line of output: line breaks and tabs escaped, the rest as displayed."""
    assert one_line("a\nb\r\tc") == "a\\nb\\r\\tc"
    assert one_line("plain name é") == "plain name é"
