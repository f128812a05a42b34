"""The Gemini API of the model server: what a request says, and the answers.

Gemini CLI (``@google/genai``) posts to ``/v1beta/models/{model}:streamGenerateContent?alt=sse``
(a server-sent event per ``GenerateContentResponse``), ``:generateContent`` (one JSON answer)
and ``:countTokens``. A request is ``{contents, systemInstruction, tools, generationConfig}``:

- ``contents``: turns with a ``role`` of ``user`` or ``model`` and ``parts``, each a ``text``,
  a ``functionCall`` (``name``, ``args``, ``id``) or a ``functionResponse`` (``name``,
  ``response``, ``id``);
- ``tools``: ``[{"functionDeclarations": [{name, description, parameters |
  parametersJsonSchema}]}]``.

An answer has ``candidates[0].content.parts`` (text, then a ``functionCall``), a
``finishReason`` (``STOP``) and ``usageMetadata`` (``promptTokenCount``,
``candidatesTokenCount``, ``totalTokenCount``).

Part of :mod:`orchestrator.testing.model_server` (import from there). Imports nothing of the
server's other modules at run time, so that the script module can use its parsers.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.testing._model_script import ToolChoice

#: the path suffixes (after ``models/NAME``) of the Gemini API routes
STREAM, GENERATE, COUNT = ":streamGenerateContent", ":generateContent", ":countTokens"


def is_gemini_path(path: str) -> bool:
    """Whether ``path`` is one of the Gemini API's model methods."""
    return path.endswith((STREAM, GENERATE, COUNT))


def model_name(path: str) -> str:
    """The model named in ``/v1beta/models/{model}:method``."""
    tail = path.rsplit("/models/", 1)[-1]
    return tail.split(":", 1)[0] or "scripted-model"


def _contents(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    contents = body.get("contents")
    if isinstance(contents, dict):
        return [contents]
    return [c for c in contents if isinstance(c, dict)] if isinstance(contents, list) else []


def _parts(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"text": content}]
    if not isinstance(content, dict):
        return []
    parts = content.get("parts")
    return [p for p in parts if isinstance(p, dict)] if isinstance(parts, list) else []


def _texts(parts: list[dict[str, Any]]) -> str:
    return "\n".join(p["text"] for p in parts if isinstance(p.get("text"), str))


def system_text(body: Mapping[str, Any]) -> str:
    """The ``systemInstruction`` as text."""
    return _texts(_parts(body.get("systemInstruction")))


def conversation(body: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The turns as (role, text): ``user``, ``assistant`` (a ``model`` turn) and ``tool``.

    Function responses travel in user turns; each is split out as a ``tool`` entry (after any
    text of the same turn, so that a conversation ending with results ends with ``tool``).
    """
    out: list[tuple[str, str]] = []
    for content in _contents(body):
        parts = _parts(content)
        if content.get("role") == "model":
            calls = [p["functionCall"] for p in parts if isinstance(p.get("functionCall"), dict)]
            text = _texts([p for p in parts if not p.get("thought")])
            out.append(("assistant", "\n".join([text, *map(json.dumps, calls)]).strip()))
            continue
        responses = [p["functionResponse"] for p in parts if "functionResponse" in p]
        others = [p for p in parts if "functionResponse" not in p]
        if others or not responses:
            out.append(("user", _texts(others)))
        out.extend(("tool", _response_text(r)) for r in responses)
    return out


def _response_text(response: Any) -> str:
    """A function response as text: its ``output`` when it is one, else its JSON."""
    if not isinstance(response, dict):
        return ""
    inner = response.get("response")
    output = inner.get("output") if isinstance(inner, dict) else None
    if isinstance(output, str):
        return output
    return json.dumps(inner if inner is not None else response, ensure_ascii=False)


def tools(body: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The declared functions as (name, JSON schema of the parameters)."""
    out: list[tuple[str, dict[str, Any]]] = []
    groups = body.get("tools")
    for group in groups if isinstance(groups, list) else []:
        declarations = group.get("functionDeclarations") if isinstance(group, dict) else None
        for decl in declarations if isinstance(declarations, list) else []:
            if not isinstance(decl, dict) or not isinstance(decl.get("name"), str):
                continue
            schema = decl.get("parametersJsonSchema") or decl.get("parameters") or {}
            out.append((decl["name"], schema if isinstance(schema, dict) else {}))
    return out


def estimate_tokens(body: Mapping[str, Any]) -> int:
    """Estimated prompt tokens of a request (about four characters a token)."""
    return max(1, len(json.dumps(body.get("contents"), ensure_ascii=False)) // 4)


def usage(prompt_tokens: int, output_tokens: int) -> dict[str, int]:
    """``usageMetadata`` for an answer."""
    return {
        "promptTokenCount": prompt_tokens,
        "candidatesTokenCount": output_tokens,
        "totalTokenCount": prompt_tokens + output_tokens,
    }


def response(
    parts: list[dict[str, Any]],
    *,
    model: str,
    ident: str,
    finish: bool = True,
    usage_metadata: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """One ``GenerateContentResponse`` carrying ``parts`` (a whole answer or a chunk of one)."""
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finish:
        candidate["finishReason"] = "STOP"
    out: dict[str, Any] = {"candidates": [candidate], "modelVersion": model, "responseId": ident}
    if usage_metadata is not None:
        out["usageMetadata"] = dict(usage_metadata)
    return out


def call_part(call: ToolChoice, call_id: str) -> dict[str, Any]:
    """The ``functionCall`` part that carries a tool call."""
    return {"functionCall": {"id": call_id, "name": call.name, "args": call.arguments}}


def whole_answer(
    text: str, call: ToolChoice | None, *, model: str, ident: str, call_id: str, tokens: int
) -> dict[str, Any]:
    """The answer of ``:generateContent``."""
    parts: list[dict[str, Any]] = [{"text": text}] if text else []
    if call is not None:
        parts.append(call_part(call, call_id))
    output = max(1, len(text) // 4 + (20 if call else 0))
    return response(parts, model=model, ident=ident, usage_metadata=usage(tokens, output))


def stream_events(
    text: str,
    call: ToolChoice | None,
    *,
    model: str,
    ident: str,
    call_id: str,
    tokens: int,
    chunk: int,
    stall: bool,
) -> Iterator[bytes]:
    """The server-sent events of ``:streamGenerateContent?alt=sse``.

    Text in pieces of ``chunk`` characters, then the function call, the finish reason and the
    usage in the last event. A stalled answer stops after its text.
    """

    def event(obj: Mapping[str, Any]) -> bytes:
        return b"data: " + json.dumps(obj).encode() + b"\r\n\r\n"

    pieces = [text[i : i + chunk] for i in range(0, len(text), chunk)] if chunk > 0 else [text]
    output = max(1, len(text) // 4 + (20 if call else 0))
    last = len(pieces) - 1 if call is None else -1
    for index, piece in enumerate(pieces):
        if stall or index != last:
            yield event(response([{"text": piece}], model=model, ident=ident, finish=False))
    if stall:
        return
    final: list[dict[str, Any]] = []
    if call is None:
        final.append({"text": pieces[-1] if pieces else ""})
    else:
        final.append(call_part(call, call_id))
    yield event(response(final, model=model, ident=ident, usage_metadata=usage(tokens, output)))
