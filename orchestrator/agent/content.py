"""Helpers that build prompt content blocks, from text and from files."""

from __future__ import annotations

import base64
import mimetypes
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import get_args

from ..errors import CapabilityNotSupported, UsageError
from ..protocol import types as t

__all__ = [
    "audio_from_file",
    "check_prompt",
    "check_prompt_capabilities",
    "embedded_resource_from_file",
    "image_from_file",
    "resource_link_from_file",
    "text",
    "to_blocks",
]

PromptInput = str | t.ContentBlock | Sequence[str | t.ContentBlock]


def text(value: str) -> t.TextContent:
    """A text block."""
    return t.TextContent(text=value)


def _read(path: str | os.PathLike[str]) -> tuple[Path, bytes]:
    p = Path(path).absolute()
    try:
        return p, p.read_bytes()
    except OSError as e:
        raise UsageError(f"cannot read {p}: {e.strerror}") from e


def _mime(path: Path, default: str) -> str:
    return mimetypes.guess_type(path.name)[0] or default


def image_from_file(path: str | os.PathLike[str], mime_type: str | None = None) -> t.ImageContent:
    """An image block with the file's bytes (base64) and its MIME type."""
    p, data = _read(path)
    return t.ImageContent(
        data=base64.b64encode(data).decode("ascii"),
        mime_type=mime_type or _mime(p, "image/png"),
        uri=p.as_uri(),
    )


def audio_from_file(path: str | os.PathLike[str], mime_type: str | None = None) -> t.AudioContent:
    """An audio block with the file's bytes (base64) and its MIME type."""
    p, data = _read(path)
    return t.AudioContent(
        data=base64.b64encode(data).decode("ascii"), mime_type=mime_type or _mime(p, "audio/wav")
    )


def resource_link_from_file(path: str | os.PathLike[str]) -> t.ResourceLink:
    """A link to a file (the agent reads it itself); needs no prompt capability."""
    p = Path(path).absolute()
    size = p.stat().st_size if p.exists() else None
    return t.ResourceLink(
        name=p.name, uri=p.as_uri(), mime_type=mimetypes.guess_type(p.name)[0], size=size
    )


def embedded_resource_from_file(path: str | os.PathLike[str]) -> t.EmbeddedResource:
    """The file's content embedded: as text when it is UTF-8, else as a base64 blob."""
    p, data = _read(path)
    mime = mimetypes.guess_type(p.name)[0]
    resource: t.EmbeddedResourceResource
    try:
        resource = t.TextResourceContents(uri=p.as_uri(), text=data.decode("utf-8"), mime_type=mime)
    except UnicodeDecodeError:
        resource = t.BlobResourceContents(
            uri=p.as_uri(), blob=base64.b64encode(data).decode("ascii"), mime_type=mime
        )
    return t.EmbeddedResource(resource=resource)


#: the classes of a content block
_BLOCKS: tuple[type, ...] = get_args(t.ContentBlock)


def check_prompt(prompt: object) -> PromptInput:
    """``prompt`` when it is one: text, a content block, or a sequence (list, tuple) of texts
    and blocks; else a :class:`~orchestrator.errors.UsageError` saying what a prompt is."""
    if isinstance(prompt, (str, *_BLOCKS)):
        return prompt  # type: ignore[return-value]
    if isinstance(prompt, Sequence) and not isinstance(prompt, (bytes, bytearray)):
        wrong = [p for p in prompt if not isinstance(p, (str, *_BLOCKS))]
        if not wrong:
            return prompt
        got = f"a sequence holding {type(wrong[0]).__name__}"
    else:
        got = "None" if prompt is None else type(prompt).__name__
    raise UsageError(
        "a prompt is text (str), a content block (orchestrator.protocol.types.ContentBlock) "
        f"or a list of texts and blocks; got {got}"
    )


def to_blocks(prompt: PromptInput) -> list[t.ContentBlock]:
    """Normalise a prompt: a string, a block, or a sequence of strings and blocks."""
    if isinstance(prompt, str):
        return [text(prompt)]
    if not isinstance(prompt, Sequence):
        return [prompt]
    return [text(p) if isinstance(p, str) else p for p in prompt]


def check_prompt_capabilities(
    blocks: Iterable[t.ContentBlock], caps: t.PromptCapabilities | None, *, agent: str
) -> None:
    """Refuse blocks the agent did not advertise (image, audio, embedded resources)."""
    needs = {
        t.ImageContent: ("image", caps.image if caps else None),
        t.AudioContent: ("audio", caps.audio if caps else None),
        t.EmbeddedResource: ("embeddedContext", caps.embedded_context if caps else None),
    }
    for block in blocks:
        need = needs.get(type(block))
        if need is not None and not need[1]:
            raise CapabilityNotSupported(
                f"the agent does not accept {type(block).__name__} prompt blocks "
                f"(promptCapabilities.{need[0]} is not advertised)",
                agent=agent,
            )
