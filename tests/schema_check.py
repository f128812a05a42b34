"""Validate every frame our client sends against the official ACP v1 JSON schema.

Feed a :class:`FrameValidator` the wire in both directions::

    validator = FrameValidator()
    validator.feed("recv", line_from_agent)   # remembers the agent's request ids
    validator.feed("send", line_to_agent)     # validates; AssertionError on a violation

What is checked on ``send``:

- the JSON-RPC envelope: one JSON object per line, ``"jsonrpc": "2.0"``, no unknown members;
  request ids are integers or strings (not booleans, floats or null) and not reused while
  pending; a response has exactly one of ``result``/``error`` and answers a request the agent
  sent and we have not answered yet (``id: null`` only on an error response);
- client->agent requests and notifications: ``params`` against the schema def whose
  ``x-method`` is the method (``x-side`` "agent", or "protocol" for ``$/cancel_request``);
- our responses to agent requests: ``result`` against the def with that ``x-method`` and
  ``x-side`` "client" (so ``fs/write_text_file`` must answer ``{}``, not ``null``), errors
  against the ``Error`` def; the answer to an agent request the schema does not declare must be
  an error (-32601);
- extension methods (``_name``) and ``extra_methods`` are checked for the envelope only.

``recv`` frames are never validated (the agent is not under test); they are read as the client
reads them (:func:`~orchestrator.jsonrpc.framing.decode_message`), and one it cannot read is
ignored.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Collection, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal, NoReturn, TypeGuard

import attrs
import orjson
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match, relevance

from orchestrator.errors import ParseError
from orchestrator.jsonrpc.framing import decode_message

__all__ = ["SCHEMA_PATH", "Direction", "FrameValidator", "SchemaIndex", "validate_transcript"]

Direction = Literal["send", "recv"]
SCHEMA_PATH = (
    Path(__file__).resolve().parent.parent / "orchestrator" / "protocol" / "schema" / "schema.json"
)
_FRAME_EXCERPT = 600
_VALID_CACHE_SIZE = 4096
_REQUEST_KEYS = frozenset({"jsonrpc", "id", "method", "params"})
_NOTIFICATION_KEYS = frozenset({"jsonrpc", "method", "params"})
_RESPONSE_KEYS = frozenset({"jsonrpc", "id", "result", "error"})


def _union_refs(union_def: Mapping[str, Any], member: str) -> Iterator[str]:
    """Names of the defs listed in a message union's ``params``/``result`` anyOf."""

    def walk(node: Any) -> Iterator[str]:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                yield ref.removeprefix("#/$defs/")
            for key in ("anyOf", "oneOf", "allOf"):
                for child in node.get(key, ()):
                    yield from walk(child)

    branches = union_def.get("anyOf", [union_def])
    for branch in branches:
        yield from walk(branch.get("properties", {}).get(member, {}))


@attrs.define
class SchemaIndex:
    """The schema's defs, indexed by method for what the client may send; validators cached."""

    defs: dict[str, Any]
    dialect: str
    #: client->agent request method -> params def (x-side "agent")
    requests: dict[str, str]
    #: client->agent or protocol notification method -> params def
    notifications: dict[str, str]
    #: agent->client request method -> result def of our answer (x-side "client")
    responses: dict[str, str]
    #: every method the client handles (x-side "client"): never ours to send
    client_side: frozenset[str]
    _validators: dict[str, Any] = attrs.field(factory=dict)
    _valid: OrderedDict[tuple[str, bytes], None] = attrs.field(factory=OrderedDict)

    @classmethod
    def from_schema(cls, schema: Mapping[str, Any]) -> SchemaIndex:
        """Index a loaded ``schema.json``: method tables come from the message unions."""
        defs: dict[str, Any] = schema["$defs"]

        def by_method(union: str, member: str, sides: Collection[str]) -> dict[str, str]:
            table: dict[str, str] = {}
            for name in _union_refs(defs[union], member):
                definition = defs[name]
                method = definition.get("x-method")
                if method is not None and definition.get("x-side") in sides:
                    table[method] = name
            return table

        notifications = by_method("ClientNotification", "params", {"agent"})
        for name, definition in defs.items():
            if definition.get("x-side") == "protocol" and "x-method" in definition:
                notifications[definition["x-method"]] = name
        return cls(
            defs=defs,
            dialect=schema.get("$schema", "https://json-schema.org/draft/2020-12/schema"),
            requests=by_method("ClientRequest", "params", {"agent"}),
            notifications=notifications,
            responses=by_method("ClientResponse", "result", {"client"}),
            client_side=frozenset(
                d["x-method"] for d in defs.values() if d.get("x-side") == "client"
            ),
        )

    def fault(self, def_name: str, instance: Any) -> tuple[str, str] | None:
        """``(json_path, message)`` of ``instance``'s fault against ``$defs/def_name``, or None."""
        try:
            key: tuple[str, bytes] | None = (
                def_name,
                orjson.dumps(instance, option=orjson.OPT_SORT_KEYS),
            )
        except TypeError:
            key = None  # not JSON-serializable: validation below says what is wrong
        if key is not None and key in self._valid:
            self._valid.move_to_end(key)
            return None
        validator = self._validators.get(def_name)
        if validator is None:
            # Embedding all defs lets "#/$defs/..." refs resolve inside one root document.
            root = {"$schema": self.dialect, "$defs": self.defs, "$ref": f"#/$defs/{def_name}"}
            validator = self._validators[def_name] = Draft202012Validator(root)
        errors = validator.iter_errors(instance)
        first = next(errors, None)
        if first is None:
            if key is None:
                return None
            self._valid[key] = None
            if len(self._valid) > _VALID_CACHE_SIZE:
                self._valid.popitem(last=False)
            return None
        return _explain([first, *errors])


def _explain(errors: list[ValidationError]) -> tuple[str, str]:
    """The JSON path and message of the error that says best what is wrong.

    ACP is full of tagged unions; jsonschema's ``best_match`` stops at "is not valid under any
    of the given schemas" or descends into an arbitrary branch. Here a branch whose tag
    (``type``, ``sessionUpdate``, ``outcome``...) or JSON type does not match is dropped, and
    the one branch left is followed. If several are left, each one's complaint is listed.
    """
    error = max(errors, key=relevance)
    while error.context:
        branches: dict[Any, list[ValidationError]] = {}
        for sub in error.context:
            branches.setdefault(sub.relative_schema_path[0], []).append(sub)
        live = {i: subs for i, subs in branches.items() if not any(map(_wrong_branch, subs))}
        # A branch whose tag matched beats an untagged catch-all branch (McpServer's stdio).
        tagged = {i: subs for i, subs in live.items() if _is_tagged(error.validator_value, i)}
        if len(tagged) == 1 or len(live) == 1:
            error = max(
                next(iter(tagged.values() if len(tagged) == 1 else live.values())), key=relevance
            )
            continue
        if not live and (tags := _tag_values(error)):
            key, expected = tags
            got = error.instance.get(key) if isinstance(error.instance, dict) else None
            message = f"{key} {got!r} is none of " + ", ".join(map(repr, expected))
            return str(error.json_path), message
        reasons: dict[str, None] = {}
        for subs in (live or branches).values():
            best = best_match(subs)
            where = "".join(f"[{p!r}]" for p in best.relative_path)
            reasons[_shorten(f"{where or 'itself'}: {best.message}", 160)] = None
        message = f"{_shorten(error.message, 200)}; no alternative fits: " + " | ".join(reasons)
        return str(error.json_path), message
    return str(error.json_path), error.message


def _is_tagged(branch_schemas: Any, index: Any) -> bool:
    """Whether union branch ``index`` pins a property with ``const`` (a tagged variant)."""
    try:
        properties = branch_schemas[index].get("properties", {})
    except (IndexError, KeyError, TypeError, AttributeError):
        return False
    return any(isinstance(p, dict) and "const" in p for p in properties.values())


def _tag_values(error: ValidationError) -> tuple[str, list[Any]] | None:
    """``(tag, allowed values)`` when every branch failed only on the same tag's value."""
    consts = [
        sub for sub in error.context if sub.validator == "const" and len(sub.relative_path) == 1
    ]
    keys = {sub.relative_path[0] for sub in consts}
    if len(keys) != 1 or not consts:
        return None
    return str(keys.pop()), [sub.validator_value for sub in consts]


def _wrong_branch(error: ValidationError) -> bool:
    """Whether a union branch's error shows the sender meant another branch."""
    if error.validator == "type" and not error.relative_path:
        return True  # not even the JSON type of this branch
    if error.validator == "const" and len(error.relative_path) == 1:
        return True  # a tag with another value
    if error.validator == "required" and not error.relative_path:
        # a missing tag: the property this branch pins with "const" is absent
        properties = error.schema.get("properties", {}) if isinstance(error.schema, dict) else {}
        missing = [p for p in error.validator_value if p not in error.instance]
        return any("const" in properties.get(p, {}) for p in missing)
    return False


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


@functools.cache
def _load_index(path: Path) -> SchemaIndex:
    return SchemaIndex.from_schema(orjson.loads(path.read_bytes()))


def _excerpt(frame: Any) -> str:
    try:
        text = orjson.dumps(frame).decode()
    except TypeError:
        text = repr(frame)
    if len(text) > _FRAME_EXCERPT:
        text = text[:_FRAME_EXCERPT] + f"... ({len(text)} chars)"
    return text


def _is_id(value: Any) -> TypeGuard[str | int]:
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def _method_set(methods: Iterable[str]) -> frozenset[str]:
    return frozenset(methods)


@attrs.define
class FrameValidator:
    """Checks the frames our client sends; see the module docstring for the rules.

    ``validated`` counts the sent frames checked so far. ``extra_methods`` lists methods
    outside the stable schema (say, unstable ones) to check for the envelope only.
    """

    schema_path: Path = SCHEMA_PATH
    extra_methods: frozenset[str] = attrs.field(default=frozenset(), converter=_method_set)
    validated: int = attrs.field(default=0, init=False)
    _index: SchemaIndex = attrs.field(init=False)
    #: agent request id -> method, until we answer it
    _inbound: dict[str | int, str] = attrs.field(factory=dict, init=False)
    #: our request id -> method, until the agent answers it
    _outbound: dict[str | int, str] = attrs.field(factory=dict, init=False)

    def __attrs_post_init__(self) -> None:
        self._index = _load_index(Path(self.schema_path).resolve())

    @property
    def pending_agent_requests(self) -> dict[str | int, str]:
        """Agent requests (id -> method) that we have not answered yet."""
        return dict(self._inbound)

    def assert_all_answered(self) -> None:
        """Fail if some request of the agent never got an answer from us."""
        if self._inbound:
            pending = ", ".join(f"{m} (id {i!r})" for i, m in self._inbound.items())
            raise AssertionError(f"agent requests left unanswered by the client: {pending}")

    def feed(self, direction: Direction, frame: bytes | str | Mapping[str, Any]) -> None:
        """Take one frame: remember it (``recv``) or validate it (``send``)."""
        if direction == "recv":
            self._remember(frame)
        elif direction == "send":
            self._check_sent(frame)
        else:
            raise ValueError(f"direction must be 'send' or 'recv', not {direction!r}")

    # ------------------------------------------------------------------ recv

    def _remember(self, frame: bytes | str | Mapping[str, Any]) -> None:
        if not isinstance(frame, Mapping):
            data = frame.encode() if isinstance(frame, str) else frame
            try:
                # as the client reads it (lone surrogate escapes included), so that what the
                # client answers is matched with what it read
                frame = decode_message(data)
            except ParseError:
                return  # the agent's junk is not ours to judge
        if not isinstance(frame, Mapping):
            return
        msg_id = frame.get("id")
        if not _is_id(msg_id):
            return
        method = frame.get("method")
        if isinstance(method, str):
            self._inbound[msg_id] = method
        elif "result" in frame or "error" in frame:
            self._outbound.pop(msg_id, None)

    # ------------------------------------------------------------------ send

    def _check_sent(self, raw: bytes | str | Mapping[str, Any]) -> None:
        frame = self._parse(raw)
        if frame.get("jsonrpc") != "2.0":
            self._fail(frame, None, "$.jsonrpc", f'must be "2.0", got {frame.get("jsonrpc")!r}')
        if "method" in frame:
            method = frame["method"]
            if not isinstance(method, str):
                self._fail(frame, None, "$.method", f"must be a string, got {method!r}")
            if "id" in frame:
                self._check_request(frame, method)
            else:
                self._check_notification(frame, method)
        elif "id" in frame:
            self._check_response(frame)
        else:
            self._fail(frame, None, "$", "neither a request, a notification nor a response")
        self.validated += 1

    def _parse(self, raw: bytes | str | Mapping[str, Any]) -> Mapping[str, Any]:
        if isinstance(raw, Mapping):
            return raw
        data = raw.encode() if isinstance(raw, str) else bytes(raw)
        body = data.removesuffix(b"\n")
        if b"\n" in body or b"\r" in body:
            self._fail(_excerpt_bytes(data), None, "$", "a frame must be one line (ND-JSON)")
        try:
            frame = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            self._fail(_excerpt_bytes(data), None, "$", f"not valid UTF-8 JSON: {exc}")
        if not isinstance(frame, dict):
            kind = "a batch" if isinstance(frame, list) else type(frame).__name__
            self._fail(frame, None, "$", f"must be a JSON object, got {kind}")
        return frame

    def _check_request(self, frame: Mapping[str, Any], method: str) -> None:
        self._check_keys(frame, method, _REQUEST_KEYS)
        msg_id = frame["id"]
        if not _is_id(msg_id):
            self._fail(
                frame, method, "$.id", f"request id must be an integer or string: {msg_id!r}"
            )
        if msg_id in self._outbound:
            self._fail(
                frame, method, "$.id", f"id {msg_id!r} is still pending ({self._outbound[msg_id]})"
            )
        self._outbound[msg_id] = method
        if method in self._index.requests:
            self._check_member(frame, method, "params", self._index.requests[method])
        elif not self._envelope_only(method):
            self._fail(frame, method, "$.method", self._unknown(method, "request"))

    def _check_notification(self, frame: Mapping[str, Any], method: str) -> None:
        self._check_keys(frame, method, _NOTIFICATION_KEYS)
        if method in self._index.notifications:
            self._check_member(frame, method, "params", self._index.notifications[method])
        elif not self._envelope_only(method):
            self._fail(frame, method, "$.method", self._unknown(method, "notification"))

    def _check_response(self, frame: Mapping[str, Any]) -> None:
        msg_id = frame["id"]
        has_result, has_error = "result" in frame, "error" in frame
        method = self._inbound.get(msg_id) if _is_id(msg_id) else None
        self._check_keys(frame, method, _RESPONSE_KEYS)
        if has_result == has_error:
            self._fail(frame, method, "$", "a response needs exactly one of result and error")
        if msg_id is None and has_error:
            pass  # the answer to a request whose id could not be read (e.g. -32700)
        elif not _is_id(msg_id):
            self._fail(
                frame, method, "$.id", f"response id must be an integer or string: {msg_id!r}"
            )
        elif method is None:
            self._fail(frame, None, "$.id", f"answers no pending agent request (id {msg_id!r})")
        else:
            del self._inbound[msg_id]
        if has_error:
            self._check_member(frame, method, "error", "Error")
        elif method is not None and method in self._index.responses:
            self._check_member(frame, method, "result", self._index.responses[method])
        elif method is not None and not self._envelope_only(method):
            self._fail(
                frame,
                method,
                "$.result",
                "the answer to an undeclared agent request must be "
                "an error (-32601 method not found)",
            )

    def _check_keys(
        self, frame: Mapping[str, Any], method: str | None, allowed: frozenset[str]
    ) -> None:
        extra = sorted(set(frame) - allowed)
        if extra:
            self._fail(frame, method, "$", f"unexpected member(s) {', '.join(extra)}")
        params = frame.get("params")
        if "params" in frame and not isinstance(params, dict):
            self._fail(frame, method, "$.params", f"params must be an object, got {params!r}")

    def _check_member(
        self, frame: Mapping[str, Any], method: str | None, member: str, def_name: str
    ) -> None:
        if member not in frame:
            self._fail(frame, method, "$", f"{member} is missing ({def_name} expected)")
        fault = self._index.fault(def_name, frame[member])
        if fault is not None:
            # the path is relative to the member ("$", "$.prompt[0]"...): make it the frame's
            path = f"$.{member}" + fault[0].removeprefix("$")
            self._fail(frame, method, path, f"{fault[1]} (against {def_name})")

    def _envelope_only(self, method: str) -> bool:
        return method.startswith("_") or method in self.extra_methods

    def _unknown(self, method: str, kind: str) -> str:
        if method in self._index.client_side:
            return f"{method!r} is an agent->client method; the client must not send it"
        return f"unknown {kind} method {method!r} (not in the stable v1 schema, not an extension)"

    @staticmethod
    def _fail(frame: Any, method: str | None, path: str, problem: str) -> NoReturn:
        where = f"method {method!r}" if method else "no method"
        raise AssertionError(
            f"ACP schema violation in a sent frame ({where}) at {path}: {problem}\n"
            f"  frame: {frame if isinstance(frame, str) else _excerpt(frame)}"
        )


def _excerpt_bytes(data: bytes) -> str:
    text = data.decode("utf-8", errors="replace")
    return text if len(text) <= _FRAME_EXCERPT else text[:_FRAME_EXCERPT] + "..."


def validate_transcript(
    path: str | Path, *, validator: FrameValidator | None = None
) -> FrameValidator:
    """Run an ND-JSON transcript (``{"dir": "send"|"recv", "t": ..., "msg": frame}`` per line)
    through a :class:`FrameValidator` and return it; violations name the transcript line."""
    checker = validator if validator is not None else FrameValidator()
    with Path(path).open("rb") as lines:
        for lineno, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                entry = orjson.loads(line)
                direction, frame = entry["dir"], entry["msg"]
                checker.feed(direction, frame)
            except AssertionError as exc:
                raise AssertionError(f"{path}:{lineno}: {exc}") from None
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                raise AssertionError(f"{path}:{lineno}: not a transcript entry: {exc!r}") from None
    return checker
