"""Tests of prompt content helpers and the prompt capability gate."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from orchestrator.agent import content
from orchestrator.errors import CapabilityNotSupported, UsageError
from orchestrator.protocol import types as t


def test_to_blocks_accepts_strings_blocks_and_lists() -> None:
    """A prompt may be a string, one block, or a mix of strings and blocks."""
    link = t.ResourceLink(name="a", uri="file:///a")
    assert content.to_blocks("hi") == [t.TextContent(text="hi")]
    assert content.to_blocks(link) == [link]
    assert content.to_blocks(["a", link]) == [t.TextContent(text="a"), link]


def test_file_blocks_carry_bytes_and_mime_types(tmp_path: Path) -> None:
    """Image, audio and embedded blocks read the file; text embeds as text, binary as a blob."""
    png = tmp_path / "pic.png"
    png.write_bytes(b"\x89PNG\r\n")
    wav = tmp_path / "s.wav"
    wav.write_bytes(b"RIFF")
    note = tmp_path / "note.md"
    note.write_text("hello")
    blob = tmp_path / "data.bin"
    blob.write_bytes(b"\xff\xfe\x00")
    image = content.image_from_file(png)
    assert (image.mime_type, base64.b64decode(image.data)) == ("image/png", b"\x89PNG\r\n")
    assert content.audio_from_file(wav).mime_type in ("audio/x-wav", "audio/wav")
    text_res = content.embedded_resource_from_file(note).resource
    assert isinstance(text_res, t.TextResourceContents) and text_res.text == "hello"
    blob_res = content.embedded_resource_from_file(blob).resource
    assert isinstance(blob_res, t.BlobResourceContents)
    link = content.resource_link_from_file(note)
    assert (link.name, link.size, link.uri) == ("note.md", 5, note.as_uri())


def test_missing_file_is_a_usage_error(tmp_path: Path) -> None:
    """Reading a missing file names it."""
    with pytest.raises(UsageError, match="cannot read"):
        content.image_from_file(tmp_path / "nope.png")


def test_capability_gate_refuses_unadvertised_blocks() -> None:
    """Image, audio and embedded blocks need their prompt capability; text and links never do."""
    blocks: list[t.ContentBlock] = [
        t.TextContent(text="x"),
        t.ResourceLink(name="a", uri="file:///a"),
    ]
    content.check_prompt_capabilities(blocks, None, agent="a")
    image = t.ImageContent(data="", mime_type="image/png")
    with pytest.raises(CapabilityNotSupported, match=r"promptCapabilities\.image"):
        content.check_prompt_capabilities([image], t.PromptCapabilities(audio=True), agent="a")
    content.check_prompt_capabilities([image], t.PromptCapabilities(image=True), agent="a")
